"""Plain serving workloads: ``vllm bench serve`` / ``vllm bench throughput`` run through the simulator.

A plain request is one prompt of ``input_len`` tokens and exactly ``output_len`` generated
tokens: no branches, no gate, no verification pass. Each is a one-branch :class:`sim.workload.job.Job`
with ``verify_on = False``, served by the same simpy engine (:mod:`sim.serving.engine`), the same
scheduler (:mod:`sim.serving.scheduler`) and the same block manager (:mod:`sim.serving.kvcache`) as the
reasoning workload; nothing here schedules.

Workload names, defaults and arithmetic follow vLLM's benchmark code (read, not copied):

* **random dataset** (``vllm/benchmarks/datasets/random.py`` @ 237145ea, ``RandomDataset``):
  ``rng = numpy.random.default_rng(seed)``; input lengths ``rng.integers(lo_in, hi_in + 1, K)``
  then output lengths ``rng.integers(lo_out, hi_out + 1, K)`` with
  ``lo = floor(len (1 - r))``, ``hi = ceil(len (1 + r))``, ``r = --random-range-ratio`` in
  ``[0, 1)``, output bounds at least 1; a prompt is ``--random-prefix-len`` shared tokens plus
  its sampled length. vLLM subtracts the tokenizer's special tokens from ``input_len``
  (``num_special_tokens_to_add``) and the server adds them back; rksim has no tokenizer
  and takes ``num_special = 0``, so for the same seed it draws vLLM's lengths exactly
  when that count is 0 (and always when ``r = 0``).
* **arrivals** (``vllm/benchmarks/serve.py`` @ 009e6d4a, ``get_request``): with
  ``--request-rate R`` finite, inter-arrival gaps are ``Gamma(shape = B, scale = 1 / (R B))``
  (``B = --burstiness``; 1 = Poisson), drawn with the global ``numpy.random`` seeded by
  ``--seed`` (here ``numpy.random.RandomState(seed)``: the same stream), cumulated, then
  rescaled so the last request is sent at ``K / R``; ``R = inf`` sends all at t = 0.
  ``--max-concurrency C`` lets at most C requests be outstanding (an asyncio semaphore: a
  request is *sent*, and its latencies start, when it gets a slot).
* **metrics** (``calculate_metrics`` there): ``ttft`` = first token - send; ``itl`` = gaps
  between consecutive tokens; ``tpot = (e2el - ttft) / (output_len - 1)`` for requests with
  more than one output token; ``e2el`` = last token - send; throughputs over the benchmark
  duration (t = 0 to the last completion); percentiles ``numpy.percentile`` (linear),
  reported for ``--metric-percentiles`` (default 99).
* **offline** (``vllm/benchmarks/throughput.py`` @ 02028314): every request at t = 0,
  ``elapsed_time``, ``requests_per_second``, ``tokens_per_second`` (prompt + output).

Scheduler defaults per device (``vllm/engine/arg_utils.py`` @ 99d7eb5d,
``EngineArgs.get_batch_defaults``): a GPU with >= 70 GiB whose name does not contain
"a100" gets ``max_num_batched_tokens`` 8192 for ``vllm serve`` (OPENAI_API_SERVER) and
16384 for the offline ``LLM`` class (LLM_CLASS), ``max_num_seqs`` 1024 for both; any other
GPU 2048 / 8192 and 256 / 256. :data:`OFFLINE_DEFAULTS` holds the ``LLM`` column;
:data:`sim.serving.capacity.SCHEDULER_DEFAULTS` the server's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.serving.capacity import GENERIC_DEFAULTS, SCHEDULER_DEFAULTS, ServingConfig, kv_blocks
from sim.cost.fingerprint import host_fields
from sim.bench.plain_workload import MAX_LEN, MAX_PROMPTS, PlainError, PlainWorkload, int_arg, arrival_times, \
    file_workload, random_workload  # noqa: F401 (re-exported: the workload half of this module)
from sim.workload.job import Job
from sim.cost.overheads import overheads_info, overheads_words  # noqa: F401 (overheads_words: re-exported)
from sim.bench.plain_results import (Gaps, ITLs, Tally, provenance, serve_result,  # noqa: F401
                                     throughput_result)

# vLLM LLM-class (offline) defaults by device; source in the module docstring.
OFFLINE_DEFAULTS = {
    "h100-sxm": {"max_num_seqs": 1024, "max_num_batched_tokens": 16384},
    "h200": {"max_num_seqs": 1024, "max_num_batched_tokens": 16384},
    "a100-80gb": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "l4": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "rtx-pro-6000": {"max_num_seqs": 1024, "max_num_batched_tokens": 16384},
    "rtx-4090": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "local-cpu": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
}
OFFLINE_GENERIC = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
BLOCK_SIZE = 16                      # vLLM's default --block-size on CUDA
PREFIX_ID_BASE = 1                   # shared prefix token ids are 1..prefix_len (request tokens are negative)


def scheduler_defaults(hw_name: str, offline: bool) -> dict:
    """vLLM's ``max_num_seqs`` / ``max_num_batched_tokens`` for the device (server or offline ``LLM``)."""
    if offline:
        return dict(OFFLINE_DEFAULTS.get(hw_name, OFFLINE_GENERIC))
    return dict(SCHEDULER_DEFAULTS.get(hw_name, GENERIC_DEFAULTS))


