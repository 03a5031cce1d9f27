"""rksim's cost model side by side with two analytical peers: GenZ (``genz-llm``) and ``llm-analysis``.

llama-3-8b and qwen2.5-7b on h100-sxm and a100-80gb; prefill of 128..8192
tokens (batch 1, nothing cached) and one decode step at batch 1..256 and
context 512..16384. Writes the table into ``docs/benchmarks/calibration.md`` (a dated log) between the
``peers-table`` markers and every number to ``runs/peers/peers.json``.

The peers are installed into their own virtual environment
(``runs/peers-venv``, created on first use with ``python3 -m venv`` and pip
from PyPI), never into the project's; this script talks to them through a
subprocess of that interpreter. Inputs are the same datasheet numbers for all
three (rksim's presets: dense BF16 peak, HBM bandwidth, capacity); each peer
keeps its own default efficiencies (GenZ: ``system_eff = 1``; llm-analysis:
``flops_efficiency = hbm_memory_efficiency = 1``) — the differences in the
table come from the assumptions each model makes, named in the doc.

    python scripts/peers_table.py [--venv runs/peers-venv] [--no-doc]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEERS = {"genz-llm": "0.0.16", "llm-analysis": "0.2.2"}
MODELS = {  # rksim preset -> (GenZ model name, HF config fields for llm-analysis)
    "llama-3-8b": "meta-llama/Llama-3.1-8B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
}
HARDWARE = {"h100-sxm": "h100-sxm-80gb", "a100-80gb": "a100-sxm-80gb"}   # rksim -> llm-analysis gpu config
PREFILL = (128, 512, 2048, 8192)
DECODE_BATCH = (1, 16, 64, 256)
DECODE_CTX = (512, 4096, 16384)
BEGIN, END = "<!-- peers-table:begin -->", "<!-- peers-table:end -->"

# Runs inside the peers' venv: reads the cases (JSON, stdin), prints {case id: {peer: ms or "error: ..."}}.
PEER_CODE = r'''
import contextlib, io, json, logging, os, sys, tempfile, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
req = json.load(sys.stdin)
out = {}
try:
    from GenZ import decode_moddeling, prefill_moddeling
    genz = None
except Exception as exc:  # noqa: BLE001
    genz = f"error: import GenZ: {type(exc).__name__}: {exc}"
try:
    from llm_analysis.analysis import infer
    lla = None
except Exception as exc:  # noqa: BLE001
    lla = f"error: import llm_analysis: {type(exc).__name__}: {exc}"
tmp = tempfile.mkdtemp()
cfgs = {}
for name, m in req["models"].items():
    p = os.path.join(tmp, name + ".json")
    with open(p, "w") as f:
        json.dump({"name": name, "num_layers": m["n_layers"], "n_head": m["n_heads"], "hidden_dim": m["hidden_size"],
                   "vocab_size": m["vocab_size"], "max_seq_len": 32768, "num_key_value_heads": m["n_kv_heads"],
                   "model_type": "llama"}, f)   # no ffn_embed_dim: it must be an integer multiple of hidden_dim
                                                # (14336 / 4096 = 3.5 is refused), so its default 4 h applies
    cfgs[name] = p
for c in req["cases"]:
    r = {}
    sysd = {"Flops": c["tflops"], "Memory_BW": c["gbs"], "Memory_size": c["mem_gb"], "ICN": 450, "real_values": True}
    if genz is None:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                if c["op"] == "prefill":
                    o = prefill_moddeling(model=c["genz_model"], batch_size=1, input_tokens=c["n"], system_name=sysd,
                                          bits="bf16")
                else:
                    o = decode_moddeling(model=c["genz_model"], batch_size=c["batch"], input_tokens=c["ctx"],
                                         system_name=sysd, bits="bf16")
            r["genz"] = float(o["Latency"])
        except Exception as exc:  # noqa: BLE001
            r["genz"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    else:
        r["genz"] = genz
    if lla is None:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                if c["op"] == "prefill":
                    s = infer(model_name=cfgs[c["model"]], gpu_name=c["lla_gpu"], dtype_name="w16a16e16",
                              log_level="CRITICAL", batch_size_per_gpu=1, seq_len=c["n"], num_tokens_to_generate=1,
                              flops_efficiency=1.0, hbm_memory_efficiency=1.0)
                    r["llm_analysis"] = 1000.0 * float(s["prefill_latency"])
                else:
                    s = infer(model_name=cfgs[c["model"]], gpu_name=c["lla_gpu"], dtype_name="w16a16e16",
                              log_level="CRITICAL", batch_size_per_gpu=c["batch"], seq_len=c["ctx"],
                              num_tokens_to_generate=1, flops_efficiency=1.0, hbm_memory_efficiency=1.0)
                    r["llm_analysis"] = 1000.0 * float(s["decode_latency"])
        except Exception as exc:  # noqa: BLE001
            r["llm_analysis"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    else:
        r["llm_analysis"] = lla
    out[c["id"]] = r
print("PEERS-JSON" + json.dumps(out))
'''


def ensure_venv(venv: Path) -> tuple[Path | None, str]:
    """The peers' interpreter (created and filled on first use), or (None, why not)."""
    py = venv / "bin" / "python"
    if not py.is_file():
        r = subprocess.run([sys.executable if os.environ.get("PEERS_BASE_PY") is None else os.environ["PEERS_BASE_PY"],
                            "-m", "venv", str(venv)], capture_output=True, text=True)
        if r.returncode:
            return None, f"python -m venv {venv} failed: {r.stderr.strip().splitlines()[-1:]}"
    have = subprocess.run([str(py), "-m", "pip", "show", *PEERS], capture_output=True, text=True).stdout
    missing = [f"{k}=={v}" for k, v in PEERS.items() if f"Name: {k}" not in have]
    if missing:
        print(f"peers_table: installing {', '.join(missing)} into {venv} (not the project venv)", flush=True)
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", *missing], capture_output=True, text=True)
        if r.returncode:
            tail = [x for x in r.stderr.strip().splitlines() if not x.startswith("WARNING")][-2:]
            return None, f"pip install {' '.join(missing)} into {venv} failed: {' | '.join(tail)}"
    return py, ""


