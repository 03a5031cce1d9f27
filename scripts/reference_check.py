"""``make reference-check``: the project's token-eviction policies against kvpress's presses.

1. Capture (project venv, the project's own code): SmolLM2-135M reads a ~300-token prompt
   (the first GSM8K test questions, one after another); ``traces.capture_ops.QKVRecorder``
   records the post-RoPE Q, K, V that attention receives at three layers; saved as
   float32 ``.npy`` under ``OUT/qkv/``.
2. Project side: each policy of ``policies/`` chooses, per KV head, which tokens of that
   prompt to keep at compression 0.5 (``n_kept = int(T * 0.5)``, kvpress's rule).
3. kvpress side (its own venv, ``scripts/reference_check_kvpress.py``): kvpress 0.5.5's
   presses compress the same tensors.
4. Jaccard |A ∩ B| / |A ∪ B| of the kept sets per press, layer and KV head, printed and
   written to ``OUT/report.json`` and ``OUT/report.md``; exit 1 when a checked pair falls
   under its threshold (a regression), 0 otherwise.

How a prefill press maps onto the project's decode-time ``select`` (one eviction over the
whole prompt, every query of the prompt already seen):

- SnapKV (window w): kvpress keeps the last w tokens (their score is padded to max + 1)
  and the top ``n_kept - w`` of the rest; here ``SnapKV(window=w, kernel=5)`` selects
  ``budget = n_kept - w`` of the first ``T - w`` candidates with the last w queries, and
  the w window tokens are kept as the recent buffer.
- StreamingLLM: 4 sinks + the most recent; ``StreamingLLM(budget=n_kept)`` over all T.
- CUR: ``CURPress(use_local_approximation=True, local_window_size=16)`` (no random
  projection: kvpress's default) against ``CurDKV(local_window=16, rank=0)`` (rank 0 = no
  projection); ``cur-defaults`` compares both libraries' defaults (CurDKV projects with a
  fixed Gaussian G of rank 20) for information.
- H2O vs ``ObservedAttentionPress``: the attention of all T queries, observed as the
  decode loop observes it (``policies.token_loop.observe``); ``h2o-mean``
  (``mean_over_queries=True``) divides each token's sum by the T - j queries that saw it
  as the press does, ``h2o-sum`` (H2O's default) does not — shown for information.

Usage: ``python scripts/reference_check.py [--kvpress-python .venv-refcheck/bin/python]
[--out runs/reference-check] [--tokens 300] [--layers 8,16,30]``
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

COMPRESSION = 0.5

# project config -> (kvpress config, minimum Jaccard on every head; None = information only).
# SnapKV / CUR / observed attention: kvpress's eager softmax is float32, the project's
# float64, so a near-tie at the boundary may swap one token (Jaccard 74/76 = 0.974 at T = 300).
PAIRS = {
    "snapkv-w32": ("snapkv-w32", 0.97),
    "snapkv-w64": ("snapkv-w64", 0.97),
    "streamingllm": ("streamingllm", 1.0),
    "cur-local16": ("cur-local16", 0.97),
    "cur-defaults": ("cur-defaults", None),
    "h2o-mean": ("observed-attention", 0.97),
    "h2o-sum": ("observed-attention", None),
}


def n_kept(T: int, ratio: float = COMPRESSION) -> int:
    """kvpress's ``compute_n_kept``: ``max(1, int(T * (1 - ratio)))``."""
    return max(1, int(T * (1 - ratio)))


# ------------------------------------------------------------------ 1. capture (torch)