def plain_job(input_len: int, output_len: int, L: int, bs: int) -> Job:
    """A one-branch job: ``input_len`` prompt tokens, ``output_len`` sampled, no gate, no verification."""
    z = np.zeros(1, np.int64)
    P = np.array([int(input_len)], np.int64)
    return Job(B=1, L=L, bs=bs, reused=z, computed=P, copy=z, gate=z, source=np.array([-1]),
               share=np.zeros(1, bool), ctx=P, gen=np.array([int(output_len)], np.int64), own=P.copy(),
               verify_on=False, v_new=z, v_cached=z, v_layers=np.array([L]), v_probes=z,
               v_head=np.ones(1, np.int64), v_kv_tokens=z, v_reuse=False, score=np.zeros(1))


@dataclass
class PlainRun:
    """What one simulated benchmark measured, per request (seconds from the benchmark's start)."""

    workload: PlainWorkload
    scheduled: np.ndarray     # when each request was due (the rate schedule)
    start: np.ndarray         # when it was sent (got a concurrency slot)
    ttft: np.ndarray
    e2el: np.ndarray
    itls: list | None         # per request, the gaps between consecutive tokens (None: not kept, keep_gaps)
    duration: float
    info: dict
    replica: np.ndarray | None = None   # with data_parallel_size > 1: the replica each request was routed to
    tally: Tally | None = None   # the gaps counted and tokens per second (the front end's pass; else from itls)


