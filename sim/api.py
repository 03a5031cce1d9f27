"""The simulator's public API (docs/sim-api.md): ``evaluate``, ``simulate``, ``compare_policies``, ``load_presets``.

``evaluate`` returns plain scalars for sweeps; ``simulate`` returns a
:class:`SimResult` with the per-problem / per-branch DataFrames and the KV
timeline (for the CLI and the HTML report).
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from policies import BlockPool, FullAttention, attention_metrics, list_policies, run_token_eviction

from . import features
from .cost import batch_terms, eviction_scoring_terms
from .decisions import ConfigError, _fields, decide, job_for, make_config, scale_layers
from .engine import Engine
from .fastpath import FastPath
from .metrics import SUMMARY_KEYS, branch_rows, clean, mark_trace_model_figures, problem_row, summarize
from .profiles import HardwareProfile, ModelShape, load_hardware, load_model, model_from_manifest
from .profiles import load_presets as _load_presets
from .workload import BlockLedger, RecordingLedger, ReplayLedger, blocks, ledger_key, probes_for

MODES = ("isolated", "serving")


def default_trace_path() -> Path:
    """The bundled example trace (``examples/trace-gsm8k-persona`` at the repository root)."""
    return Path(__file__).resolve().parent.parent / "examples" / "trace-gsm8k-persona"


def load_presets() -> dict[str, list[str]]:
    """Names of every model and hardware preset (shipped + ``$RKSIM_PRESETS``)."""
    return _load_presets()


# ---------------------------------------------------------------------------- caches
_PRESET_CACHE: dict = {}
_TRACE_MODEL: dict = {}
_FP_CACHE: dict = {}
_DEC_CACHE: dict = {}
_BASE_CACHE: dict = {}


def clear_caches() -> None:
    """Forget every memoised decision, job result and summary (the trace features stay loaded)."""
    for c in (_PRESET_CACHE, _FP_CACHE, _DEC_CACHE, _BASE_CACHE, _SIG_CACHE, _ROW_CACHE, _SUMMARY_CACHE,
              _LEDGER_CACHE, _TOKQ_CACHE, _TOKSIZE_CACHE, _TRACE_MODEL, _TARGET_IDS, _RANGE_OK):
        c.clear()


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


def _fastpath(model: ModelShape, hw: HardwareProfile) -> FastPath:
    key = (model, _hw_key(hw))
    fp = _FP_CACHE.get(key)
    if fp is None:
        fp = _FP_CACHE[key] = FastPath(model, hw)
    return fp


def _freeze(d) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in (d or {}).items()))


def _wl_key(cfg) -> tuple:
    """``_freeze(cfg.workload)``, computed once per config."""
    k = cfg.__dict__.get("_wl_key")
    if k is None:
        k = cfg.__dict__["_wl_key"] = _freeze(cfg.workload)
    return k


_TARGET_IDS: dict = {}


def _target_id(model: ModelShape, hw: HardwareProfile) -> int:
    """A small int standing for ``(model, _hw_key(hw))`` in per-problem memo keys (hashing the
    model's dataclass for every problem of every configuration was a visible cost)."""
    key = (model, _hw_key(hw))
    t = _TARGET_IDS.get(key)
    if t is None:
        t = _TARGET_IDS[key] = len(_TARGET_IDS)
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


def _load(trace, reshape=None):
    """Features of ``trace`` (default: the bundled one), reshaped by ``reshape`` if given (sim/reshape.py)."""
    tf = features.load(default_trace_path() if trace is None else trace)
    if reshape is None:
        return tf
    from .reshape import reshape_trace
    return features.load(reshape_trace(tf, reshape))


def _reshape_info(tf) -> dict | None:
    from .reshape import describe
    return describe(tf)


def _reshape_fields(tf) -> dict:
    """Summary scalars saying whether, and from what, the replayed problems were reshaped."""
    r = _reshape_info(tf)
    return {"reshaped": r is not None, "reshape_spec": r["spec"] if r else None,
            "reshape_source": r["source"] if r else None}


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
        return clean({**self.summary, "info": self.info})


def _targets(tf, model_preset, hardware):
    trace_model = _TRACE_MODEL.get(id(tf))
    if trace_model is None:
        trace_model = _TRACE_MODEL[id(tf)] = model_from_manifest(tf.manifest)
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


_SIG_CACHE: dict = {}


def _decisions(tf, cfg, probs, L_target: int):
    """(ProblemDecision, Job) per problem, memoised per distinct decision (see ``decision_key``)."""
    from .decisions import bind_vocab, decision_key, in_target_units, prefetch_exits, static_key
    bind_vocab(cfg, tf.vocab_size)  # CGEE theta as a fraction of ln V: the trace model's V
    sig_cache = _SIG_CACHE.setdefault(id(tf), {})
    wl = (_wl_key(cfg), L_target)
    static = static_key(cfg)
    if cfg.exit is not None:
        prefetch_exits(probs, cfg, sig_cache, static)
    scaled = tf.n_layers != L_target
    out = []
    for f in probs:
        key = (id(tf), decision_key(f, cfg, sig_cache, static, scaled)) + wl
        hit = _DEC_CACHE.get(key)
        if hit is None:
            dec = decide(f, cfg)
            job = _scale_job(job_for(f, cfg, dec, tf.n_layers), tf.n_layers, L_target,
                             getattr(cfg.exit, "l_min", None))
            dec = in_target_units(dec, tf.n_layers, L_target)  # exit layers as the job runs them
            hit = _DEC_CACHE[key] = (dec, job, key)
        out.append(hit)
    return out


_RANGE_OK: dict = {}


def _check_range(hw, model, jobs, batch_items: int) -> None:
    # Jobs are memoised objects (held by _DEC_CACHE): the same jobs on the same target pass again.
    okey = (tuple(id(j) for _, j in jobs), id(hw), id(model), batch_items)
    if okey in _RANGE_OK:
        return
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
    hw.check_query(model, max_context=max_ctx, max_new=max_new, max_batch=batch_items)
    _RANGE_OK[okey] = (hw, model, [j for _, j in jobs])  # kept alive so the ids in the key stay theirs


def _budget(cfg, job) -> int:
    """Block budget of one isolated problem: explicit, or ``budget_frac`` x its unconstrained peak blocks."""
    if cfg.budget_blocks is not None:
        return int(cfg.budget_blocks)
    peak = job.__dict__.get("_peak_blocks")
    if peak is None:
        peak = job.__dict__["_peak_blocks"] = float(blocks(job.own + job.decode_steps, job.bs).sum())
    return int(math.ceil(cfg.budget_frac * peak))


def simulate(trace=None, policy: str = "exact-prefix", params: dict | None = None, model_preset=None,
             hardware="local-cpu", mode: str = "isolated", problems=None, workload: dict | None = None,
             seed: int = 0, arrival_rate: float | None = None, baselines: bool = True,
             engine: bool = False, reshape=None) -> SimResult:
    """Simulate one configuration; see :func:`evaluate` for the arguments.

    ``reshape``: a :class:`sim.reshape.ReshapeSpec` or its flag text (``"prefix_tokens=1024,
    branches=8,gen_tokens=256"``): replay the trace's problems at that shape (docs/simulator.md,
    "Workload reshaping"); the summary says ``reshaped`` and from what.

    ``engine=True`` forces the simpy engine in isolated mode too (the fast path
    and the engine agree to 1e-9; the tests check it).
    """
    if mode not in MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    if arrival_rate is not None and (isinstance(arrival_rate, bool) or not isinstance(arrival_rate, (int, float))
                                     or not arrival_rate > 0 or not math.isfinite(arrival_rate)):
        raise ConfigError(f"arrival_rate: must be a number > 0, got {arrival_rate!r}")
    if arrival_rate is not None and mode != "serving":
        raise ConfigError("arrival_rate: only meaningful with mode='serving'")
    tf = _load(trace, reshape)
    trace_model, model, hw = _targets(tf, model_preset, hardware)
    cfg = make_config(policy, params, workload)
    probs = _select(tf, problems)
    info = {"policy": policy, "params": dict(params or {}), "components": cfg.describe(),
            "decisions_model": tf.model_name, "cost_model": model.name, "hardware": hw.name,
            "hardware_calibrated": bool(hw.calibrated), "hardware_provisional": bool(hw.provisional),
            "mode": mode, "verify_reuses_kv": bool(cfg.workload["verify_reuses_kv"]),
            "workload": {k: v for k, v in cfg.workload.items()}, "seed": int(seed),
            "arrival_rate": arrival_rate, "trace": tf.path, "reshape": _reshape_info(tf),
            "note": (f"decisions from the trace's model {tf.model_name}; costs from {model.name} on {hw.name}"
                     if model.name != tf.model_name else f"decisions and costs from {model.name} on {hw.name}")}
    if cfg.kind == "token":
        return _simulate_token(tf, cfg, model, hw, seed, info)
    L = model.n_layers
    triples = _decisions(tf, cfg, probs, L)
    jobs = [(f.pos, job) for f, (_, job, _) in zip(probs, triples)]
    # Serving mode: the batch an iteration reaches is only known while it runs; the engine checks it.
    _check_range(hw, model, jobs, max((j.B for _, j in jobs), default=0))
    rows, brows, timeline = [], [], []
    makespan = peak = None
    if mode == "isolated" and not engine:
        fp = _fastpath(model, hw)
        hk = _target_id(model, hw)
        bkey = (cfg.block.name, _freeze(_fields(cfg.block))) if cfg.block is not None else None
        for f, (dec, job, dkey) in zip(probs, triples):
            # The block pool is deterministic given the job, budget and block policy: memoise it too.
            budget = _budget(cfg, job) if cfg.block is not None else None
            rkey = (dkey, hk, budget, bkey)
            hit = _ROW_CACHE.get(rkey)
            if hit is None:
                led = None
                if cfg.block is not None:
                    lk = ledger_key(job, budget, bkey)
                    rec = _LEDGER_CACHE.get(lk)
                    if rec is None:
                        led = RecordingLedger(BlockPool(budget, cfg.block), job, f.pos)
                        _LEDGER_CACHE[lk] = led
                    else:
                        led = ReplayLedger(rec)
                        led.memo_key = lk
                res = fp.run(job, led)
                hit = _ROW_CACHE[rkey] = (problem_row(f, dec, res, L), branch_rows(f, dec, L), res)
            row, br, res = hit
            rows.append(row)
            brows.extend(br)
            timeline.append((f.pos, res["kv_times"], res["kv_bytes"]))
    else:
        res_list, makespan, peak, tl = _run_engine(tf, cfg, model, hw, probs, triples, mode, seed, arrival_rate)
        for r in res_list:
            f = tf.problems[r["pos"]]
            dec = triples[r["pseq"] % len(triples)][0]
            rows.append(problem_row(f, dec, r, L))
            brows.extend(branch_rows(f, dec, L))
        timeline.extend(tl)
        if mode == "isolated":
            makespan = peak = None
    if mode == "isolated" and not engine:
        # Rows are memoised objects: the same rows (by identity) give the same summary.
        skey = (tuple(map(id, rows)), cfg.exit is not None, getattr(cfg.sharing, "name", ""), L)
        summary = _SUMMARY_CACHE.get(skey)
        if summary is None:
            summary = _SUMMARY_CACHE[skey] = summarize(rows, brows, cfg=cfg, L=L)
        summary = dict(summary)
    else:
        summary = summarize(rows, brows, cfg=cfg, L=L, makespan=makespan, peak_kv_bytes=peak)
    if baselines:
        base = {}
        for name in ("no-kv", "exact-prefix"):
            base[name] = _baseline_latency(tf, name, model, hw, mode, problems, cfg.workload, seed, arrival_rate,
                                           wl_key=_wl_key(cfg))
        lat = summary["latency_mean_s"]
        summary["speedup_vs_no_kv"] = base["no-kv"] / lat if lat and lat > 0 else None
        summary["speedup_vs_exact_prefix"] = base["exact-prefix"] / lat if lat and lat > 0 else None
    summary.update({"decisions_model": tf.model_name, "cost_model": model.name, "hardware": hw.name,
                    "mode": mode, "verify_reuses_kv": bool(cfg.workload["verify_reuses_kv"]), **_reshape_fields(tf)})
    mark_trace_model_figures(summary)
    return SimResult(summary, rows, brows, timeline, info)


_ROW_CACHE: dict = {}
_SUMMARY_CACHE: dict = {}
_LEDGER_CACHE: dict = {}


def _run_engine(tf, cfg, model, hw, probs, triples, mode, seed, arrival_rate):
    jobs = [(f.pos, job) for f, (_, job, _) in zip(probs, triples)]
    n_req = cfg.workload.get("n_requests") if mode == "serving" else None
    if n_req is not None:
        if isinstance(n_req, bool) or not isinstance(n_req, (int, np.integer)) or n_req < 1:
            raise ConfigError(f"workload option 'n_requests' must be an integer >= 1, got {n_req!r}")
        jobs = [jobs[i % len(jobs)] for i in range(int(n_req))]
    fp = _fastpath(model, hw)
    # Admission reserves each problem's unconstrained KV peak (closed form).
    need = [fp.run(job)["peak_kv_bytes"] for _, job in jobs]
    capacity = max(hw.mem_capacity - model.weight_bytes, 0.0) if mode == "serving" else None
    shared_pool = None
    ledger_factory = None
    if cfg.block is not None:
        if mode == "serving":
            budget = (int(cfg.budget_blocks) if cfg.budget_blocks is not None else
                      int(math.ceil(cfg.budget_frac * sum(float(blocks(j.own + j.decode_steps, j.bs).sum())
                                                          for _, j in jobs[: int(cfg.workload["concurrency"])]))))
            shared_pool = BlockPool(budget, cfg.block)
            ledger_factory = lambda pseq, pos, job: BlockLedger(shared_pool, job, pseq)  # noqa: E731
        else:
            ledger_factory = lambda pseq, pos, job: BlockLedger(BlockPool(_budget(cfg, job), cfg.block), job, pseq)  # noqa: E731
    eng = Engine(model, hw, jobs, concurrency=int(cfg.workload["concurrency"]) if mode == "serving" else 1,
                 arrival_rate=arrival_rate, seed=seed, ledger_factory=ledger_factory, need_bytes=need,
                 kv_capacity=capacity, shared_pool=shared_pool,
                 max_batch=(hw.fitted_range or {}).get("max_batch"), hw_name=hw.name)
    res = eng.run()
    recs = res.records()
    if shared_pool is not None:
        # One pool for all problems: report its evictions once (on the first record).
        for r in recs:
            r["evictions"] = 0
        if recs:
            recs[0]["evictions"] = int(shared_pool.evictions)
    if mode == "isolated":
        return recs, None, None, [(r["pos"], r["kv_times"], r["kv_bytes"]) for r in recs]
    tl = [(-1, res.timeline_t, res.timeline_b)]
    peak = float(res.timeline_b.max()) if res.timeline_b.size else 0.0
    return recs, res.makespan, peak, tl


def _baseline_latency(tf, name, model, hw, mode, problems, workload, seed, arrival_rate, wl_key=None) -> float:
    wl = {k: v for k, v in workload.items()}
    key = (id(tf), name, _target_id(model, hw), mode, None if problems is None else tuple(int(p) for p in problems),
           _freeze(wl) if wl_key is None else wl_key, seed, arrival_rate)
    hit = _BASE_CACHE.get(key)
    if hit is None:
        r = simulate(tf.trace if tf.trace is not None else tf.path, policy=name, params={}, model_preset=model,
                     hardware=hw, mode=mode, problems=problems, workload=wl, seed=seed,
                     arrival_rate=arrival_rate, baselines=False)
        hit = _BASE_CACHE[key] = r.summary["latency_mean_s"]
    return hit


# ---------------------------------------------------------------------------- token eviction
_FULL_CACHE: dict = {}


def _long_arrays(ld, li: int):
    return (np.asarray(ld.K[li], dtype=np.float64), np.asarray(ld.V[li], dtype=np.float64),
            np.asarray(ld.Q[li], dtype=np.float64))


_TOKQ_CACHE: dict = {}
_TOKSIZE_CACHE: dict = {}


def token_quality(tf, pol, seed: int, max_layers=None) -> pd.DataFrame:
    """Attention-output error and mass recall of a token policy on every recorded (sequence, layer).

    Independent of the cost target: memoised per (trace, policy parameters, seed).
    """
    key = (id(tf), pol.name, _freeze(dataclasses.asdict(pol)), int(seed), max_layers)
    hit = _TOKQ_CACHE.get(key)
    if hit is None:
        hit = _TOKQ_CACHE[key] = _token_quality(tf, pol, seed, max_layers)
    return hit


def _token_quality(tf, pol, seed: int, max_layers=None) -> pd.DataFrame:
    # One BLAS thread: the matmuls of the attention metrics then reduce in a fixed order, so the
    # same inputs give bit-identical numbers whatever the machine's thread count (and spinning
    # BLAS threads only burn CPU on a shared machine).
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):
        return _token_quality_rows(tf, pol, seed, max_layers)


