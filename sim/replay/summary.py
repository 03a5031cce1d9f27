"""Where every mode's summary and ``info`` are assembled: the fields each figure is stated under.

A figure says which model's decisions and which target's costs produced it, under what
capacity, batch and scheduler it holds: :func:`info_of` and :func:`stated_under` put those
on every result; :func:`finish` adds the speedups over the baselines and marks the trace
model's own figures (``sim.replay.problem_metrics.mark_trace_model_figures``).
"""
from __future__ import annotations

from sim.cost.fingerprint import host_fields
from sim.replay.problem_metrics import mark_trace_model_figures
from sim.workload.reshape import describe as reshape_info


def reshape_fields(tf) -> dict:
    """Summary scalars saying whether, and from what, the replayed problems were reshaped."""
    r = reshape_info(tf)
    return {"reshaped": r is not None, "reshape_spec": r["spec"] if r else None,
            "reshape_source": r["source"] if r else None}


def info_of(session, target, config, cap: dict, sched) -> dict:
    """What a result was computed from (``SimResult.info``)."""
    tf, cfg = session.tf, config.sim
    hw = target.hardware
    return {**config.describe(),
            "decisions_model": tf.model_name, "cost_model": target.model.name, "hardware": hw.name,
            **host_fields(hw, config.strict, session.host),  # is the profile this host's? (a one-line note if not)
            "hardware_provisional": bool(getattr(hw, "provisional", False)),
            "mode": config.mode, "verify_reuses_kv": bool(cfg.workload.verify_reuses_kv),
            "workload": cfg.workload.to_dict(), "seed": int(config.seed),
            "arrival_rate": config.arrival_rate, "trace": tf.path, "reshape": reshape_info(tf),
            "kv_capacity_bytes": cap["kv_capacity_bytes"], "capacity_source": cap["capacity_source"],
            "capacity": cap, "scheduler": sched.to_dict(), "note": target.note(tf.model_name),
            **({"deployment": deployment_fields(target)} if target.layout() else {})}


def served(info: dict, overheads: dict) -> None:
    """``info`` gains what its run priced beyond the kernels (``overheads``: ``Target.overheads`` of a served run,
    ``Target.kernels_only`` of an isolated one) and its note the clause saying so."""
    from sim.cost.overheads import overheads_words
    info["overheads"] = overheads
    info["note"] = (info.get("note") or "") + overheads_words(info)


def deployment_fields(target) -> dict:
    """The layout a multi-GPU or multi-replica result ran on (empty for one GPU, one replica: today's keys)."""
    if not target.layout():
        return {}
    out = {"tensor_parallel_size": target.tensor_parallel_size, "pipeline_parallel_size": target.pipeline_parallel_size,
           "data_parallel_size": target.data_parallel_size,
           "node": target.node.name if target.node is not None else None,
           "gpus": target.tensor_parallel_size * target.pipeline_parallel_size * target.data_parallel_size}
    if target.parallel.dp_attention(target.model):
        # vLLM's DP attention + EP: the replicas are DP ranks whose experts run over every rank's tokens
        out["dp_attention_expert_parallel_size"] = target.parallel.expert_parallel_size(target.model)
    return out


def stated_under(session, target, config, cap: dict, sched, info: dict) -> dict:
    """The summary fields naming the decisions' model, the cost target, capacity and scheduler."""
    tf = session.tf
    return {"decisions_model": tf.model_name, "cost_model": target.model.name, "hardware": target.hardware.name,
            "mode": config.mode, "verify_reuses_kv": bool(config.sim.workload.verify_reuses_kv),
            **reshape_fields(tf), "kv_capacity_bytes": cap["kv_capacity_bytes"],
            "capacity_source": cap["capacity_source"], "hardware_calibrated": info["hardware_calibrated"],
            **{k: v for k, v in sched.to_dict().items() if k != "long_prefill_token_threshold"},
            **deployment_fields(target)}


def finish(summary: dict, base: dict | None) -> dict:
    """Speedups over the baselines' mean latencies (``base``: name -> latency; None: not applicable)."""
    if base is not None:
        lat = summary["latency_mean_s"]
        summary["speedup_vs_no_kv"] = base["no-kv"] / lat if lat and lat > 0 else None
        summary["speedup_vs_exact_prefix"] = base["exact-prefix"] / lat if lat and lat > 0 else None
    mark_trace_model_figures(summary)
    return summary


__all__ = ["info_of", "served", "stated_under", "deployment_fields", "finish", "reshape_fields", "reshape_info"]