def run(model, hw, wl: PlainWorkload, *, request_rate: float = math.inf, burstiness: float = 1.0,
        max_concurrency: int | None = None, seed: int = 0, serving: ServingConfig | None = None,
        offline: bool = False, token_policy=None, block_size: int = BLOCK_SIZE,
        arrivals: np.ndarray | None = None, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
        node=None, data_parallel_size: int = 1, router: str = "prefix-affinity", pipeline_schedule: str = "overlapped",
        disable_custom_all_reduce: bool = False, enable_expert_parallel: bool = False, moe_routing: str = "expected",
        async_scheduling: bool | None = None, frontend: bool | None = None, host_time: bool = True,
        step_by_step: bool = False, keep_gaps: bool = True, progress=None, allow_extrapolation: bool = False) -> PlainRun:
    """Serve ``wl`` on ``hw`` through :class:`sim.serving.engine.Engine` and return per-request timings.

    ``serving``: scheduler and capacity settings (None fields: vLLM's device defaults, the
    offline ``LLM`` column when ``offline``). ``serving.prefix_caching`` switches exact-prefix
    caching; ``token_policy``: a token eviction policy of :mod:`policies` bounding each
    request's KV (its decode attends over the policy's cache; scoring costs are charged).
    ``arrivals``: explicit send schedule (overrides ``request_rate`` / ``burstiness``).
    ``tensor_parallel_size`` x ``pipeline_parallel_size`` GPUs of ``node`` (None: the node preset of
    ``hw``'s GPU) serve as one replica: iterations priced by :class:`sim.cost.parallel.ParallelCost`, KV the
    replica's (:func:`sim.serving.capacity.kv_capacity`), the fitted range checked on one rank's shard; a layout
    whose weights do not fit is refused naming the smallest that does (:func:`sim.serving.capacity.check_fits`).
    ``data_parallel_size`` such replicas sit behind ``router`` (:mod:`sim.serving.router`; :func:`_replicated`); one
    replica is the engine's own driver, unchanged. ``pipeline_schedule`` (PP > 1): ``"overlapped"``, vLLM's
    up to PP batches in flight, or ``"serial"``, one batch through all stages at a time.
    ``disable_custom_all_reduce``: vLLM's flag, every tensor-parallel all-reduce priced by NCCL.
    ``enable_expert_parallel``: vLLM's flag, each TP rank holds ``E / TP`` whole experts (:func:`sim.cost.parallel.rank_model`).
    ``moe_routing``: ``expected`` distinct experts per iteration, or ``sampled`` (seeded by ``seed``;
    :class:`sim.cost.terms.SampledRouting`).
    ``step_by_step``: price and schedule every iteration one at a time (the reference); default: quiet decode
    windows are advanced at once (:mod:`sim.serving.fastforward`; one replica of one pipeline stage), with identical results.

    Beyond the kernels: host time per step and the API server's front-end time, :func:`_engine_kw`.
    ``keep_gaps``: keep each request's gaps (detailed results); else their counts only (``sim.bench.gap_counts``).
    ``progress``: called with no argument once per answered request (a progress bar's ``update``).
    ``allow_extrapolation``: price a run outside the profile's fitted range (``info["extrapolated"]``; else refused).
    """
    from sim.serving.engine import Engine

    sv = serving or ServingConfig()
    if max_concurrency is not None:
        max_concurrency = int_arg("--max-concurrency", max_concurrency, 1, MAX_PROMPTS)
    bs = int_arg("--block-size", block_size, 1, 4096)
    sched, graphs, sv_eff = _scheduler(model, hw, sv, offline)
    par, nd, routing = _layout(model, hw, sv_eff, tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
                               disable_custom_all_reduce, enable_expert_parallel, moe_routing, seed, router, node)
    cap, blocks = kv_blocks(model, hw, sv_eff, par, bs, nd)   # one GPU (TP = PP = 1, no DP attention): as with None
    extrapolated = _check_range(model, hw, par, wl.input_lens, wl.output_lens, sched, allow_extrapolation)
    sched_t = _send_times(wl.n, offline, arrivals, request_rate, burstiness, seed)
    jobs, ids, pre = _jobs(model, hw, wl, bs, token_policy)
    kw, async_on, fe_on, host, fe = _engine_kw(model, hw, sv, sched, graphs, blocks, token_policy, par, nd, routing,
                                               seed, pipeline_schedule, offline, async_scheduling, frontend, host_time)
    where, sent = None, {}
    delays = _client_delays(fe, wl.input_lens)
    if par.data_parallel_size == 1:
        eng = Engine(model, hw, jobs, prompt_ids=ids, arrival_times=sched_t, max_concurrency=max_concurrency,
                     fast_forward=not step_by_step, **kw, **({} if delays is None else {"client_delays": delays, "api_servers": fe.api_servers}))
        eng.on_answered = progress
        res = eng.run()
        recs = res.records(res.PLAIN_FIELDS)
        # the records hold what the results read: the problems go now, not when the engine's cycles are collected
        eng.probs, res.problems = [], []
        results = [res]
        sent = eng.sent
    else:
        keys = [pre if wl.prefix_len else x[0] for x in ids]   # what prefix-affinity hashes: the shared prefix
        results, recs, where, makespan = _replicated(model, hw, jobs, ids, keys, sched_t, max_concurrency,
                                                     par.data_parallel_size, router, kw, delays,
                                                     fe.api_servers if fe is not None else 1, sent, step_by_step,
                                                     progress)
    makespan = float(res.makespan) if where is None else makespan
    start, ttft, e2el, itls = _timings(recs)
    tally = None   # the gaps counted and tokens per second, where the front end's pass makes them
    if fe is not None:
        start, ttft, e2el, itls, tally = _with_frontend(fe, recs, results, where, sent, delays, start, ttft, e2el,
                                                         keep_gaps)
        makespan = max(makespan, float((start + e2el).max()))
    info = _info(model, hw, sv, sched, graphs, cap, bs, blocks, token_policy, results, recs, offline, par,
                 moe_routing)
    info["overheads"] = overheads_info(hw, host, fe, async_on, fe_on, host_time, results)
    info.update({"extrapolated": list(extrapolated)} if extrapolated else {})   # only where a size lay outside
    info.update(_layout_info(par, nd, router, blocks, where is not None, par.dp_attention(model)))
    return PlainRun(wl, np.asarray(sched_t, np.float64), start, ttft, e2el, itls, makespan, info, where, tally)


