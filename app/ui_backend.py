"""The dashboard's one door into the simulator, the policy library, traces, sweeps and calibration runs.

Every page calls only this module (and :mod:`app.ui_paths` for files), so re-pointing the
dashboard at a changed simulator API is an edit here. Functions are pure: they take
paths and plain values and return plain values or pandas DataFrames, so the pages can
cache them with ``st.cache_data``. No torch is imported (``calibrate.report`` and
``calibrate.fit`` are numpy/scipy only).
"""
from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

# ------------------------------------------------------------------ words for the metrics
# key -> (label with unit, whose figure it is: "target" = the cost model's model on the hardware,
# "trace" = decided on the trace's own model's signals and answers)
METRICS: dict[str, tuple[str, str]] = {
    "latency_mean_s": ("mean latency per problem (s)", "target"),
    "latency_p95_s": ("p95 latency per problem (s)", "target"),
    "speedup_vs_no_kv": ("speedup vs No-KV (x)", "target"),
    "speedup_vs_exact_prefix": ("speedup vs exact prefix (x)", "target"),
    "throughput_tokens_per_s": ("throughput (generated tokens/s)", "target"),
    "throughput_problems_per_s": ("throughput (problems/s)", "target"),
    "ttft_mean_s": ("mean time to first token (s)", "target"),
    "queue_s_mean": ("mean queueing delay (s)", "target"),
    "peak_kv_bytes": ("peak KV cache (MB)", "target"),
    "kv_reuse": ("prompt tokens reused from cache (share)", "trace"),
    "skip_rate": ("verifications skipped (share)", "trace"),
    "mean_exit_layer": ("mean exit layer (trace model's layers)", "trace"),
    "cgee_error_rate": ("answer changed by early exit (share)", "trace"),
    "cgee_branch_disagreement_rate": ("selected branch changed by early exit (share)", "trace"),
    "accuracy": ("accuracy of the selected answer (share)", "trace"),
    "asks_gate_auc": ("ASKS gate AUC (sigma vs answer kept)", "trace"),
    "evictions": ("KV blocks/tokens evicted (count)", "trace"),
    "recompute_tokens": ("tokens recomputed after eviction (count)", "trace"),
    "attn_output_rel_error": ("attention-output relative error", "trace"),
    "attn_mass_recall": ("attention mass kept (share)", "trace"),
    "speedup_vs_full": ("speedup vs full cache (x)", "target"),
    "budget": ("token budget K (tokens)", "trace"),
    # serving at capacity (present where the simulator reports them)
    "ttft_p50_s": ("median time to first token per problem (s)", "target"),
    "ttft_p99_s": ("p99 time to first token per problem (s)", "target"),
    "e2e_p50_s": ("median end-to-end latency per problem (s)", "target"),
    "e2e_p99_s": ("p99 end-to-end latency per problem (s)", "target"),
    "request_ttft_p50_s": ("median time to first token per request (s)", "target"),
    "request_ttft_p99_s": ("p99 time to first token per request (s)", "target"),
    "request_tpot_p50_s": ("median time per output token per request (s)", "target"),
    "request_itl_p50_s": ("median inter-token latency (s)", "target"),
    "request_itl_p99_s": ("p99 inter-token latency (s)", "target"),
    "queue_p50_s": ("median queueing delay (s)", "target"),
    "preemptions": ("preemptions (count)", "target"),
    "max_running_seqs": ("most sequences running at once", "target"),
    "mean_running_seqs": ("mean sequences running", "target"),
    "kv_capacity_bytes": ("KV capacity (MB)", "target"),
    "prefix_hit_rate": ("prefix-cache hit rate (share)", "target"),
}
BYTES_KEYS = ("peak_kv_bytes", "kv_capacity_bytes")
KPI_BRANCH = ["speedup_vs_no_kv", "speedup_vs_exact_prefix", "latency_mean_s", "accuracy"]
KPI_TOKEN = ["attn_output_rel_error", "attn_mass_recall", "peak_kv_bytes", "speedup_vs_full",
             "throughput_tokens_per_s"]
