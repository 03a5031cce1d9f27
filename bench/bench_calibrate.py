"""Calibration benchmark: fidelity of the simulator against real runs, real speedups, eviction quality.

Writes ``DIR/calibrate.json`` and prints a short table. Steps (all on the real
default model, 1 CPU thread):

1. ``calibrate run`` (problems x every end-to-end policy, op sweep, parity capture),
   ``calibrate fit`` (preset written to ``DIR/calibrate/local-cpu.yaml``, not to the
   repository), ``calibrate report`` on the held-out problems;
2. ``calibrate speedup`` on the RKSC paper's shape (prefix ~1,024 tokens, B = 8,
   32 new tokens);
3. ``calibrate quality`` for the token-eviction policies at 2x, 4x, 8x.

Goals: mean latency error <= 2%, per-problem median <= 5%,
speedup-ratio error <= 3%, RKSC >= 3x faster than No-KV on the paper's shape.

``--matrix`` instead measures serving fidelity on this machine: ``rksim calibrate
host`` fits the host (or ``--host-profile FILE`` reuses such a fit), then
``calibrate serve`` runs the shapes of :data:`MATRIX` — concurrency 1, 2, 4, 8 x
KV capacity binding or not x 4 or 8 branches x 32 or 64 new tokens, every
level of every factor in four of the eight — each replayed by the simulator
under the host's profile. Written to ``DIR/calibrate-matrix.json`` and
``DIR/calibrate-matrix.md`` (goal: every shape within 5% on makespan,
throughput and e2e median, scheduling parity 100%). Before and after every
shape three of the fit's shapes are run again (``calibrate.host.speed_drift``):
``speed_drift`` is how much more CPU time the host takes now than when it was
fitted, and the ``*_drift_adjusted`` columns are the errors at that speed.
Every shape is served ``--matrix-repeats`` times (default 2; the seeded sampling
gives the same schedule each time): the errors compare the simulator with the
mean of those runs (:func:`combine_repeats`), and ``real_makespan_spread`` /
``real_e2e_spread_pct`` say how far the real runs of one shape fell from each
other: the measurement's own noise, against which a 5% goal is read.

``--runs N`` repeats step 1 N consecutive times (the fidelity goals must hold on
each), ``--stress-seconds S`` first starts one CPU-bound stress process (a
pure-Python busy loop that stops itself after S seconds, killed when the benchmark ends) so
that the fidelity is measured beside a neighbour, as on a shared machine; the
benchmark prints that it did. ``--clock`` is the clock fit and report use
(default ``auto``: the timing thread's CPU time on CPU). ``--fidelity-only``
skips steps 2 and 3.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/summary.py: the Markdown check

from summary import has_tabulate  # noqa: E402

# (concurrency, capacity binds, branches, max new tokens): each level of each factor in 4 of the 8
MATRIX = ((1, False, 4, 32), (1, True, 8, 64), (2, True, 4, 32), (2, False, 8, 64),
          (4, True, 8, 32), (4, False, 4, 64), (8, True, 4, 64), (8, False, 8, 32))
BINDING_TOKENS = {1: 512, 2: 768, 4: 1024, 8: 1536}   # less than the shape's KV demand: preemptions happen
FREE_TOKENS = 65536                                     # more than any shape needs
MATRIX_GOAL = 0.05


def combine_repeats(comparisons: list[dict]) -> dict:
    """The simulator against the mean of several real runs of one shape, and how far those runs spread.

    ``comparisons``: :func:`calibrate.serve.compare` of each run. Makespans are averaged, e2e per problem
    too (problem by problem); errors as ``compare``'s: ``(sim - real) / real``. Spreads:
    ``real_makespan_spread = (max - min) / mean`` of the real makespans, ``real_e2e_spread_pct`` the median
    over problems of the same ratio of their real e2e, in percent (0 for one run).
    """
    ms_r = np.array([c["makespan_real_s"] for c in comparisons])
    ms_s = np.array([c["makespan_sim_s"] for c in comparisons])
    er = np.array([c["e2e_real_s"] for c in comparisons])     # runs x problems
    es = np.array([c["e2e_sim_s"] for c in comparisons])
    gen = comparisons[0]["throughput_real_tokens_per_s"] * comparisons[0]["makespan_real_s"]
    mr, msim = float(ms_r.mean()), float(ms_s.mean())
    e_r, e_s = er.mean(axis=0), es.mean(axis=0)
    return {"repeats": len(comparisons), "makespan_real_s": mr, "makespan_sim_s": msim,
            "makespan_error": msim / mr - 1, "throughput_error": (gen / msim) / (gen / mr) - 1,
            "e2e_median_abs_pct_error": float(np.median(np.abs(e_s - e_r) / e_r) * 100),
            "e2e_real_s": [float(x) for x in e_r], "e2e_sim_s": [float(x) for x in e_s],
            "real_makespan_spread": float((ms_r.max() - ms_r.min()) / mr),
            "real_e2e_spread_pct": float(np.median((er.max(axis=0) - er.min(axis=0)) / e_r) * 100)}


def matrix(args) -> int:
    """``--matrix``: the serving-fidelity matrix (module docstring)."""
    import torch

    import numpy as np

    from calibrate.host import HostConfig, PhaseRunner, format_host, probe_reference, run_host, speed_drift
    from calibrate.serve import ServeConfig, run_serve
    from sim.cost.fingerprint import describe, profile_host_status
    from sim.cost.profiles import load_hardware
    import pandas as pd
    from traces.models import load_model
    from traces.store import atomic_write_json, atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "calibrate-matrix"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.host_profile:
        prof, host = Path(args.host_profile), None
        keep = Path(args.host_phases) if args.host_phases else None
    else:
        prof, keep = work / "host.yaml", work / "host-phases"
        host = run_host(HostConfig(minutes=args.host_minutes), out=prof, keep=keep)
        print(format_host(host), flush=True)
    hw = load_hardware(str(prof))
    torch.set_num_threads(1)
    lm = load_model("smollm2-135m", device="cpu")
    # the host's speed before and after every shape against the fit's (calibrate.host.speed_drift): a
    # miss that the drift explains is the machine's, not the cost model's
    ref = probe_reference(pd.read_parquet(keep / "phases.parquet")) if keep is not None else {}
    probe = PhaseRunner(lm, HostConfig()) if ref else None
    rows = []
    shapes = MATRIX[:args.matrix_shapes] if args.matrix_shapes else MATRIX
    for i, (conc, binds, br, new) in enumerate(shapes):
        cap = BINDING_TOKENS[conc] if binds else FREE_TOKENS
        cfg = ServeConfig(problems=max(4, 2 * conc), capacity_tokens=cap, concurrency=conc, branches=br,
                          max_new_tokens=new, hardware=str(prof), seed=args.matrix_seed)
        c1 = time.process_time()
        before = speed_drift(probe, ref) if probe else None
        runs = []
        for k in range(args.matrix_repeats):
            runs.append(run_serve(cfg, work / (f"shape{i}" if k == 0 else f"shape{i}-repeat{k}"), progress=False,
                                  lm=lm))
        after = speed_drift(probe, ref) if probe else None
        res = runs[0]
        cs = [x["comparison"] for x in runs]
        c = combine_repeats(cs)
        drift = None if probe is None else float(np.sqrt(before["drift"] * after["drift"]))
        rows.append({"concurrency": conc, "capacity_tokens": cap, "capacity_binds": binds, "branches": br,
                     "max_new_tokens": new, "problems": cfg.problems, "iterations": res["n_iterations"],
                     "preemptions": res["preemptions"], "max_running_seqs": res["max_running_seqs"],
                     # parity: every run's schedule equals the replay's
                     "scheduling_parity": min(x["scheduling_parity"] for x in runs),
                     "makespan_error": c["makespan_error"], "throughput_error": c["throughput_error"],
                     "e2e_median_abs_pct_error": c["e2e_median_abs_pct_error"],
                     "real_makespan_spread": c["real_makespan_spread"], "real_e2e_spread_pct": c["real_e2e_spread_pct"],
                     "repeats": len(runs), "same_schedule_every_repeat": len({x["n_iterations"] for x in runs}) == 1
                     and len({round(x["makespan_sim_s"], 9) for x in cs}) == 1,
                     "per_repeat": [{k: x[k] for k in ("makespan_error", "throughput_error",
                                                        "e2e_median_abs_pct_error", "scheduling_parity")}
                                    for x in runs],
                     "iteration_abs_pct_error_median": float(np.median([x["iteration_abs_pct_error_median"]
                                                                        for x in cs])),
                     "makespan_real_cpu_s": c["makespan_real_s"], "makespan_sim_s": c["makespan_sim_s"],
                     "hardware_calibrated": res.get("hardware_calibrated"), "cpu_s": time.process_time() - c1,
                     "speed_drift": drift, "speed_drift_before": None if before is None else before["drift"],
                     "speed_drift_after": None if after is None else after["drift"]})
        r = rows[-1]
        if drift is not None:
            # the same comparison with the simulator's seconds scaled by the drift (the host's speed now)
            ms = c["makespan_sim_s"] * drift
            er, es = np.asarray(c["e2e_real_s"]), np.asarray(c["e2e_sim_s"]) * drift
            r.update({"makespan_error_drift_adjusted": ms / c["makespan_real_s"] - 1,
                      "throughput_error_drift_adjusted": c["makespan_real_s"] / ms - 1,
                      "e2e_median_abs_pct_error_drift_adjusted": float(np.median(np.abs(es - er) / er) * 100)})
        atomic_write_json(args.out / "calibrate-matrix.partial.json", {"shapes": rows, "host_profile": str(prof),
                                                                        "fingerprint": hw.fingerprint})
        print(f"shape {i + 1}/{len(shapes)} C={conc} cap={cap} B={br} T={new}: parity {r['scheduling_parity']:.0%}, "
              f"makespan {r['makespan_error']:+.1%}, throughput {r['throughput_error']:+.1%}, e2e median "
              f"{r['e2e_median_abs_pct_error']:.1f}% ({r['preemptions']} preemptions, {r['iterations']} iterations; "
              f"{r['repeats']} real runs, {r['real_makespan_spread']:.1%} apart in makespan, "
              f"{r['real_e2e_spread_pct']:.1f}% in e2e)"
              + ("" if drift is None else f"; the host runs {abs(drift - 1):.1%} {'slower' if drift > 1 else 'faster'} "
                 f"than at the fit, makespan at that speed {r['makespan_error_drift_adjusted']:+.1%}"), flush=True)
    ok = [abs(r["makespan_error"]) <= MATRIX_GOAL and abs(r["throughput_error"]) <= MATRIX_GOAL
          and r["e2e_median_abs_pct_error"] <= 100 * MATRIX_GOAL and r["scheduling_parity"] == 1.0 for r in rows]
    for r, k in zip(rows, ok):
        r["within_goal"] = bool(k)
    df = pd.DataFrame(rows)
    show = df[["concurrency", "capacity_tokens", "branches", "max_new_tokens", "preemptions", "scheduling_parity",
               "makespan_error", "throughput_error", "e2e_median_abs_pct_error", "within_goal",
               "real_makespan_spread", "real_e2e_spread_pct"]
              + (["speed_drift", "makespan_error_drift_adjusted", "e2e_median_abs_pct_error_drift_adjusted"]
                 if "speed_drift" in df and df["speed_drift"].notna().all() else [])]
    fp = hw.fingerprint
    shipped = load_hardware("local-cpu")
    head = (f"Serving fidelity on {describe(fp)}: `calibrate serve` (smollm2-135m, 1 thread, cpu clock, vllm-v1, "
            f"block 16, max_num_batched_tokens 2048) vs the simulator under the `calibrate host` profile {prof.name} "
            f"({hw.extra.get('notes', '')}). Shipped local-cpu on this host: "
            f"{'matches' if profile_host_status(shipped, fp)['host_match'] else 'does not match (or records no fingerprint)'}.")
    md = head + "\n\n" + (show.to_markdown(index=False, floatfmt=".4f") if has_tabulate() else show.to_string(index=False))
    res = {"shapes": rows, "all_within_goal": all(ok), "goal": MATRIX_GOAL, "host_profile": str(prof),
           "fingerprint": fp, "shipped_local_cpu_matches_host": profile_host_status(shipped, fp)["host_match"],
           "calibrate_host": None if host is None else {k: host[k] for k in ("cpu_seconds", "budget_s", "shapes",
                                                                             "rel_rms", "roofline")},
           "seconds": time.perf_counter() - t0}
    atomic_write_json(args.out / "calibrate-matrix.json", res)
    atomic_write_text(args.out / "calibrate-matrix.md", md + "\n")
    (args.out / "calibrate-matrix.partial.json").unlink(missing_ok=True)
    print(md)
    print(f"all {len(rows)} shapes within {MATRIX_GOAL:.0%}: {all(ok)} -> {args.out / 'calibrate-matrix.json'}")
    return 0


GOALS = {"mean_abs_pct_error": 0.02, "median_abs_pct_error": 0.05, "speedup_ratio_error": 0.03,
         "rksc_speedup_vs_no_kv": 3.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--speedup-problems", type=int, default=1)
    ap.add_argument("--quality-problems", type=int, default=1)
    ap.add_argument("--long-decode", type=int, default=64)
    ap.add_argument("--runs", type=int, default=1, help="consecutive fidelity runs (run + fit + report)")
    ap.add_argument("--stress-seconds", type=int, default=0,
                    help="start one CPU-bound stress process for at most this many seconds (0: none)")
    ap.add_argument("--clock", default="auto", choices=["auto", "cpu", "wall"])
    ap.add_argument("--branches", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3,
                    help="interleaved passes per run, the fastest kept per (problem, policy) and sweep row")
    ap.add_argument("--fidelity-only", action="store_true", help="skip the speedup and quality steps")
    ap.add_argument("--reuse-runs", action="store_true",
                    help="keep finished run directories under OUT/calibrate and only re-fit and re-report them")
    ap.add_argument("--matrix", action="store_true", help="the serving-fidelity matrix instead (module docstring)")
    ap.add_argument("--host-profile", default=None, help="--matrix: a `calibrate host` profile (default: fit one)")
    ap.add_argument("--host-phases", default=None,
                    help="--matrix with --host-profile: that fit's `calibrate host --keep` folder (the speed probe's "
                         "reference; default: no probe)")
    ap.add_argument("--host-minutes", type=float, default=3.0, help="--matrix: calibrate host's budget (default 3)")
    ap.add_argument("--matrix-shapes", type=int, default=0, help="--matrix: only the first N shapes (default all)")
    ap.add_argument("--matrix-seed", type=int, default=0, help="--matrix: sampling seed of the serve runs")
    ap.add_argument("--matrix-repeats", type=int, default=2,
                    help="--matrix: real runs of every shape; the simulator is compared with their mean (default 2)")
    args = ap.parse_args(argv)
    if args.matrix_repeats < 1:
        ap.error(f"--matrix-repeats: must be at least 1, got {args.matrix_repeats}")
    if args.matrix:
        return matrix(args)

    from calibrate.fit import fit_run_dir
    from calibrate.quality import QualityConfig, run_quality
    from calibrate.report import fidelity_report
    from calibrate.runner import RealRunConfig, run_calibration
    from calibrate.speedup import SpeedupConfig, run_speedup
    from traces.store import atomic_write_json

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "calibrate"
    if work.exists() and not args.reuse_runs:
        shutil.rmtree(work)
    stress = None
    if args.stress_seconds > 0 and not args.reuse_runs:
        # One neighbour that wants a whole core, bounded in time, like another engineer's job.
        # The loop bounds itself (no `timeout` wrapper: killing a wrapper leaves its child running).
        stress = subprocess.Popen([sys.executable, "-c",
                                   f"import time\nend = time.monotonic() + {int(args.stress_seconds)}\n"
                                   "while time.monotonic() < end:\n    pass\n"])
        print(f"bench_calibrate: started a CPU-bound stress process (pid {stress.pid}, a Python busy loop, "
              f"at most {args.stress_seconds} s, killed when the benchmark ends) beside the benchmark", flush=True)
    t0 = time.perf_counter()
    runs = []
    try:
        for i in range(args.runs):
            d = work / (f"run{i}" if args.runs > 1 else "run")
            cfg = RealRunConfig(problems=args.problems, branches=args.branches, max_new_tokens=args.max_new_tokens,
                            repeats=args.repeats)
            t1 = time.perf_counter()
            if args.reuse_runs and (d / "run.json").is_file():
                run = json.loads((d / "run.json").read_text())
                print(f"fidelity run {i + 1}/{args.runs}: reusing {d} (re-fit and re-report only)", flush=True)
            else:
                run = run_calibration(cfg, d)
            fit = fit_run_dir(d, name="local-cpu", out=d.parent / f"local-cpu-{d.name}.yaml", clock=args.clock)
            rep = fidelity_report(d, clock=args.clock)
            runs.append({"dir": str(d), "seconds": time.perf_counter() - t1, "clock": rep["clock"],
                         "roofline": fit["roofline"], "by_roofline": fit["by_roofline"],
                         **{k: rep[k] for k in ("mean_abs_pct_error", "median_abs_pct_error", "p90_abs_pct_error",
                                                "speedup_ratio_error", "decision_parity")},
                         "by_clock": rep["by_clock"], "cost_model_replay": {
                             k: rep["cost_model_replay"][k] for k in ("mean_abs_pct_error", "median_abs_pct_error",
                                                                      "speedup_ratio_error")},
                         "coefficients": fit["coefficients"]})
            print(f"fidelity run {i + 1}/{args.runs} ({rep['clock']} clock, {fit['roofline']} roofline): "
                  f"mean {rep['mean_abs_pct_error']:.2%}, median {rep['median_abs_pct_error']:.2%}, speedup-ratio "
                  f"{(rep['speedup_ratio_error'] or 0):.2%}, parity {rep['decision_parity']:.0%} "
                  f"[{runs[-1]['seconds']:.0f} s]", flush=True)
    finally:
        if stress is not None and stress.poll() is None:
            stress.kill()
            stress.wait()
    t_fid = time.perf_counter() - t0
    res_runs = {"runs": runs, "stress_process": bool(stress is not None), "stress_seconds": args.stress_seconds,
                "all_runs_meet_goals": all(
                    r["mean_abs_pct_error"] <= GOALS["mean_abs_pct_error"]
                    and r["median_abs_pct_error"] <= GOALS["median_abs_pct_error"]
                    and (r["speedup_ratio_error"] or 0) <= GOALS["speedup_ratio_error"] for r in runs)}
    if args.fidelity_only:
        name = "calibrate-rereport.json" if args.reuse_runs else "calibrate.json"
        atomic_write_json(args.out / name, {"fidelity_runs": res_runs, "goals": GOALS,
                                            "seconds": {"fidelity": t_fid}})
        print(f"all {len(runs)} runs meet the fidelity goals: {res_runs['all_runs_meet_goals']} "
              f"-> {args.out / name}")
        return 0
    sp = run_speedup(SpeedupConfig(problems=args.speedup_problems), work / "speedup")
    t_sp = time.perf_counter() - t0 - t_fid
    q = run_quality(QualityConfig(problems=args.quality_problems, long_decode=args.long_decode), work / "quality")
    t_q = time.perf_counter() - t0 - t_fid - t_sp
    rksc_x = sp["speedup_vs_no_kv"].get("rksc")
    rksc_reuse = (sp.get("verify_reuses_kv") or {}).get("speedup_vs_no_kv", {}).get("rksc")
    res = {
        "fidelity": {k: rep[k] for k in ("mean_abs_pct_error", "median_abs_pct_error", "p90_abs_pct_error",
                                         "speedup_ratio_error", "decision_parity", "n_fit", "n_holdout",
                                         "unaccounted_host_share")},
        "fidelity_per_policy": rep["per_policy"],
        "fidelity_runs": res_runs,
        "fit": {"rel_rms": fit["rel_rms"], "rel_median_abs": fit["rel_median_abs"], **fit["coefficients"],
                "fitted_range": fit["fitted_range"]},
        "parity_by_decision": run.get("parity_by_decision"),
        "speedup": {"speedup_vs_no_kv": sp["speedup_vs_no_kv"], "speedup_vs_exact_prefix": sp["speedup_vs_exact_prefix"],
                    "latency_s": sp["latency_s"], "shape": sp["shape"],
                    "verify_reuses_kv": sp.get("verify_reuses_kv"),
                    **{k: v for k, v in sp.items() if k.startswith(("cgee_", "rksc_"))}},
        "quality": {"spearman_proxy_vs_kl": q["spearman_proxy_vs_kl"], "full_accuracy": q["full_accuracy"],
                    "table": q["table"]},
        "goals": GOALS,
        "goals_met": {
            "mean_abs_pct_error": rep["mean_abs_pct_error"] <= GOALS["mean_abs_pct_error"],
            "median_abs_pct_error": rep["median_abs_pct_error"] <= GOALS["median_abs_pct_error"],
            "speedup_ratio_error": (rep["speedup_ratio_error"] or 0) <= GOALS["speedup_ratio_error"],
            "rksc_speedup_vs_no_kv": bool(rksc_x is not None and rksc_x >= GOALS["rksc_speedup_vs_no_kv"]),
            "rksc_speedup_vs_no_kv_verify_reuses_kv": bool(rksc_reuse is not None
                                                           and rksc_reuse >= GOALS["rksc_speedup_vs_no_kv"]),
        },
        "seconds": {"fidelity": t_fid, "speedup": t_sp, "quality": t_q, "total": time.perf_counter() - t0},
    }
    atomic_write_json(args.out / "calibrate.json", res)
    f = res["fidelity"]
    print(f"{'metric':<34}{'value':>10}{'goal':>8}")
    print(f"{'mean |error| of mean latency':<34}{f['mean_abs_pct_error']:>10.2%}{'<=2%':>8}")
    print(f"{'median |error| per problem':<34}{f['median_abs_pct_error']:>10.2%}{'<=5%':>8}")
    print(f"{'speedup-ratio error':<34}{(f['speedup_ratio_error'] or 0):>10.2%}{'<=3%':>8}")
    print(f"{'decision parity':<34}{f['decision_parity']:>10.1%}{'100%':>8}")
    print(f"{'RKSC speedup vs No-KV (paper shape)':<34}{(rksc_x or 0):>10.2f}{'>=3x':>8}")
    print(f"{'  same, verify_reuses_kv':<34}{(rksc_reuse or 0):>10.2f}{'>=3x':>8}")
    print(f"{'Spearman(proxy, KL)':<34}{(q['spearman_proxy_vs_kl'] or 0):>10.2f}")
    print(f"total {res['seconds']['total']:.0f} s -> {args.out / 'calibrate.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