def _send_times(n: int, offline: bool, arrivals, request_rate: float, burstiness: float, seed: int) -> np.ndarray:
    """When each request is due: all at once offline, else the given schedule or ``vllm bench serve``'s draw."""
    if offline:
        return np.zeros(n)
    if arrivals is not None:
        return np.asarray(arrivals, np.float64)
    return arrival_times(n, request_rate, burstiness, seed)


def _timings(recs):
    """Per request: when it was sent, its TTFT and E2E latency, and its token gaps (made when read, not kept)."""
    return (np.array([r["arrival_s"] for r in recs]), np.array([r["first_token_times"][0] for r in recs]),
            np.array([r["latency_s"] for r in recs]), ITLs([r["token_times"][0] for r in recs]))


def _layout_info(par, nd, router, blocks, replicated: bool, dpa: bool = False) -> dict:
    """The provenance of a multi-GPU layout and of replicas behind a router (empty for one GPU, one replica);
    ``dpa``: vLLM's DP attention + EP, whose replicas are DP ranks sharing their experts."""
    info = {}
    if not par.is_single or dpa:
        info.update({"tensor_parallel_size": par.tensor_parallel_size,
                     "pipeline_parallel_size": par.pipeline_parallel_size, "node": nd.name})
    if dpa:
        info["dp_attention"] = {
            "expert_parallel_size": par.tensor_parallel_size * par.data_parallel_size,
            "note": (f"vLLM's DP attention + EP: {par.data_parallel_size} DP ranks, each with its own batch and KV "
                     f"cache on TP {par.tensor_parallel_size}; experts over all "
                     f"{par.tensor_parallel_size * par.data_parallel_size} GPUs, run over every rank's gathered "
                     "tokens; each rank is priced as if the others carried its token count (ranks step on their "
                     "own clocks, not in vLLM's lockstep)")}
    if replicated:
        info.update({"data_parallel_size": par.data_parallel_size, "router": router,
                     "kv_capacity_blocks_per_replica": int(blocks)})
    return info


def _check_range(model, hw, par, inp, out, sched, allow_extrapolation: bool = False) -> list[str]:
    """Refuse a run outside the hardware profile's fitted range, checked on the shard one GPU holds; with
    ``allow_extrapolation``, the notes of each dimension outside (empty: inside)."""
    from sim.cost.ranges import chunk_tokens
    return hw.check_query(par.gpu_shard(model), max_context=int((inp + out).max()),
                          max_new=chunk_tokens(int(inp.max()), sched.policy, sched.max_num_batched_tokens),
                          max_batch=0, allow_extrapolation=allow_extrapolation)


