"""The simulator's public API (docs/sim-api.md): ``evaluate``, ``simulate``, ``compare_policies``, ``load_presets``.

``evaluate`` returns plain scalars for sweeps; ``simulate`` returns a
:class:`SimResult` with the per-problem / per-branch DataFrames and the KV
timeline (for the CLI and the HTML report).

The path reads one way: trace → decisions → jobs → engine (or the isolated
fast path) → metrics. Everything memoised lives in a caller-owned
:class:`LoadedTrace` (:func:`loaded`): pass it instead of a path to keep the
memo between calls; a path or a ``traces.store.Trace`` is turned into the one
``LoadedTrace`` of its loaded features.
"""
from __future__ import annotations

import dataclasses
import math
import os
import weakref
from pathlib import Path

import numpy as np
import pandas as pd

from policies import FullAttention, attention_metrics, list_policies, run_token_eviction

from . import features
from .capacity import (MAX_BLOCKS, CapacityError, ServingConfig, capacity_blocks, check_block_budget,
                       check_block_size, check_budget_frac, kv_capacity)
from .cost import batch_terms, eviction_scoring_terms
from .decisions import ConfigError, _fields, decide, job_for, make_config, scale_layers
from .fastpath import FastPath
from .host import host_fields
from .metrics import SUMMARY_KEYS, branch_rows, clean, mark_trace_model_figures, problem_row, summarize
from .profiles import HardwareProfile, ModelShape, load_hardware, load_model, model_from_manifest
from .profiles import load_presets as _load_presets
from .ranges import job_extent
from .scheduler import SchedulerConfig
from .serving_metrics import serving_summary, timelines
from .workload import blocks, probes_for

MODES = ("isolated", "serving")


def default_trace_path() -> Path:
    """The bundled example trace (``examples/trace-gsm8k-persona`` at the repository root)."""
    return Path(__file__).resolve().parent.parent / "examples" / "trace-gsm8k-persona"


def load_presets() -> dict[str, list[str]]:
    """Names of every model and hardware preset (shipped + ``$RKSIM_PRESETS``)."""
    return _load_presets()


# ---------------------------------------------------------------------------- the loaded trace
class LoadedTrace:
    """A trace's features plus every memo the simulator keeps for it (owned by the caller).

    Attributes hold dicts: ``decisions`` (decision key → (decision, job, key)), ``signals``
    (sigma / exit-layer memo of :func:`sim.decisions.decision_key`), ``rows`` (per-problem
    results), ``summaries``, ``baselines``, ``token_quality``, ``token_sizes``, ``full_attention``,
    ``range_ok``; plus the trace model's shape, the fast paths and target ids per cost target.
    """

    def __init__(self, tf):
        self.tf = tf
        self.trace_model = None
        self.clear()

    def clear(self) -> None:
        self.decisions, self.signals, self.rows, self.summaries, self.baselines = {}, {}, {}, {}, {}
        self.token_quality, self.token_sizes, self.full_attention, self.range_ok = {}, {}, {}, {}
        self.fastpaths, self.target_ids = {}, {}

    @property
    def trace(self):
        return self.tf.trace

    @property
    def path(self):
        return self.tf.path


_LOADED: "weakref.WeakSet[LoadedTrace]" = weakref.WeakSet()


def loaded(trace) -> LoadedTrace:
    """The :class:`LoadedTrace` of a path, a ``traces.store.Trace``, features or a ``LoadedTrace``."""
    if isinstance(trace, LoadedTrace):
        return trace
    if trace is None:
        trace = default_trace_path()
    tf = trace if isinstance(trace, features.TraceFeatures) else features.load(trace)
    lt = tf.__dict__.get("_loaded")
    if lt is None:
        lt = tf.__dict__["_loaded"] = LoadedTrace(tf)
        _LOADED.add(lt)
    return lt


def _loaded(trace, reshape=None) -> LoadedTrace:
    """:func:`loaded` of ``trace`` (default: the bundled one), reshaped by ``reshape`` if given (sim/reshape.py)."""
    lt = loaded(default_trace_path() if trace is None else trace)
    if reshape is None:
        return lt
    from .reshape import reshape_trace
    return loaded(reshape_trace(lt.tf, reshape).features)


def _reshape_info(tf) -> dict | None:
    from .reshape import describe
    return describe(tf)


def _reshape_fields(tf) -> dict:
    """Summary scalars saying whether, and from what, the replayed problems were reshaped."""
    r = _reshape_info(tf)
    return {"reshaped": r is not None, "reshape_spec": r["spec"] if r else None,
            "reshape_source": r["source"] if r else None}


_PRESET_CACHE: dict = {}


def clear_caches() -> None:
    """Forget every memoised decision, job result and summary (the trace features stay loaded)."""
    _PRESET_CACHE.clear()
    for lt in list(_LOADED):
        lt.clear()


def _cached_preset(kind: str, name) -> object:
    key = (kind, str(name))
    path = str(name)
    mtime = None
    if path.endswith((".yaml", ".yml", ".json")) or os.sep in path:
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            mtime = None
    hit = _PRESET_CACHE.get(key)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    obj = load_model(name) if kind == "model" else load_hardware(name)
    _PRESET_CACHE[key] = (mtime, obj)
    return obj


def _hw_key(hw: HardwareProfile) -> tuple:
    return (hw.name, hw.source, hw.peak_flops, hw.mem_bw, hw.mem_capacity, hw.eff_c, hw.eff_m,
            hw.per_kernel_s, hw.per_layer_s)


def _fastpath(lt: LoadedTrace, model: ModelShape, hw: HardwareProfile) -> FastPath:
    key = (model, _hw_key(hw))
    fp = lt.fastpaths.get(key)
    if fp is None:
        fp = lt.fastpaths[key] = FastPath(model, hw)
    return fp


