"""Runs of the simulator from the pages: one policy, the comparison, token curves, serving KPIs."""
from __future__ import annotations

import inspect

import pandas as pd

from app.ui_backend.words import KPI_SERVING, PHASES, is_finite_number
from app.ui_backend.targets import presets


# ------------------------------------------------------------------ simulation
def _simulate_params() -> set[str]:
    from sim.api import simulate

    return set(inspect.signature(simulate).parameters)


# Serving controls. Each goes to sim.api.simulate as a keyword where that build of the
# simulator takes it (arrival_rate), else into its ``serving=`` settings where it has them
# (sim.serving.capacity.ServingConfig: scheduler, max_num_seqs, ...), else into the workload where the workload
# knows it (concurrency, n_requests), else it is reported as "not applied by this simulator" (never
# silently dropped).
SERVING_OPTIONS = ("arrival_rate", "concurrency", "n_requests", "scheduler", "max_num_seqs",
                   "max_num_batched_tokens", "gpu_memory_utilization", "memory_rules", "kv_capacity_bytes",
                   "decode_tokens")


def _serving_fields() -> set[str]:
    try:
        from sim.serving.capacity import ServingConfig
    except ImportError:  # a simulator without serving at capacity
        return set()
    return set(ServingConfig.__dataclass_fields__)


def scheduler_choices() -> tuple[str, ...]:
    """The serving scheduler's policies (``vllm-v1``, ``prefill-first``), or () where there is none."""
    try:
        from sim.serving.scheduler import POLICIES
    except ImportError:
        return ()
    return tuple(POLICIES)


def memory_rules_choices() -> tuple[str, ...]:
    """The vLLM generations whose KV sizing the simulator knows (``sim.serving.capacity.VLLM_RULES``), the default
    first, or () where there are none."""
    try:
        from sim.serving.capacity import DEFAULT_RULES, VLLM_RULES
    except ImportError:
        return ()
    return (DEFAULT_RULES,) + tuple(k for k in VLLM_RULES if k != DEFAULT_RULES)


def serving_kwargs(options: dict) -> tuple[dict, dict, list[str]]:
    """``(kwargs for simulate, workload additions, names not applied)`` for the serving controls set."""
    from sim.workload.config import WORKLOAD_DEFAULTS

    sig = _simulate_params()
    fields = _serving_fields() if "serving" in sig else set()
    kw, wl, sv, skipped = {}, {}, {}, []
    for k, v in options.items():
        if v is None:
            continue
        if k in sig and k != "serving":
            kw[k] = v
        elif k in fields:
            sv[k] = v
        elif k in WORKLOAD_DEFAULTS:
            wl[k] = v
        else:
            skipped.append(k)
    if sv:
        kw["serving"] = sv
    return kw, wl, skipped


TARGET_OPTIONS = ("quantization", "kv_cache_dtype")   # the pages' precision pickers (ui_common.precision_controls)


def target_kwargs(target: dict | None) -> dict:
    """The set precision keywords of ``target`` (a page's pickers), checked against :data:`TARGET_OPTIONS`."""
    bad = sorted(set(target or {}) - set(TARGET_OPTIONS))
    if bad:
        raise ValueError(f"target options: {', '.join(bad)} not one of {', '.join(TARGET_OPTIONS)}")
    return {k: v for k, v in (target or {}).items() if v is not None}


