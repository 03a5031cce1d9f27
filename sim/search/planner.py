"""Deployment planner: TP x PP x replicas x scheduler limits x policy within a GPU budget, judged on goodput.

Like Vidur-Search, plus the policies: every deployment that the model, node and budget admit
(:meth:`sim.cost.parallel.ParallelConfig.validate`) and whose weights fit (:func:`sim.serving.capacity.fits`) is
served by :class:`sim.serving.replicas.Replicas` (each replica's steps priced as vLLM serves them,
:func:`sim.cost.pricing.served_costs`: its kernels with CUDA graphs and its host time per step; its KV capacity
:func:`sim.serving.capacity.kv_capacity` at that layout) on the policy's jobs, and scored by its
goodput under the SLOs (:mod:`sim.serving.goodput`). The frontier is the deployments no other beats on both
fewer GPUs and more goodput (:func:`sim.search.pareto.pareto_mask`); with a GPU-hour price, the cost per
million output tokens is ``price * gpus / 3600 / (output tokens / s) * 1e6``.

:func:`evaluate` is one pure task per deployment (what a Dask backend maps); the workload of each policy
(its jobs, token ids, block policy, caching) comes from the caller, who owns the trace decisions.
"""
from __future__ import annotations

import itertools
from types import SimpleNamespace
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from sim.serving.capacity import DEFAULT_RULES, ServingConfig, fits, kv_blocks
from sim.serving.goodput import SLO
from sim.cost.parallel import TP_SIZES, ParallelConfig, ParallelError
from sim.search.pareto import pareto_mask
from sim.serving.replicas import Replicas, summary
from sim.serving.router import make_router
from sim.serving.scheduler import SchedulerConfig


@dataclass(frozen=True)
class Deployment:
    """One point of the sweep."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str

    @property
    def parallel(self) -> ParallelConfig:
        return ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size)

    @property
    def gpus(self) -> int:
        return self.parallel.gpus

    def layout(self, model, enable_expert_parallel: bool = False) -> ParallelConfig:
        """Its parallel layout, with vLLM's ``--enable-expert-parallel`` where ``model`` has experts to place."""
        par = self.parallel
        if enable_expert_parallel and model.num_experts:
            import dataclasses
            par = dataclasses.replace(par, enable_expert_parallel=True)
        return par

    def serving(self, memory_rules: str = DEFAULT_RULES) -> ServingConfig:
        """Its scheduler limits, the KV sized as vLLM generation ``memory_rules`` sizes it."""
        return ServingConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                             memory_rules=memory_rules)

    def to_dict(self) -> dict:
        return {**asdict(self), "gpus": self.gpus}


PLAN_SCHEDULER = "vllm-v1"   # the scheduling rule every plan deployment runs (vllm serve's)