def _freeze(d) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in (d or {}).items()))


def _wl_key(cfg) -> tuple:
    """``_freeze(cfg.workload)``, computed once per config."""
    k = cfg.__dict__.get("_wl_key")
    if k is None:
        k = cfg.__dict__["_wl_key"] = _freeze(cfg.workload)
    return k


def _target_id(lt: LoadedTrace, model: ModelShape, hw: HardwareProfile) -> int:
    """A small int standing for ``(model, _hw_key(hw))`` in per-problem memo keys (hashing the
    model's dataclass for every problem of every configuration was a visible cost)."""
    key = (model, _hw_key(hw))
    t = lt.target_ids.get(key)
    if t is None:
        t = lt.target_ids[key] = len(lt.target_ids)
    return t


def _clean_flat(d: dict) -> dict:
    """:func:`sim.metrics.clean` of a flat dict of scalars, with a fast lane for plain values."""
    out = {}
    for k, v in d.items():
        t = type(v)
        if t is float:
            out[k] = v if math.isfinite(v) else None
        elif v is None or t is int or t is bool or t is str:
            out[k] = v
        else:
            out[k] = clean(v)
    return out


# ---------------------------------------------------------------------------- result
class SimResult:
    """Everything one simulation produced (DataFrames built on first access)."""

    def __init__(self, summary: dict, rows: list, brows: list, timeline: list, info: dict, token=None):
        self.summary, self.info, self.token = summary, info, token
        self._rows, self._brows, self._timeline = rows, brows, timeline
        self._cache: dict = {}

    @property
    def problems(self) -> pd.DataFrame:
        """One row per problem (latency and phases, reuse, decisions, accuracy, ...)."""
        if "p" not in self._cache:
            self._cache["p"] = pd.DataFrame(self._rows)
        return self._cache["p"]

    @property
    def branches(self) -> pd.DataFrame:
        """One row per (problem, branch): sigma, shared, exit layer, selected."""
        if "b" not in self._cache:
            self._cache["b"] = pd.DataFrame(self._brows)
        return self._cache["b"]

    @property
    def kv_timeline(self) -> pd.DataFrame:
        """KV bytes after every iteration (``pos`` = problem; -1 = the whole server in serving mode)."""
        if "t" not in self._cache:
            parts = [pd.DataFrame({"pos": p, "t_s": t, "kv_bytes": b}) for p, t, b in self._timeline]
            self._cache["t"] = (pd.concat(parts, ignore_index=True) if parts
                                else pd.DataFrame(columns=["pos", "t_s", "kv_bytes"]))
        return self._cache["t"]

    @property
    def aggregate(self) -> pd.DataFrame:
        """The summary as a one-row DataFrame (index: the policy)."""
        return pd.DataFrame([clean(self.summary)], index=[self.info.get("policy", "")])

    def to_json_dict(self) -> dict:
        """The summary's keys, ``info``, and (serving) ``timeline``: KV bytes and running sequences over time."""
        out = {**self.summary, "info": {k: v for k, v in self.info.items() if k != "timeline"}}
        if "timeline" in self.info:
            out["timeline"] = self.info["timeline"]
        return clean(out)


def _targets(lt: LoadedTrace, model_preset, hardware):
    lt = loaded(lt)
    trace_model = lt.trace_model
    if trace_model is None:
        trace_model = lt.trace_model = model_from_manifest(lt.tf.manifest)
    if model_preset is None:
        model = trace_model
    elif isinstance(model_preset, ModelShape):
        model = model_preset
    else:
        model = _cached_preset("model", model_preset)
    hw = hardware if isinstance(hardware, HardwareProfile) else _cached_preset("hardware", hardware)
    return trace_model, model, hw


def _select(tf, problems) -> list:
    if problems is None:
        return tf.problems
    out = []
    n = len(tf.problems)
    for p in problems:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= int(p) < n:
            raise ConfigError(f"problems: {p!r} is not a problem position in 0..{n - 1}")
        out.append(tf.problems[int(p)])
    return out


def _scale_job(job, L_trace: int, L_target: int, l_min):
    """Map exit layers recorded on the trace's model onto the target's depth (same fraction of depth)."""
    if L_trace == L_target:
        job.L = L_target
        return job
    job.v_layers = scale_layers(job.v_layers, L_trace, L_target)
    job.v_head = (job.v_layers == L_target).astype(np.int64)
    if l_min is not None:
        job.v_probes = probes_for(job.v_layers, L_target, int(math.ceil(l_min * L_target / L_trace)))
    job.L = L_target
    return job


def _decisions(lt: LoadedTrace, cfg, probs, L_target: int):
    """(ProblemDecision, Job) per problem, memoised per distinct decision (see ``decision_key``)."""
    from .decisions import bind_vocab, decision_key, in_target_units, prefetch_exits, static_key
    lt = loaded(lt)
    tf = lt.tf
    bind_vocab(cfg, tf.vocab_size)  # CGEE theta as a fraction of ln V: the trace model's V
    sig_cache = lt.signals
    wl = (_wl_key(cfg), L_target)
    static = static_key(cfg)
    if cfg.exit is not None:
        prefetch_exits(probs, cfg, sig_cache, static)
    scaled = tf.n_layers != L_target
    out = []
    for f in probs:
        key = (decision_key(f, cfg, sig_cache, static, scaled),) + wl
        hit = lt.decisions.get(key)
        if hit is None:
            dec = decide(f, cfg)
            job = _scale_job(job_for(f, cfg, dec, tf.n_layers), tf.n_layers, L_target,
                             getattr(cfg.exit, "l_min", None))
            dec = in_target_units(dec, tf.n_layers, L_target)  # exit layers as the job runs them
            hit = lt.decisions[key] = (dec, job, key)
        out.append(hit)
    return out