def cases() -> list[dict]:
    from sim.cost.profiles import load_hardware

    out = []
    for hwn, lla in HARDWARE.items():
        hw = load_hardware(hwn)
        base = {"hw": hwn, "tflops": hw.peak_flops / 1e12, "gbs": hw.mem_bw / 1e9, "mem_gb": hw.mem_capacity / 1e9,
                "lla_gpu": lla}
        for m, gm in MODELS.items():
            for n in PREFILL:
                out.append({**base, "id": f"{m}|{hwn}|prefill|{n}", "model": m, "genz_model": gm, "op": "prefill",
                            "n": n})
            for b in DECODE_BATCH:
                for c in DECODE_CTX:
                    out.append({**base, "id": f"{m}|{hwn}|decode|{b}x{c}", "model": m, "genz_model": gm,
                                "op": "decode", "batch": b, "ctx": c})
    return out


def rksim_ms(case: dict) -> tuple[float, bool]:
    """(rksim's milliseconds, does it fit in memory) with the shipped preset, whatever its fitted range."""
    import numpy as np

    from sim.cost import terms as C
    from sim.cost.profiles import load_hardware, load_model

    m, hw = load_model(case["model"]), load_hardware(case["hw"])
    if case["op"] == "prefill":
        t = C.prefill_terms(m, case["n"])
        kv = case["n"]
    else:
        t = C.decode_step_terms(m, np.full(case["batch"], float(case["ctx"])))
        kv = case["batch"] * (case["ctx"] + 1)
    fits = m.weight_bytes + kv * m.kv_bytes_per_token <= hw.mem_capacity
    return 1000.0 * float(np.sum(hw.time(t, model=m))), bool(fits)