def _token_quality_rows(tf, pol, seed: int, max_layers=None) -> pd.DataFrame:
    rows = []
    for ld in tf.longs:
        n_lay = len(ld.layers) if max_layers is None else min(len(ld.layers), int(max_layers))
        for li in range(n_lay):
            K, V, Q = _long_arrays(ld, li)
            fkey = (id(tf), ld.pos, li)
            full = _FULL_CACHE.get(fkey)
            if full is None:
                full = _FULL_CACHE[fkey] = FullAttention(K, V, Q, ld.prompt_len)
            rng = np.random.default_rng([int(seed), ld.pos, li])
            res = run_token_eviction(pol, K, V, Q, ld.prompt_len, rng, record=True)
            met = attention_metrics(res, full=full)
            sizes = _cache_sizes(res, ld.prompt_len, K.shape[0])
            if li == 0:
                # The cache the first recorded layer keeps prices the whole long decode (all layers alike).
                _TOKSIZE_CACHE[(id(tf), pol.name, _freeze(dataclasses.asdict(pol)), int(seed), ld.pos)] = (
                    sizes, [n - pol.buffer for n in _pre_eviction_sizes(res, pol)], res.n_evictions)
            rows.append({"seq": ld.pos, "layer": int(ld.layers[li]), "T": int(K.shape[0]),
                         "prompt_len": ld.prompt_len, "evictions": res.n_evictions,
                         "attn_output_rel_error": met["attn_output_rel_error"],
                         "attn_mass_recall": met["attn_mass_recall"],
                         "mean_cache_tokens": float(np.mean(sizes)) if sizes.size else float("nan")})
    return pd.DataFrame(rows)