KPI_SERVING = ["throughput_tokens_per_s", "throughput_problems_per_s", "goodput_problems_per_s", "slo_attainment",
               "ttft_p50_s", "ttft_p99_s", "e2e_p50_s",
               "e2e_p99_s", "queue_p50_s", "preemptions", "recompute_tokens", "max_running_seqs",
               "mean_running_seqs", "kv_capacity_bytes", "peak_kv_bytes", "prefix_hit_rate", "request_ttft_p50_s",
               "request_ttft_p99_s", "request_tpot_p50_s", "request_itl_p50_s", "request_itl_p99_s"]
TABLE_BRANCH = ["latency_mean_s", "latency_p95_s", "speedup_vs_no_kv", "speedup_vs_exact_prefix", "kv_reuse",
                "skip_rate", "mean_exit_layer", "cgee_error_rate", "cgee_branch_disagreement_rate", "accuracy",
                "peak_kv_bytes", "evictions",
                "recompute_tokens", "asks_gate_auc"]
PHASES = ("gate", "prefill", "decode", "verify", "queue")
BASELINES = ("no-kv", "exact-prefix")


def label(key: str) -> str:
    """``latency_mean_s`` -> ``mean latency per problem (s) · target``."""
    lab, src = METRICS.get(key, (key.replace("_", " "), ""))
    return f"{lab} · {'target' if src == 'target' else 'trace model'}" if src else lab


def fmt(key: str, v) -> str:
    """A metric value in its unit (bytes as MB, shares as %), "n/a" where it does not apply."""
    if v is None or isinstance(v, str) or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a" if v is None or not isinstance(v, str) else v
    if key in BYTES_KEYS:
        return f"{v / 1e6:.3g} MB"
    if key.startswith("speedup"):
        return f"{v:.3f}x"
    if key == "throughput_tokens_per_s":  # before the "_s" = seconds rule: these end in "per_s"
        return f"{v:.4g} tokens/s"
    if key in ("throughput_problems_per_s", "goodput_problems_per_s"):
        return f"{v:.4g} problems/s"
    if key.endswith("_s") and not isinstance(v, bool):
        return f"{v:.4g} s"
    lab = METRICS.get(key, ("",))[0]
    if "(share)" in lab:
        return f"{100 * v:.1f}%"
    if isinstance(v, (bool, np.bool_)):
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    return f"{v:.4g}"


def fmt_ci(key: str, s: dict) -> str:
    """:func:`fmt` of ``s[key]`` with its 95% interval ``s[key + "_ci95"]`` in the same unit, where it has one."""
    from sim.replay.intervals import SUFFIX
    v, ci = s.get(key), s.get(key + SUFFIX)
    txt = fmt(key, v)
    if not U_finite(v) or not ci or not all(U_finite(x) for x in ci):
        return txt
    return f"{txt} [{fmt(key, ci[0])}, {fmt(key, ci[1])}]"


CI_NOTE = ("[lo, hi]: 95% interval over the trace's problems (Wilson for rates; a paired bootstrap over problems "
           "for speedups, reuse and AUC)")


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
                   "max_num_batched_tokens", "gpu_memory_utilization", "kv_capacity_bytes", "decode_tokens")


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


def run(trace: str, policy: str, params: dict, model: str | None, hardware: str, mode: str = "isolated",
        workload: dict | None = None, seed: int = 0, serving: dict | None = None) -> dict:
    """One simulation. Returns ``{"summary", "problems", "branches", "token", "info", "kv", "not_applied"}``.

    Raises ``ValueError`` (bad parameter, preset, out-of-calibration target) with the
    simulator's one-line message.
    """
    from sim.api import simulate
    from sim.replay.problem_metrics import clean

    kw, wl_add, skipped = serving_kwargs(serving or {}) if mode == "serving" else ({}, {}, [])
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
    from sim.errors import OutOfCalibrationError

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
            seed: int = 0) -> pd.DataFrame:
    """The ``rksim compare`` table (same code path: ``app.cli_sim.run_compare`` and ``app.tables.fmt_table``)."""
    from app.cli_sim import run_compare
    from app.tables import fmt_table

    from sim.replay.intervals import SUFFIX, fmt_ci as ci_text

    out = run_compare(trace, model, hardware, mode, workload, seed, None, progress=False)
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
    if U_finite(cap):
        parts.append(f"KV capacity {cap / 1e6:,.0f} MB")  # info["capacity_source"] says how (long)
    b = info.get("kv_budget_blocks")
    if U_finite(b):
        parts.append(f"block budget {int(b):,} blocks")
    if summary.get("budget") is not None:
        parts.append(f"token budget K = {summary['budget']}")
    return "; ".join(parts) or None