def table(rows: list[dict], why: str) -> str:
    from sim.cost.profiles import load_hardware

    def fmt(v):
        return f"{v:.2f}" if isinstance(v, float) else "–"

    def ratio(a, b):
        return f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) and b > 0 else "–"

    notes = {h: load_hardware(h).calibration_note for h in HARDWARE}
    lines = [BEGIN, "",
             "Generated by `python scripts/peers_table.py` (do not edit by hand). Milliseconds; rksim with the "
             "shipped presets (" + "; ".join(f"{h}: {n}" for h, n in notes.items()) + "); GenZ "
             f"{PEERS['genz-llm']} and llm-analysis {PEERS['llm-analysis']} on the same datasheet peak and "
             "bandwidth with their default efficiencies of 1. `fits`: weights + KV within the 80 GB "
             "(GenZ refuses what does not fit; rksim and llm-analysis price it anyway).", ""]
    if why:
        lines += [f"**Peers unavailable here:** {why}", ""]
    lines += ["| model | hardware | operation | fits | rksim | GenZ | llm-analysis | rksim / GenZ | rksim / llm-analysis |",
              "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        op = f"prefill {r['n']}" if r["op"] == "prefill" else f"decode b={r['batch']} ctx={r['ctx']}"
        g, la = r["genz"], r["llm_analysis"]
        lines.append(f"| {r['model']} | {r['hw']} | {op} | {'yes' if r['fits'] else 'no'} | {fmt(r['rksim'])} | "
                     f"{fmt(g) if not isinstance(g, str) else '–'} | {fmt(la) if not isinstance(la, str) else '–'} | "
                     f"{ratio(r['rksim'], g)} | {ratio(r['rksim'], la)} |")
    errs = sorted({f"{k}: {r[k]}" for r in rows for k in ("genz", "llm_analysis") if isinstance(r[k], str)})
    if errs:
        lines += ["", "Peer errors (verbatim, deduplicated): " + "; ".join(e[:200] for e in errs[:6])]
    lines += ["", END]
    return "\n".join(lines)


def main(argv=None) -> int:
    from traces.store import atomic_write_text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=ROOT / "runs" / "peers-venv")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks" / "calibration.md")
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args(argv)
    cs = cases()
    py, why = ensure_venv(a.venv)
    peer = {}
    if py is not None:
        req = {"cases": cs, "models": {}}
        from sim.cost.profiles import load_model
        for m in MODELS:
            s = load_model(m)
            req["models"][m] = {k: getattr(s, k) for k in ("n_layers", "n_heads", "hidden_size", "vocab_size",
                                                            "n_kv_heads", "intermediate_size")}
        r = subprocess.run([str(py), "-c", PEER_CODE], input=json.dumps(req), capture_output=True, text=True,
                           timeout=1800)
        mark = [ln for ln in r.stdout.splitlines() if ln.startswith("PEERS-JSON")]
        if r.returncode or not mark:
            why = f"the peers' interpreter failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}"
        else:
            peer = json.loads(mark[-1][len("PEERS-JSON"):])
    rows = []
    for c in cs:
        ms, fits = rksim_ms(c)
        p = peer.get(c["id"], {"genz": why or "n/a", "llm_analysis": why or "n/a"})
        rows.append({**{k: c.get(k) for k in ("model", "hw", "op", "n", "batch", "ctx")}, "fits": fits, "rksim": ms,
                     "genz": p["genz"], "llm_analysis": p["llm_analysis"]})
    out = ROOT / "runs" / "peers"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "peers.json", json.dumps({"rows": rows, "peers": PEERS, "unavailable": why}, indent=1))
    text = table(rows, why)
    if not a.no_doc:
        doc = a.doc.read_text()
        if BEGIN in doc and END in doc:
            doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
        else:
            doc = doc.rstrip("\n") + "\n\n" + text + "\n"
        atomic_write_text(a.doc, doc)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