def _cache_sizes(res, P: int, T: int) -> np.ndarray:
    """Tokens the query at each decode position t = P..T-1 attends over (``EvictionResult.cache_sizes``)."""
    return np.asarray(res.cache_sizes(), dtype=np.float64)


def _long_latency(model, hw, P: int, sizes: np.ndarray, evictions: list, window: int) -> dict:
    """One long decode: prefill of P tokens, then one decode step per token over its (evicted) cache."""
    pre = float(hw.time(batch_terms(model, [float(P)], [0.0])))
    ctx = np.asarray(sizes, np.float64) - 1.0  # cached tokens before each step
    dec = float(np.sum(hw.time(batch_terms(model, np.ones((ctx.size, 1)), ctx[:, None])))) if ctx.size else 0.0
    ev = float(sum(float(hw.time(eviction_scoring_terms(model, c, max(window, 1)))) for c in evictions))
    return {"prefill_s": pre, "decode_s": dec, "evict_s": ev, "latency_s": pre + dec + ev}


def _simulate_token(tf, cfg, model, hw, seed, info) -> SimResult:
    if not tf.longs:
        raise ConfigError(f"policy {cfg.policy!r}: the trace {tf.path} has no long-decode sequences (long/)")
    pol = cfg.token
    q = token_quality(tf, pol, seed, cfg.workload.get("max_long_layers"))
    max_ctx = max(int(ld.prompt_len + ld.gen_len) for ld in tf.longs)
    hw.check_query(model, max_context=max_ctx, max_new=max(int(ld.prompt_len) for ld in tf.longs), max_batch=1)
    rows = []
    for ld in tf.longs:
        T = ld.prompt_len + ld.gen_len
        key = (id(tf), pol.name, _freeze(dataclasses.asdict(pol)), int(seed), ld.pos)
        if key not in _TOKSIZE_CACHE:  # max_long_layers = 0: run the first layer for the sizes only
            K, V, Q = _long_arrays(ld, 0)
            res = run_token_eviction(pol, K, V, Q, ld.prompt_len, np.random.default_rng([int(seed), ld.pos, 0]),
                                     record=False)
            _TOKSIZE_CACHE[key] = (_cache_sizes(res, ld.prompt_len, T),
                                   [n - pol.buffer for n in _pre_eviction_sizes(res, pol)], res.n_evictions)
        sizes, cands, n_ev = _TOKSIZE_CACHE[key]
        lat = _long_latency(model, hw, ld.prompt_len, sizes, cands, getattr(pol, "window", 0) or pol.buffer)
        full_sizes = np.arange(ld.prompt_len, T, dtype=np.float64) + 1.0  # full cache: every token so far
        flat = _long_latency(model, hw, ld.prompt_len, full_sizes, [], 1)
        rows.append({"pos": ld.pos, "latency_s": lat["latency_s"], "prefill_s": lat["prefill_s"],
                     "decode_s": lat["decode_s"], "evict_s": lat["evict_s"], "full_latency_s": flat["latency_s"],
                     "evictions": n_ev, "gen_tokens": ld.gen_len,
                     "peak_kv_bytes": float(sizes.max() if sizes.size else ld.prompt_len) * model.kv_bytes_per_token})
    df = pd.DataFrame(rows)
    lat = df["latency_s"].to_numpy()
    summary = {k: None for k in SUMMARY_KEYS}
    summary.update({
        "latency_mean_s": float(lat.mean()), "latency_p50_s": float(np.percentile(lat, 50)),
        "latency_p95_s": float(np.percentile(lat, 95)),
        "speedup_vs_full": float(df["full_latency_s"].mean() / lat.mean()),
        "peak_kv_bytes": float(df["peak_kv_bytes"].max()), "evictions": int(df["evictions"].sum()),
        "recompute_tokens": 0, "kv_reuse": None, "mean_exit_layer": None, "accuracy": None,
        "attn_output_rel_error": float(q["attn_output_rel_error"].mean()),
        "attn_mass_recall": float(q["attn_mass_recall"].mean()),
        "budget": int(pol.budget), "buffer": int(pol.buffer),
        "throughput_tokens_per_s": float(df["gen_tokens"].sum() / lat.sum()),
        "n_sequences": len(df), "n_layers_evaluated": len(q),
        "decisions_model": tf.model_name, "cost_model": model.name, "hardware": hw.name, "mode": "isolated",
        "verify_reuses_kv": None, **_reshape_fields(tf),
    })
    mark_trace_model_figures(summary)
    return SimResult(summary, rows, [], [], info, token=q)


