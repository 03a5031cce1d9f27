"""The priced result of one tree walk (:func:`sim.replay.tree.simulate_tree`): phase times, block counts, KV.

:func:`sim.replay.tree.walk_tree` records the walk's operations (hardware-free); this module resolves the
:class:`sim.replay.target.Target` (``Target.resolve``), prices them on it with ``sim.cost.terms`` and builds
the result dict ``rksim tree`` prints.
"""
from __future__ import annotations

import numpy as np

from sim.cost import terms as C
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import ModelShape
from sim.base.errors import PresetError
from sim.cost.profiles import load_model, model_from_manifest
from sim.serving.capacity import CapacityError

PHASES = ("verify", "prefill", "assemble", "decode", "recompute")


def tree_target(spec, model_preset, hardware, error=ValueError):
    """The :class:`sim.replay.target.Target` the walk is priced on, by the one resolver (``Target.resolve``, whose
    preset and layout errors name the flag); the model defaults to the trace manifest's. ``spec``: a
    :class:`sim.replay.tree.TreeSpec`; a missing or unknown ``--model-preset`` of a bare tree raises ``error``."""
    from sim.replay.session import Session
    from sim.replay.target import Target
    session = Session(spec)   # the resolver's preset memo; the decisions' model is set here, so no features load
    if spec.manifest is not None:
        session.trace_model = model_from_manifest(spec.manifest)
    elif model_preset is None:
        raise error("--model-preset: needed (the tree has no trace manifest to take the model from)")
    else:   # a bare TreeSpec (no trace): its decisions' model is the cost model
        try:
            model_preset = session.trace_model = model_preset if isinstance(model_preset, ModelShape) \
                else load_model(model_preset)
        except PresetError as exc:
            raise error(f"--model-preset: {exc}") from None
    return Target.resolve(session, model_preset, hardware)


def price_phase(model: ModelShape, hw: HardwareProfile, phase: str, items: list) -> float:
    """Seconds of one phase's forward items ``(n list, c list)``: ``t = max(flops / (peak eff_c), bytes / (bw eff_m))
    + overheads`` per batch (``sim.cost.terms.batch_terms``); ``assemble`` is the context's KV copy
    (``sim.cost.terms.kv_copy_terms``)."""
    if not items:
        return 0.0
    if phase == "assemble":
        return float(np.sum(hw.time(C.kv_copy_terms(model, np.array([n[0] for n, _ in items], dtype=np.float64)))))
    k = max(len(n) for n, _ in items)
    N = np.zeros((len(items), k))
    Cc = np.zeros((len(items), k))
    M = np.zeros((len(items), k), dtype=bool)
    for r, (n, c) in enumerate(items):
        N[r, :len(n)], Cc[r, :len(c)], M[r, :len(n)] = n, c, True
    return float(np.sum(hw.time(C.batch_terms(model, N, Cc, mask=M), model=model)))


def tree_result(spec, w, target, policy: str, params, budget_blocks, budget_frac, block_size: int,
                error=ValueError) -> dict:
    """The result of walk ``w`` (:class:`sim.replay.tree.TreeWalk`) of ``spec`` priced on ``target``.

    The walk's largest query is checked against the hardware's fitted range (``Target.check_query``) and its
    KV peak against the target's KV capacity (the tree runs alone on the device, like isolated mode);
    a peak past it raises ``error`` (the caller's error class) naming ``--budget-blocks``.
    """
    model, hw = target.model, target.hardware
    max_ctx = max((max(np.add(n, c)) if c else n[0]) for ops in w.ops.values() for n, c in ops)
    max_new = max(max(n) for p, ops in w.ops.items() if p != "assemble" for n, _ in ops)
    max_batch = max(len(n) for p, ops in w.ops.items() if p != "assemble" for n, _ in ops)
    target.check_query(max_context=int(max_ctx), max_new=int(max_new), max_batch=int(max_batch))
    phases = {f"{p}_s": price_phase(model, hw, p, w.ops[p]) for p in PHASES}
    tb = w.blocks
    bm = tb.bm
    nodes = spec.nodes
    best = w.best_node
    # a hybrid (full + sliding) model: the walk's blocks are token blocks, priced at every layer's KV (the sliding
    # layers' window bound is not tracked by the walk, shared with the real runner: an upper bound, stated)
    hybrid = model.kv_cache_groups != (1, 0, 0)
    bytes_per_block = block_size * (sum(model.kv_bytes_by_kind().values()) if hybrid else model.kv_bytes_per_token)
    cap = target.capacity("isolated", block_size)
    if tb.peak * bytes_per_block > cap["kv_capacity_bytes"]:
        raise error(str(CapacityError(
            f"tree {spec.name}: holds {tb.peak * bytes_per_block / 1e9:.3f} GB of KV at its peak but {model.name} "
            f"on {hw.name} has {cap['kv_capacity_bytes'] / 1e9:.3f} GB of KV capacity: "
            f"{(tb.peak * bytes_per_block - cap['kv_capacity_bytes']) / 1e9:.3f} GB short (lower --budget-blocks)")))
    return {
        "policy": policy, "params": dict(params or {}), "tree": spec.name,
        "latency_s": float(sum(phases.values())), **phases,
        "evictions": int(bm.evictions), "refetches": int(tb.refetches), "preemptions": int(tb.preemptions),
        "recompute_tokens": int(tb.recompute_tokens),
        "hits": sum(t.hit for t in tb.touches), "misses": sum(not t.hit for t in tb.touches),
        "touches": len(tb.touches),
        "peak_blocks": int(tb.peak), "peak_kv_bytes": int(tb.peak * bytes_per_block),
        "peak_used_blocks": int(bm.peak_used), "floor_blocks": int(tb.floor),
        "budget_blocks": int(w.budget_blocks), "budget_frac": None if budget_blocks is not None else budget_frac,
        "block_size": int(block_size), "n_nodes": int(w.n_nodes),
        "best_node": int(best), "best_score": float(nodes["score"].iloc[best]),
        "best_answer": str(nodes["answer"].iloc[best]) if "answer" in nodes else "",
        "correct": bool(nodes["correct"].iloc[best]) if "correct" in nodes else False,
        "eviction_order": [list(b) for b in tb.evicted_log],
        "cost_model": model.name, "hardware": hw.name,
        "kv_capacity_bytes": float(cap["kv_capacity_bytes"]), "capacity_source": cap["capacity_source"],
        "decisions_model": str(((spec.manifest or {}).get("model") or {}).get("name", "")),
        "kv_note": (f"peak_kv_bytes counts every layer of {model.name} at every token: its "
                    f"{model.n_sliding_layers} sliding-window layers' bound ({model.sliding_window} tokens) is not "
                    "applied in tree mode (an upper bound)") if hybrid else "",
    }
