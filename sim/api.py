"""The simulator's public API (docs/sim-api.md): ``simulate``, ``evaluate``, ``compare_policies``, ``load_presets``.

Each is a thin function over the three objects a simulation is made of: a caller-owned
:class:`Session` (the trace and every memo; pass one instead of a path to keep them between
calls), a frozen :class:`Target` (model, hardware, serving limits) and a validated
:class:`RunConfig`; ``sim.replay.modes.run`` picks the mode's module (``sim.replay.mode_isolated``,
``sim.replay.mode_serving``, ``sim.replay.mode_token``). ``evaluate`` returns plain scalars for sweeps; ``simulate``
a :class:`SimResult` with the per-problem / per-branch DataFrames and the KV timeline.
"""
from __future__ import annotations

from policies import list_policies

from sim.serving.capacity import ServingConfig
from sim.workload.decisions import policy_kind
from sim.replay.problem_metrics import clean
from sim.replay.modes import run, token_entry, token_runs_on
from sim.cost.profiles import load_presets as _load_presets
from sim.replay.records import SimResult
from sim.replay.runconfig import MODES, RunConfig
from sim.replay.session import Session, default_trace_path
from sim.replay.summary import reshape_info
from sim.replay.target import Target
from sim.replay.mode_token import eviction_schedule, token_budgets

def load_presets() -> dict[str, list[str]]:
    """Names of every model and hardware preset (shipped + ``$RKSIM_PRESETS``)."""
    return _load_presets()


def loaded(trace=None, reshape=None) -> Session:
    """``trace`` as a :class:`Session` (a new one unless it is one), reshaped by ``reshape`` if given.

    A session passed in is used as it is: its owner calls ``session.refresh()`` to see a trace
    re-captured in place (the dashboard does on every rerun).
    """
    s = Session.of(trace)
    return s if reshape is None else s.reshaped(reshape)


def simulate(trace=None, policy: str = "exact-prefix", params: dict | None = None, model_preset=None,
             hardware="local-cpu", mode: str = "isolated", problems=None, workload: dict | None = None,
             seed: int = 0, arrival_rate: float | None = None, baselines: bool | None = None,
             engine: bool = False, serving=None, reshape=None, strict: bool = False,
             allow_extrapolation: bool = False, node=None, tensor_parallel_size: int = 1,
             pipeline_parallel_size: int = 1, data_parallel_size: int = 1, router: str = "prefix-affinity",
             slo: str | None = None, pipeline_schedule: str = "overlapped", quantization: str | None = None,
             kv_cache_dtype: str | None = None, disable_custom_all_reduce: bool = False,
             enable_expert_parallel: bool = False, moe_routing: str = "expected",
             step_by_step: bool = False) -> SimResult:
    """Simulate one configuration; see :func:`evaluate` for the arguments.

    ``strict``: refuse a profile fitted on another host (``sim.cost.fingerprint``) instead of noting it;
    ``allow_extrapolation``: price queries outside the fitted range, listed in ``info["extrapolated"]``.

    ``engine=True`` forces the simpy engine in isolated mode too (the fast path and the engine
    agree to 1e-9; the tests check it). ``serving``: a :class:`sim.serving.capacity.ServingConfig` or
    dict (scheduler, max_num_seqs, max_num_batched_tokens, gpu_memory_utilization,
    activation_reserve_bytes, kv_capacity_bytes, decode_tokens, prefix_caching).
    ``baselines``: speedups over no-kv and exact-prefix (default: where the mode has them;
    token policies have none, and ``problems`` / ``engine`` / ``baselines`` given to one are refused).
    ``node``, ``tensor_parallel_size``, ``pipeline_parallel_size``, ``data_parallel_size``: the deployment
    (docs/parallelism.md; :meth:`sim.replay.target.Target.resolve`); ``pipeline_schedule``: with PP > 1,
    ``"overlapped"`` (vLLM's up to PP batches in flight) or ``"serial"``; ``quantization`` / ``kv_cache_dtype``:
    vLLM's ``--quantization fp8`` / ``--kv-cache-dtype fp8``; ``disable_custom_all_reduce``: every
    tensor-parallel all-reduce priced by NCCL (vLLM's flag); ``enable_expert_parallel`` / ``moe_routing``: vLLM's
    ``--enable-expert-parallel`` and the experts an MoE iteration reads (``expected`` or ``sampled``, serving
    mode); ``router`` routes the replicas' requests and
    ``slo`` (``"ttft=S,tpot=S,e2e=S"``) adds goodput, serving mode. ``step_by_step``: serving mode steps every
    engine iteration (the reference path) instead of advancing quiet decode stretches at once; the same figures.
    """
    config = RunConfig(policy=policy, params=dict(params or {}), workload=workload, mode=mode, seed=seed,
                       arrival_rate=arrival_rate, problems=problems, engine=engine, baselines=baselines,
                       strict=strict, allow_extrapolation=allow_extrapolation, router=router, slo=slo,
                       step_by_step=step_by_step)
    session = loaded(trace, reshape)
    return run(session, Target.resolve(session, model_preset, hardware, serving, node=node,
                                       tensor_parallel_size=tensor_parallel_size,
                                       pipeline_parallel_size=pipeline_parallel_size,
                                       data_parallel_size=data_parallel_size,
                                       pipeline_schedule=pipeline_schedule, quantization=quantization,
                                       kv_cache_dtype=kv_cache_dtype,
                                       disable_custom_all_reduce=disable_custom_all_reduce,
                                       enable_expert_parallel=enable_expert_parallel, moe_routing=moe_routing),
               config)