def _pre_eviction_sizes(res, pol) -> list:
    """Cache length when each eviction fired (what the eviction scored): previous kept size plus what accrued."""
    out = []
    prev = None
    for e in res.event_positions:
        out.append(e + 1 if prev is None else res.size_after_eviction + (e - prev))
        prev = e
    return out


# ---------------------------------------------------------------------------- evaluate / compare
def evaluate(trace, policy: str = "asks", params: dict | None = None, model_preset=None, hardware="local-cpu",
             mode: str = "isolated", problems=None, workload: dict | None = None, seed: int = 0,
             arrival_rate: float | None = None, reshape=None) -> dict:
    """Metrics of one configuration as plain Python scalars (docs/sim-api.md)."""
    r = simulate(trace, policy=policy, params=params, model_preset=model_preset, hardware=hardware, mode=mode,
                 problems=problems, workload=workload, seed=seed, arrival_rate=arrival_rate, reshape=reshape)
    return _clean_flat(r.summary)


def token_budgets(tf, pol_name: str, compressions) -> dict:
    """Budget K for each compression ratio r: ``K = max(sinks + 1, round(T_mean / r) - buffer)``."""
    from policies import policy_defaults
    d = policy_defaults(pol_name)
    T = float(np.mean([ld.prompt_len + ld.gen_len for ld in tf.longs])) if tf.longs else 0.0
    out = {}
    for r in compressions:
        K = max(int(d.get("sinks", 4)) + 1, int(round(T / float(r))) - int(d.get("buffer", 16)))
        out[f"{r}x"] = K
    return out