def _check_range(lt: LoadedTrace, hw, model, jobs, batch_items: int, allow_extrapolation: bool = False,
                 tokens: int = 0, mixed: bool = False) -> list:
    # Jobs are memoised objects (held by lt.decisions): the same jobs on the same target pass again.
    okey = (tuple(id(j) for _, j in jobs), id(hw), id(model), batch_items, allow_extrapolation, tokens, mixed)
    if okey in lt.range_ok:
        return lt.range_ok[okey][3]
    max_ctx = max_new = 0
    for _, j in jobs:
        if not j.B:
            continue
        rng = j.__dict__.get("_range")
        if rng is None:
            rng = j.__dict__["_range"] = (
                max(int((j.ctx + j.gen).max()), int((j.v_cached + j.v_new).max()) if j.verify_on else 0),
                max(int(j.computed.max()), int(j.gate.max()), int(j.v_new.max()) if j.verify_on else 0))
        max_ctx, max_new = max(max_ctx, rng[0]), max(max_new, rng[1])
    marks = hw.check_query(model, max_context=max_ctx, max_new=max_new, max_batch=batch_items,
                           tokens=tokens, mixed=mixed, allow_extrapolation=allow_extrapolation)
    lt.range_ok[okey] = (hw, model, [j for _, j in jobs], marks)  # kept alive so the ids in the key stay theirs
    return marks


def _user_budget(cfg, params, workload) -> tuple:
    """The block budget the user asked for: ``("blocks", n)``, ``("frac", f)`` or ``None`` (the device's capacity)."""
    params, workload = params or {}, workload or {}
    if cfg.budget_blocks is not None:
        return ("blocks", check_block_budget(f"policy {cfg.policy!r}: budget_blocks" if "budget_blocks" in params else
                                             "workload option 'kv_budget_blocks'", cfg.budget_blocks))
    if "budget_frac" in params or "kv_budget_frac" in workload:
        return ("frac", check_budget_frac(f"policy {cfg.policy!r}: budget_frac" if "budget_frac" in params else
                                          "workload option 'kv_budget_frac'", cfg.budget_frac))
    return None


def _capacity_info(model, hw, sv: ServingConfig, sched_cfg, bs: int) -> dict:
    cap = kv_capacity(model, hw, sv)
    cap["kv_capacity_blocks"] = capacity_blocks(cap["kv_capacity_bytes"], bs, model.kv_bytes_per_token)
    cap["block_size"] = int(bs)
    cap["scheduler"] = sched_cfg.to_dict()
    return cap


def _refuse_if_too_big(peaks, positions, cap: dict, model, hw, what: str = "problem") -> None:
    """Isolated mode: a problem whose KV peak exceeds the capacity is refused, saying by how much."""
    kvcap = cap["kv_capacity_bytes"]
    for pos, peak in zip(positions, peaks):
        if peak > kvcap:
            raise CapacityError(
                f"{what} {pos}: needs {peak / 1e9:.3f} GB of KV at its peak but {model.name} on {hw.name} has "
                f"{kvcap / 1e9:.3f} GB of KV capacity ("
                + ("given" if cap["capacity_source"].startswith("given") else
                   f"{cap['mem_capacity_bytes'] / 1e9:.3f} GB x {cap['gpu_memory_utilization']:g} - "
                   f"{cap['weight_bytes'] / 1e9:.3f} GB weights - {cap['activation_reserve_bytes'] / 1e9:.3f} GB "
                   f"activation reserve") + f"): {(peak - kvcap) / 1e9:.3f} GB "
                f"short (use --mode serving to queue, a smaller model, or a larger --gpu-memory-utilization)")


