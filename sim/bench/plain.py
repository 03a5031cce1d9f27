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

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.serving.capacity import GENERIC_DEFAULTS, SCHEDULER_DEFAULTS, ServingConfig, capacity_blocks, kv_capacity
from sim.cost.fingerprint import host_fields
from sim.serving.kvcache import check_size
from sim.workload.job import Job
from sim.serving.metrics import percentile_word

# vLLM LLM-class (offline) defaults by device; source in the module docstring.
OFFLINE_DEFAULTS = {
    "h100-sxm": {"max_num_seqs": 1024, "max_num_batched_tokens": 16384},
    "h200": {"max_num_seqs": 1024, "max_num_batched_tokens": 16384},
    "a100-80gb": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "l4": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "local-cpu": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
}
OFFLINE_GENERIC = {"max_num_seqs": 256, "max_num_batched_tokens": 8192}
BLOCK_SIZE = 16                      # vLLM's default --block-size on CUDA
MAX_PROMPTS = 10_000_000
MAX_LEN = 1 << 22
PREFIX_ID_BASE = 1                   # shared prefix token ids are 1..prefix_len (request tokens are negative)


class PlainError(ValueError):
    """A bad plain-workload input (the message names the flag, file or field)."""


@dataclass(frozen=True)
class PlainWorkload:
    """Per request: ``input_lens`` (prompt tokens, shared prefix included) and ``output_lens``.

    ``prefix_len``: the first tokens of every prompt are the same (exact-prefix caching can hit them).
    """

    input_lens: np.ndarray
    output_lens: np.ndarray
    prefix_len: int = 0
    source: str = "random"

    def __post_init__(self) -> None:
        if len(self.input_lens) != len(self.output_lens) or not len(self.input_lens):
            raise PlainError("workload: input and output lengths must be non-empty and of equal count")

    @property
    def n(self) -> int:
        return int(len(self.input_lens))


def _int(name: str, v, lo: int, hi: int) -> int:
    try:
        return check_size(name, v, lo, hi)
    except ValueError as exc:
        raise PlainError(str(exc)) from None


def random_workload(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    prefix_len: int = 0, seed: int = 0) -> PlainWorkload:
    """vLLM's ``RandomDataset`` lengths (module docstring), ``num_special = 0``."""
    K = _int("--num-prompts", num_prompts, 1, MAX_PROMPTS)
    Li = _int("--random-input-len", input_len, 0, MAX_LEN)
    Lo = _int("--random-output-len", output_len, 1, MAX_LEN)
    P = _int("--random-prefix-len", prefix_len, 0, MAX_LEN)
    r = range_ratio
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0.0 <= r < 1.0:
        raise PlainError(f"--random-range-ratio: must be in [0, 1), got {r!r}")
    lo_in, hi_in = math.floor(Li * (1 - r)), math.ceil(Li * (1 + r))
    lo_out, hi_out = max(math.floor(Lo * (1 - r)), 1), max(math.ceil(Lo * (1 + r)), 1)
    if P + lo_in < 1:
        raise PlainError(f"--random-input-len: {Li} with --random-range-ratio {r} and --random-prefix-len {P} "
                         "can give an empty prompt; the shortest prompt must have at least 1 token")
    rng = np.random.default_rng(_int("--seed", seed, 0, 2 ** 63 - 1))
    inp = rng.integers(lo_in, hi_in + 1, size=K)
    out = rng.integers(lo_out, hi_out + 1, size=K)
    return PlainWorkload(inp.astype(np.int64) + P, out.astype(np.int64), P, "random")