def run(trace: str, policy: str, params: dict, model: str | None, hardware: str, mode: str = "isolated",
        workload: dict | None = None, seed: int = 0, serving: dict | None = None, target: dict | None = None) -> dict:
    """One simulation. Returns ``{"summary", "problems", "branches", "token", "info", "kv", "not_applied"}``.

    ``target``: the target keywords of ``sim.api.simulate`` set beside the model and hardware in any mode
    (``quantization``, ``kv_cache_dtype``; None values left out).

    Raises ``ValueError`` (bad parameter, preset, out-of-calibration target) with the
    simulator's one-line message.
    """
    from sim.api import simulate
    from sim.replay.problem_metrics import clean

    kw, wl_add, skipped = serving_kwargs(serving or {}) if mode == "serving" else ({}, {}, [])
    kw.update(target_kwargs(target))
    wl = {**(workload or {}), **wl_add}
    r = simulate(trace, policy=policy, params=dict(params), model_preset=model, hardware=hardware, mode=mode,
                 workload=wl or None, seed=int(seed), **kw)
    kv = r.kv_timeline
    if len(kv) > 20_000:  # enough for a line; a page need not carry every iteration
        kv = kv.iloc[:: max(1, len(kv) // 20_000)]
    # each rate and ratio's 95% interval beside it (``<metric>_ci95``: sim.replay.intervals)
    return {"summary": clean({**r.summary, **r.intervals()}), "problems": r.problems, "branches": r.branches,
            "token": r.token, "info": clean(dict(r.info)), "kv": kv, "not_applied": skipped}


def out_of_calibration(exc: BaseException) -> bool:
    """The simulator refused a target its hardware profile was not fitted for (not a bad value)."""
    from sim.base.errors import OutOfCalibrationError

    return isinstance(exc, OutOfCalibrationError)


def hardware_that_serves(trace: str, model: str | None) -> list[str]:
    """Hardware presets whose calibrated range covers ``model`` on this trace (the isolated no-kv baseline)."""
    from sim.api import evaluate

    ok = []
    for hw in presets()["hardware"]:
        try:
            evaluate(trace, policy="no-kv", params={}, model_preset=model, hardware=hw)
        except ValueError:
            continue
        ok.append(hw)
    return ok


def compare(trace: str, model: str | None, hardware: str, mode: str = "isolated", workload: dict | None = None,
            seed: int = 0, target: dict | None = None) -> pd.DataFrame:
    """The ``rksim compare`` table (same code path: ``app.cli_sim.run_compare`` and ``app.tables.fmt_table``);
    ``target`` as for :func:`run`."""
    from app.cli_sim import run_compare
    from app.tables import fmt_table

    from app.tables import fmt_ci as ci_text
    from sim.replay.intervals import SUFFIX

    out = run_compare(trace, model, hardware, mode, workload, seed, None, progress=False, **target_kwargs(target))
    df = fmt_table(out["policies"])
    df.insert(0, "kind", [out["policies"][n].get("kind") for n in df.index])
    # each figure that has a 95% interval gets a text column beside it (the figures stay numbers)
    for col in list(df.columns):
        key = col.rstrip("*")
        cis = {n: out["policies"][n].get(key + SUFFIX) for n in df.index}
        if any(cis.values()):
            at = df.columns.get_loc(col) + 1
            df.insert(at, f"{col} 95% CI", [ci_text(df.at[n, col], cis[n]) if cis[n] else "" for n in df.index])
    df.index.name = "policy"
    return df


def token_curve(trace: str, policy: str, budgets: list[int], params: dict, seed: int = 0) -> pd.DataFrame:
    """Attention-output error and mass recall of a token policy at each budget (cost-target independent)."""
    from sim.api import simulate

    rows = []
    base = {k: v for k, v in params.items() if k != "budget"}
    for K in budgets:
        s = simulate(trace, policy=policy, params={**base, "budget": int(K)}, seed=int(seed)).summary
        rows.append({"policy": policy, "budget": int(K), "attn_output_rel_error": s.get("attn_output_rel_error"),
                     "attn_mass_recall": s.get("attn_mass_recall"), "speedup_vs_full": s.get("speedup_vs_full")})
    return pd.DataFrame(rows)


def capacity_note(info: dict, summary: dict) -> str | None:
    """What KV capacity and budget a run had, where the simulator reports them (serving at capacity)."""
    parts = []
    cap = info.get("kv_capacity_bytes", summary.get("kv_capacity_bytes"))
    if is_finite_number(cap):
        parts.append(f"KV capacity {cap / 1e6:,.0f} MB")  # info["capacity_source"] says how (long)
    b = info.get("kv_budget_blocks")
    if is_finite_number(b):
        parts.append(f"block budget {int(b):,} blocks")
    if summary.get("budget") is not None:
        parts.append(f"token budget K = {summary['budget']}")
    return "; ".join(parts) or None


def serving_kpis(summary: dict) -> list[str]:
    """The serving-at-capacity KPIs this simulator reports, else today's serving metrics."""
    if summary.get("ttft_p50_s") is not None:
        return [k for k in KPI_SERVING if k in summary]
    return ["throughput_tokens_per_s", "throughput_problems_per_s", "latency_mean_s", "latency_p95_s",
            "ttft_mean_s", "queue_s_mean", "peak_kv_bytes"]


def why_it_loses(name: str, kind: str, s: dict, ref: dict, ref_name: str, facts: dict,
                 nokv: dict | None = None) -> str | None:
    """One sentence from the phase breakdown when ``s`` is slower than ``ref`` (None when it is not)."""
    lat, rlat = s.get("latency_mean_s"), ref.get("latency_mean_s")
    if lat is None or rlat is None or lat <= rlat:
        return None
    d = {ph: (s.get(f"{ph}_s_mean") or 0.0) - (ref.get(f"{ph}_s_mean") or 0.0) for ph in PHASES}
    worst = max(d, key=d.get)
    loss = lat - rlat
    saved_prefill = -d["prefill"]
    head = f"{name} is {lat / rlat:.3f}x the latency of {ref_name} ({loss:.3g} s more per problem): "
    if worst == "gate":
        if saved_prefill > 0:
            return head + (f"the gate costs {d['gate']:.3g} s per problem, more than the {saved_prefill:.3g} s of "
                           f"prefill it saves at this prompt length (about {facts.get('mean_prompt_tokens', 0):.0f} tokens).")
        return head + f"the gate costs {d['gate']:.3g} s per problem and saves no prefill here."
    if worst == "decode":
        why = ("branches that take the root's KV generate longer answers (the trace's counterfactual generations)"
               if kind in ("sharing", "composite") else
               "evicted blocks are recomputed during decoding" if s.get("recompute_tokens") else
               "it decodes more tokens")
        return head + f"decoding takes {d['decode']:.3g} s more per problem: {why}."
    if worst == "verify":
        nv = (nokv or {}).get("verify_s_mean")
        ev, rv = s.get("verify_s_mean") or 0.0, ref.get("verify_s_mean") or 0.0
        if kind == "exit" and nv is not None:
            return head + (f"it runs on the workload's base sharing (No-KV), so verification recomputes each "
                           f"sequence: {ev:.3g} s per problem against {rv:.3g} s on {ref_name}'s reused KV; "
                           + (f"early exit cuts No-KV's {nv:.3g} s by {nv - ev:.3g} s." if ev < nv else
                              f"early exit saves nothing at these thresholds (No-KV alone: {nv:.3g} s)."))
        why = (f"its verification recomputes {s.get('recompute_tokens', 0):,} evicted tokens"
               if s.get("recompute_tokens") else
               "the early-exit probes and re-checks cost more than the layers they skip"
               if kind in ("exit", "composite") else "verification reuses less KV")
        return head + f"verification takes {d['verify']:.3g} s more per problem: {why}."
    if worst == "prefill":
        return head + (f"prefill takes {d['prefill']:.3g} s more per problem: it reuses less prompt KV than "
                       f"{ref_name} (workload base sharing for {kind} policies).")
    return head + f"requests wait {d['queue']:.3g} s longer in the queue."