def _engine_kw(model, hw, sv, sched, graphs, blocks, token_policy, par, nd, routing, seed, pipeline_schedule,
               offline, async_scheduling, frontend, host_time):
    """The engine's keyword arguments (its cost object: ``ScalarCost`` on one GPU, else ``ParallelCost``), and
    whether async scheduling and the front end are on, with the host and front-end costs priced.

    Beyond the kernels (:mod:`sim.cost.overheads`; docs/calibration.md, "Host time per step and front-end
    time"): with ``host_time`` and a profile carrying ``host_step``, every engine step costs
    ``step_seconds(gpu_s, host_s, async_scheduling, host_serial_s)`` (:meth:`sim.serving.engine.Engine._stepped`;
    with PP > 1 the host time goes with stage 0). ``async_scheduling`` None is vLLM 0.33's default: on
    (``VllmConfig``, vllm/config/vllm.py: ``scheduler_config.async_scheduling is None`` becomes True unless
    an option is incompatible; pipeline parallelism is incompatible only on the V1 model runner, and 0.33
    picks the V2 runner by default). ``frontend`` (None: on for ``vllm serve``, off when ``offline``: ``vllm
    bench throughput`` runs the in-process ``LLM`` class, vllm/benchmarks/throughput.py ``run_vllm``) with a
    profile carrying ``frontend``: each request's TTFT and E2E gain :meth:`FrontendCost.ttft_s` of its
    prompt, and each gap between its tokens is at least :meth:`FrontendCost.step_s` of the step's running
    requests (``FrontendCost.itl_s``).
    """
    from sim.cost.parallel import replica_cost
    async_on = True if async_scheduling is None else bool(async_scheduling)   # vLLM 0.33's default (docstring)
    fe_on = (not offline) if frontend is None else bool(frontend)
    host = hw.host_step if host_time else None
    fe = hw.frontend if fe_on else None
    kw = dict(seed=seed, scheduler=sched, kv_blocks=blocks, caching=bool(sv.prefix_caching) and token_policy is None,
              host_step=host, async_scheduling=async_on,
              max_batch=(hw.fitted_range or {}).get("max_batch"), hw_name=hw.name, record_token_times=True,
              cost=replica_cost(model, hw, nd, par, pipeline_schedule, graphs, routing))
    return kw, async_on, fe_on, host, fe


def _client_delays(fe, inp):
    """The API server in front of the engine (``FrontendCost``): per request, send -> engine (HTTP,
    tokenisation) and last engine token -> client (its chunk); before + after = ``FrontendCost.ttft_s(prompt)``.
    None without a front end."""
    if fe is None:
        return None
    before = (fe.request_s + fe.per_prompt_token_s * inp.astype(np.float64)) / fe.host_speed
    after = fe.ttft_s(inp) - before
    return list(zip(before.tolist(), np.broadcast_to(after, before.shape).tolist()))


def _scheduler(model, hw, sv: ServingConfig, offline: bool):
    """The scheduler settings (None fields: :func:`scheduler_defaults`), vLLM's CUDA graphs and the serving
    settings with those limits filled in."""
    from sim.cost.graphs import engine_graphs
    from sim.serving.scheduler import SchedulerConfig
    d = scheduler_defaults(hw.name, offline)
    sched = SchedulerConfig(max_num_seqs=int(sv.max_num_seqs or d["max_num_seqs"]),
                            max_num_batched_tokens=int(sv.max_num_batched_tokens or d["max_num_batched_tokens"]),
                            policy=sv.scheduler,
                            # a hybrid (full + sliding) model: every KV-cache group's blocks per request
                            kv_groups=() if model.kv_cache_groups == (1, 0, 0) else model.kv_cache_groups)
    graphs = engine_graphs(hw, sched.max_num_seqs, sv.enforce_eager)   # vLLM's CUDA graphs (sim.cost.graphs)
    sv_eff = ServingConfig(**{**sv.to_dict(), "max_num_seqs": sched.max_num_seqs,
                              "max_num_batched_tokens": sched.max_num_batched_tokens})
    return sched, graphs, sv_eff


def _layout(model, hw, sv_eff, tensor_parallel_size, pipeline_parallel_size, data_parallel_size,
            disable_custom_all_reduce, enable_expert_parallel, moe_routing, seed, router, node):
    """The checked layout, its node (:func:`sim.replay.target.resolve_layout`, the one layout resolver) and the
    MoE routing (seeded by ``seed``)."""
    from sim.cost.parallel import ParallelConfig
    from sim.cost.terms import routing_for
    from sim.replay.target import resolve_layout
    par = ParallelConfig(tensor_parallel_size, pipeline_parallel_size, data_parallel_size, disable_custom_all_reduce,
                         enable_expert_parallel)
    try:
        routing = routing_for(moe_routing, int(seed)) if model.num_experts else None
    except ValueError as exc:
        raise PlainError(str(exc)) from None
    if data_parallel_size > 1:
        from sim.serving.router import ROUTERS
        if router not in ROUTERS:
            raise PlainError(f"--router: {router!r} is not one of {', '.join(ROUTERS)}")
    nd = resolve_layout(model, hw, sv_eff, par, node)   # names the smallest TP x PP that fits
    return par, nd, routing