def file_workload(path, num_prompts: int | None = None) -> PlainWorkload:
    """(input, output) lengths from a file, first ``num_prompts`` rows in order (default all).

    Accepted: CSV with columns ``input_len,output_len`` (or ``prompt_len,output_len``); JSON: a
    list of ``[input, output]`` pairs or of objects with those keys, or a ``vllm bench serve
    --save-result --save-detailed`` file (its ``input_lens`` / ``output_lens``); JSON lines of
    such objects or pairs.
    """
    p = Path(path)
    if not p.is_file():
        raise PlainError(f"--dataset-path: {p}: no such file")
    text = p.read_text()
    rows = []
    try:
        if p.suffix.lower() == ".csv":
            rd = csv.DictReader(text.splitlines())
            cols = rd.fieldnames or []
            ik = next((c for c in ("input_len", "prompt_len", "input_tokens") if c in cols), None)
            ok = next((c for c in ("output_len", "output_tokens") if c in cols), None)
            if ik is None or ok is None:
                raise PlainError(f"--dataset-path: {p}: CSV needs columns input_len and output_len, has {cols}")
            rows = [(r[ik], r[ok]) for r in rd]
        else:
            if p.suffix.lower() == ".jsonl":
                data = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
            else:
                data = json.loads(text)
            if isinstance(data, dict) and "input_lens" in data and "output_lens" in data:
                rows = list(zip(data["input_lens"], data["output_lens"]))
            elif isinstance(data, list):
                for i, r in enumerate(data):
                    if isinstance(r, dict):
                        ik = next((c for c in ("input_len", "prompt_len", "input_tokens") if c in r), None)
                        ok = next((c for c in ("output_len", "output_tokens") if c in r), None)
                        if ik is None or ok is None:
                            raise PlainError(f"--dataset-path: {p}: row {i} has no input_len/output_len")
                        rows.append((r[ik], r[ok]))
                    elif isinstance(r, (list, tuple)) and len(r) == 2:
                        rows.append(tuple(r))
                    else:
                        raise PlainError(f"--dataset-path: {p}: row {i} is not an (input, output) pair")
            else:
                raise PlainError(f"--dataset-path: {p}: expected a list of (input, output) lengths or a "
                                 "vllm bench result with input_lens/output_lens")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlainError(f"--dataset-path: {p}: not valid JSON: {exc}") from None
    if not rows:
        raise PlainError(f"--dataset-path: {p}: no rows")
    K = len(rows) if num_prompts is None else _int("--num-prompts", num_prompts, 1, MAX_PROMPTS)
    if K > len(rows):
        raise PlainError(f"--num-prompts: {K} requested but {p} has {len(rows)} rows")
    inp, out = np.zeros(K, np.int64), np.zeros(K, np.int64)
    for i, (a, b) in enumerate(rows[:K]):
        try:
            inp[i], out[i] = int(a), int(b)
        except (TypeError, ValueError):
            raise PlainError(f"--dataset-path: {p}: row {i}: lengths must be integers, got {a!r}, {b!r}") from None
        if not 1 <= inp[i] <= MAX_LEN or not 1 <= out[i] <= MAX_LEN:
            raise PlainError(f"--dataset-path: {p}: row {i}: lengths must be in 1..{MAX_LEN}, got {a}, {b}")
    return PlainWorkload(inp, out, 0, str(p))