def U_finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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


# ------------------------------------------------------------------ sweeps
def read_sweep(path: str) -> tuple[pd.DataFrame, dict]:
    from sim.search.sweep import read_sweep as _rs

    return _rs(path)


def sweep_param_columns(df: pd.DataFrame) -> list[str]:
    from sim.search.sweep import param_columns

    return param_columns(df)


def param_name(column: str) -> str:
    from sim.search.sweep import param_column

    prefix = param_column("")
    return column[len(prefix):] if column.startswith(prefix) else column


def run_small_sweep(trace: str, policy: str, grid_specs: list[str], max_configs: int, model: str | None,
                    hardware: str, seed: int = 0) -> pd.DataFrame:
    """A sweep from the page: the CLI's grid parser and validation, the local backend, in memory."""
    from sim.search.grid import parse_grids
    from sim.search.sweep import SweepOptions, default_evaluate, run_sweep, validate_params

    grid = parse_grids(grid_specs, max_configs=max_configs)
    configs = list(grid.configs())
    validate_params(policy, configs)
    opts = SweepOptions(model_preset=model, hardware=hardware, seed=int(seed))
    return run_sweep(trace, policy, configs, opts, evaluate=default_evaluate(), backend="local", progress=False)


def pareto(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    from sim.search.pareto import frontier

    return frontier(df, x, y)


def default_minimise(metric: str) -> bool:
    from sim.search.pareto import default_minimise as _dm

    return _dm(metric)


# ------------------------------------------------------------------ calibration folders
SERVE_SUMMARIES = ("serve.json", "summary.json")  # calibrate/serve.py's SUMMARY_FILE, and the older name


def _serve_summary(folder: Path) -> Path | None:
    for name in SERVE_SUMMARIES:
        p = folder / name
        if p.is_file():
            try:
                if "scheduling_parity" in json.loads(p.read_text()):
                    return p
            except (OSError, ValueError):
                continue
    return None


def calibration_kind(folder: Path) -> str | None:
    """``"serve"`` for a ``calibrate serve`` folder (its summary holds ``scheduling_parity``; it also has a
    run.json and phases.parquet for ``calibrate fit``), ``"run"`` for a ``calibrate run`` one, else None."""
    folder = Path(folder)
    if _serve_summary(folder) is not None:
        return "serve"
    if all((folder / f).is_file() for f in ("run.json", "phases.parquet", "decisions.parquet")):
        return "run"
    return None


def calibration_run(folder: str) -> dict:
    """Simulated vs measured per held-out (problem, policy) of a ``calibrate run`` folder, read-only.

    The numbers are ``calibrate.report``'s own (``simulate_records`` — the cost model charged for the
    executed operations — and ``fit_errors``); without ``fit.json`` the folder is shown unfitted.
    """
    from calibrate.report import fit_errors, load_run, simulate_records
    from sim.cost.profiles import load_hardware, model_from_manifest

    d = Path(folder)
    run_json = json.loads((d / "run.json").read_text())
    out = {"run": run_json, "fit": None, "frame": None, "errors": None,
           "decision_parity": run_json.get("decision_parity", run_json.get("replay_parity"))}
    if (d / "parity.parquet").is_file():
        out["parity"] = pd.read_parquet(d / "parity.parquet")
    if not (d / "fit.json").is_file():
        return out
    phases, dec, run_json, fit = load_run(d)
    out["fit"] = fit
    hw = load_hardware(fit["preset"])  # the preset `calibrate fit` wrote (its path or name)
    model = model_from_manifest({"model": run_json["model"]})
    hold = {int(p) for p in fit.get("holdout_problems", [])}
    sim = simulate_records(phases, hw, model)
    df = dec[["problem", "policy", "seconds"]].merge(sim, on=["problem", "policy"], how="left")
    df = df[df["problem"].isin(hold)].rename(columns={"seconds": "measured"}).dropna(subset=["sim"])
    if df.empty:
        return out
    errors, frame = fit_errors(df)
    out["errors"], out["frame"] = errors, frame
    return out


def calibration_serve(folder: str) -> dict:
    """A ``calibrate serve`` folder: its summary, the per-iteration real and simulated seconds (on the run's
    clock), and the per-problem end-to-end pairs of its comparison, where present."""
    d = Path(folder)
    path = _serve_summary(d)
    if path is None:
        raise ValueError(f"{d}: no serve.json with scheduling_parity (not a `calibrate serve` folder)")
    s = json.loads(path.read_text())
    out = {"summary": s, "iterations": None, "e2e": None}
    clock = f"{s.get('clock', 'wall')}_s"
    if (d / "iterations.parquet").is_file():
        it = pd.read_parquet(d / "iterations.parquet")
        if {clock, "sim_s"} <= set(it.columns):
            out["iterations"] = it.rename(columns={clock: "measured_s", "sim_s": "simulated_s"})
    c = s.get("comparison") or {}
    if c.get("e2e_real_s") and len(c["e2e_real_s"]) == len(c.get("e2e_sim_s") or []):
        out["e2e"] = pd.DataFrame({"measured_s": c["e2e_real_s"], "simulated_s": c["e2e_sim_s"]})
    return out


# ------------------------------------------------------------------ parameter ranges
def _checks_of(cls) -> dict[str, dict]:
    """``{field: {lo, hi, lo_open, hi_open, integer}}`` read from the ``self._check_number(...)`` calls of
    the class's ``__post_init__`` (and its bases'): the ranges the policy itself enforces, not a copy."""
    import ast
    import textwrap

    out: dict[str, dict] = {}
    for klass in cls.__mro__:
        fn = klass.__dict__.get("__post_init__")
        if fn is None:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("_check_number", "_check_bool") and node.args
                    and isinstance(node.args[0], ast.Constant)):
                continue
            field = node.args[0].value
            if field in out:
                continue  # the subclass's check is the one that binds
            spec = {"type": "bool"} if node.func.attr == "_check_bool" else {"type": "number"}
            names = ("lo", "hi", "lo_open", "hi_open", "integer")
            for name, arg in zip(names, node.args[1:]):
                if isinstance(arg, ast.Constant):
                    spec[name] = arg.value
            for kw in node.keywords:
                if kw.arg in names:
                    try:
                        spec[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        pass
            out[field] = spec
    return out


def param_ranges(name: str) -> dict[str, dict]:
    """Each numeric/bool parameter's enforced range: ``{"type", "lo", "hi", "lo_open", "hi_open", "integer"}``.

    A composite policy takes its components' parameters and so their checks.
    """
    from policies import list_policies, policy_class, policy_defaults

    cls = policy_class(name)
    classes = [cls]
    if cls.kind == "composite":
        classes += [policy_class(n) for n in list_policies() if policy_class(n).kind in ("sharing", "exit", "block")]
    fields = policy_defaults(name)
    out: dict[str, dict] = {}
    for c in classes:
        for k, v in _checks_of(c).items():
            if k in fields and k not in out:
                out[k] = v
    return out


def range_text(spec: dict | None) -> str:
    """``[1, inf) integer`` style text of a range from :func:`param_ranges`."""
    if not spec:
        return ""
    if spec.get("type") == "bool":
        return "true | false"
    lo, hi = spec.get("lo"), spec.get("hi")
    left = "(" if spec.get("lo_open") or lo is None else "["
    right = ")" if spec.get("hi_open") or hi is None else "]"
    txt = f"{left}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}{right}"
    return txt + (" integer" if spec.get("integer") else "")


# ------------------------------------------------------------------ deployments (TP, PP, replicas, router, SLO)
# The deployment keywords of sim.api.simulate; ``serving_kwargs`` routes them there like the serving options.
DEPLOYMENT_OPTIONS = ("node", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "router", "slo")
REPLICA_KEYS = ("problems", "throughput_tokens_per_s", "throughput_problems_per_s", "goodput_problems_per_s",
                "slo_attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
                "prefix_hit_rate", "preemptions", "gpu_utilisation")
METRICS.update({
    "goodput_problems_per_s": ("goodput (problems/s meeting every SLO)", "target"),
    "slo_attainment": ("problems meeting every SLO (share)", "target"),
    "tpot_p50_s": ("median time per output token (s)", "target"),
    "tpot_p99_s": ("p99 time per output token (s)", "target"),
    "gpu_utilisation": ("GPU busy (share of the run)", "target"),
    "lost_asks_shares": ("ASKS shares lost to routing (count)", "target"),
    "lost_prefix_reuse": ("exact-prefix reuses lost to routing (count)", "target"),
    "split_problems": ("problems split over replicas (count)", "target"),
    "problems": ("problems served (count)", "target"),
})


def node_presets() -> list[str]:
    from sim.cost.profiles import list_presets

    return list_presets("nodes")


def routers() -> tuple[str, ...]:
    from sim.serving.router import ROUTERS

    return tuple(ROUTERS)


def tp_sizes() -> tuple[int, ...]:
    from sim.cost.parallel import TP_SIZES

    return tuple(TP_SIZES)


def slo_text(ttft=None, tpot=None, e2e=None) -> str | None:
    """``"ttft=0.5,e2e=10"`` from the stated SLOs (seconds; None = not stated), None when none is."""
    parts = [f"{k}={v:g}" for k, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)) if v is not None]
    return ",".join(parts) or None