class PromptIds:
    """Request ``i``'s prompt token ids (one branch), made when read: the shared prefix's ids
    ``PREFIX_ID_BASE..``, then its own ``-(1 + i 10^9 + k)``, unique per request and token. Nothing is held
    per request, so a run's memory does not grow with its prompts (the engine reads a request's ids when it
    starts and lets them go when it is answered)."""

    def __init__(self, pre: np.ndarray, input_lens: np.ndarray):
        self.pre = pre
        self.input_lens = input_lens

    def __len__(self) -> int:
        return len(self.input_lens)

    def __getitem__(self, i: int) -> list:
        own = -(1 + int(i) * 10 ** 9 + np.arange(int(self.input_lens[i]) - len(self.pre), dtype=np.int64))
        return [np.concatenate([self.pre, own]) if len(self.pre) else own]


def _jobs(model, hw, wl: PlainWorkload, bs: int, token_policy):
    """One job per request (requests of the same lengths share one: a job is what a request asks, not its
    state), their prompt token ids (:class:`PromptIds`), and the shared prefix's ids."""
    jobs = []
    memo = {}
    inp, out = wl.input_lens, wl.output_lens
    pre = np.arange(PREFIX_ID_BASE, PREFIX_ID_BASE + wl.prefix_len, dtype=np.int64)
    for i in range(wl.n):
        P, T = int(inp[i]), int(out[i])
        job = memo.get((P, T))
        if job is None:
            job = memo[(P, T)] = plain_job(P, T, model.n_layers, bs)
            if token_policy is not None:
                job.long = _long_decode(model, hw, token_policy, P, T)
        jobs.append((i, job))
    return jobs, PromptIds(pre, inp), pre


def _info(model, hw, sv, sched, graphs, cap, bs, blocks, token_policy, results, recs, offline, par,
          moe_routing) -> dict:
    """The run's provenance (:func:`provenance` words it); ``overheads`` is added by the caller."""
    info = {"model": model.name, "hardware": hw.name, "calibration": hw.calibration_note,
            **host_fields(hw), "calibration_status": hw.calibration_status,
            "scheduler": sched.to_dict(), "block_size": bs, "kv_capacity_blocks": int(blocks),
            "kv_capacity_bytes": float(cap["kv_capacity_bytes"]), "capacity_source": cap["capacity_source"],
            # the vLLM generation whose KV sizing gave the capacity (None: given as bytes)
            "memory_rules": None if sv.kv_capacity_bytes is not None else cap.get("memory_rules"),
            "prefix_caching": bool(sv.prefix_caching) and token_policy is None,
            "token_policy": getattr(token_policy, "name", None) if token_policy is not None else None,
            "preemptions": int(sum(x.stats["preemptions"] for x in results)),
            "max_running_seqs": int(max(x.stats["max_running_seqs"] for x in results)),   # of any one replica
            "iterations": int(sum(x.iterations for x in results)), "offline": bool(offline),
            "prefix_hit_tokens": int(sum(r["prefix_hit_tokens"] for r in recs))}
    info["cuda_graphs"] = "off (eager)" if graphs is None else f"padded to capture sizes up to {graphs.max_size}"
    if model.quantization or model.kv_cache_dtype:   # stated only when set: a 16-bit run's info is as before
        info.update({"quantization": model.quantization or None, "kv_cache_dtype": model.kv_cache_dtype or "auto"})
    info["kv_bytes_per_token"] = int(model.kv_bytes_per_token)
    if not model.is_plain:   # MoE / MLA / sliding-window targets: their kinds and the weights one GPU holds
        info.update({"model_kinds": model.layer_kinds(), "weight_bytes_per_gpu": float(cap["weight_bytes"])})
        if par.enable_expert_parallel:
            info["enable_expert_parallel"] = True
        if model.num_experts:
            info["moe_routing"] = moe_routing
            from sim.cost.gemm import expert_rate_words
            words = expert_rate_words(hw, model)
            if words:
                info["moe_experts"] = words
    return info


