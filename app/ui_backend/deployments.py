"""Deployments (TP, PP, replicas, router, SLO): plans, knees and the checks of a deployment."""
from __future__ import annotations

import math

import pandas as pd

from app.ui_backend.simulation import serving_kwargs


# ------------------------------------------------------------------ deployments (TP, PP, replicas, router, SLO)
# The deployment keywords of sim.api.simulate; ``serving_kwargs`` routes them there like the serving options.
DEPLOYMENT_OPTIONS = ("node", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "router", "slo",
                      "quantization", "kv_cache_dtype", "enable_expert_parallel", "moe_routing")
AS_RELEASED = "as released"   # the weights widget's default: the checkpoint's own format (sim.cost.profiles.load_model)
# the target flags a plan's meta keeps (``target_options``) that the deployment widgets can take
PLAN_TARGET_OPTIONS = ("quantization", "kv_cache_dtype", "enable_expert_parallel", "moe_routing")
REPLICA_KEYS = ("problems", "throughput_tokens_per_s", "throughput_problems_per_s", "goodput_problems_per_s",
                "slo_attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s", "e2e_p99_s",
                "prefix_hit_rate", "preemptions", "gpu_utilisation")


def node_presets() -> list[str]:
    from sim.cost.profiles import list_presets

    return list_presets("nodes")


def routers() -> tuple[str, ...]:
    from sim.serving.router import ROUTERS

    return tuple(ROUTERS)


def precision_choices() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The weights widget's choices (as released, then vLLM's ``--quantization`` values the cost model prices, then
    none: 16-bit weights) and the KV cache's (``--kv-cache-dtype``: auto first)."""
    from sim.cost.model_shape import KV_CACHE_DTYPES, QUANTIZATIONS

    return ((AS_RELEASED,) + tuple(q for q in QUANTIZATIONS if q) + ("none",),
            ("auto",) + tuple(k for k in KV_CACHE_DTYPES if k))


def moe_routings() -> tuple[str, ...]:
    """``--moe-routing``'s values, the default (expected) first."""
    from sim.cost.routing import ROUTINGS

    return tuple(ROUTINGS)


def tp_sizes() -> tuple[int, ...]:
    from sim.cost.parallel import TP_SIZES

    return tuple(TP_SIZES)


def slo_text(ttft=None, tpot=None, e2e=None) -> str | None:
    """``"ttft=0.5,e2e=10"`` from the stated SLOs (seconds; None = not stated), None when none is."""
    parts = [f"{k}={v:g}" for k, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)) if v is not None]
    return ",".join(parts) or None


def error_field(exc: BaseException) -> str | None:
    """The option a simulator error names (``sim.base.errors.ConfigError.field``), None when it names none."""
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
                   n_requests: int | None, seed: int = 0, target: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """``rksim plan`` from the page: the same deployments, tasks and frontier (local backend, in memory), at most
    :data:`SMALL_PLAN_MAX` deployments; returns the table (``on_frontier`` marked) and the plan's metadata.
    ``target``: the deployment controls' target flags (:data:`PLAN_TARGET_OPTIONS`: ``--quantization``,
    ``--kv-cache-dtype``, ``--enable-expert-parallel``, ``--moe-routing``) and ``memory_rules``
    (``--vllm-memory-rules``: the vLLM generation whose KV sizing the deployments get), as ``rksim plan`` takes them."""
    from sim.workload.decisions import make_config
    from sim.serving.goodput import SLO
    from sim.cost.parallel import load_node
    from sim.search.planner import deployments, frontier, plan_model, run_plan, target_options
    from sim.cost.profiles import load_hardware
    from sim.serving.capacity import DEFAULT_RULES

    spec = SLO.parse(slo)
    rules = (target or {}).get("memory_rules") or DEFAULT_RULES
    for pol in policies:
        try:
            make_config(pol, {}, None)
        except ValueError as exc:
            raise ValueError(f"--policies: {exc}") from None
    t = {k: v for k, v in (target or {}).items() if k in PLAN_TARGET_OPTIONS and v is not None}
    m = plan_model(model, t.get("quantization"), t.get("kv_cache_dtype"))
    nd = load_node(node)
    hw = load_hardware(nd.gpu)
    hw.check_precision(m)   # refused before any deployment runs, naming the flag
    ep = bool(t.get("enable_expert_parallel", False))
    deps = list(deployments(m, hw, nd, int(gpus), list(policies), tp_sizes=tp, pp_sizes=pp,
                            enable_expert_parallel=ep, memory_rules=rules))
    if not deps:
        raise ValueError(f"--gpus {gpus}: no deployment of {m.name} on {nd.name} fits in {gpus} GPU(s) with "
                         f"TP {', '.join(map(str, tp))} and PP {', '.join(map(str, pp))}")
    if len(deps) > SMALL_PLAN_MAX:
        raise ValueError(f"--gpus {gpus}: {len(deps)} deployments, more than the {SMALL_PLAN_MAX} a plan run on this "
                         "page may have; fewer GPUs, TP/PP sizes or policies (or `rksim plan`, then load its file)")
    opts = {"model_preset": model, "node": node, "router": router, "slo": str(spec) if spec.stated else None,
            "arrival_rate": arrival_rate, "concurrency": int(concurrency), "n_requests": n_requests, "seed": int(seed)}
    tops = target_options(m, ep, t.get("moe_routing", "expected"), t.get("quantization"), t.get("kv_cache_dtype"),
                          memory_rules=rules)
    opts.update(tops)
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
            "seed": int(seed), "target_options": tops,
            "overheads": str(df["overheads"].iloc[0]) if len(df) and "overheads" in df else None,
            "quantization": m.quantization or None, "kv_cache_dtype": m.kv_cache_dtype or "auto"}
    return df, meta


