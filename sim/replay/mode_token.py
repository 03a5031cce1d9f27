"""Token-eviction policies: the trace's long decodes under a token policy's cache (either mode).

Quality (attention-output error, attention-mass recall) is measured on the recorded Q/K/V by
``policies.run_token_eviction`` and memoised in the :class:`sim.replay.session.Session`; latency comes
from the policy's schedule alone (:func:`eviction_schedule`), so a decode longer than recorded
(``decode_tokens``) is priced too. Serving mode runs the long decodes through the engine twice,
under the policy and under a full cache, for ``throughput_vs_full``.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from policies import FullAttention, attention_metrics, run_token_eviction

from sim.serving.capacity import ServingConfig
from sim.cost.terms import batch_terms, eviction_scoring_terms
from sim.workload.decisions import freeze
from sim.base.errors import ConfigError
from sim.replay.mode_isolated import refuse_if_too_big
from sim.replay.problem_metrics import SUMMARY_KEYS
from sim.replay.records import SimResult
from sim.replay.mode_serving import requests
from sim.serving.metrics import serving_summary, timelines
from sim.replay.summary import finish, info_of, served, stated_under


def _long_arrays(ld, li: int):
    return (np.asarray(ld.K[li], dtype=np.float64), np.asarray(ld.V[li], dtype=np.float64),
            np.asarray(ld.Q[li], dtype=np.float64))


def _pol_key(pol) -> tuple:
    return (pol.name, freeze(dataclasses.asdict(pol)))


def token_quality(session, pol, seed: int, max_layers=None) -> pd.DataFrame:
    """Attention-output error and mass recall of a token policy on every recorded (sequence, layer).

    Independent of the cost target: memoised per (policy parameters, seed) in the
    :class:`sim.replay.session.Session`.
    """
    lt = session
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


def _long_latency(target, P: int, sizes: np.ndarray, cands: list, window: int) -> dict:
    """One long decode alone: prefill of P tokens, then one decode step per token over its (evicted) cache.

    On a model with sliding-window layers the eviction runs on the full-attention layers only (kvpress skips
    sliding layers), so each step's window layers read their last ``min(position, W)`` keys whatever the policy
    keeps: ``window_s[t]`` is what that costs over pricing every layer at the evicted cache (the seconds the
    engine adds to the step at position ``t`` in serving mode; only where they differ). A tensor-parallel
    target: :func:`_replica_latency`."""
    model, hw = target.model, target.hardware
    if not target.single:
        return _replica_latency(target, P, sizes, cands, window)
    pre = float(hw.time(batch_terms(model, [float(P)], [0.0]), model=model))
    ctx = np.asarray(sizes, np.float64) - 1.0  # cached tokens before each step
    ones = np.ones((ctx.size, 1))
    dec_each = hw.time(batch_terms(model, ones, ctx[:, None]), model=model) if ctx.size else np.zeros(0)
    window_s = {}
    if model.sliding_window and ctx.size:
        pos = np.arange(P, P + ctx.size, dtype=np.float64)   # every token so far: what a window layer holds
        sw_each = hw.time(batch_terms(model, ones, ctx[:, None], sliding_context=pos[:, None]), model=model)
        extra = np.asarray(sw_each, np.float64) - np.asarray(dec_each, np.float64)
        window_s = {int(P + i): float(extra[i]) for i in np.flatnonzero(extra > 0)}
        dec_each = sw_each
    dec = float(np.sum(dec_each))
    ev = float(sum(_scoring_s(target, c, window) for c in cands))
    return {"prefill_s": pre, "decode_s": dec, "evict_s": ev, "latency_s": pre + dec + ev, "window_s": window_s}


def _scoring_s(target, c: int, window: int) -> float:
    """Seconds of one eviction's scoring over a cache of ``c`` keys (``sim.cost.terms.eviction_scoring_terms``): on
    one GPU the model's; on a tensor-parallel replica one rank's shard (:attr:`Target.rank_model`: its KV heads, or
    an MLA model's whole latent), each rank scoring the heads it holds, with no collective."""
    rm = target.model if target.single else target.rank_model
    return float(target.hardware.time(eviction_scoring_terms(rm, c, max(window, 1))))


def _replica_latency(target, P: int, sizes: np.ndarray, cands: list, window: int) -> dict:
    """:func:`_long_latency` on a tensor-parallel replica (one pipeline stage): the prefill and each decode step
    priced by the replica's cost (:meth:`sim.replay.target.Target.cost`: each rank's shard and its all-reduces,
    eager kernels as isolated mode prices them; the decode steps in one pass of its closed form,
    ``decode_batch_seconds`` of one request over the cache, the window layers' key sum given apart); the eviction's
    scoring on one rank's shard (:attr:`Target.rank_model`: its KV heads, or the whole latent of an MLA model), each
    rank scoring the heads it holds (:func:`_scoring_s`)."""
    model, cost = target.model, target.cost()
    pre = float(cost.seconds([(float(P), 0.0, None, 0.0, 1.0, 0.0)]))
    ctx = np.asarray(sizes, np.int64) - 1   # cached tokens before each step
    window_s = {}
    if not ctx.size:
        dec_each = np.zeros(0)
    elif model.sliding_window:
        pos = np.arange(P, P + ctx.size, dtype=np.int64)   # every token so far: what a window layer holds
        W = int(model.sliding_window)
        try:
            dec_each = cost.decode_batch_seconds(1, ctx, ctx, np.minimum(pos + 1, W))
        except ValueError:   # a window share without the closed form (Gemma 3's 5/6: ScalarCost.sliding_window)
            raise ConfigError(f"--tensor-parallel-size: {target.tensor_parallel_size}: the token policies price "
                              f"{model.name}'s window layers on one GPU only", field="tensor_parallel_size") from None
        extra = dec_each - cost.decode_batch_seconds(1, ctx, ctx, np.minimum(ctx + 1, W))
        window_s = {int(P + i): float(extra[i]) for i in np.flatnonzero(extra > 0)}
    else:
        dec_each = cost.decode_batch_seconds(1, ctx, ctx)
    dec = float(np.sum(dec_each))
    ev = float(sum(_scoring_s(target, c, window) for c in cands))
    return {"prefill_s": pre, "decode_s": dec, "evict_s": ev, "latency_s": pre + dec + ev, "window_s": window_s}


def held_slots(model, P: int, sizes: np.ndarray) -> int:
    """The most KV block slots a long decode holds (``sim.cost.model_shape.ModelShape.kv_bytes_per_token`` each):
    after its prefill and at every step, ``G_full x cache + G_sw x min(tokens, W)`` with ``(G_full, G_sw, W)`` the
    model's KV-cache groups (:attr:`~sim.cost.model_shape.ModelShape.kv_cache_groups`; ``(1, 0, 0)`` without
    sliding-window layers: the cache alone). The policy's cache is the full-attention layers'; a window layer
    keeps its last ``W`` tokens (eviction does not apply there)."""
    fg, sg, W = model.kv_cache_groups
    n = np.asarray(sizes, np.int64)
    tokens = np.arange(P + 1, P + 1 + n.size, dtype=np.int64)   # the query at P + i is the (P + i + 1)-th token
    after = fg * n + sg * np.minimum(tokens, W) if n.size else np.zeros(0, np.int64)
    return int(max(fg * P + sg * min(P, W), int(after.max()) if after.size else 0))


def eviction_note(model) -> str | None:
    """What a token policy evicts on a model with sliding-window layers (None without them)."""
    if not model.sliding_window:
        return None
    ns = model.n_sliding_layers
    return (f"token eviction on the {model.n_layers - ns} full-attention layers of {model.n_layers}; the {ns} "
            f"sliding-window layers keep their last {model.sliding_window} tokens (eviction does not apply inside "
            f"a window; kvpress skips those layers too)")


def _decode_len(ld, sv: ServingConfig) -> int:
    return int(sv.decode_tokens) if sv.decode_tokens is not None else int(ld.gen_len)


def run(session, target, config) -> SimResult:
    """The trace's long decodes under the token policy of ``config`` on ``target`` (either mode)."""
    lt, cfg, mode, seed = session, config.sim, config.mode, config.seed
    model, hw, sv = target.model, target.hardware, target.serving
    tf = lt.tf
    if not tf.longs:
        raise ConfigError(f"policy {cfg.policy!r}: the trace {tf.path} has no long-decode sequences (long/)",
                          field="policy")
    sched_cfg = target.scheduler(mode)
    cap = target.capacity(mode, int(cfg.workload.block_size))
    info = info_of(session, target, config, cap, sched_cfg)
    pol = cfg.token
    q = token_quality(session, pol, seed, cfg.workload.max_long_layers)
    # longer than recorded: the policy's steady state is held past the trace (quality stays the recorded one's)
    extrapolated = sv.decode_tokens is not None and any(sv.decode_tokens > ld.gen_len for ld in tf.longs)
    max_ctx = max(int(ld.prompt_len + _decode_len(ld, sv)) for ld in tf.longs)
    target.check_query(max_context=max_ctx, max_new=max(int(ld.prompt_len) for ld in tf.longs), max_batch=1)
    window = getattr(pol, "window", 0) or pol.buffer
    rows, longs = [], {}
    for ld in tf.longs:
        T = ld.prompt_len + _decode_len(ld, sv)
        sizes, events, cands = eviction_schedule(pol, ld.prompt_len, T)
        lat = _long_latency(target, ld.prompt_len, sizes, cands, window)
        full_sizes = np.arange(ld.prompt_len, T, dtype=np.int64) + 1  # full cache: every token so far
        flat = _long_latency(target, ld.prompt_len, full_sizes, [], 1)
        rows.append({"pos": ld.pos, "latency_s": lat["latency_s"], "prefill_s": lat["prefill_s"],
                     "decode_s": lat["decode_s"], "evict_s": lat["evict_s"], "full_latency_s": flat["latency_s"],
                     "evictions": len(events), "gen_tokens": T - ld.prompt_len,
                     "peak_kv_bytes": float(held_slots(model, ld.prompt_len, sizes)) * model.kv_bytes_per_token})
        ev_s = {t: _scoring_s(target, c, window) for t, c in zip(events, cands)}
        longs[ld.pos] = (ld.prompt_len, T, sizes, ev_s, full_sizes, lat["window_s"])
    df = pd.DataFrame(rows)
    if mode == "isolated":
        refuse_if_too_big(df["peak_kv_bytes"].tolist(), df["pos"].tolist(), cap, target, what="long decode")
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
        **stated_under(session, target, config, cap, sched_cfg, info), "verify_reuses_kv": None,
        "length_extrapolated": bool(extrapolated), "decode_tokens": sv.decode_tokens,
        "kv_cap_tokens_per_sequence": int(max(max(int(longs[p][2].max()) if longs[p][2].size else 0, longs[p][0])
                                              for p in longs)),
    })
    info["length_extrapolated"] = bool(extrapolated)
    note = eviction_note(model)
    if note:
        info["eviction_layers"] = note
        info["note"] = f"{info['note']}; {note}" if info.get("note") else note
    timeline = []
    if mode != "serving":
        served(info, target.kernels_only())
    if mode == "serving":
        serve = _serve_longs(config, target, longs, sched_cfg, cap, token=True)
        full = _serve_longs(config, target, longs, sched_cfg, cap, token=False)
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
        served(info, serve["overheads"])
        timeline.append((-1, serve["res"].timeline_t, serve["res"].timeline_b))
    finish(summary, None)
    return SimResult(summary, rows, [], timeline, info, token=q)