def _with_frontend(fe, recs, results, where, sent, delays, start, ttft, e2el, keep_gaps: bool = True):
    """Send times, TTFT, E2E and ITLs as a ``vllm bench serve`` client sees them through the API server, and their
    :class:`sim.bench.plain_results.Tally`, made as the gaps land (the ITLs are None unless ``keep_gaps``).

    A request is sent at ``sent``, reaches the engine after its wait for the API server and its
    ``before`` seconds there (HTTP, tokenisation), and its first token reaches the client ``after``
    seconds (its chunk) after the engine sampled it: ``ttft = (engine arrival - sent) + engine ttft +
    after``, so an idle server adds exactly ``FrontendCost.ttft_s(prompt)`` (the client's clock stops at
    the first SSE chunk, vllm/benchmarks/lib/endpoint_request_func.py). Each later gap is
    ``FrontendCost.itl_s(gap, running)`` = ``max(gap, step_s(running))``, ``running`` the requests of the
    step that sampled the token (the engine's timeline); ``e2el = ttft + sum(itl)``.
    """
    s0 = np.array([sent[int(r["pseq"])] for r in recs], np.float64)
    lead = start - s0 + np.array([d[1] for d in delays], np.float64)
    ttft = ttft + lead
    out_e2el = np.array(e2el, np.float64) + lead
    # every request's gaps in one array (Gaps), filled in place: a day's ITLs are never held twice; or only counted
    off = np.zeros(len(recs) + 1, np.int64)
    np.cumsum([max(len(r["token_times"][0]) - 1, 0) for r in recs], out=off[1:])
    values = np.empty(int(off[-1]), np.float64) if keep_gaps else None
    where = None if where is None else np.asarray(where, np.int64)   # each request's replica
    tally = Tally(float(s0.min()))
    for a in range(0, len(recs), FRONTEND_CHUNK):
        b = min(a + FRONTEND_CHUNK, len(recs))
        g = _frontend_gaps(fe, recs, results, where, a, b, off, out_e2el)
        if values is not None:
            values[off[a]:off[b]] = g
        tally.add(s0[a:b], ttft[a:b], [g[off[i] - off[a]:off[i + 1] - off[a]] for i in range(a, b)], flat=g)
    return s0, ttft, out_e2el, (Gaps(values, off) if keep_gaps else None), tally


FRONTEND_CHUNK = 1024   # requests whose token times are joined at once (bounded memory, few numpy calls)


def _frontend_gaps(fe, recs, results, where, a: int, b: int, off, out_e2el) -> np.ndarray:
    """Requests ``a..b-1``'s gaps through the front end (:func:`_with_frontend`), returned, their E2E gains
    into ``out_e2el``: their token times joined, each gap against the engine step that sampled it, in a few numpy
    passes (the same element-wise operations as request by request; a request's E2E gains ``sum(itl) -
    sum(gaps)``, each summed over its own gaps as before, where the front end slowed one of them)."""
    tts = []
    for r in recs[a:b]:
        tts.append(np.asarray(r["token_times"][0], np.float64))
        r["token_times"] = None   # read once: its times go as its gaps land (a day's are never held twice)
    if not tts or off[b] == off[a]:
        return np.zeros(0, np.float64)
    tt = np.concatenate(tts)
    n = np.array([len(x) for x in tts], np.int64)
    later = np.ones(len(tt), bool)
    later[(np.cumsum(n) - n)[n > 0]] = False       # each request's first token time starts no gap
    pos = np.flatnonzero(later)
    ends = tt[pos]
    gaps = ends - tt[pos - 1]
    g2 = gaps.copy()
    owner = np.repeat(np.arange(a, b), np.maximum(n - 1, 0))   # the request of each gap
    for w in ([None] if where is None else np.unique(where[a:b]).tolist()):
        res = results[0 if w is None else w]
        tl_t, tl_run = res.timeline_t, res.timeline_running
        if not tl_t.size:
            continue
        sel = slice(None) if w is None else where[owner] == w
        k = np.clip(np.searchsorted(tl_t, ends[sel]), 0, tl_t.size - 1)
        g2[sel] = np.asarray(fe.itl_s(gaps[sel], tl_run[k]), np.float64).reshape(-1)
    for i in np.unique(owner[g2 != gaps]).tolist():   # the front end set the pace of some of its tokens
        lo, hi = off[i] - off[a], off[i + 1] - off[a]
        out_e2el[i] += float(g2[lo:hi].sum() - gaps[lo:hi].sum())
    return g2