def serving_load(row: dict, meta: dict) -> dict:
    """What the Serving page needs to re-run one plan deployment (``st.session_state["serving.load"]``):
    the policy, target, deployment, scheduler limits and arrivals of the plan."""
    from sim.serving.capacity import DEFAULT_RULES
    return {"policy": str(row["policy"]), "model": meta.get("model_preset") or row.get("model"),
            "hardware": meta.get("hardware") or row.get("hardware"),
            "deployment": {"node": meta.get("node_preset") or row.get("node"),
                           "tensor_parallel_size": int(row["tensor_parallel_size"]),
                           "pipeline_parallel_size": int(row["pipeline_parallel_size"]),
                           "data_parallel_size": int(row["data_parallel_size"]),
                           "router": meta.get("router") or row.get("router"),
                           "slo": None if str(meta.get("slo") or row.get("slo") or "none") == "none"
                           else str(meta.get("slo") or row.get("slo")),
                           **{k: v for k, v in _target_options(meta).items() if k in PLAN_TARGET_OPTIONS}},
            "serving": {"max_num_seqs": int(row["max_num_seqs"]),
                        "max_num_batched_tokens": int(row["max_num_batched_tokens"]),
                        "arrival_rate": meta.get("arrival_rate"), "n_requests": meta.get("n_requests"),
                        # the KV sized as the plan sized it (its vLLM generation; absent: the default), stated so
                        # the page's box shows the plan's
                        "memory_rules": _target_options(meta).get("memory_rules", DEFAULT_RULES),
                        **step_switches(_target_options(meta))},
            "concurrency": meta.get("concurrency"), "seed": meta.get("seed")}


def step_switches(options: dict) -> dict:
    """The ServingConfig switches (``no_host_time``, ``no_async_scheduling``, ``enforce_eager``) of a plan's
    ``target_options`` (``host_time`` / ``async_scheduling`` / ``enforce_eager`` where not vLLM's default,
    :data:`sim.search.planner.ENGINE_DEFAULTS`): every one stated, so the Serving page's boxes show the plan's."""
    return {"no_host_time": not options.get("host_time", True),
            "no_async_scheduling": not options.get("async_scheduling", True),
            "enforce_eager": bool(options.get("enforce_eager", False))}


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
            seed=int(meta.get("seed") or 0), refine=int(refine), **_target_options(meta))
    return c, caption({"provenance": c["provenance"]}, c, unit="problems/s")


def _target_options(meta: dict) -> dict:
    """The target flags the plan ran with (its meta's ``target_options``: expert parallelism and routing, a
    precision flag), for its knee to be priced as its rows were; a file from before them, none."""
    opts = meta.get("target_options")
    return dict(opts) if isinstance(opts, dict) else {}


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
                   data_parallel_size=kw.get("data_parallel_size", 1), quantization=kw.get("quantization"),
                   kv_cache_dtype=kw.get("kv_cache_dtype"),
                   enable_expert_parallel=bool(kw.get("enable_expert_parallel", False)),
                   moe_routing=kw.get("moe_routing", "expected"))
    RunConfig(mode="serving", router=kw.get("router", "prefix-affinity"), slo=kw.get("slo"),
              arrival_rate=kw.get("arrival_rate"))
