"""Per-trace features the simulator replays, extracted once and cached.

A trace's Parquet tables are read once per process into plain numpy arrays
(:class:`ProblemFeatures`); every configuration evaluated afterwards only does
cheap array work on them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from policies.similarity import identical_spans

_COS_COLS = ("cos_mean_raw", "cos_mean_centered", "cos_last_raw", "cos_last_centered")
_LENS = ("entropy", "p_yes", "p_no")


@dataclass
class ProblemFeatures:
    """Everything the simulator needs from one problem shard (B branches, L layers)."""

    pos: int                      # position in trace.problems
    index: int                    # problem_index (row in the dataset)
    truth: str
    B: int
    L: int
    prompt_ids: list              # B int64 arrays
    prompt_len: np.ndarray        # (B,) int64
    spans: np.ndarray             # (B, 2) variant [start, end)
    verify_len: np.ndarray        # (B,) tokens of the verification suffix
    gen: dict                     # "own"/"cf" -> dict of (B,) arrays: len, answer, correct, mean_prob, vote_share, verify_score
    cos: dict                     # column -> (B, L)
    lens: dict                    # (gen, norm) -> {"entropy","p_yes","p_no"} (B, L)
    key: tuple = field(default=())

    def eff(self, share: np.ndarray, what: str) -> np.ndarray:
        """Per-branch value of ``what`` from the own generation, or the counterfactual where ``share``."""
        return np.where(share, self.gen["cf"][what], self.gen["own"][what])

    def eff_lens(self, share: np.ndarray, norm: bool = True) -> dict:
        own, cf = self.lens[("own", norm)], self.lens[("cf", norm)]
        s = np.asarray(share, bool)[:, None]
        return {k: np.where(s, cf[k], own[k]) for k in _LENS}


@dataclass
class LongFeatures:
    """One long-decode sequence (VASE): memmapped K/V/Q of the recorded layers."""

    pos: int
    meta: dict
    layers: list
    prompt_len: int
    gen_len: int
    K: np.ndarray
    V: np.ndarray
    Q: np.ndarray


@dataclass
class TraceFeatures:
    path: str
    manifest: dict
    model_name: str
    n_layers: int
    problems: list
    longs: list
    timings: list                  # per problem DataFrame of measured phases
    trace: object = None
    vocab_size: int | None = None  # the trace model's V (manifest model.vocab_size)


def _gen_arrays(df, prefix: str) -> dict:
    col = lambda c: df[prefix + c]  # noqa: E731
    ans = col("answer").astype(str).to_numpy()
    out = {
        "len": col("gen_len").to_numpy(dtype=np.int64),
        "answer": ans,
        "correct": col("correct").to_numpy(dtype=bool),
        "mean_prob": col("mean_prob").to_numpy(dtype=np.float64),
        "verify_score": col("verify_score").to_numpy(dtype=np.float64),
    }
    vs = prefix + "vote_share"
    out["vote_share"] = df[vs].to_numpy(dtype=np.float64) if vs in df else np.zeros(len(df))
    return out


def problem_features(p, pos: int, L: int) -> ProblemFeatures:
    br = p.branches
    B = len(br)
    own = _gen_arrays(br, "")
    has_cf = "cf_gen_len" in br
    cf = _gen_arrays(br, "cf_") if has_cf else own
    lens = {}
    for g in ("own", "cf"):
        for norm in (True, False):
            try:
                d = p.lens(g, norm=norm)
            except ValueError:
                d = p.lens("own", norm=norm)
            lens[(g, norm)] = {k: np.asarray(d[k], dtype=np.float64) for k in _LENS}
    prompt_ids = [np.asarray(x, dtype=np.int64) for x in br["prompt_ids"]]
    spans = np.stack([br["variant_start"].to_numpy(dtype=np.int64), br["variant_end"].to_numpy(dtype=np.int64)], 1)
    # Identical variant spans give sigma exactly 1 (DESIGN §4). The gate pools each span on its
    # own, so equal span tokens mean equal pooled vectors; traces captured before the one cosine
    # (policies.similarity.cosine) stored 1 - 6e-16 for some of them, which tau = 1 would refuse.
    same = identical_spans(prompt_ids, spans) if B else np.zeros(0, bool)
    cos = {}
    for c in _COS_COLS:
        pooling, kind = c.split("_")[1], c.split("_")[2]
        v = np.array(p.cos(pooling, "cosine" if kind == "raw" else "centered"), dtype=np.float64)
        v[same] = 1.0
        cos[c] = v
    return ProblemFeatures(
        pos=pos, index=int(p.index), truth=str(p.truth), B=B, L=L,
        prompt_ids=prompt_ids,
        prompt_len=br["prompt_len"].to_numpy(dtype=np.int64),
        spans=spans,
        verify_len=br["verify_prompt_len"].to_numpy(dtype=np.int64),
        gen={"own": own, "cf": cf}, cos=cos, lens=lens)


def _vocab_size(manifest: dict) -> int | None:
    v = (manifest.get("model") or {}).get("vocab_size")
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def load(trace) -> TraceFeatures:
    """Features of ``trace`` (a path or a loaded ``traces.store.Trace``), built anew on every call.

    Keep them in a :class:`sim.replay.session.Session` (which also sees a trace re-captured in place).
    """
    from traces.store import load_trace  # no torch: the store is pure pyarrow/numpy

    built = getattr(trace, "reshaped_features", None)
    if built is not None:  # a sim.workload.reshape.ReshapedTrace: its features are built in memory
        return built
    tr = load_trace(trace, verify=True) if isinstance(trace, (str, os.PathLike)) else trace
    L = int(tr.n_layers)
    probs = [problem_features(p, i, L) for i, p in enumerate(tr.problems)]
    longs = []
    for i, ld in enumerate(tr.long_decodes):
        meta = ld.meta
        longs.append(LongFeatures(pos=i, meta=meta, layers=list(ld.layers), prompt_len=int(meta["prompt_len"]),
                                  gen_len=int(meta["gen_len"]), K=ld.K, V=ld.V, Q=ld.Q))
    tf = TraceFeatures(path=str(getattr(tr, "path", "")), manifest=tr.manifest, model_name=tr.model_name,
                       n_layers=L, problems=probs, longs=longs, timings=[p.timings for p in tr.problems], trace=tr,
                       vocab_size=_vocab_size(tr.manifest))
    return tf