def _replicated(model, hw, jobs, ids, keys, sched_t, max_concurrency, n: int, router: str, kw: dict,
                delays=None, api_servers: int = 1, sent: dict | None = None, step_by_step: bool = False,
                progress=None):
    """``n`` replica engines under one clock behind ``router``: each request, when due (and, with
    ``max_concurrency``, when it holds one of the client's slots, FIFO, as the single engine's driver), is
    routed on arrival (``outstanding`` = requests in flight per replica, :mod:`sim.serving.router`) and submitted to
    that replica's engine. Returns ``(engine results, records in request order, replica per request,
    makespan)``. ``progress``: :func:`run`'s, every replica's answers.

    Without ``max_concurrency`` an answer only lowers the router's count (no client waits on it to send the
    next request), so the replicas take decode windows (unless ``step_by_step``): the clock is a
    :class:`sim.serving.fleet_clock.FleetClock` and each engine a fleet's (``Engine.fleet``). With client
    slots an answer on one replica can send a request to another: every replica steps."""
    import simpy

    from sim.serving import arrivals
    from sim.serving.engine import Engine
    from sim.serving.fleet_clock import FleetClock
    from sim.serving.router import Arrival, choose, make_router

    fleet = not step_by_step and max_concurrency is None
    env = FleetClock() if fleet else simpy.Environment()
    # several accelerators must not wait on each other's zero-time steps: one settle step each (sim.serving.replicas)
    engines = [Engine(model, hw, [], env=env, settle=1, fast_forward=fleet, fleet=fleet, **kw) for _ in range(n)]
    for e in engines:
        e.on_answered = progress
    accs = [e.start() for e in engines]
    rt = make_router(router, n)
    outstanding = [0] * n
    where = np.zeros(len(jobs), np.int64)
    arr = arrivals.Timed(tuple(float(t) for t in sched_t), max_concurrency, delays, int(api_servers))

    def submit(i, hold):
        r = choose(rt, Arrival(i, 0, 1, keys[i]), outstanding, engines)
        where[i] = r
        outstanding[r] += 1
        done = env.event()
        done.callbacks.append(lambda _e, r=r: outstanding.__setitem__(r, outstanding[r] - 1))
        engines[r].submit(i, jobs[i][0], jobs[i][1], ids[i], done)
        return done

    arrivals.start(env, arr, len(jobs), submit, sent)
    arrivals.run_until_empty(env, accs)
    counts = np.bincount(where, minlength=n)
    results = [e.result(n_expected=int(c)) for e, c in zip(engines, counts)]
    by = {}
    for res in results:
        for rec in res.records(res.PLAIN_FIELDS):
            by[rec["pseq"]] = rec
    return results, [by[i] for i in range(len(jobs))], where, float(env.now)


def _long_decode(model, hw, pol, P: int, T: int):
    """The :class:`sim.serving.long_decode.LongDecode` of one request under a token policy: the cache each decode
    step attends over and the eviction scoring seconds (the same schedule as the reasoning workload's
    long decodes)."""
    from sim.replay.mode_token import eviction_schedule
    from sim.cost.terms import eviction_scoring_terms
    from sim.serving.long_decode import LongDecode
    sizes, events, cands = eviction_schedule(pol, P, P + T)
    window = max(getattr(pol, "window", 0) or pol.buffer, 1)
    ev = {t: float(hw.time(eviction_scoring_terms(model, c, window))) for t, c in zip(events, cands)}
    return LongDecode(P, sizes, ev)


# ------------------------------------------------------------------------------------------- results