def simulate(trace=None, policy: str = "exact-prefix", params: dict | None = None, model_preset=None,
             hardware="local-cpu", mode: str = "isolated", problems=None, workload: dict | None = None,
             seed: int = 0, arrival_rate: float | None = None, baselines: bool = True,
             engine: bool = False, serving=None, reshape=None, strict: bool = False,
             allow_extrapolation: bool = False) -> SimResult:
    """Simulate one configuration; see :func:`evaluate` for the arguments.

    ``strict``: refuse a profile fitted on another host (:func:`sim.host.host_status`) instead of
    noting it; ``allow_extrapolation``: price queries outside the fitted range, marked in
    ``info["extrapolated"]`` (:mod:`sim.ranges`).

    ``engine=True`` forces the simpy engine in isolated mode too (the fast path
    and the engine agree to 1e-9; the tests check it). ``serving``: a
    :class:`sim.capacity.ServingConfig` or dict (scheduler, max_num_seqs,
    max_num_batched_tokens, gpu_memory_utilization, activation_reserve_bytes,
    kv_capacity_bytes, decode_tokens, prefix_caching).
    """
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if arrival_rate is not None and (isinstance(arrival_rate, bool) or not isinstance(arrival_rate, (int, float))
                                     or not arrival_rate > 0 or not math.isfinite(arrival_rate)):
        raise ConfigError(f"arrival_rate: must be a number > 0, got {arrival_rate!r}")
    if arrival_rate is not None and mode != "serving":
        raise ConfigError("arrival_rate: only meaningful with mode='serving'")
    sv = ServingConfig.from_any(serving)
    lt = _loaded(trace, reshape)
    tf = lt.tf
    trace_model, model, hw = _targets(lt, model_preset, hardware)
    cfg = make_config(policy, params, workload)
    if mode == "serving" and cfg.workload["batching"] == "static":
        raise ConfigError("workload option 'batching': static pads one problem's branches into one batch "
                          "(the real module's eager runs) and is only defined in isolated mode; serving mode "
                          "is continuous batching")
    bs = check_block_size("workload option 'block_size'", cfg.workload["block_size"])
    ubudget = _user_budget(cfg, params, workload) if cfg.block is not None else None
    probs = _select(tf, problems)
    sched_cfg = sv.scheduler_config(hw.name) if mode == "serving" else ISOLATED_SCHEDULER
    fitted_batch = (hw.fitted_range or {}).get("max_batch")
    if mode == "serving" and fitted_batch is not None and sched_cfg.max_num_seqs > int(fitted_batch):
        # a calibrated profile answers batches up to its fitted size: larger batches wait (queue), never fail
        sched_cfg = dataclasses.replace(sched_cfg, max_num_seqs=int(fitted_batch))
    cap = _capacity_info(model, hw, sv, sched_cfg, bs)
    info = {"policy": policy, "params": dict(params or {}), "components": cfg.describe(),
            "decisions_model": tf.model_name, "cost_model": model.name, "hardware": hw.name,
            **host_fields(hw, strict),   # sim.host: is the profile this host's? (one-line note if not)
            "hardware_provisional": bool(getattr(hw, "provisional", False)),
            "mode": mode, "verify_reuses_kv": bool(cfg.workload["verify_reuses_kv"]),
            "workload": {k: v for k, v in cfg.workload.items()}, "seed": int(seed),
            "arrival_rate": arrival_rate, "trace": tf.path, "reshape": _reshape_info(tf),
            "kv_capacity_bytes": cap["kv_capacity_bytes"], "capacity_source": cap["capacity_source"],
            "capacity": cap, "scheduler": sched_cfg.to_dict(),
            "note": (f"decisions from the trace's model {tf.model_name}; costs from {model.name} on {hw.name}"
                     if model.name != tf.model_name else f"decisions and costs from {model.name} on {hw.name}")}
    if cfg.kind == "token":
        return _simulate_token(lt, cfg, model, hw, seed, info, mode=mode, sv=sv, cap=cap, sched_cfg=sched_cfg,
                               arrival_rate=arrival_rate)
    L = model.n_layers
    triples = _decisions(lt, cfg, probs, L)
    jobs = [(f.pos, job) for f, (_, job, _) in zip(probs, triples)]
    # Serving mode: the batch an iteration reaches is only known while it runs; the engine checks it.
    info["extrapolated"] = _check_range(lt, hw, model, jobs, max((j.B for _, j in jobs), default=0),
                                        allow_extrapolation, *job_extent([j for _, j in jobs], mode,
                                                                         sched_cfg.max_num_batched_tokens))
    rows, brows, timeline = [], [], []
    makespan = peak = None
    extra: dict = {}
    fast = mode == "isolated" and not engine and cfg.block is None
    if fast:
        fp = _fastpath(lt, model, hw)
        hk = _target_id(lt, model, hw)
        for f, (dec, job, dkey) in zip(probs, triples):
            rkey = (dkey, hk)
            hit = lt.rows.get(rkey)
            if hit is None:
                res = fp.run(job)
                hit = lt.rows[rkey] = (problem_row(f, dec, res, L), branch_rows(f, dec, L), res)
            row, br, res = hit
            rows.append(row)
            brows.extend(br)
            timeline.append((f.pos, res["kv_times"], res["kv_bytes"]))
        _refuse_if_too_big([r["peak_kv_bytes"] for r in rows], [f.pos for f in probs], cap, model, hw)
        info["kv_budget_blocks"] = None
    elif mode == "isolated":
        fp = _fastpath(lt, model, hw)
        for f, (dec, job, dkey) in zip(probs, triples):
            unc = fp.run(job)
            if cfg.block is None:
                _refuse_if_too_big([unc["peak_kv_bytes"]], [f.pos], cap, model, hw)
            budget = _isolated_budget(ubudget, job, cap)
            rkey = ("engine", dkey, _target_id(lt, model, hw), budget, _block_key(cfg))
            hit = lt.rows.get(rkey)
            if hit is None:
                eng = _make_engine(lt, cfg, model, hw, [(f.pos, job)], [f], [dec], ISOLATED_SCHEDULER, budget,
                                   concurrency=1, arrival_rate=None, seed=seed, per_problem=True)
                res = eng.run()
                r = res.records()[0]
                r["evictions"] = int(res.kv.evictions)
                r["preemptions"] = int(res.stats["preemptions"])
                hit = lt.rows[rkey] = (problem_row(f, dec, r, L), branch_rows(f, dec, L), r)
            row, br, r = hit
            rows.append(row)
            brows.extend(br)
            timeline.append((f.pos, r["kv_times"], r["kv_bytes"]))
        info["kv_budget_blocks"] = (None if ubudget is None and cfg.block is None else
                                    "per problem" if ubudget is not None and ubudget[0] == "frac"
                                    else _isolated_budget(ubudget, None, cap))
    else:
        budget = _serving_budget(ubudget, cap)
        res_list, res = _run_engine(lt, cfg, model, hw, probs, triples, seed, arrival_rate, sched_cfg, budget,
                                    caching=sv.prefix_caching)
        for r in res_list:
            f = tf.problems[r["pos"]]
            dec = triples[r["pseq"] % len(triples)][0]
            rows.append(problem_row(f, dec, r, L))
            brows.extend(branch_rows(f, dec, L))
        timeline.append((-1, res.timeline_t, res.timeline_b))
        makespan = res.makespan
        peak = float(res.timeline_b.max()) if res.timeline_b.size else 0.0
        extra = serving_summary(res_list, res, cap, budget)
        info["kv_budget_blocks"] = budget
        info["timeline"] = timelines(res)
    if fast:
        # Rows are memoised objects: the same rows (by identity) give the same summary.
        skey = (tuple(map(id, rows)), cfg.exit is not None, getattr(cfg.sharing, "name", ""), L)
        summary = lt.summaries.get(skey)
        if summary is None:
            summary = lt.summaries[skey] = (summarize(rows, brows, cfg=cfg, L=L), rows)
        summary = dict(summary[0])
    else:
        summary = summarize(rows, brows, cfg=cfg, L=L, makespan=makespan, peak_kv_bytes=peak)
    summary.update(extra)
    if baselines:
        base = {}
        for name in ("no-kv", "exact-prefix"):
            base[name] = _baseline_latency(lt, name, model, hw, mode, problems, cfg.workload, seed, arrival_rate,
                                           wl_key=_wl_key(cfg), serving=sv, allow_extrapolation=allow_extrapolation)
        lat = summary["latency_mean_s"]
        summary["speedup_vs_no_kv"] = base["no-kv"] / lat if lat and lat > 0 else None
        summary["speedup_vs_exact_prefix"] = base["exact-prefix"] / lat if lat and lat > 0 else None
    summary.update({"decisions_model": tf.model_name, "cost_model": model.name, "hardware": hw.name,
                    "mode": mode, "verify_reuses_kv": bool(cfg.workload["verify_reuses_kv"]), **_reshape_fields(tf),
                    "kv_capacity_bytes": cap["kv_capacity_bytes"], "capacity_source": cap["capacity_source"],
                    "hardware_calibrated": info["hardware_calibrated"],
                    "kv_budget_blocks": info["kv_budget_blocks"] if isinstance(info["kv_budget_blocks"], int) else None,
                    **{k: v for k, v in sched_cfg.to_dict().items() if k != "long_prefill_token_threshold"}})
    mark_trace_model_figures(summary)
    return SimResult(summary, rows, brows, timeline, info)


