"""Calibration benchmark: fidelity of the simulator against real runs, real speedups, eviction quality.

Writes ``DIR/calibrate.json`` and prints a short table. Steps (all on the real
default model, 1 CPU thread):

1. ``calibrate run`` (problems x every end-to-end policy, op sweep, parity capture),
   ``calibrate fit`` (preset written to ``DIR/calibrate/local-cpu.yaml``, not to the
   repository), ``calibrate report`` on the held-out problems;
2. ``calibrate speedup`` on the RKSC paper's shape (prefix ~1,024 tokens, B = 8,
   32 new tokens);
3. ``calibrate quality`` for the token-eviction policies at 2x, 4x, 8x.

Goals (from the issue): mean latency error <= 2%, per-problem median <= 5%,
speedup-ratio error <= 3%, RKSC >= 3x faster than No-KV on the paper's shape.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    args = ap.parse_args(argv)

    from calibrate.fit import fit_run_dir
    from calibrate.quality import QualityConfig, run_quality
    from calibrate.report import fidelity_report
    from calibrate.runner import RunConfig, run_calibration
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
            cfg = RunConfig(problems=args.problems, branches=args.branches, max_new_tokens=args.max_new_tokens,
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