def error_field(exc: BaseException) -> str | None:
    """The option a simulator error names (``sim.errors.ConfigError.field``), None when it names none."""
    return getattr(exc, "field", None)


def per_replica(summary: dict) -> pd.DataFrame:
    """One row per replica and a ``total`` row: throughput, goodput, TTFT/TPOT/E2E p50/p99, hit rate, ..."""
    reps = summary.get("per_replica") or []
    rows = [{"replica": str(r.get("replica", i)), **{k: r.get(k) for k in REPLICA_KEYS}} for i, r in enumerate(reps)]
    total = {"replica": "total", **{k: summary.get(k) for k in REPLICA_KEYS}}
    total["problems"] = sum(int(r.get("problems") or 0) for r in reps) if reps else None
    return pd.DataFrame(rows + [total]).set_index("replica")


def read_plan(path: str) -> tuple[pd.DataFrame, dict]:
    from sim.search.planner import read_plan as _rp

    return _rp(path)


def plan_figure(df: pd.DataFrame, meta: dict, x: str, y: str):
    from app.frontier_plot import plan_figure as _pf
    from sim.search.planner import plan_axes

    xc, yc = plan_axes(df, x, y)
    fig, curves = _pf(df, meta, xc, yc)
    return fig, curves, xc, yc


def plan_frontier(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    from sim.search.planner import plan_frontiers

    return plan_frontiers(df, x, y)[0]


SMALL_PLAN_MAX = 24  # deployments a plan started from the page may have (the CLI has no such cap)


def run_small_plan(trace: str, model: str, node: str, gpus: int, policies: tuple[str, ...], tp: tuple[int, ...],
                   pp: tuple[int, ...], router: str, slo: str | None, arrival_rate: float | None, concurrency: int,
                   n_requests: int | None, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """``rksim plan`` from the page: the same deployments, tasks and frontier (local backend, in memory), at most
    :data:`SMALL_PLAN_MAX` deployments; returns the table (``on_frontier`` marked) and the plan's metadata."""
    from sim.workload.decisions import make_config
    from sim.serving.goodput import SLO
    from sim.cost.parallel import load_node
    from sim.search.planner import deployments, frontier, run_plan
    from sim.cost.profiles import load_hardware, load_model

    spec = SLO.parse(slo)
    for pol in policies:
        try:
            make_config(pol, {}, None)
        except ValueError as exc:
            raise ValueError(f"--policies: {exc}") from None
    m = load_model(model)
    nd = load_node(node)
    hw = load_hardware(nd.gpu)
    deps = list(deployments(m, hw, nd, int(gpus), list(policies), tp_sizes=tp, pp_sizes=pp))
    if not deps:
        raise ValueError(f"--gpus {gpus}: no deployment of {m.name} on {nd.name} fits in {gpus} GPU(s) with "
                         f"TP {', '.join(map(str, tp))} and PP {', '.join(map(str, pp))}")
    if len(deps) > SMALL_PLAN_MAX:
        raise ValueError(f"--gpus {gpus}: {len(deps)} deployments, more than the {SMALL_PLAN_MAX} a plan run on this "
                         "page may have; fewer GPUs, TP/PP sizes or policies (or `rksim plan`, then load its file)")
    opts = {"model_preset": model, "node": node, "router": router, "slo": str(spec) if spec.stated else None,
            "arrival_rate": arrival_rate, "concurrency": int(concurrency), "n_requests": n_requests, "seed": int(seed)}
    rows = run_plan(trace, deps, opts, progress=False)
    df, front, _ = frontier(rows)
    key = ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs",
           "max_num_batched_tokens", "policy"]
    on = set(map(tuple, front[key].to_numpy().tolist()))
    df = df.assign(on_frontier=[tuple(r) in on for r in df[key].to_numpy().tolist()])
    meta = {"command": "plan", "model": m.name, "node": nd.name, "hardware": hw.name, "gpus": int(gpus),
            "slo": str(spec), "router": router, "policies": list(policies), "deployments": len(deps),
            "decisions_model": df["decisions_model"].iloc[0] if len(df) else None, "model_preset": model,
            "node_preset": node, "trace": trace, "arrival_rate": arrival_rate,
            "concurrency": None if arrival_rate is not None else int(concurrency), "n_requests": n_requests,
            "seed": int(seed)}
    return df, meta


def serving_load(row: dict, meta: dict) -> dict:
    """What the Serving page needs to re-run one plan deployment (``st.session_state["serving.load"]``):
    the policy, target, deployment, scheduler limits and arrivals of the plan."""
    return {"policy": str(row["policy"]), "model": meta.get("model_preset") or row.get("model"),
            "hardware": meta.get("hardware") or row.get("hardware"),
            "deployment": {"node": meta.get("node_preset") or row.get("node"),
                           "tensor_parallel_size": int(row["tensor_parallel_size"]),
                           "pipeline_parallel_size": int(row["pipeline_parallel_size"]),
                           "data_parallel_size": int(row["data_parallel_size"]),
                           "router": meta.get("router") or row.get("router"),
                           "slo": None if str(meta.get("slo") or row.get("slo") or "none") == "none"
                           else str(meta.get("slo") or row.get("slo"))},
            "serving": {"max_num_seqs": int(row["max_num_seqs"]),
                        "max_num_batched_tokens": int(row["max_num_batched_tokens"]),
                        "arrival_rate": meta.get("arrival_rate"), "n_requests": meta.get("n_requests")},
            "concurrency": meta.get("concurrency"), "seed": meta.get("seed")}


def deployment_knee(row: dict, meta: dict, rates: str, slo: str | None, refine: int = 0) -> tuple[dict, str]:
    """``(curve, caption)`` of a plan deployment's latency-rate knee, the function ``rksim plan --knee`` calls
    (:func:`sim.search.planner.deployment_knee`): its problems at each Poisson rate of ``rates`` (problems/s, the
    ``--knee`` syntax) under the plan's model, node, router, problem count and seed; errors name the flag."""
    from sim.search.knee import caption, parse_rates
    from sim.search.planner import deployment_knee as _dk

    params = {k: (str(row[k]) if k == "policy" else int(row[k])) for k in
              ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs",
               "max_num_batched_tokens", "policy")}
    n = meta.get("n_requests")
    c = _dk(meta.get("trace"), params, parse_rates(rates, "--knee"), model_preset=meta.get("model_preset") or
            meta.get("model"), node=meta.get("node_preset") or meta.get("node"),
            router=meta.get("router") or "prefix-affinity", slo=slo or None,
            n_requests=None if n is None or (isinstance(n, float) and math.isnan(n)) else int(n),
            seed=int(meta.get("seed") or 0), refine=int(refine))
    return c, caption({"provenance": c["provenance"]}, c, unit="problems/s")


def knee_figure(curve: dict, caption: str):
    from app.knee_plot import curve_figure

    return curve_figure(curve, caption, unit="problems/s")


def check_deployment(trace, model: str | None, hardware: str, options: dict) -> None:
    """Raise the simulator's error (``ConfigError`` with its ``field``) for a deployment the target or the run
    settings refuse: :meth:`sim.api.Target.resolve` and :class:`sim.api.RunConfig`, without a run."""
    from sim.api import RunConfig, Target, loaded

    kw, _, _ = serving_kwargs(options)
    Target.resolve(loaded(trace), model, hardware, kw.get("serving"), node=kw.get("node"),
                   tensor_parallel_size=kw.get("tensor_parallel_size", 1),
                   pipeline_parallel_size=kw.get("pipeline_parallel_size", 1),
                   data_parallel_size=kw.get("data_parallel_size", 1))
    RunConfig(mode="serving", router=kw.get("router", "prefix-affinity"), slo=kw.get("slo"),
              arrival_rate=kw.get("arrival_rate"))