ISOLATED_SCHEDULER = SchedulerConfig(max_num_seqs=1 << 20, max_num_batched_tokens=1 << 24, policy="prefill-first")


def _block_key(cfg) -> tuple | None:
    return (cfg.block.name, _freeze(_fields(cfg.block))) if cfg.block is not None else None


def _isolated_budget(ubudget, job, cap) -> int:
    """Blocks of one isolated problem: the user's count, their fraction of the problem's unconstrained peak
    blocks, else the device's KV capacity in blocks."""
    if ubudget is None:
        return int(cap["kv_capacity_blocks"])
    if ubudget[0] == "blocks":
        return int(ubudget[1])
    if job is None:
        return -1
    peak = float(job.peak_blocks())
    return int(min(math.ceil(ubudget[1] * peak), MAX_BLOCKS))


def _serving_budget(ubudget, cap) -> int:
    """Blocks of the server: the user's count, their fraction of the device's KV capacity, else the capacity."""
    if ubudget is None:
        return int(cap["kv_capacity_blocks"])
    if ubudget[0] == "blocks":
        return int(ubudget[1])
    return int(min(math.ceil(ubudget[1] * cap["kv_capacity_blocks"]), MAX_BLOCKS))


def _kv_ids(f, dec) -> list:
    """Token ids each branch's KV holds: its own prompt, or its root's when ASKS shares the root's KV."""
    out = []
    for b in range(f.B):
        src = b
        plan = dec.plan
        while bool(np.asarray(plan.share_root)[src]) and int(np.asarray(plan.source)[src]) >= 0 \
                and int(np.asarray(plan.source)[src]) != src:
            src = int(np.asarray(plan.source)[src])
        out.append(np.asarray(f.prompt_ids[src], np.int64))
    return out


def _make_engine(lt, cfg, model, hw, jobs, feats, decs, sched_cfg, budget, *, concurrency, arrival_rate, seed,
                 per_problem=False, caching=True):
    from .engine import SCORE_AT, Engine
    return Engine(model, hw, jobs, concurrency=concurrency, arrival_rate=arrival_rate, seed=seed,
                  scheduler=sched_cfg, kv_blocks=budget, block_policy=cfg.block,
                  caching=caching and not cfg.no_kv, prompt_ids=[_kv_ids(f, d) for f, d in zip(feats, decs)],
                  score_at=SCORE_AT[cfg.workload["score"]], max_batch=(hw.fitted_range or {}).get("max_batch"),
                  hw_name=hw.name, per_problem_timeline=per_problem)


def _run_engine(lt, cfg, model, hw, probs, triples, seed, arrival_rate, sched_cfg, budget, caching=True):
    jobs = [(f.pos, job) for f, (_, job, _) in zip(probs, triples)]
    feats, decs = list(probs), [d for d, _, _ in triples]
    n_req = cfg.workload.get("n_requests")
    if n_req is not None:
        if isinstance(n_req, bool) or not isinstance(n_req, (int, np.integer)) or not 1 <= n_req <= 10_000_000:
            raise ConfigError(f"workload option 'n_requests' must be an integer in 1..10000000, got {n_req!r}")
        idx = [i % len(jobs) for i in range(int(n_req))]
        jobs, feats, decs = [jobs[i] for i in idx], [feats[i] for i in idx], [decs[i] for i in idx]
    eng = _make_engine(lt, cfg, model, hw, jobs, feats, decs, sched_cfg, budget,
                       concurrency=int(cfg.workload["concurrency"]), arrival_rate=arrival_rate, seed=seed,
                       caching=caching)
    res = eng.run()
    recs = res.records()
    # One pool for all problems: report its evictions once (on the first record).
    if recs:
        recs[0]["evictions"] = int(res.kv.evictions)
    return recs, res


def _baseline_latency(lt, name, model, hw, mode, problems, workload, seed, arrival_rate, wl_key=None,
                      serving=None, allow_extrapolation: bool = False) -> float:
    wl = {k: v for k, v in workload.items()}
    key = (name, _target_id(lt, model, hw), mode, None if problems is None else tuple(int(p) for p in problems),
           _freeze(wl) if wl_key is None else wl_key, seed, arrival_rate, repr(serving), allow_extrapolation)
    hit = lt.baselines.get(key)
    if hit is None:
        r = simulate(lt, policy=name, params={}, model_preset=model,
                     hardware=hw, mode=mode, problems=problems, workload=wl, seed=seed,
                     arrival_rate=arrival_rate, baselines=False, serving=serving,
                     allow_extrapolation=allow_extrapolation)
        hit = lt.baselines[key] = r.summary["latency_mean_s"]
    return hit


