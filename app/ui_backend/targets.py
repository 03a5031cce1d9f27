"""Presets, policies and the trace facts the pages' widgets are built from (slider ranges)."""
from __future__ import annotations

import numpy as np


# ------------------------------------------------------------------ presets and policies
def presets() -> dict[str, list[str]]:
    from sim.api import load_presets

    return load_presets()


def default_hardware() -> str:
    from app.cli_sim import DEFAULT_HARDWARE

    return DEFAULT_HARDWARE


def policy_table() -> list[dict]:
    """Every registered policy: name, kind, parameters with defaults and allowed values."""
    from policies import list_policies, param_choices, policy_class, policy_defaults

    out = []
    for name in list_policies():
        out.append({"name": name, "kind": policy_class(name).kind, "defaults": policy_defaults(name),
                    "choices": param_choices(name), "doc": (policy_class(name).__doc__ or "").strip().split("\n")[0]})
    return out


def policy_kind(name: str) -> str:
    from policies import policy_class

    return policy_class(name).kind


# ------------------------------------------------------------------ trace facts (slider ranges)
def trace_facts(trace: str) -> dict:
    """What the sliders need: depth, problem count, long-decode lengths, entropy range, trace model."""
    from sim.api import loaded

    tf = loaded(trace).tf
    ent = np.concatenate([f.lens[("own", True)]["entropy"].ravel() for f in tf.problems]) if tf.problems else np.zeros(1)
    return {"n_layers": int(tf.n_layers), "n_problems": len(tf.problems), "model": tf.model_name,
            "n_longs": len(tf.longs),
            "long_T": [int(ld.prompt_len + ld.gen_len) for ld in tf.longs],
            "long_prompt": [int(ld.prompt_len) for ld in tf.longs],
            "entropy_min": float(np.nanmin(ent)), "entropy_max": float(np.nanmax(ent)),
            "mean_prompt_tokens": float(np.mean([f.prompt_len.mean() for f in tf.problems])) if tf.problems else 0.0}


def observed_sigmas(trace: str, asks_params: dict) -> np.ndarray:
    """ASKS sigma of every non-root branch under these ASKS parameters (tau aside: sigma does not use it)."""
    from sim.api import simulate

    p = {k: v for k, v in asks_params.items() if k != "tau"}
    p["tau"] = 2.0  # gate disabled, sigma still reported
    br = simulate(trace, policy="asks", params=p, baselines=False).branches
    s = br.loc[br["branch"] > 0, "sigma"].to_numpy(dtype=np.float64)
    return s[np.isfinite(s)]