def evaluate(trace, policy: str = "asks", params: dict | None = None, model_preset=None, hardware="local-cpu",
             mode: str = "isolated", problems=None, workload: dict | None = None, seed: int = 0,
             arrival_rate: float | None = None, serving=None, reshape=None, **deployment) -> dict:
    """Metrics of one configuration as plain Python scalars (docs/sim-api.md); ``deployment``: the
    parallelism, router and SLO keywords of :func:`simulate`."""
    out = simulate(trace, policy=policy, params=params, model_preset=model_preset, hardware=hardware, mode=mode,
                   problems=problems, workload=workload, seed=seed, arrival_rate=arrival_rate, serving=serving,
                   reshape=reshape, **deployment).scalars()
    out.pop("per_replica", None)  # a list; the totals are the summary's own keys
    return out


def compare_policies(trace=None, model_preset=None, hardware="local-cpu", mode: str = "isolated",
                     policies=None, workload: dict | None = None, seed: int = 0, problems=None,
                     progress: bool = False, serving=None, reshape=None, node=None, tensor_parallel_size: int = 1,
                     pipeline_parallel_size: int = 1, data_parallel_size: int = 1,
                     router: str = "prefix-affinity", arrival_rate: float | None = None,
                     pipeline_schedule: str = "overlapped", quantization: str | None = None,
                     kv_cache_dtype: str | None = None, disable_custom_all_reduce: bool = False,
                     enable_expert_parallel: bool = False, moe_routing: str = "expected") -> dict:
    """``{"policies": {NAME: metrics}}`` for every registered policy at its defaults (docs/sim-api.md).

    Every rate and ratio has its 95% interval beside it, ``<metric>_ci95 = [lo, hi]``
    (:mod:`sim.replay.intervals`: Wilson for rates, a paired bootstrap over problems for ratios).
    Token-eviction policies also get ``budgets`` = ``{"2x": {budget, attn_output_rel_error,
    attn_mass_recall, ...}, ...}`` at the workload's ``token_compressions``. Every entry states the
    KV capacity (``kv_capacity_bytes``) and block budget (``kv_budget_blocks``) it ran under.
    ``arrival_rate``: serving mode's Poisson problems/s (default: the closed loop of ``workload.concurrency``).
    """
    session = loaded(trace, reshape)
    target = Target.resolve(session, model_preset, hardware, ServingConfig.from_any(serving), node=node,
                            tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                            data_parallel_size=data_parallel_size, pipeline_schedule=pipeline_schedule,
                            quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                            disable_custom_all_reduce=disable_custom_all_reduce,
                            enable_expert_parallel=enable_expert_parallel, moe_routing=moe_routing)
    names = list(policies) if policies is not None else list_policies()
    if progress:
        from tqdm import tqdm
        names = tqdm(names, desc="compare", unit="policy")
    out: dict = {}
    for name in names:
        kind = policy_kind(name)
        if kind == "token":
            if not token_runs_on(target):
                continue  # one sequence's decode on one TP group (sim.replay.modes.check_layout)
            if session.tf.longs:
                out[name] = token_entry(session, target, name, mode, workload, seed, arrival_rate)
            continue
        config = RunConfig(policy=name, params={}, workload=workload, mode=mode, seed=seed,
                           problems=problems, router=router, arrival_rate=arrival_rate)
        r = run(session, target, config)
        out[name] = {**r.scalars(), **clean(r.intervals()), "kind": kind}
    result = {"policies": out}
    if reshape_info(session.tf) is not None:
        result["reshape"] = reshape_info(session.tf)
    return result


__all__ = ["simulate", "evaluate", "compare_policies", "load_presets", "loaded", "default_trace_path", "token_budgets",
           "eviction_schedule", "Session", "Target", "RunConfig", "SimResult", "MODES"]