# ---------------------------------------------------------------------------- token eviction
def _long_arrays(ld, li: int):
    return (np.asarray(ld.K[li], dtype=np.float64), np.asarray(ld.V[li], dtype=np.float64),
            np.asarray(ld.Q[li], dtype=np.float64))


def _pol_key(pol) -> tuple:
    return (pol.name, _freeze(dataclasses.asdict(pol)))


def token_quality(tf, pol, seed: int, max_layers=None) -> pd.DataFrame:
    """Attention-output error and mass recall of a token policy on every recorded (sequence, layer).

    Independent of the cost target: memoised per (trace, policy parameters, seed) on the
    :class:`LoadedTrace`.
    """
    lt = loaded(tf)
    key = (_pol_key(pol), int(seed), max_layers)
    hit = lt.token_quality.get(key)
    if hit is None:
        hit = lt.token_quality[key] = _token_quality(lt, pol, seed, max_layers)
    return hit


def _token_quality(lt, pol, seed: int, max_layers=None) -> pd.DataFrame:
    # One BLAS thread: the matmuls of the attention metrics then reduce in a fixed order, so the
    # same inputs give bit-identical numbers whatever the machine's thread count (and spinning
    # BLAS threads only burn CPU on a shared machine).
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):
        return _token_quality_rows(lt, pol, seed, max_layers)


def _token_quality_rows(lt, pol, seed: int, max_layers=None) -> pd.DataFrame:
    rows = []
    for ld in lt.tf.longs:
        n_lay = len(ld.layers) if max_layers is None else min(len(ld.layers), int(max_layers))
        for li in range(n_lay):
            K, V, Q = _long_arrays(ld, li)
            fkey = (ld.pos, li)
            full = lt.full_attention.get(fkey)
            if full is None:
                full = lt.full_attention[fkey] = FullAttention(K, V, Q, ld.prompt_len)
            rng = np.random.default_rng([int(seed), ld.pos, li])
            res = run_token_eviction(pol, K, V, Q, ld.prompt_len, rng, record=True)
            met = attention_metrics(res, full=full)
            sizes = np.asarray(res.cache_sizes(), dtype=np.float64)
            rows.append({"seq": ld.pos, "layer": int(ld.layers[li]), "T": int(K.shape[0]),
                         "prompt_len": ld.prompt_len, "evictions": res.n_evictions,
                         "attn_output_rel_error": met["attn_output_rel_error"],
                         "attn_mass_recall": met["attn_mass_recall"],
                         "mean_cache_tokens": float(np.mean(sizes)) if sizes.size else float("nan")})
    return pd.DataFrame(rows)


def eviction_schedule(pol, P: int, T: int) -> tuple[np.ndarray, list, list]:
    """The cache a token policy keeps over positions ``P..T-1``, from its schedule alone.

    Returns ``(sizes, events, candidates)``: ``sizes[i]`` = keys the query at ``P + i`` attends
    over; ``events`` = eviction positions; ``candidates`` = cache length minus the recent buffer at
    each (what the eviction scores). Same arithmetic as ``policies.run_token_eviction`` (which
    checks every ``buffer`` steps: at ``t`` with ``cache_len`` tokens after appending ``t``,
    ``pol.should_evict(cache_len, t - P + 1)`` cuts the candidates to ``budget``), so it equals
    ``EvictionResult.cache_sizes()`` of a run on recorded tensors and extends it past their length.
    """
    B = int(pol.buffer)
    events, cands = [], []
    n, last = P, P - 1
    if pol.evicts:
        for t in range(P - 1 + B, T, B):
            n += t - last
            last = t
            if pol.should_evict(n, t - P + 1):
                events.append(t)
                cands.append(n - B)
                n = int(pol.budget) + B
    t = np.arange(P, T)
    sizes = t + 1
    if events:
        ev = np.asarray(events)
        i = np.searchsorted(ev, t, side="right") - 1
        after = i >= 0
        sizes[after] = int(pol.budget) + B + (t[after] - ev[i[after]])
    return sizes.astype(np.int64), events, cands


def _long_latency(model, hw, P: int, sizes: np.ndarray, cands: list, window: int) -> dict:
    """One long decode alone: prefill of P tokens, then one decode step per token over its (evicted) cache."""
    pre = float(hw.time(batch_terms(model, [float(P)], [0.0])))
    ctx = np.asarray(sizes, np.float64) - 1.0  # cached tokens before each step
    dec = float(np.sum(hw.time(batch_terms(model, np.ones((ctx.size, 1)), ctx[:, None])))) if ctx.size else 0.0
    ev = float(sum(float(hw.time(eviction_scoring_terms(model, c, max(window, 1)))) for c in cands))
    return {"prefill_s": pre, "decode_s": dec, "evict_s": ev, "latency_s": pre + dec + ev}


def _decode_len(ld, sv: ServingConfig) -> int:
    return int(sv.decode_tokens) if sv.decode_tokens is not None else int(ld.gen_len)