def arrival_times(n: int, request_rate: float = math.inf, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times of ``n`` requests as ``vllm bench serve`` schedules them (module docstring)."""
    R, B = request_rate, burstiness
    if isinstance(R, bool) or not isinstance(R, (int, float)) or math.isnan(R) or R <= 0:
        raise PlainError(f"--request-rate: must be > 0 (inf: all at t = 0), got {R!r}")
    if isinstance(B, bool) or not isinstance(B, (int, float)) or math.isnan(B) or B <= 0:
        raise PlainError(f"--burstiness: must be > 0, got {B!r}")
    if math.isinf(R):
        return np.zeros(n)
    if math.isinf(B):
        d = np.full(n, 1.0 / R)
    else:
        d = np.random.RandomState(int(seed) % (2 ** 32)).gamma(shape=B, scale=1.0 / (R * B), size=n)
    t = np.cumsum(d)
    if t[-1] != 0:
        t = t * ((n / R) / t[-1])
    return t


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


class ITLs:
    """Per request, the gaps between consecutive tokens, computed from its token times when read
    (``numpy.diff``): a run holds its token-time windows (:class:`sim.serving.fastforward.TokenTimes`), not a
    list per token, until a result asks for the ITLs."""

    def __init__(self, times: list):
        self.times = times

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, i) -> list:
        return np.diff(np.asarray(self.times[i], np.float64)).tolist()

    def __iter__(self):
        for i in range(len(self.times)):
            yield self[i]

    def flat(self) -> np.ndarray:
        """Every request's gaps, in request order, as one array."""
        parts = [np.diff(np.asarray(t, np.float64)) for t in self.times]
        return np.concatenate(parts) if parts else np.zeros(0)


@dataclass
class PlainRun:
    """What one simulated benchmark measured, per request (seconds from the benchmark's start)."""

    workload: PlainWorkload
    scheduled: np.ndarray     # when each request was due (the rate schedule)
    start: np.ndarray         # when it was sent (got a concurrency slot)
    ttft: np.ndarray
    e2el: np.ndarray
    itls: list                # per request, the gaps between consecutive tokens
    duration: float
    info: dict
    replica: np.ndarray | None = None   # with data_parallel_size > 1: the replica each request was routed to


def run(model, hw, wl: PlainWorkload, *, request_rate: float = math.inf, burstiness: float = 1.0,
        max_concurrency: int | None = None, seed: int = 0, serving: ServingConfig | None = None,
        offline: bool = False, token_policy=None, block_size: int = BLOCK_SIZE,
        arrivals: np.ndarray | None = None, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
        node=None, data_parallel_size: int = 1, router: str = "prefix-affinity",
        pipeline_schedule: str = "overlapped", disable_custom_all_reduce: bool = False,
        enable_expert_parallel: bool = False, moe_routing: str = "expected",
        async_scheduling: bool | None = None, frontend: bool | None = None, host_time: bool = True,
        step_by_step: bool = False) -> PlainRun:
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
    windows are advanced at once (:mod:`sim.serving.fastforward`; one replica on one GPU), with identical results.

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
    from sim.cost.terms import ScalarCost, routing_for
    from sim.serving.engine import Engine
    from sim.cost.graphs import engine_graphs
    from sim.serving.scheduler import SchedulerConfig

    sv = serving or ServingConfig()
    if max_concurrency is not None:
        max_concurrency = _int("--max-concurrency", max_concurrency, 1, MAX_PROMPTS)
    bs = _int("--block-size", block_size, 1, 4096)
    d = scheduler_defaults(hw.name, offline)
    sched = SchedulerConfig(max_num_seqs=int(sv.max_num_seqs or d["max_num_seqs"]),
                            max_num_batched_tokens=int(sv.max_num_batched_tokens or d["max_num_batched_tokens"]),
                            policy=sv.scheduler,
                            # a hybrid (full + sliding) model: every KV-cache group's blocks per request
                            kv_groups=() if model.kv_cache_groups == (1, 0, 0) else model.kv_cache_groups)
    graphs = engine_graphs(hw, sched.max_num_seqs, sv.enforce_eager)   # vLLM's CUDA graphs (sim.cost.graphs)
    sv_eff = ServingConfig(**{**sv.to_dict(), "max_num_seqs": sched.max_num_seqs,
                              "max_num_batched_tokens": sched.max_num_batched_tokens})
    from sim.serving.capacity import check_fits
    from sim.cost.parallel import ParallelConfig, ParallelCost, rank_model, stage_layers
    from sim.replay.target import resolve_node
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
    nd = resolve_node(node, hw, par)
    par.validate(model, nd, None)
    if not par.is_single or model.weight_bytes > hw.mem_capacity:
        check_fits(model, hw, sv_eff, par, nd)   # names the smallest TP x PP that fits
    cap = kv_capacity(model, hw, sv_eff, None if par.is_single else par)
    blocks = capacity_blocks(cap["kv_capacity_bytes"], bs, model.kv_bytes_per_token)
    inp, out = wl.input_lens, wl.output_lens
    shard = model if par.is_single else rank_model(model, par.tensor_parallel_size,
                                                   max(stage_layers(model.n_layers, par.pipeline_parallel_size)))
    hw.check_query(shard, max_context=int((inp + out).max()),
                   max_new=int(min(int(inp.max()), sched.max_num_batched_tokens)), max_batch=0)
    sched_t = np.zeros(wl.n) if offline else (
        np.asarray(arrivals, np.float64) if arrivals is not None else
        arrival_times(wl.n, request_rate, burstiness, seed))
    L = model.n_layers
    jobs, ids = [], []
    memo = {}
    pre = np.arange(PREFIX_ID_BASE, PREFIX_ID_BASE + wl.prefix_len, dtype=np.int64)
    for i in range(wl.n):
        P, T = int(inp[i]), int(out[i])
        job = plain_job(P, T, L, bs)
        if token_policy is not None:
            key = (P, T)
            if key not in memo:
                memo[key] = _long_decode(model, hw, token_policy, P, T)
            job.long = memo[key]
        jobs.append((i, job))
        own = -(1 + i * 10 ** 9 + np.arange(P - wl.prefix_len, dtype=np.int64))
        ids.append([np.concatenate([pre, own]) if wl.prefix_len else own])
    async_on = True if async_scheduling is None else bool(async_scheduling)   # vLLM 0.33's default (docstring)
    fe_on = (not offline) if frontend is None else bool(frontend)
    host = hw.host_step if host_time else None
    fe = hw.frontend if fe_on else None
    kw = dict(seed=seed, scheduler=sched, kv_blocks=blocks, caching=bool(sv.prefix_caching) and token_policy is None,
              host_step=host, async_scheduling=async_on,
              max_batch=(hw.fitted_range or {}).get("max_batch"), hw_name=hw.name, record_token_times=True,
              cost=(ScalarCost(model, hw, graphs=graphs, routing=routing) if par.is_single
                    else ParallelCost(model, hw, nd, par, schedule=pipeline_schedule, graphs=graphs, routing=routing)))
    where = None
    # the API server in front of the engine (FrontendCost): per request, send -> engine (HTTP, tokenisation)
    # and last engine token -> client (its chunk); before + after = FrontendCost.ttft_s(prompt)
    delays = None
    if fe is not None:
        before = (fe.request_s + fe.per_prompt_token_s * inp.astype(np.float64)) / fe.host_speed
        after = fe.ttft_s(inp) - before
        delays = list(zip(before.tolist(), np.broadcast_to(after, before.shape).tolist()))
    sent = {}
    if par.data_parallel_size == 1:
        eng = Engine(model, hw, jobs, prompt_ids=ids, arrival_times=sched_t, max_concurrency=max_concurrency,
                     fast_forward=not step_by_step, **kw, **({} if delays is None else {"client_delays": delays, "api_servers": fe.api_servers}))
        res = eng.run()
        recs = res.records()
        results = [res]
        sent = eng.sent
    else:
        keys = [pre if wl.prefix_len else x[0] for x in ids]   # what prefix-affinity hashes: the shared prefix
        results, recs, where, makespan = _replicated(model, hw, jobs, ids, keys, sched_t, max_concurrency,
                                                     par.data_parallel_size, router, kw, delays,
                                                     fe.api_servers if fe is not None else 1, sent)
    makespan = float(res.makespan) if where is None else makespan
    start = np.array([r["arrival_s"] for r in recs])
    ttft = np.array([r["first_token_times"][0] for r in recs])
    e2el = np.array([r["latency_s"] for r in recs])
    itls = ITLs([r["token_times"][0] for r in recs])   # per-token gaps made when read, not kept
    if fe is not None:
        start, ttft, e2el, itls = _with_frontend(fe, recs, results, where, sent, delays, start, ttft, e2el, itls)
        makespan = max(makespan, float((start + e2el).max()))
    info = {"model": model.name, "hardware": hw.name, "calibration": hw.calibration_note,
            **host_fields(hw), "calibration_status": hw.calibration_status,
            "scheduler": sched.to_dict(), "block_size": bs, "kv_capacity_blocks": int(blocks),
            "kv_capacity_bytes": float(cap["kv_capacity_bytes"]), "capacity_source": cap["capacity_source"],
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
    info["overheads"] = _overheads_info(hw, host, fe, async_on, fe_on, host_time, results)
    if not par.is_single:
        info.update({"tensor_parallel_size": par.tensor_parallel_size,
                     "pipeline_parallel_size": par.pipeline_parallel_size, "node": nd.name})
    if where is not None:
        info.update({"data_parallel_size": par.data_parallel_size, "router": router,
                     "kv_capacity_blocks_per_replica": int(blocks)})
    return PlainRun(wl, np.asarray(sched_t, np.float64), start, ttft, e2el, itls, makespan, info, where)


def _with_frontend(fe, recs, results, where, sent, delays, start, ttft, e2el, itls):
    """Send times, TTFT, E2E and ITLs as a ``vllm bench serve`` client sees them through the API server.

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
    out_itls, out_e2el = [], np.array(e2el, np.float64) + lead
    for i, r in enumerate(recs):
        res = results[0 if where is None else int(where[i])]
        tl_t, tl_run = res.timeline_t, res.timeline_running
        tt = np.asarray(r["token_times"][0], np.float64)
        gaps = np.diff(tt)
        if gaps.size and tl_t.size:
            k = np.clip(np.searchsorted(tl_t, tt[1:]), 0, tl_t.size - 1)
            g2 = np.asarray(fe.itl_s(gaps, tl_run[k]), np.float64).reshape(-1)
            out_e2el[i] += float(g2.sum() - gaps.sum())
            gaps = g2
        out_itls.append(gaps.tolist())
    return s0, ttft, out_e2el, out_itls


def _overheads_info(hw, host, fe, async_on: bool, fe_on: bool, host_time: bool, results) -> dict:
    """What a run priced beyond the kernels, and on what it stands (``info["overheads"]``)."""
    if host is not None:
        h = {"priced": True, "async_scheduling": async_on, "host_speed": host.host_speed,
             "serial_fraction": host.serial_fraction, "source": host.source,
             "host_seconds": float(sum(getattr(x, "host_seconds", 0.0) for x in results)),
             "steps_beyond_measured": int(sum(getattr(x, "host_extrapolated", 0) for x in results))}
    else:
        h = {"priced": False, "async_scheduling": async_on,
             "why": ("turned off: --no-host-time, or a figure's host_time: false" if not host_time and hw.host_step is not None else
                     "the profile has no host_step" + (" (its host_per_iter_s holds the host time of its end-to-end "
                                                       "fit)" if hw.host_per_iter_s else ""))}
    if fe is not None:
        f = {"priced": True, "host_speed": fe.host_speed, "api_servers": fe.api_servers, "source": fe.source}
    else:
        f = {"priced": False, "why": ("in-process LLM run (no API server)" if not fe_on
                                      else "the profile has no frontend")}
    return {"host_step": h, "frontend": f}


def overheads_words(info: dict) -> str:
    """The provenance line's clause on host and front-end time (empty for a record without them)."""
    o = info.get("overheads")
    if not o:
        return ""
    h, f = o["host_step"], o["frontend"]
    hs = (f"host time per step priced (async scheduling {'on' if h['async_scheduling'] else 'off'}, host_speed "
          f"{h['host_speed']:g}" + (f", {h['steps_beyond_measured']} steps beyond the measured sizes"
                                    if h.get("steps_beyond_measured") else "") + ")"
          if h["priced"] else f"no host time per step ({h['why']})")
    fs = (f"front-end time priced ({f['api_servers']} API server{'s' if f['api_servers'] > 1 else ''}, host_speed "
          f"{f['host_speed']:g})" if f["priced"] else f"no front-end time ({f['why']})")
    return f"; {hs}; {fs}"


def _replicated(model, hw, jobs, ids, keys, sched_t, max_concurrency, n: int, router: str, kw: dict,
                delays=None, api_servers: int = 1, sent: dict | None = None):
    """``n`` replica engines under one clock behind ``router``: each request, when due (and, with
    ``max_concurrency``, when it holds one of the client's slots, FIFO, as the single engine's driver), is
    routed on arrival (``outstanding`` = requests in flight per replica, :mod:`sim.serving.router`) and submitted to
    that replica's engine. Returns ``(engine results, records in request order, replica per request,
    makespan)``."""
    import simpy

    from sim.serving import arrivals
    from sim.serving.engine import Engine
    from sim.serving.router import Arrival, make_router

    env = simpy.Environment()
    # several accelerators must not wait on each other's zero-time steps: one settle step each (sim.serving.replicas)
    engines = [Engine(model, hw, [], env=env, settle=1, **kw) for _ in range(n)]
    accs = [e.start() for e in engines]
    rt = make_router(router, n)
    outstanding = [0] * n
    where = np.zeros(len(jobs), np.int64)
    arr = arrivals.Timed(tuple(float(t) for t in sched_t), max_concurrency, delays, int(api_servers))

    def submit(i, hold):
        r = int(rt.route(Arrival(i, 0, 1, keys[i]), outstanding))
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
        for rec in res.records():
            by[rec["pseq"]] = rec
    return results, [by[i] for i in range(len(jobs))], where, float(env.now)


def _long_decode(model, hw, pol, P: int, T: int):
    """The :class:`sim.serving.engine.LongDecode` of one request under a token policy: the cache each decode
    step attends over and the eviction scoring seconds (the same schedule as the reasoning workload's
    long decodes)."""
    from sim.replay.mode_token import eviction_schedule
    from sim.cost.terms import eviction_scoring_terms
    from sim.serving.engine import LongDecode
    sizes, events, cands = eviction_schedule(pol, P, P + T)
    window = max(getattr(pol, "window", 0) or pol.buffer, 1)
    ev = {t: float(hw.time(eviction_scoring_terms(model, c, window))) for t, c in zip(events, cands)}
    return LongDecode(P, sizes, ev)


# ------------------------------------------------------------------------------------------- results
def _stats(x, percentiles) -> tuple:
    a = np.asarray(x, np.float64) if len(x) else np.zeros(1)
    return (float(np.mean(a)) * 1000, float(np.median(a)) * 1000, float(np.std(a)) * 1000,
            [(p, float(np.percentile(a, p)) * 1000) for p in percentiles])


def serve_result(r: PlainRun, *, percentiles=(99.0,), metrics=("ttft", "tpot", "itl", "e2el"),
                 request_rate: float = math.inf, burstiness: float = 1.0, max_concurrency: int | None = None,
                 model_id: str = "", num_prompts: int | None = None, detailed: bool = True,
                 extra: dict | None = None, slo=None) -> dict:
    """``vllm bench serve``'s result dictionary (its keys; module docstring) for a simulated run.

    ``slo`` (a :class:`sim.serving.goodput.SLO`): ``request_goodput`` = requests meeting every stated SLO per second
    of the run, vLLM's ``--goodput`` rule (TPOT ``(e2el - ttft) / (output_len - 1)``, 0 for one output token;
    a request is good when each stated latency is <= its SLO); None when no SLO is stated. With replicas,
    ``rksim.per_replica`` holds each replica's requests, throughput, goodput and latency percentiles.

    ``start_times`` are seconds from the benchmark's start (vLLM writes ``perf_counter`` values:
    only differences matter). ``extra`` keys (rksim's provenance) are added under ``"rksim"``.
    """
    wl = r.workload
    n = wl.n
    dur = r.duration
    out_lens = wl.output_lens.tolist()
    tot_in, tot_out = int(wl.input_lens.sum()), int(wl.output_lens.sum())
    tpots = [(e - t) / (o - 1) for e, t, o in zip(r.e2el, r.ttft, out_lens) if o > 1]
    allitl = r.itls.flat() if isinstance(r.itls, ITLs) else [x for it in r.itls for x in it]
    queue = (r.start - r.scheduled).tolist()
    # peak output tokens per whole second and peak concurrency, as calculate_metrics buckets them
    tt = [r.start[i] + r.ttft[i] + np.concatenate([[0.0], np.cumsum(r.itls[i])]) for i in range(n)]
    t0 = float(r.start.min())
    nsec = int(np.ceil(float((r.start + r.e2el).max()) - t0)) + 1
    tok = np.bincount(np.clip((np.concatenate(tt) - t0).astype(np.int64), 0, nsec - 1), minlength=nsec)
    # to the nanosecond: a client slot freed at t and taken again at t (send = start + e2el, summed in floating
    # point in different orders) is one request after the other, not two at once
    ev = sorted([(round(float(s), 9), 1) for s in r.start] + [(round(float(s + e), 9), -1)
                                                              for s, e in zip(r.start, r.e2el)])
    cur = peak = 0
    for _, dlt in ev:
        cur += dlt
        peak = max(peak, cur)
    res = {
        "date": "simulated", "endpoint_type": "rksim", "backend": "rksim", "label": None, "model_id": model_id,
        "tokenizer_id": None, "num_prompts": int(num_prompts if num_prompts is not None else n),
        "request_rate": request_rate if request_rate < math.inf else "inf", "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "duration": dur, "completed": n, "failed": 0, "total_input_tokens": tot_in, "total_output_tokens": tot_out,
        "request_throughput": n / dur, "request_goodput": None, "output_throughput": tot_out / dur,
        "total_token_throughput": (tot_in + tot_out) / dur,
        "input_lens": wl.input_lens.tolist(), "output_lens": out_lens, "ttfts": r.ttft.tolist(),
        "itls": [list(map(float, x)) for x in r.itls] if detailed else None, "latencies": r.e2el.tolist(), "start_times": r.start.tolist(),
        "queue_times": queue, "generated_texts": [""] * n, "errors": [""] * n,
        "max_output_tokens_per_s": float(tok.max()), "max_concurrent_requests": int(peak), "rtfx": 0.0,
    }
    series = {"ttft": r.ttft, "tpot": tpots, "itl": allitl, "e2el": r.e2el}
    for m in metrics:
        if m not in series:
            raise PlainError(f"--percentile-metrics: {m!r} is not one of {', '.join(series)}")
        mean, med, std, pcts = _stats(series[m], percentiles)
        res[f"mean_{m}_ms"], res[f"median_{m}_ms"], res[f"std_{m}_ms"] = mean, med, std
        for p, v in pcts:
            res[f"p{percentile_word(p)}_{m}_ms"] = v
    if not detailed:
        for k in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
            res.pop(k, None)
    from sim.serving.goodput import goodput, tpot
    all_tpot = tpot(r.ttft, r.e2el, out_lens)
    if slo is not None and slo.stated:
        res["request_goodput"] = goodput(slo, r.ttft, all_tpot, r.e2el, dur)["goodput_rps"]
    res["rksim"] = {**r.info, **(extra or {}), "slo": None if slo is None or not slo.stated else str(slo)}
    if r.replica is not None:
        res["rksim"]["per_replica"] = _per_replica(r, all_tpot, slo, percentiles)
    return res


def _per_replica(r: PlainRun, all_tpot, slo, percentiles) -> list:
    """Each replica's requests, request throughput and goodput over the whole run's duration, TTFT / TPOT /
    E2EL mean and percentiles in ms."""
    from sim.serving.goodput import goodput
    out = []
    for k in range(int(r.info["data_parallel_size"])):
        m = r.replica == k
        row = {"replica": k, "completed": int(m.sum()),
               "request_throughput": float(m.sum()) / r.duration if r.duration > 0 else None,
               "request_goodput": (goodput(slo, r.ttft[m], all_tpot[m], r.e2el[m], r.duration)["goodput_rps"]
                                   if slo is not None and slo.stated else None),
               "output_throughput": float(r.workload.output_lens[m].sum()) / r.duration if r.duration > 0 else None}
        for name, x in (("ttft", r.ttft[m]), ("tpot", all_tpot[m][r.workload.output_lens[m] > 1]), ("e2el", r.e2el[m])):
            if m.any():
                mean, med, _, pcts = _stats(x, percentiles)
                row[f"mean_{name}_ms"], row[f"median_{name}_ms"] = mean, med
                for p, v in pcts:
                    row[f"p{percentile_word(p)}_{name}_ms"] = v
        out.append(row)
    return out


def provenance(info: dict, run_stats: bool = True) -> str:
    """One line: which target's costs, under what scheduler, batch and capacity (``run_stats``: and the run's
    preemptions and most sequences running; off for a line that covers several runs)."""
    s = info["scheduler"]
    pol = info.get("token_policy")
    lay = (f" x TP {info['tensor_parallel_size']} x PP {info['pipeline_parallel_size']} on {info['node']}"
           if "tensor_parallel_size" in info else "")
    prec = ", ".join(x for x in ((f"{info['quantization']} weights" if info.get("quantization") else ""),
                                 (f"{info['kv_cache_dtype']} KV cache" if info.get("kv_cache_dtype", "auto") != "auto"
                                  else "")) if x)
    return (f"simulated: model {info['model']}{f' ({prec})' if prec else ''} on {info['hardware']}{lay} "
            f"({info['calibration']}); scheduler "
            f"{s['scheduler']}, max_num_seqs {s['max_num_seqs']}, max_num_batched_tokens "
            f"{s['max_num_batched_tokens']}, KV capacity {info['kv_capacity_blocks']} blocks of "
            f"{info['block_size']} tokens ({info['kv_capacity_bytes'] / 1e9:.2f} GB), prefix caching "
            f"{'on' if info['prefix_caching'] else 'off'}" + (f", token policy {pol}" if pol else "")
            + (f"; {info['data_parallel_size']} replicas behind {info['router']}, each with that capacity"
               if "data_parallel_size" in info else "")
            + overheads_words(info)
            + (f"; SLO {info['slo']}" if info.get("slo") else "")
            + ((f"; {info['preemptions']} preemptions, at most {info['max_running_seqs']} running"
                + (" on one replica" if "data_parallel_size" in info else "")) if run_stats else ""))


def throughput_result(r: PlainRun) -> dict:
    """``vllm bench throughput --output-json``'s keys for a simulated offline run."""
    wl = r.workload
    tot_out = int(wl.output_lens.sum())
    tot = int(wl.input_lens.sum()) + tot_out
    return {"elapsed_time": r.duration, "num_requests": wl.n, "total_num_tokens": tot,
            "requests_per_second": wl.n / r.duration, "tokens_per_second": tot / r.duration,
            "output_tokens_per_second": tot_out / r.duration, "total_output_tokens": tot_out,
            "rksim": dict(r.info)}