def _long_job(P: int, T: int, L: int, bs: int):
    from sim.workload.job import Job
    z = np.zeros(1, np.int64)
    return Job(B=1, L=L, bs=bs, reused=z, computed=np.array([P]), copy=z, gate=z, source=np.array([-1]),
               share=np.zeros(1, bool), ctx=np.array([P]), gen=np.array([T - P + 1]), own=np.array([P]),
               verify_on=False, v_new=z, v_cached=z, v_layers=np.array([L]), v_probes=z, v_head=np.ones(1, np.int64),
               v_kv_tokens=z, v_reuse=False, score=np.zeros(1))


def _serve_longs(config, target, longs: dict, sched_cfg, cap, token: bool) -> dict:
    """Serve the long decodes (``n_requests`` of them, cycling) under the token policy (``token``) or full cache."""
    from sim.serving.engine import Engine
    from sim.serving.long_decode import LongDecode
    cfg, model, hw = config.sim, target.model, target.hardware
    bs = int(cfg.workload.block_size)
    jobs = []
    for pos in requests(config, sorted(longs)):
        P, T, sizes, ev_s, full_sizes, window_s = longs[pos]
        job = _long_job(P, T, model.n_layers, bs)
        # the step computing position t (the decode's t - P + 1-th) attends over sizes[t - P] keys (its window
        # layers over their last W: window_s, the seconds that adds)
        job.long = LongDecode(P, sizes, ev_s, window_s) if token else LongDecode(P, full_sizes, {})
        jobs.append((pos, job))
    budget = int(cap["kv_capacity_blocks"])
    costs = target.serving_costs(sched_cfg)
    eng = Engine(model, hw, jobs, concurrency=int(cfg.workload.concurrency), arrival_rate=config.arrival_rate,
                 seed=config.seed, scheduler=sched_cfg, kv_blocks=budget, caching=False,
                 max_batch=target.max_batch, hw_name=hw.name, **costs)
    res = eng.run()
    recs = res.records()
    gen = float(sum(longs[r["pos"]][1] - longs[r["pos"]][0] for r in recs))
    summ = serving_summary(recs, res, cap, budget, gen_tokens=gen)
    return {"summary": summ, "timeline": timelines(res), "res": res, "budget": budget,
            "overheads": target.overheads(costs, [res])}




def token_budgets(tf, pol_name: str, compressions, decode_tokens: int | None = None) -> dict:
    """Budget K for each compression ratio r: ``K = max(sinks + 1, round(T_mean / r) - buffer)``
    (``T`` = prompt + decode length, the latter ``decode_tokens`` when given)."""
    from policies import policy_defaults
    d = policy_defaults(pol_name)
    tf = getattr(tf, "tf", tf)  # a Session or the features
    T = float(np.mean([ld.prompt_len + (decode_tokens if decode_tokens is not None else ld.gen_len)
                       for ld in tf.longs])) if tf.longs else 0.0
    out = {}
    for r in compressions:
        K = max(int(d.get("sinks", 4)) + 1, int(round(T / float(r))) - int(d.get("buffer", 16)))
        out[f"{r}x"] = K
    return out


__all__ = ["run", "token_quality", "eviction_schedule", "token_budgets"]