def _simulate_token(lt, cfg, model, hw, seed, info, *, mode, sv, cap, sched_cfg, arrival_rate) -> SimResult:
    tf = lt.tf
    if not tf.longs:
        raise ConfigError(f"policy {cfg.policy!r}: the trace {tf.path} has no long-decode sequences (long/)")
    pol = cfg.token
    from policies import get_policy
    full_pol = get_policy("full")
    q = token_quality(lt, pol, seed, cfg.workload.get("max_long_layers"))
    # longer than recorded: the policy's steady state is held past the trace (quality stays the recorded one's)
    extrapolated = sv.decode_tokens is not None and any(sv.decode_tokens > ld.gen_len for ld in tf.longs)
    max_ctx = max(int(ld.prompt_len + _decode_len(ld, sv)) for ld in tf.longs)
    hw.check_query(model, max_context=max_ctx, max_new=max(int(ld.prompt_len) for ld in tf.longs), max_batch=1)
    window = getattr(pol, "window", 0) or pol.buffer
    rows, longs = [], {}
    for ld in tf.longs:
        T = ld.prompt_len + _decode_len(ld, sv)
        sizes, events, cands = eviction_schedule(pol, ld.prompt_len, T)
        lat = _long_latency(model, hw, ld.prompt_len, sizes, cands, window)
        full_sizes = np.arange(ld.prompt_len, T, dtype=np.int64) + 1  # full cache: every token so far
        flat = _long_latency(model, hw, ld.prompt_len, full_sizes, [], 1)
        peak_tok = max(int(sizes.max()) if sizes.size else 0, ld.prompt_len)
        rows.append({"pos": ld.pos, "latency_s": lat["latency_s"], "prefill_s": lat["prefill_s"],
                     "decode_s": lat["decode_s"], "evict_s": lat["evict_s"], "full_latency_s": flat["latency_s"],
                     "evictions": len(events), "gen_tokens": T - ld.prompt_len,
                     "peak_kv_bytes": float(peak_tok) * model.kv_bytes_per_token})
        ev_s = {t: float(hw.time(eviction_scoring_terms(model, c, max(window, 1)))) for t, c in zip(events, cands)}
        longs[ld.pos] = (ld.prompt_len, T, sizes, ev_s, full_sizes)
    df = pd.DataFrame(rows)
    if mode == "isolated":
        _refuse_if_too_big(df["peak_kv_bytes"].tolist(), df["pos"].tolist(), cap, model, hw, what="long decode")
    lat = df["latency_s"].to_numpy()
    summary = {k: None for k in SUMMARY_KEYS}
    summary.update({
        "latency_mean_s": float(lat.mean()), "latency_p50_s": float(np.percentile(lat, 50)),
        "latency_p95_s": float(np.percentile(lat, 95)),
        "speedup_vs_full": float(df["full_latency_s"].mean() / lat.mean()),
        "peak_kv_bytes": float(df["peak_kv_bytes"].max()), "evictions": int(df["evictions"].sum()),
        "recompute_tokens": 0, "kv_reuse": None, "mean_exit_layer": None, "accuracy": None,
        "attn_output_rel_error": float(q["attn_output_rel_error"].mean()) if len(q) else None,
        "attn_mass_recall": float(q["attn_mass_recall"].mean()) if len(q) else None,
        "budget": int(pol.budget), "buffer": int(pol.buffer),
        "throughput_tokens_per_s": float(df["gen_tokens"].sum() / lat.sum()),
        "n_sequences": len(df), "n_layers_evaluated": len(q),
        "decisions_model": tf.model_name, "cost_model": model.name, "hardware": hw.name, "mode": mode,
        "verify_reuses_kv": None, "length_extrapolated": bool(extrapolated), **_reshape_fields(tf),
        "decode_tokens": sv.decode_tokens, "kv_capacity_bytes": cap["kv_capacity_bytes"],
        "capacity_source": cap["capacity_source"], "hardware_calibrated": info["hardware_calibrated"],
        "kv_cap_tokens_per_sequence": int(max(max(int(longs[p][2].max()) if longs[p][2].size else 0, longs[p][0])
                                              for p in longs)),
        **{k: v for k, v in sched_cfg.to_dict().items() if k != "long_prefill_token_threshold"},
    })
    info["length_extrapolated"] = bool(extrapolated)
    timeline = []
    if mode == "serving":
        serve = _serve_longs(lt, cfg, model, hw, longs, sched_cfg, cap, seed, arrival_rate, token=True)
        full = _serve_longs(lt, cfg, model, hw, longs, sched_cfg, cap, seed, arrival_rate, token=False)
        summary.update({k: v for k, v in serve["summary"].items() if k != "length_extrapolated"})
        summary["throughput_vs_full"] = (serve["summary"]["throughput_tokens_per_s"]
                                         / full["summary"]["throughput_tokens_per_s"]
                                         if full["summary"]["throughput_tokens_per_s"] else None)
        summary["full_cache_max_running_seqs"] = full["summary"]["max_running_seqs"]
        summary["full_cache_mean_running_seqs"] = full["summary"]["mean_running_seqs"]
        summary["full_cache_throughput_tokens_per_s"] = full["summary"]["throughput_tokens_per_s"]
        summary["latency_mean_s"] = serve["summary"]["e2e_mean_s"]
        info["timeline"] = serve["timeline"]
        info["kv_budget_blocks"] = serve["budget"]
        timeline.append((-1, serve["res"].timeline_t, serve["res"].timeline_b))
    mark_trace_model_figures(summary)
    return SimResult(summary, rows, [], timeline, info, token=q)


def _long_job(P: int, T: int, L: int, bs: int):
    from .workload import Job
    z = np.zeros(1, np.int64)
    return Job(B=1, L=L, bs=bs, reused=z, computed=np.array([P]), copy=z, gate=z, source=np.array([-1]),
               share=np.zeros(1, bool), ctx=np.array([P]), gen=np.array([T - P + 1]), own=np.array([P]),
               verify_on=False, v_new=z, v_cached=z, v_layers=np.array([L]), v_probes=z, v_head=np.ones(1, np.int64),
               v_kv_tokens=z, v_reuse=False, score=np.zeros(1))


