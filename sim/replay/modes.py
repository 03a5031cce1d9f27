"""The registry of simulation modes: ``(policy kind, mode) -> run(session, target, config) -> SimResult``.

:func:`run` is the one path of a simulation: the runner of the configuration's kind and mode,
then (where the mode has them) the no-KV and exact-prefix baselines, memoised in the
:class:`sim.replay.session.Session`, then the summary's speedups (``sim.replay.summary.finish``).
"""
from __future__ import annotations

from sim.replay import mode_isolated as isolated
from sim.replay import mode_serving as serving
from sim.replay import mode_token as token
from sim.base.errors import ConfigError
from sim.replay.problem_metrics import SUMMARY_KEYS, clean
from sim.replay.records import SimResult
from sim.replay.runconfig import RunConfig, Workload
from sim.replay.summary import finish, reshape_fields

BASELINES = ("no-kv", "exact-prefix")

RUNNERS = {(kind, mode): mod.run
           for kind in ("sharing", "exit", "block", "composite")
           for mode, mod in (("isolated", isolated), ("serving", serving))}
RUNNERS.update({("token", "isolated"): token.run, ("token", "serving"): token.run})


def runner(kind: str, mode: str):
    """The run function of ``(kind, mode)``; a combination with none is refused by name."""
    fn = RUNNERS.get((kind, mode))
    if fn is None:
        raise ConfigError(f"mode: {mode!r} does not apply to {kind} policies "
                          f"(modes: {', '.join(m for k, m in RUNNERS if k == kind)})", field="mode")
    return fn


def _one_tp_group_refusal(target, where: str) -> ConfigError | None:
    """Why ``target`` is more than one tensor-parallel group priced by the expected experts (what isolated mode and
    the token policies' replays price: no pipeline stages, one replica, ``--moe-routing expected``), naming the
    flag; None where it is not."""
    for name, flag in (("pipeline_parallel_size", "--pipeline-parallel-size"),
                       ("data_parallel_size", "--data-parallel-size")):
        v = getattr(target, name)
        if v != 1:
            return ConfigError(f"{flag}: {v} is not supported in {where}", field=name)
    # the fast path and the token replays price the expected experts only (sim.replay.fastpath)
    if getattr(target, "moe_routing", "expected") != "expected":
        return ConfigError(f"--moe-routing: {target.moe_routing} is not supported in {where}", field="moe_routing")
    return None


def token_runs_on(target) -> bool:
    """Whether the token policies replay on ``target`` (:func:`check_layout` would not refuse them)."""
    return _one_tp_group_refusal(target, "") is None


def check_layout(target, config) -> None:
    """Refuse a multi-GPU or multi-replica target where the mode has no such deployment, naming the flag:
    isolated mode (one problem alone) and the token policies (one sequence's decode) run on one tensor-parallel
    group (:func:`_one_tp_group_refusal`)."""
    if config.kind == "token":
        where = f"the token policy {config.policy!r} (one sequence's decode on one TP group)"
    elif config.mode != "serving":
        where = "isolated mode (one problem alone on one TP group; use --mode serving)"
    else:
        return
    err = _one_tp_group_refusal(target, where)
    if err is not None:
        raise err


def baseline_run(session, target, config, name: str) -> tuple:
    """``(mean latency, positions, per-problem latencies)`` of the baseline ``name`` on the same target,
    problems, workload and seed (memoised; the per-problem figures pair the speedups' bootstrap)."""
    key = config.baseline_key(name) + (session.target_id(target.key), repr(target.serving),
                                        target.data_parallel_size)
    hit = session.baselines.get(key)
    if hit is None:
        base = config.baseline(name)
        r = runner(base.kind, base.mode)(session, target, base)
        hit = session.baselines[key] = (r.summary["latency_mean_s"], *r.problem_latencies())
    return hit


def baseline_latency(session, target, config, name: str) -> float:
    """Mean latency of the baseline ``name`` on the same target, problems, workload and seed (memoised)."""
    return baseline_run(session, target, config, name)[0]


def run(session, target, config) -> SimResult:
    """Simulate ``config`` on ``target`` with the session's trace (holding the session's lock)."""
    with session.lock:
        check_layout(target, config)
        res = runner(config.kind, config.mode)(session, target, config)
        if config.kind == "token":
            return res  # token.run finishes its own summary (no baselines)
        runs = {n: baseline_run(session, target, config, n) for n in BASELINES} if config.wants_baselines else None
        finish(res.summary, None if runs is None else {n: r[0] for n, r in runs.items()})
        if runs is not None:
            res.baselines = {n: (r[1], r[2]) for n, r in runs.items()}
        return res


# What compare_policies reports for each budget of a token policy.
TOKEN_BUDGET_KEYS = ("attn_output_rel_error", "attn_mass_recall", "latency_mean_s", "speedup_vs_full", "peak_kv_bytes",
                     "evictions", "kv_capacity_bytes", "kv_cap_tokens_per_sequence", "throughput_tokens_per_s",
                     "throughput_vs_full", "max_running_seqs", "length_extrapolated")


def token_entry(session, target, name: str, mode: str, workload, seed: int, arrival_rate=None) -> dict:
    """A token policy at each of the workload's compression ratios; the headline is its 4x budget."""
    opts = Workload.from_any(workload)
    res = {}
    budgets = token.token_budgets(session, name, list(opts.token_compressions), target.serving.decode_tokens)
    for label, K in budgets.items():
        config = RunConfig(policy=name, params={"budget": K} if name != "full" else {}, workload=workload,
                           mode=mode, seed=seed, arrival_rate=arrival_rate)
        r = run(session, target, config)
        res[label] = clean({"budget": K, **{k: r.summary.get(k) for k in TOKEN_BUDGET_KEYS}})
    entry = {k: None for k in SUMMARY_KEYS}
    entry.update(dict(res["4x" if "4x" in res else next(iter(res))]))
    entry.update({"budgets": res, "kind": "token", **reshape_fields(session.tf)})
    return clean(entry)


__all__ = ["run", "runner", "check_layout", "token_runs_on", "baseline_run", "baseline_latency", "token_entry",
           "RUNNERS", "BASELINES", "TOKEN_BUDGET_KEYS"]