def prompt_ids(tok, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` tokens of the first GSM8K test questions, one after another."""
    from traces.datasets import load_dataset

    text, ids = "", []
    for p in load_dataset("gsm8k", limit=50):
        text += f"Question: {p.question}\n\n"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            return list(ids[:n_tokens])
    raise ValueError(f"--tokens: {n_tokens} is more than the first 50 GSM8K questions hold ({len(ids)})")


def capture(out: Path, model: str, n_tokens: int, layers: list[int]) -> dict:
    """Prefill the prompt once, recording Q/K/V at ``layers`` (1-based) from inside attention."""
    import torch

    from traces import capture_ops as ops
    from traces.models import load_model
    from traces.store import atomic_write_bytes, atomic_write_json, npy_bytes

    torch.set_num_threads(1)
    lm = load_model(model, device="cpu")
    bad = [l for l in layers if not 1 <= l <= lm.n_layers]
    if bad:
        raise ValueError(f"--layers: {bad} outside 1..{lm.n_layers}")
    ids = prompt_ids(lm.tokenizer, n_tokens)
    with ops.QKVRecorder(lm, layers) as rec:
        ops.prefill(lm, torch.as_tensor([ids]))
    K, V, Q = rec.arrays()
    qdir = out / "qkv"
    for i, l in enumerate(layers):
        for name, a in (("Q", Q[i]), ("K", K[i]), ("V", V[i])):
            atomic_write_bytes(qdir / f"L{l:02d}_{name}.npy", npy_bytes(np.ascontiguousarray(a, np.float32)))
    meta = {"model": lm.name, "layers": layers, "T": len(ids), "n_heads": lm.n_heads,
            "n_kv_heads": lm.n_kv_heads, "head_dim": lm.head_dim, "compression": COMPRESSION,
            "token_ids": ids}
    atomic_write_json(qdir / "meta.json", meta)
    return meta


def load_qkv(qdir: Path, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ld = lambda x: np.load(qdir / f"L{layer:02d}_{x}.npy", allow_pickle=False).astype(np.float64)  # noqa: E731
    return ld("Q"), ld("K"), ld("V")


# ------------------------------------------------------------------ 2. project side (numpy)

def project_kept(name: str, Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """(H_kv, n_kept) ascending kept positions of the project's policy ``name``."""
    from policies import get_policy
    from policies.token_loop import observe

    T, H, _ = K.shape
    n = n_kept(T)
    pos = np.arange(T)
    allpos = np.tile(pos, (H, 1))
    if name.startswith("snapkv-w"):
        w = int(name.removeprefix("snapkv-w"))
        pol = get_policy("snapkv", window=w, kernel=5, sinks=0, budget=n - w, buffer=w)
        keep = pol.select(K, V, Q[T - w:], T - w, k_pos=pos, q_pos=pos[T - w:])
        return np.concatenate([keep, allpos[:, T - w:]], axis=1)
    if name == "streamingllm":
        return get_policy("streamingllm", budget=n, sinks=4).select(K, V, Q[:0], T)
    if name == "cur-defaults":
        return get_policy("curdkv", budget=n).select(K, V, Q[:0], T)
    if name == "cur-local16":  # rank 0: no projection, as CURPress's use_random_leverage=False
        return get_policy("curdkv", budget=n, sinks=4, local_window=16, rank=0).select(K, V, Q[:0], T)
    if name in ("h2o-sum", "h2o-mean"):
        pol = get_policy("h2o", budget=n, mean_over_queries=name == "h2o-mean")
        state = pol.init_state(H, T)
        observe(pol, state, K, Q, allpos, 0, T)   # every prompt query, each over what it sees
        return pol.select(K, V, Q[:0], T, state=state, k_pos=allpos, q_pos=pos[:0])
    raise ValueError(f"unknown project config {name!r}")


# ------------------------------------------------------------------ 3/4. compare and report

def jaccard(a, b) -> float:
    a, b = set(map(int, a)), set(map(int, b))
    return len(a & b) / len(a | b) if a | b else 1.0


def compare(meta: dict, qdir: Path, ref: dict) -> list[dict]:
    """One row per project config, layer and KV head."""
    rows = []
    for layer in meta["layers"]:
        Q, K, V = load_qkv(qdir, layer)
        for proj, (kv, thr) in PAIRS.items():
            mine = project_kept(proj, Q, K, V)
            theirs = ref["kept"][kv][str(layer)]
            for h in range(K.shape[1]):
                j = jaccard(mine[h], theirs[h])
                status = "info" if thr is None else ("ok" if j >= thr else "REGRESSION")
                rows.append({"project": proj, "kvpress": kv, "layer": int(layer), "kv_head": h,
                             "jaccard": j, "threshold": thr, "status": status,
                             "n_kept": len(theirs[h])})
    return rows


def summary_table(rows: list[dict]):
    import pandas as pd

    df = pd.DataFrame(rows)
    df["cell"] = df["jaccard"].map(lambda j: f"{j:.3f}")
    wide = df.pivot_table(index=["project", "kvpress"], columns=["layer", "kv_head"], values="cell",
                          aggfunc="first", sort=False)
    wide.columns = [f"L{l} h{h}" for l, h in wide.columns]
    st = df.groupby(["project", "kvpress"], sort=False).agg(
        threshold=("threshold", "first"),
        status=("status", lambda s: "REGRESSION" if (s == "REGRESSION").any() else s.iloc[0]))
    st["threshold"] = st["threshold"].map(lambda t: "–" if t is None or t != t else f"{t:.2f}")
    return wide.join(st).reset_index()


def markdown(df) -> str:
    """A pipe table of ``df`` (pandas' own ``to_markdown`` needs tabulate, which the project does not ship)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def write_report(out: Path, meta: dict, ref: dict, rows: list[dict]) -> tuple[str, bool]:
    from traces.store import atomic_write_json, atomic_write_text

    table = summary_table(rows)
    failed = any(r["status"] == "REGRESSION" for r in rows)
    head = (f"# Reference check against kvpress {ref.get('kvpress_version')}\n\n"
            f"{meta['model']}, a {meta['T']}-token prompt, layers {meta['layers']}, compression "
            f"{meta['compression']} (n_kept = {n_kept(meta['T'])} per KV head); Jaccard of kept sets per "
            f"layer (L) and KV head (h). kvpress side: transformers {ref.get('transformers_version')}, "
            f"torch {ref.get('torch_version')}.\n\n")
    md = head + markdown(table) + "\n\n" + (
        "**REGRESSION**: a checked pair is under its threshold.\n" if failed else "No regression.\n")
    atomic_write_text(out / "report.md", md)
    atomic_write_json(out / "report.json", {
        "model": meta["model"], "T": meta["T"], "layers": meta["layers"], "compression": meta["compression"],
        "kvpress_version": ref.get("kvpress_version"), "transformers_version": ref.get("transformers_version"),
        "thresholds": {k: v[1] for k, v in PAIRS.items()}, "pairs": {k: v[0] for k, v in PAIRS.items()},
        "regression": failed, "rows": rows})
    return table.to_string(index=False), failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvpress-python", default=str(ROOT / ".venv-refcheck" / "bin" / "python"),
                    help="python of the virtualenv that has kvpress==0.5.5 (make reference-check builds it)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "reference-check"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--layers", default="8,16,30", help="1-based layers to capture (comma-separated)")
    a = ap.parse_args(argv)
    try:
        layers = [int(x) for x in a.layers.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"reference-check: error: --layers: {a.layers!r} is not a comma-separated list of integers")
    if a.tokens < 128:
        raise SystemExit(f"reference-check: error: --tokens: {a.tokens} is under 128 (SnapKV's window 64 needs more)")
    kvpy = Path(a.kvpress_python)
    if not kvpy.is_file():
        raise SystemExit(f"reference-check: error: --kvpress-python: {kvpy} not found (run `make reference-check`)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        meta = capture(out, a.model, a.tokens, layers)
    except ValueError as e:
        raise SystemExit(f"reference-check: error: {e}")
    ref_json = out / "kvpress_kept.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    rc = subprocess.call([str(kvpy), str(ROOT / "scripts" / "reference_check_kvpress.py"), str(out / "qkv"),
                          str(ref_json)], env=env)
    if rc != 0:
        raise SystemExit(f"reference-check: error: the kvpress side exited with {rc}")
    ref = json.loads(ref_json.read_text())
    rows = compare(meta, out / "qkv", ref)
    text, failed = write_report(out, meta, ref, rows)
    print(text)
    print(f"\nwritten: {out / 'report.md'}, {out / 'report.json'}")
    if failed:
        print("reference-check: REGRESSION (see the rows marked REGRESSION)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