def _serve_longs(lt, cfg, model, hw, longs: dict, sched_cfg, cap, seed, arrival_rate, token: bool) -> dict:
    """Serve the long decodes (``n_requests`` of them, cycling) under the token policy (``token``) or full cache."""
    from .engine import Engine, LongDecode
    bs = int(cfg.workload["block_size"])
    order = sorted(longs)
    n_req = cfg.workload.get("n_requests") or len(order)
    if isinstance(n_req, bool) or not isinstance(n_req, (int, np.integer)) or not 1 <= n_req <= 10_000_000:
        raise ConfigError(f"workload option 'n_requests' must be an integer in 1..10000000, got {n_req!r}")
    jobs = []
    for i in range(int(n_req)):
        pos = order[i % len(order)]
        P, T, sizes, ev_s, full_sizes = longs[pos]
        job = _long_job(P, T, model.n_layers, bs)
        # the step computing position t (the decode's t - P + 1-th) attends over sizes[t - P] keys
        job.__dict__["_long"] = LongDecode(P, sizes, ev_s) if token else LongDecode(P, full_sizes, {})
        jobs.append((pos, job))
    budget = int(cap["kv_capacity_blocks"])
    eng = Engine(model, hw, jobs, concurrency=int(cfg.workload["concurrency"]), arrival_rate=arrival_rate,
                 seed=seed, scheduler=sched_cfg, kv_blocks=budget, caching=False,
                 max_batch=(hw.fitted_range or {}).get("max_batch"), hw_name=hw.name)
    res = eng.run()
    recs = res.records()
    gen = float(sum(longs[r["pos"]][1] - longs[r["pos"]][0] for r in recs))
    summ = serving_summary(recs, res, cap, budget, gen_tokens=gen)
    return {"summary": summ, "timeline": timelines(res), "res": res, "budget": budget}


# ---------------------------------------------------------------------------- evaluate / compare
def evaluate(trace, policy: str = "asks", params: dict | None = None, model_preset=None, hardware="local-cpu",
             mode: str = "isolated", problems=None, workload: dict | None = None, seed: int = 0,
             arrival_rate: float | None = None, serving=None, reshape=None) -> dict:
    """Metrics of one configuration as plain Python scalars (docs/sim-api.md)."""
    r = simulate(trace, policy=policy, params=params, model_preset=model_preset, hardware=hardware, mode=mode,
                 problems=problems, workload=workload, seed=seed, arrival_rate=arrival_rate, serving=serving,
                 reshape=reshape)
    return _clean_flat(r.summary)


def token_budgets(tf, pol_name: str, compressions, decode_tokens: int | None = None) -> dict:
    """Budget K for each compression ratio r: ``K = max(sinks + 1, round(T_mean / r) - buffer)``
    (``T`` = prompt + decode length, the latter ``decode_tokens`` when given)."""
    from policies import policy_defaults
    d = policy_defaults(pol_name)
    tf = loaded(tf).tf
    T = float(np.mean([ld.prompt_len + (decode_tokens if decode_tokens is not None else ld.gen_len)
                       for ld in tf.longs])) if tf.longs else 0.0
    out = {}
    for r in compressions:
        K = max(int(d.get("sinks", 4)) + 1, int(round(T / float(r))) - int(d.get("buffer", 16)))
        out[f"{r}x"] = K
    return out


def compare_policies(trace=None, model_preset=None, hardware="local-cpu", mode: str = "isolated",
                     policies=None, workload: dict | None = None, seed: int = 0, problems=None,
                     progress: bool = False, serving=None, reshape=None) -> dict:
    """``{"policies": {NAME: metrics}}`` for every registered policy at its defaults (docs/sim-api.md).

    Token-eviction policies also get ``budgets`` = ``{"2x": {budget, attn_output_rel_error,
    attn_mass_recall, ...}, ...}`` at the workload's ``token_compressions``. Every entry states the
    KV capacity (``kv_capacity_bytes``) and block budget (``kv_budget_blocks``) it ran under.
    """
    lt = _loaded(trace, reshape)
    tf = lt.tf
    sv = ServingConfig.from_any(serving)
    names = list(policies) if policies is not None else list_policies()
    out: dict = {}
    it = names
    if progress:
        from tqdm import tqdm
        it = tqdm(names, desc="compare", unit="policy")
    from .decisions import workload_options, policy_kind
    opts = workload_options(workload)
    for name in it:
        kind = policy_kind(name)
        if kind == "token":
            if not tf.longs:
                continue
            res = {}
            budgets = token_budgets(lt, name, opts["token_compressions"], sv.decode_tokens)
            for label, K in budgets.items():
                r = simulate(lt, policy=name, params={"budget": K}
                             if name != "full" else {}, model_preset=model_preset, hardware=hardware, mode=mode,
                             workload=workload, seed=seed, serving=sv)
                res[label] = clean({"budget": K, **{k: r.summary.get(k) for k in
                                                     ("attn_output_rel_error", "attn_mass_recall", "latency_mean_s",
                                                      "speedup_vs_full", "peak_kv_bytes", "evictions",
                                                      "kv_capacity_bytes", "kv_cap_tokens_per_sequence",
                                                      "throughput_tokens_per_s", "throughput_vs_full",
                                                      "max_running_seqs", "length_extrapolated")}})
            default_label = "4x" if "4x" in res else next(iter(res))
            base = dict(res[default_label])
            entry = {k: None for k in SUMMARY_KEYS}
            entry.update(base)
            entry["budgets"] = res
            entry["kind"] = kind
            entry.update(_reshape_fields(tf))
            out[name] = clean(entry)
        else:
            m = evaluate(lt, policy=name, params={},
                         model_preset=model_preset, hardware=hardware, mode=mode, workload=workload, seed=seed,
                         problems=problems, serving=sv)
            m["kind"] = kind
            out[name] = m
    result = {"policies": out}
    if _reshape_info(tf) is not None:
        result["reshape"] = _reshape_info(tf)
    return result
