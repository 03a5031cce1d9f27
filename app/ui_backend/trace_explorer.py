"""The trace explorer's data: problems, branches, similarity, lengths, exit layers, value ranges."""
from __future__ import annotations

import numpy as np
import pandas as pd


# ------------------------------------------------------------------ trace explorer
def load_trace(trace: str):
    from traces.store import load_trace as _lt

    return _lt(trace, verify=False)


def problem_list(trace: str) -> pd.DataFrame:
    tr = load_trace(trace)
    return pd.DataFrame([{"position": i, "problem_index": int(p.index), "question": str(p.meta.get("question", "")),
                          "truth": str(p.truth), "n_branches": int(p.n_branches)} for i, p in enumerate(tr.problems)])


def problem_branches(trace: str, pos: int) -> pd.DataFrame:
    """Per branch: prompt segments, own and counterfactual answers with correctness, scores."""
    p = load_trace(trace).problems[int(pos)]
    br = p.branches
    cols = ["branch", "variant_text", "prompt_len", "gen_len", "answer", "correct", "verify_score"]
    cols += [c for c in ("cf_gen_len", "cf_answer", "cf_correct", "cf_verify_score", "vote_share") if c in br]
    df = br[cols].copy()
    df.insert(2, "segments", [" + ".join(f"{k} {n}" for k, n in zip(ks, ns))
                              for ks, ns in zip(br["seg_kinds"], br["seg_lens"])])
    return df


def problem_sigma(trace: str, pos: int, asks_params: dict) -> np.ndarray:
    """sigma_b of each branch of one problem (root: NaN) under the ASKS parameters."""
    from policies import get_policy

    pol = get_policy("asks", **{k: v for k, v in asks_params.items()})
    p = load_trace(trace).problems[int(pos)]
    sig = pol.sigma(p.cos(pol.pooling, pol.similarity))
    sig = np.asarray(sig, dtype=np.float64)
    sig[0] = np.nan
    return sig


def problem_lens(trace: str, pos: int, gen: str = "own", norm: bool = True) -> dict[str, np.ndarray]:
    """(B, L) entropy and p(Yes) of the verification pass by layer (logit lens)."""
    d = load_trace(trace).problems[int(pos)].lens(gen, norm=norm)
    py, pn = np.asarray(d["p_yes"], np.float64), np.asarray(d["p_no"], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = py / (py + pn)
    return {"entropy": np.asarray(d["entropy"], np.float64), "p_yes": py, "p_yes_ratio": ratio}


def exit_layers(trace: str, pos: int, cgee_params: dict) -> pd.DataFrame:
    """CGEE's exit layer per branch of one problem (from the simulator's decisions)."""
    from sim.api import simulate

    br = simulate(trace, policy="cgee", params=cgee_params, problems=[int(pos)], baselines=False).branches
    return br[["branch", "exit_layer", "selected"]].copy()


def value_ranges(trace: str, seq: int) -> pd.DataFrame:
    """Long-decode value ranges (max(v) - min(v) over D) as rows (layer, head, value_range)."""
    ld = load_trace(trace).long_decodes[int(seq)]
    vr = np.asarray(ld.value_range, dtype=np.float32)  # (n_layers, T, H_kv)
    n_l, T, H = vr.shape
    step = max(1, T // 256)  # a box per (layer, head) needs only a sample of positions
    sub = vr[:, ::step, :]
    lay = np.repeat(np.asarray(ld.layers), sub.shape[1] * H)
    head = np.tile(np.arange(H), n_l * sub.shape[1])
    return pd.DataFrame({"layer": lay, "head": head, "value_range": sub.reshape(-1)})