def serve_limits(hw) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` that ``vllm serve`` takes on GPU ``hw`` when neither flag is
    given (:data:`sim.serving.capacity.SCHEDULER_DEFAULTS`: 1,024 and 8,192 on an H100 or H200, 256 and 2,048 on
    an A100): the deployment a plan's row describes is the server its user would start."""
    sc = ServingConfig().scheduler_config(hw.name)
    return int(sc.max_num_seqs), int(sc.max_num_batched_tokens)


def deployments(model, hw, node, gpus: int, policies: Iterable[str], *, tp_sizes=TP_SIZES, pp_sizes=(1, 2, 4, 8),
                replicas: Iterable[int] | None = None, max_num_seqs: Iterable[int] | None = None,
                max_num_batched_tokens: Iterable[int] | None = None, enable_expert_parallel: bool = False,
                memory_rules: str = DEFAULT_RULES) -> Iterator[Deployment]:
    """Every admissible deployment within ``gpus`` GPUs (a generator: nothing sized by the budget is stored).

    ``replicas`` default: ``1 .. gpus // (TP x PP)`` for each layout; ``max_num_seqs`` / ``max_num_batched_tokens``
    default: ``vllm serve``'s for the GPU (:func:`serve_limits`), the server a user would start without the flags;
    ``enable_expert_parallel``: vLLM's flag on
    every layout (a TP that does not divide the experts is left out); ``memory_rules``: the vLLM generation whose
    KV sizing decides what fits (``--vllm-memory-rules``).
    """
    pols = list(policies)
    d_mns, d_mnbt = serve_limits(hw)
    max_num_seqs = (d_mns,) if max_num_seqs is None else tuple(max_num_seqs)
    max_num_batched_tokens = (d_mnbt,) if max_num_batched_tokens is None else tuple(max_num_batched_tokens)
    for tp, pp in itertools.product(tp_sizes, pp_sizes):
        try:
            ParallelConfig(tp, pp, enable_expert_parallel=enable_expert_parallel).validate(model, node, gpus)
        except ParallelError:
            continue
        dps = range(1, gpus // (tp * pp) + 1) if replicas is None else [d for d in replicas if d * tp * pp <= gpus]
        for mns, mnbt in itertools.product(max_num_seqs, max_num_batched_tokens):
            sv = ServingConfig(max_num_seqs=mns, max_num_batched_tokens=mnbt, memory_rules=memory_rules)
            if not fits(model, hw, sv, ParallelConfig(tp, pp, enable_expert_parallel=enable_expert_parallel)):
                continue
            for dp in dps:
                if dp > 1 and enable_expert_parallel and model.num_experts:
                    # vLLM's DP attention + EP: the EP size D x TP must divide the experts and fit the node, and
                    # each GPU holds E / (D TP) experts (its own capacity)
                    dpa = ParallelConfig(tp, pp, int(dp), enable_expert_parallel=True)
                    try:
                        dpa.validate(model, node, gpus)
                    except ParallelError:
                        continue
                    if not fits(model, hw, sv, dpa):
                        continue
                for pol in pols:
                    yield Deployment(tp, pp, int(dp), int(mns), int(mnbt), pol)


def check_plan_range(dep: Deployment, model, hw, jobs, enable_expert_parallel: bool = False,
                     allow_extrapolation: bool = False) -> list[str]:
    """Refuse ``jobs`` on ``dep`` outside ``hw``'s fitted range, checked on the shard one GPU holds
    (:meth:`sim.cost.parallel.ParallelConfig.gpu_shard`): the longest context, and the most new tokens of one item
    as vLLM V1's chunked prefill presents them (at most ``max_num_batched_tokens``), as ``bench`` checks a plain
    workload; with ``allow_extrapolation``, the notes of each dimension outside."""
    from sim.cost.ranges import chunk_tokens
    from sim.replay.jobs import query_extent
    ctx, new = query_extent(jobs)
    return hw.check_query(dep.layout(model, enable_expert_parallel).gpu_shard(model), max_context=ctx,
                          max_new=chunk_tokens(new, PLAN_SCHEDULER, dep.max_num_batched_tokens),
                          allow_extrapolation=allow_extrapolation)


def evaluate(dep: Deployment, model, hw, node, workload: Callable[[str], dict], *, router: str = "prefix-affinity",
             slo: SLO | None = None, arrival_rate: float | None = None, concurrency: int = 1, seed: int = 0,
             gpu_hour_cost: float | None = None, enable_expert_parallel: bool = False,
             moe_routing: str = "expected", allow_extrapolation: bool = False, **engine) -> dict:
    """Serve ``workload(dep.policy)`` (``{"jobs", "prompt_ids"?, "block_policy"?, "caching"?}``) on ``dep``;
    one row of the planner's table. ``engine``: :data:`ENGINE_DEFAULTS`' keys (host time, async scheduling, CUDA
    graphs), as :func:`_serve` prices them. A workload outside the GPU profile's fitted range is refused
    (:func:`check_plan_range`) unless ``allow_extrapolation``, which prices it and lists it in the row's
    ``extrapolated``."""
    w = workload(dep.policy)
    jobs = w["jobs"]
    extrapolated = check_plan_range(dep, model, hw, jobs, enable_expert_parallel, allow_extrapolation)
    run, blocks, costs = _serve(dep, model, hw, node, w, router, arrival_rate, concurrency, seed,
                                enable_expert_parallel, moe_routing, **engine)
    s = summary(run, jobs, slo)
    tot = s["total"]
    tps = tot["throughput_tokens_per_s"]
    row = {**dep.to_dict(), "router": router, "slo": s["slo"], "kv_capacity_blocks_per_replica": blocks,
           "goodput_problems_per_s": tot["goodput_problems_per_s"], "throughput_problems_per_s": tot["throughput_problems_per_s"],
           "throughput_tokens_per_s": tps, "slo_attainment": tot["slo_attainment"], "ttft_p99_s": tot["ttft_p99_s"],
           "tpot_p99_s": tot["tpot_p99_s"], "e2e_p99_s": tot["e2e_p99_s"], "prefix_hit_rate": tot["prefix_hit_rate"],
           "preemptions": tot["preemptions"], "lost_asks_shares": s["lost_asks_shares"],
           "lost_prefix_reuse": s["lost_prefix_reuse"], "model": model.name, "hardware": hw.name, "node": node.name}
    if enable_expert_parallel and model.num_experts:   # stated only where it prices something
        row["enable_expert_parallel"] = True
        if dep.data_parallel_size > 1:   # vLLM's DP attention + EP: DP ranks sharing their experts
            row["dp_attention"] = True
    if moe_routing != "expected" and model.num_experts:
        row["moe_routing"] = moe_routing
    if model.quantization:   # the weights' format when not the 16-bit shape (a release's, or --quantization)
        row["quantization"] = model.quantization
    if model.kv_cache_dtype:
        row["kv_cache_dtype"] = model.kv_cache_dtype
    if engine.get("memory_rules", DEFAULT_RULES) != DEFAULT_RULES:   # the KV sized as another vLLM generation
        row["memory_rules"] = engine["memory_rules"]
    if extrapolated:   # stated only where a size lay outside the fit
        row["extrapolated"] = "; ".join(extrapolated)
    row["overheads"] = overheads_words(hw, costs, run.results, engine.get("host_time", True))
    if gpu_hour_cost is not None:
        row["cost_per_million_output_tokens"] = (gpu_hour_cost * dep.gpus / 3600.0 / tps * 1e6) if tps else None
    return row


def _engine_defaults() -> dict:
    """The planner's engine keys at :class:`ServingConfig`'s defaults (vLLM 0.33's serve), read from its fields so
    the default is declared once."""
    import dataclasses
    d = {f.name: f.default for f in dataclasses.fields(ServingConfig)}
    return {"host_time": not d["no_host_time"], "async_scheduling": not d["no_async_scheduling"],
            "enforce_eager": bool(d["enforce_eager"]), "step_by_step": False}   # (every iteration stepped: the same rows)


ENGINE_DEFAULTS = _engine_defaults()


def overheads_words(hw, costs: dict, results, host_time: bool) -> str:
    """What a plan run priced beyond the kernels and whether its steps replayed CUDA graphs
    (:func:`sim.cost.pricing.served_overheads` in :func:`sim.cost.overheads.overheads_words`' words, without its
    "; "); ``costs``: :func:`_serve`'s."""
    from sim.cost.overheads import overheads_words as words
    from sim.cost.pricing import served_overheads
    info = {"overheads": served_overheads(hw, costs, results, host_time, "a plan's replay prices no API server")}
    return words(info).lstrip("; ")


def _serve(dep: Deployment, model, hw, node, w: dict, router: str, arrival_rate, concurrency: int, seed: int,
           enable_expert_parallel: bool = False, moe_routing: str = "expected", host_time: bool = True,
           async_scheduling: bool = True, enforce_eager: bool = False, step_by_step: bool = False,
           memory_rules: str = DEFAULT_RULES):
    """``(ReplicaRun, KV blocks per replica, the engines' costs)`` of ``w`` served on ``dep`` (what :func:`evaluate`
    scores); ``step_by_step``: every iteration stepped (the reference path; the same figures); ``memory_rules``: the
    vLLM generation whose KV sizing gives the blocks;
    ``moe_routing`` sampled is seeded by ``seed``. Each replica's steps are priced as vLLM serves them
    (:func:`sim.cost.pricing.served_costs`): CUDA graphs unless ``enforce_eager``, the host time per step unless
    ``host_time`` is False, under ``async_scheduling``."""
    from sim.cost.pricing import served_costs
    from sim.cost.routing import routing_for
    jobs = w["jobs"]
    par = dep.layout(model, enable_expert_parallel)
    bs = jobs[0][1].bs if jobs else 16
    cap, blocks = kv_blocks(model, hw, dep.serving(memory_rules), par, bs, node)
    routing = routing_for(moe_routing, int(seed)) if model.num_experts else None
    costs = served_costs(model, hw, node, par, dep.max_num_seqs, enforce_eager=enforce_eager, host_time=host_time,
                         async_scheduling=async_scheduling, routing=routing)   # stateless: it prices every replica
    sched = SchedulerConfig(max_num_seqs=dep.max_num_seqs, max_num_batched_tokens=dep.max_num_batched_tokens,
                            policy=PLAN_SCHEDULER,
                            kv_groups=() if model.kv_cache_groups == (1, 0, 0) else model.kv_cache_groups)
    run = Replicas(model, hw, jobs, make_router(router, par.data_parallel_size), par.data_parallel_size,
                   costs=[costs["cost"]] * par.data_parallel_size, host_step=costs["host_step"],
                   async_scheduling=costs["async_scheduling"], concurrency=concurrency, arrival_rate=arrival_rate,
                   seed=seed, scheduler=sched, kv_blocks=blocks, block_policy=w.get("block_policy"),
                   caching=w.get("caching", True), prompt_ids=w.get("prompt_ids"), hw_name=hw.name,
                   fast_forward=not step_by_step).run()
    return run, blocks, costs


def knee_point(run, jobs, percentiles=(50.0, 99.0), tolerance: float = 0.05) -> tuple[dict, dict]:
    """``(metrics, growth)`` of one planner run for :func:`sim.search.knee.sweep`: per problem TTFT (mean of its
    branches' first tokens), TPOT (longest branch, :func:`sim.serving.goodput.tpot`) and E2E as ``vllm bench serve``'s
    ``*_ms`` keys, ``request_throughput`` = problems / makespan, and :func:`sim.search.knee.queue_growth` on the
    problems' arrivals and their wait to first token."""
    from sim.serving.goodput import tpot
    from sim.search.knee import latency_metrics, queue_growth

    recs = run.problems
    gen = {pseq: (int(np.max(j.gen)) if j.B else 0) for pseq, (_, j) in enumerate(jobs)}
    ttft = np.array([r["ttft_s"] for r in recs], np.float64)
    e2e = np.array([r["latency_s"] for r in recs], np.float64)
    tp = tpot(ttft, e2e, [gen[r["pseq"]] for r in recs])
    m = latency_metrics(ttft, tp[np.asarray([gen[r["pseq"]] for r in recs]) > 1], e2e, percentiles)
    m["request_throughput"] = len(recs) / run.makespan if run.makespan > 0 else None
    m["preemptions"] = int(sum(r.stats["preemptions"] for r in run.results))
    arr = np.array([r["arrival_s"] for r in recs], np.float64)
    return m, queue_growth(arr, ttft, tolerance)


def plan_model(model_preset: str, quantization: str | None = None, kv_cache_dtype: str | None = None):
    """The plan's model: the preset served as released, or under ``--quantization`` / ``--kv-cache-dtype``
    (:func:`sim.replay.target.with_precision`, errors naming the flag)."""
    from sim.cost.profiles import load_model
    from sim.replay.target import with_precision
    return with_precision(load_model(model_preset), quantization, kv_cache_dtype)


def target_options(m, enable_expert_parallel: bool = False, moe_routing: str = "expected",
                   quantization: str | None = None, kv_cache_dtype: str | None = None,
                   memory_rules: str = DEFAULT_RULES, allow_extrapolation: bool = False, **engine) -> dict:
    """The target flags a plan's tasks and knees take (:func:`evaluate_deployment`), each only where it prices
    something: expert parallelism and routing on an MoE model ``m``, a precision flag where given (a release's own
    format is the model's default); a plain plan's tasks stay as they were. ``rksim plan`` and the dashboard's
    small plan both take them from here."""
    out = {"enable_expert_parallel": bool(enable_expert_parallel), "moe_routing": moe_routing} if m.num_experts else {}
    out.update({k: v for k, v in (("quantization", quantization), ("kv_cache_dtype", kv_cache_dtype)) if v})
    if memory_rules != DEFAULT_RULES:   # the KV sized as another vLLM generation (--vllm-memory-rules)
        out["memory_rules"] = memory_rules
    if allow_extrapolation:   # sizes outside the GPU profile's fitted range priced, each row saying which
        out["allow_extrapolation"] = True
    # how each step is priced beyond its kernels (ENGINE_DEFAULTS: vLLM's serve), stated where not the default
    out.update({k: bool(v) for k, v in engine.items() if bool(v) != ENGINE_DEFAULTS[k]})
    return out


def deployment_knee(trace, params: dict, rates, *, model_preset: str, node: str, router: str = "prefix-affinity",
                    slo: str | None = None, n_requests: int | None = None, seed: int = 0, refine: int = 0,
                    tolerance: float = 0.05, progress=None, enable_expert_parallel: bool = False,
                    moe_routing: str = "expected", quantization: str | None = None,
                    kv_cache_dtype: str | None = None, host_time: bool = True, async_scheduling: bool = True,
                    enforce_eager: bool = False, step_by_step: bool = False, memory_rules: str = DEFAULT_RULES,
                    allow_extrapolation: bool = False) -> dict:
    """The latency-rate curve and knee (:func:`sim.search.knee.sweep`) of one plan deployment (``params``:
    :meth:`Deployment.to_dict`, ``gpus`` ignored): its policy's problems served at each Poisson rate in
    ``rates`` (problems/s), judged on ``slo`` (:class:`sim.search.knee.KneeSLO` text; None: its default), on the
    plan's target (``enable_expert_parallel`` ... ``kv_cache_dtype``: as :func:`evaluate_deployment` priced it). The
    dict adds ``provenance``: the target, layout, scheduler limits and KV capacity it holds under."""
    from sim.search.knee import KneeSLO, check_tolerance, sweep
    from sim.replay.session import Session

    spec = KneeSLO.parse(slo, "--knee-slo")
    check_tolerance(tolerance)
    dep = Deployment(**{k: v for k, v in params.items() if k != "gpus"})
    m = plan_model(model_preset, quantization, kv_cache_dtype)
    nd, hw = node_and_gpu(node)
    if trace is None:
        from sim.replay.session import default_trace_path
        trace = default_trace_path()
    lt = trace if isinstance(trace, Session) else Session(str(trace))
    w = trace_workload(lt, dep.policy, m, n_requests)
    extrapolated = check_plan_range(dep, m, hw, w["jobs"], enable_expert_parallel, allow_extrapolation)
    pcts = sorted({50.0, 99.0, *spec.percentiles})
    engine = {"host_time": host_time, "async_scheduling": async_scheduling, "enforce_eager": enforce_eager,
              "step_by_step": step_by_step, "memory_rules": memory_rules}
    # every rate's KV blocks, engine costs and host time (summed: what the caption states, not the runs themselves)
    blocks, costs, host = [], [], SimpleNamespace(host_seconds=0.0, host_extrapolated=0)

    def evaluate(rate):
        run, b, c = _serve(dep, m, hw, nd, w, router, float(rate), 1, seed, enable_expert_parallel, moe_routing,
                           **engine)
        blocks.append(b)
        costs[:] = [c]
        host.host_seconds += sum(r.host_seconds for r in run.results)
        host.host_extrapolated += sum(r.host_extrapolated for r in run.results)
        return knee_point(run, w["jobs"], pcts, tolerance)

    curve = sweep(evaluate, list(rates), spec, refine=refine, progress=progress)
    curve["provenance"] = (
        f"simulated: model {m.priced_name} on {hw.name} ({hw.calibration_note}); {dep.policy} on TP "
        f"{dep.tensor_parallel_size} x PP {dep.pipeline_parallel_size} x DP {dep.data_parallel_size} of {nd.name}"
        f"{', expert parallel' if enable_expert_parallel and m.num_experts else ''}"
        f"{f', {moe_routing} routing' if moe_routing != 'expected' and m.num_experts else ''}, "
        f"router {router}; scheduler vllm-v1, max_num_seqs {dep.max_num_seqs}, max_num_batched_tokens "
        f"{dep.max_num_batched_tokens}, KV capacity {blocks[0]} blocks per replica"
        f"{f' (sized as vLLM {memory_rules} sizes it)' if memory_rules != DEFAULT_RULES else ''}; "
        f"{overheads_words(hw, costs[0], [host], host_time)}; decisions of "
        f"{w['decisions_model']}; {len(w['jobs'])} problems, Poisson arrivals, seed {seed}"
        + "".join(f"; {x}" for x in extrapolated))
    curve["deployment"] = deployment_id(dep)
    return curve


def frontier(rows) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(table, frontier, best per policy)``: frontier = fewest GPUs against most goodput, non-dominated;
    best per policy = most goodput, then fewest GPUs."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return df, df, df
    g = df["goodput_problems_per_s"].astype(float).to_numpy()
    mask = pareto_mask(df["gpus"].to_numpy(np.float64), g, minimize_x=True, maximize_y=True)
    front = df[mask].sort_values(["gpus", "goodput_problems_per_s"]).reset_index(drop=True)
    best = (df.sort_values(["policy", "goodput_problems_per_s", "gpus"], ascending=[True, False, True])
            .groupby("policy", as_index=False).head(1).reset_index(drop=True))
    return df, front, best


def node_and_gpu(node: str):
    """``(node profile, its GPUs' hardware profile)`` of a planner task's ``node``: the preset name or file that
    ``rksim plan`` resolved (:func:`sim.replay.target.node_for`), passed to a (Dask) worker as plain data."""
    from sim.cost.node import load_node
    from sim.cost.profiles import load_hardware
    nd = load_node(node)
    return nd, load_hardware(nd.gpu)


# --------------------------------------------------------------------------- a trace's workload, as one task
def trace_workload(trace, policy: str, model, n_requests: int | None = None, params: dict | None = None) -> dict:
    """The jobs, token ids, caching and block policy of ``policy`` (``params``, default: its defaults) on a trace's
    problems, in the cost model's layers; ``n_requests`` repeats the problems in order (as ``serve``)."""
    from sim.workload.decisions import make_config
    from sim.replay.jobs import decided, kv_ids
    from sim.replay.session import Session

    lt = trace if isinstance(trace, Session) else Session.of(trace)
    cfg = make_config(policy, dict(params or {}), None)
    probs = list(lt.tf.problems)
    hits = decided(lt, cfg, probs, model.n_layers)
    jobs = [(f.pos, job) for f, (_, job, _) in zip(probs, hits)]
    ids = [kv_ids(f, dec) for f, (dec, _, _) in zip(probs, hits)]
    if n_requests is not None:
        idx = [i % len(jobs) for i in range(int(n_requests))]
        jobs, ids = [jobs[i] for i in idx], [ids[i] for i in idx]
    return {"jobs": jobs, "prompt_ids": ids, "caching": not cfg.no_kv,
            "block_policy": (lambda: make_config(policy, dict(params or {}), None).block) if cfg.block is not None else None,
            "decisions_model": lt.tf.model_name}


def evaluate_deployment(trace, policy: str | None = None, params: dict | None = None, *, model_preset: str,
                        node: str, router: str = "prefix-affinity", slo: str | None = None,
                        arrival_rate: float | None = None, concurrency: int = 1, n_requests: int | None = None,
                        seed: int = 0, gpu_hour_cost: float | None = None, band_fit: str | None = None,
                        enable_expert_parallel: bool = False, moe_routing: str = "expected",
                        quantization: str | None = None, kv_cache_dtype: str | None = None,
                        host_time: bool = True, async_scheduling: bool = True, enforce_eager: bool = False,
                        step_by_step: bool = False, memory_rules: str = DEFAULT_RULES,
                        allow_extrapolation: bool = False) -> dict:
    """One planner task on plain data (what a Dask worker runs, :func:`sim.search.dist.run_dask`'s ``evaluate``):
    ``params`` = :meth:`Deployment.to_dict` without ``gpus``; ``band_fit``: price it with that public fit of
    the node's GPU (a label of :func:`sim.cost.bands.band_profiles`) instead of the preset's; ``quantization`` /
    ``kv_cache_dtype``: :func:`plan_model`; ``host_time`` / ``async_scheduling`` / ``enforce_eager``: how each
    step is priced beyond its kernels, ``step_by_step`` whether every iteration is stepped, ``memory_rules`` the vLLM
    generation whose KV sizing gives its blocks (:func:`_serve`), ``allow_extrapolation`` (:func:`evaluate`)."""
    from sim.cost.bands import band_profiles

    p = {k: v for k, v in (params or {}).items() if k != "gpus"}
    dep = Deployment(**p)
    m = plan_model(model_preset, quantization, kv_cache_dtype)
    nd, hw = node_and_gpu(node)
    if band_fit is not None:
        fits = dict(band_profiles(hw, host_time=host_time, fp8=m.quantization == "fp8"))
        if band_fit not in fits:
            raise ValueError(f"--band: {hw.name} has no public fit {band_fit!r} (fits: {', '.join(fits) or 'none'})")
        hw = fits[band_fit]
    w = trace_workload(trace, dep.policy, m, n_requests)
    row = evaluate(dep, m, hw, nd, lambda _pol: w, router=router, slo=SLO.parse(slo), arrival_rate=arrival_rate,
                   concurrency=concurrency, seed=seed, gpu_hour_cost=gpu_hour_cost,
                   enable_expert_parallel=enable_expert_parallel, moe_routing=moe_routing, host_time=host_time,
                   async_scheduling=async_scheduling, enforce_eager=enforce_eager, step_by_step=step_by_step,
                   memory_rules=memory_rules, allow_extrapolation=allow_extrapolation)
    row["decisions_model"] = w["decisions_model"]
    return row


def deployment_id(dep: Deployment) -> str:
    return (f"tp{dep.tensor_parallel_size}-pp{dep.pipeline_parallel_size}-dp{dep.data_parallel_size}-"
            f"s{dep.max_num_seqs}-t{dep.max_num_batched_tokens}-{dep.policy}")


def run_plan(trace, deps: Iterable[Deployment], options: dict, backend: str = "local", workers: int | None = None,
             progress: bool = True, scheduler: str | None = None) -> list[dict]:
    """Evaluate every deployment (``options``: :func:`evaluate_deployment`'s keywords) locally or on Dask
    (:func:`sim.search.dist.run_dask`: chunked tasks, reruns, nothing lost or duplicated); rows in input order."""
    items = [(deployment_id(d), {k: v for k, v in d.to_dict().items() if k != "gpus"}) for d in deps]
    if trace is None:
        from sim.replay.session import default_trace_path
        trace = default_trace_path()
    trace = str(trace)
    if backend == "local":
        from tqdm.auto import tqdm

        from sim.replay.session import Session
        session = Session(trace)  # this plan's: every deployment reuses its decisions
        return [evaluate_deployment(session, params=p, **options)
                for _, p in tqdm(items, desc="plan", unit="deployment", disable=not progress)]
    if backend == "dask":
        from sim.search import dist
        from sim.search.sweep import evaluate_chunk
        res = dist.run_dask(evaluate_chunk, evaluate_deployment, trace, "plan", items, options, workers=workers,
                            scheduler=scheduler, progress=progress)
        return [res[cid] for cid, _ in items]
    raise ValueError(f"--backend: {backend!r} is not one of local, dask")


# --------------------------------------------------------------------------- a plan file: its frontier and figure
# ``rksim pareto --x``: the cost axis (fewer is better) and ``--y``: the figure deployments are chosen on (more is
# better), each a column of the plan table.
PLAN_X = {"gpus": "gpus", "cost": "cost_per_million_output_tokens"}
PLAN_Y = {"goodput": "goodput_problems_per_s", "throughput": "throughput_tokens_per_s"}
PLAN_KEY = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs",
            "max_num_batched_tokens", "policy")


class PlanError(ValueError):
    """A file that is not a readable ``rksim plan`` table, or an axis it lacks (the message names which)."""


def read_plan(path) -> tuple[pd.DataFrame, dict]:
    """The rows and metadata of a ``rksim plan --out`` Parquet file (``command: plan`` in its metadata)."""
    from sim.search.sweep import read_sweep

    try:
        df, meta = read_sweep(path)
    except (ValueError, FileNotFoundError) as exc:
        raise PlanError(str(exc)) from None
    missing = [c for c in (*PLAN_KEY, "gpus", "goodput_problems_per_s") if c not in df.columns]
    if meta.get("command") != "plan" or missing:
        raise PlanError(f"{str(path)!r}: not a `rksim plan --out` table"
                        + (f" (no column {missing[0]!r})" if missing else " (no plan metadata)"))
    return df, meta


def plan_axes(df: pd.DataFrame, x: str = "gpus", y: str = "goodput") -> tuple[str, str]:
    """The columns of ``--x`` / ``--y``; :class:`PlanError` naming the flag for an unknown name or a column the
    table lacks (cost needs a plan run with ``--gpu-hour-cost``)."""
    if x not in PLAN_X:
        raise PlanError(f"--x: {x!r} is not one of {', '.join(PLAN_X)}")
    if y not in PLAN_Y:
        raise PlanError(f"--y: {y!r} is not one of {', '.join(PLAN_Y)}")
    xc, yc = PLAN_X[x], PLAN_Y[y]
    if xc not in df.columns or df[xc].isna().all():
        raise PlanError(f"--x {x}: the plan has no {xc} (run `rksim plan` with --gpu-hour-cost)")
    if yc not in df.columns or df[yc].isna().all():
        raise PlanError(f"--y {y}: the plan has no {yc}")
    return xc, yc


def plan_frontiers(df: pd.DataFrame, x: str = "gpus", y: str = "goodput_problems_per_s"
                   ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """``(frontier over all policies, {policy: its own frontier})`` of fewer ``x`` against more ``y``.

    Rows without both figures are left out; each frame keeps the table's index (its row number) and is
    sorted by ``x``.
    """
    data = df.dropna(subset=[x, y])
    data = data[np.isfinite(data[x].astype(float)) & np.isfinite(data[y].astype(float))]

    def front(frame):
        if frame.empty:
            return frame
        m = pareto_mask(frame[x].to_numpy(np.float64), frame[y].to_numpy(np.float64), minimize_x=True,
                        maximize_y=True)
        return frame[m].sort_values([x, y], kind="stable")

    per = {str(p): front(g) for p, g in data.groupby("policy", sort=True)}
    return front(data), per


def plan_caption(meta: dict) -> str:
    """What a plan's figures hold under: model, node, GPU budget, SLO, router, arrivals, decisions' model."""
    arr = (f"Poisson at {meta['arrival_rate']:g} problems/s" if meta.get("arrival_rate") is not None
           else f"closed loop of {meta['concurrency']}" if meta.get("concurrency") is not None else "")
    from sim.cost.model_shape import precision_words
    prec = precision_words(meta.get("quantization"), meta.get("kv_cache_dtype"))
    parts = [f"costs from {meta.get('model', '?')}{f' ({prec})' if prec else ''} on {meta.get('node', '?')} "
             f"(<= {meta.get('gpus', '?')} GPUs)",
             f"decisions of {meta.get('decisions_model', '?')}", f"SLO {meta.get('slo', 'none')}",
             f"router {meta.get('router', '?')}", "vLLM V1 scheduler at each point's max_num_seqs / "
             "max_num_batched_tokens, KV capacity per replica at its layout"]
    if arr:
        parts.append(arr)
    return "; ".join(parts)