def compare_policies(trace=None, model_preset=None, hardware="local-cpu", mode: str = "isolated",
                     policies=None, workload: dict | None = None, seed: int = 0, problems=None,
                     progress: bool = False, reshape=None) -> dict:
    """``{"policies": {NAME: metrics}}`` for every registered policy at its defaults (docs/sim-api.md).

    Token-eviction policies also get ``budgets`` = ``{"2x": {budget, attn_output_rel_error,
    attn_mass_recall, ...}, ...}`` at the workload's ``token_compressions``.
    """
    tf = _load(trace, reshape)
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
            budgets = token_budgets(tf, name, opts["token_compressions"])
            for label, K in budgets.items():
                r = simulate(tf.trace if tf.trace is not None else tf.path, policy=name, params={"budget": K}
                             if name != "full" else {}, model_preset=model_preset, hardware=hardware, mode="isolated",
                             workload=workload, seed=seed)
                res[label] = clean({"budget": K, **{k: r.summary.get(k) for k in
                                                     ("attn_output_rel_error", "attn_mass_recall", "latency_mean_s",
                                                      "speedup_vs_full", "peak_kv_bytes", "evictions")}})
            default_label = "4x" if "4x" in res else next(iter(res))
            base = dict(res[default_label])
            entry = {k: None for k in SUMMARY_KEYS}
            entry.update(base)
            entry["budgets"] = res
            entry["kind"] = kind
            entry.update(_reshape_fields(tf))
            out[name] = clean(entry)
        else:
            m = evaluate(tf.trace if tf.trace is not None else tf.path, policy=name, params={},
                         model_preset=model_preset, hardware=hardware, mode=mode, workload=workload, seed=seed,
                         problems=problems)
            m["kind"] = kind
            out[name] = m
    result = {"policies": out}
    if _reshape_info(tf) is not None:
        result["reshape"] = _reshape_info(tf)
    return result
