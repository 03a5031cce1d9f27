"""``rksim calibrate serve``: a real continuous-batching run under a binding KV capacity, then its replay.

The real run (:func:`run_serve`)
--------------------------------
Problems of the multi-branch workload (``traces.workload.build_prompts``; every
branch is one request, a problem is answered when all its branches are) are
submitted closed-loop by ``concurrency`` users: each user submits its next
problem as soon as its previous one is answered. Every iteration:

1. the serving scheduler of the simulator (``sim.serving.scheduler``, with the block
   manager ``sim.serving.kvcache``; see :mod:`calibrate.serve_sched`, the thin
   adapter) picks the sequences, the tokens of each (a decode step, a prefill
   chunk) and the preemptions — the very objects the simulator calls;
2. :func:`calibrate.serve_forward.run_iteration` runs those items as one
   packed forward of the real model over a paged KV pool whose blocks *are*
   the block manager's block ids (a prefix-cache hit reads the cached block's
   rows in place; a preempted sequence loses its blocks and recomputes);
3. the sequences that completed their known tokens sample their next token
   (seeded, one generator per branch: ``traces.capture_ops.seed_for``);
4. the scheduler is told what was computed and sampled, and which sequences
   finished (a stop token or ``max_new_tokens``).

Each iteration is timed on two clocks: wall (``time.perf_counter``) and the
thread's CPU time (``time.thread_time``; with one torch thread the work runs
on this thread, so CPU time is the work itself and not the neighbours on a
shared machine, DESIGN §6). Scheduling and sampling bookkeeping are timed
apart from the model's execution.

The replay (:mod:`calibrate.serve_replay`)
-----------------------------------------
The run's requests (prompt ids, generated lengths, problems) are replayed by
the simulator's serving engine (``sim.serving.engine.Engine``, closed loop, the same
scheduler configuration) with the cost model of the hardware profile
(default ``local-cpu``) pricing every iteration; the comparison is made
iteration by iteration (:func:`compare`).

Outputs (``DIR``, written atomically as a whole folder): ``iterations.parquet``
(one row per iteration: real and simulated composition, clocks, simulated
seconds), ``requests.parquet`` (one row per request: tokens, arrival/finish
iterations, real and simulated times), ``problems.parquet`` and
``serve.json`` (the summary, also printed by ``--json``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.serve_config import ServeConfig, check_host, profile_host_fields
from calibrate.serve_workload import ClosedLoop, Request, build_requests, check_capacity
from sim.serving.kvshare import shared_tokens

SUMMARY_FILE = "serve.json"


# --------------------------------------------------------------------------- the real loop
def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def real_loop(lm, cfg: ServeConfig, reqs: list[Request], stop_ids, progress: bool = True,
              record: bool = True, logits_hook=None) -> list[dict]:
    """Serve ``reqs`` closed-loop on the real model; one record per iteration.

    ``logits_hook(rid, logits)``, if given, sees every row of logits a token is sampled from
    (tests compare them with a plain forward of the same tokens).
    """
    from tqdm import tqdm
    from traces import capture_ops as CO

    from calibrate.serve_forward import Item, PagedKV, run_iteration
    from calibrate.serve_sched import SchedulerAdapter

    stop = set(int(s) for s in stop_ids)
    sync = getattr(lm, "sync", None) or (lambda: None)   # torch.cuda.synchronize on a GPU
    kv = PagedKV(lm, cfg.num_blocks, cfg.block_size)
    sched = SchedulerAdapter(cfg)
    loop = ClosedLoop(reqs, cfg.concurrency)
    by_rid = {r.rid: r for r in reqs}
    rows = []
    pending = loop.first()
    it = 0
    bar = tqdm(total=len(reqs), desc="calibrate serve", unit="seq", disable=not progress)
    while True:
        for r in pending:
            r.arrival_iter = it
            sched.add(r)
        pending = []
        if sched.idle():
            break
        w0, c0 = _clocks()
        step = sched.schedule()
        w1, c1 = _clocks()
        if not step.items:
            raise RuntimeError(f"calibrate serve: the scheduler scheduled nothing at iteration {it} with "
                               f"{sched.n_unfinished()} unfinished requests (capacity too small for one sequence?)")
        items = []
        for rid, start, n, samples in step.items:
            r = by_rid[rid]
            toks = r.tokens
            end = start + n
            if samples != (end == len(toks)):
                raise RuntimeError(f"calibrate serve: request {rid}: the scheduler's token count disagrees with "
                                   f"the tokens known ({end} of {len(toks)}, samples={samples})")
            items.append(Item(key=rid, tokens=toks[start:end], start=start,
                              slots=kv.slots(step.block_tables[rid], end), sample=samples))
        logits = run_iteration(lm, kv, items)
        sync()
        wf, cf = _clocks()
        sampled = {rid: int(CO.sample_tokens(lg[None, :], [by_rid[rid].gen], cfg.temperature, cfg.top_p)[0])
                   for rid, lg in logits.items()}
        w2, c2 = _clocks()
        if logits_hook is not None:
            for rid, lg in logits.items():
                logits_hook(rid, lg)
        for rid, tok in sampled.items():
            r = by_rid[rid]
            r.out.append(tok)   # known before the next schedule(): its block's content
            if r.first_iter < 0:
                r.first_iter = it
        for rid in step.preempted:
            by_rid[rid].preempted += 1
        done = sched.update(step, [rid for rid, tok in sampled.items() if tok in stop])
        finished = [by_rid[rid] for rid in done]
        for r in finished:
            r.finish_iter = it
        w3, c3 = _clocks()
        if record:
            rows.append(_iter_row(it, step, finished, sched, {
                "sched_wall_s": (w1 - w0) + (w3 - w2), "sched_cpu_s": (c1 - c0) + (c3 - c2),
                "wall_s": w2 - w1, "cpu_s": c2 - c1, "forward_wall_s": wf - w1, "forward_cpu_s": cf - c1}))
        bar.update(len(finished))
        pending = loop.finished(finished)
        it += 1
    bar.close()
    return rows


def _iter_row(it: int, step, finished, sched, clocks: dict) -> dict:
    """One iteration: what the scheduler ran and its clocks (the replay's rows, ``serve_replay.StepLog``, have
    the same composition columns)."""
    return {
        "iteration": it,
        "seqs": [int(x[0]) for x in step.items],
        "c": [int(x[1]) for x in step.items],
        "n": [int(x[2]) for x in step.items],
        "sample": [bool(x[3]) for x in step.items],
        # cached tokens in blocks an earlier item of the iteration reads too (sim.serving.kvshare, the engine's rule)
        "shared": shared_tokens([step.block_tables[x[0]] for x in step.items], [int(x[1]) for x in step.items],
                                sched.bs),
        "preempted": sorted(int(x) for x in step.preempted),
        "finished": sorted(int(r.rid) for r in finished),
        "cache_hit_tokens": int(sum(step.cache_hits.values())),
        "recompute_tokens": int(step.recompute),
        "n_running": int(sched.n_running()), "n_waiting": int(sched.n_waiting()),
        "kv_blocks_used": int(sched.blocks_used()),
        **clocks,
    }


# --------------------------------------------------------------------------- comparison
def _e2e(rows: pd.DataFrame, reqs: pd.DataFrame, sec_col: str) -> pd.Series:
    """Per problem: end of the iteration its last branch finished minus the end of the one before it arrived."""
    T = np.concatenate([[0.0], np.cumsum(rows[sec_col].to_numpy(np.float64))])
    g = reqs.groupby("problem").agg(arrival=("arrival_iter", "min"), finish=("finish_iter", "max"))
    return pd.Series(T[g["finish"].to_numpy() + 1] - T[g["arrival"].to_numpy()], index=g.index)


def compare(rows: pd.DataFrame, sim_rows: pd.DataFrame, reqs: pd.DataFrame, clock: str) -> dict:
    """Iteration-for-iteration parity and the timing errors of the replay against the real run.

    ``scheduling_parity`` = share of iterations ``i < max(n_real, n_sim)`` whose
    (sequence, new tokens, cached tokens) items and preempted set are equal (an
    iteration that exists on one side only is a mismatch). Errors are relative,
    ``(sim - real) / real``: makespan = sum of the iterations' seconds (measured
    on ``clock``), throughput = generated tokens / makespan, e2e per problem
    (see :func:`_e2e`); ``e2e_median_abs_pct_error`` is the median over
    problems of ``|sim - real| / real`` in percent.
    """
    n = max(len(rows), len(sim_rows))
    same = 0
    first_diff = None
    for i in range(n):
        if i < len(rows) and i < len(sim_rows):
            a, b = rows.iloc[i], sim_rows.iloc[i]
            ok = (list(a["seqs"]) == list(b["seqs"]) and list(a["n"]) == list(b["n"])
                  and list(a["c"]) == list(b["c"]) and list(a["preempted"]) == list(b["preempted"]))
        else:
            ok = False
        same += ok
        if not ok and first_diff is None:
            first_diff = i
    sec = f"{clock}_s"
    ms_real = float(rows[sec].sum())
    ms_sim = float(sim_rows["sim_s"].sum())
    gen = float(reqs["gen_len"].sum())
    e_real = _e2e(rows, reqs, sec)
    e_sim = _e2e(sim_rows, reqs.assign(arrival_iter=reqs["sim_arrival_iter"], finish_iter=reqs["sim_finish_iter"]),
                 "sim_s") if "sim_arrival_iter" in reqs else _e2e(sim_rows, reqs, "sim_s")
    ape = (np.abs(e_sim - e_real) / e_real) * 100.0
    fwd = f"forward_{clock}_s"
    extra = {}
    if fwd in rows:   # diagnosis: the model's forward alone, without sampling (the cost model has no sampling term)
        ms_fwd = float(rows[fwd].sum())
        extra = {"makespan_forward_only_real_s": ms_fwd, "makespan_error_vs_forward_only": (ms_sim - ms_fwd) / ms_fwd}
    return {**extra,
        "scheduling_parity": same / n if n else float("nan"),
        "first_mismatch_iteration": first_diff,
        "n_iterations": int(len(rows)), "n_iterations_sim": int(len(sim_rows)),
        "makespan_real_s": ms_real, "makespan_sim_s": ms_sim,
        "makespan_error": (ms_sim - ms_real) / ms_real,
        "throughput_real_tokens_per_s": gen / ms_real, "throughput_sim_tokens_per_s": gen / ms_sim,
        "throughput_error": (gen / ms_sim - gen / ms_real) / (gen / ms_real),
        "e2e_median_abs_pct_error": float(np.median(ape)),
        "e2e_real_s": [float(x) for x in e_real], "e2e_sim_s": [float(x) for x in e_sim],
        "iteration_abs_pct_error_median": float(np.median(
            np.abs(sim_rows["sim_s"].to_numpy()[:min(len(rows), len(sim_rows))]
                   - rows[sec].to_numpy()[:min(len(rows), len(sim_rows))])
            / rows[sec].to_numpy()[:min(len(rows), len(sim_rows))]) * 100.0),
    }


# --------------------------------------------------------------------------- the run folder
def _parquet_bytes(df: pd.DataFrame) -> bytes:
    import io
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def check_out(out: Path) -> None:
    """Refuse to replace a folder that is not an earlier ``calibrate serve`` run (nothing is lost)."""
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"--out: {out} exists and is not a directory")
        if any(out.iterdir()) and not (out / SUMMARY_FILE).is_file():
            raise ValueError(f"--out: {out} is not empty and holds no calibrate serve run ({SUMMARY_FILE})")


def write_run(out: Path, files: dict[str, bytes]) -> None:
    """Write the run folder atomically: a sibling temp folder, then renamed over ``out``.

    A reader (the dashboard) sees the old run or the new one, never a half-written
    folder; an earlier run at ``out`` is removed only after the new one is in place.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    check_out(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, data in files.items():
            with open(tmp / name, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)
        for name in files:
            os.chmod(tmp / name, 0o644)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rmdir(old)
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def requests_frame(reqs: list[Request]) -> pd.DataFrame:
    return pd.DataFrame([{
        "rid": r.rid, "problem": r.problem, "problem_index": r.problem_index, "branch": r.branch, "user": r.user,
        "prompt_len": len(r.prompt), "gen_len": len(r.out), "prompt_ids": list(r.prompt), "gen_ids": list(r.out),
        "arrival_iter": r.arrival_iter, "first_iter": r.first_iter, "finish_iter": r.finish_iter,
        "preempted": r.preempted,
    } for r in reqs])


def serve_requests(lm, cfg: ServeConfig, reqs: list[Request], stop, progress: bool = False, logits_hook=None):
    """The real loop over ``reqs``, then their replay and the comparison.

    Returns ``(rows, requests, sim_rows, sim_info, comparison, loop_wall_s)``.
    """
    from calibrate.serve_replay import replay

    check_capacity(cfg, reqs)
    # the replay prices the dtype the model ran in (a CPU run is float32; the preset says bf16)
    cfg.dtype = str(lm.dtype).replace("torch.", "")
    t0 = time.perf_counter()
    rows = pd.DataFrame(real_loop(lm, cfg, reqs, stop, progress=progress, logits_hook=logits_hook))
    loop_wall = time.perf_counter() - t0
    rq = requests_frame(reqs)
    sim_rows, sim_req, sim_info = replay(cfg, rq)
    rq = rq.merge(sim_req, on="rid", how="left")
    if not (rq["sim_gen_len"] == rq["gen_len"]).all():
        raise RuntimeError("calibrate serve: the replay generated other lengths than the real run")
    return rows, rq, sim_rows, sim_info, compare(rows, sim_rows, rq, cfg.clock), loop_wall


REAL_COLUMNS = ("iteration", "seqs", "c", "n", "sample", "shared", "preempted", "finished", "cache_hit_tokens",
                "recompute_tokens", "n_running", "n_waiting", "kv_blocks_used", "sched_wall_s", "sched_cpu_s",
                "wall_s", "cpu_s", "forward_wall_s", "forward_cpu_s")


def rescore(run_dir: Path, hardware: str | None = None, clock: str | None = None, allow_other_host: bool = False,
            allow_extrapolation: bool = False) -> dict:
    """Replay a saved run again (another hardware profile or clock) without running the model.

    Reads ``requests.parquet``, the real columns of ``iterations.parquet`` and the
    config in ``serve.json``; returns the comparison (:func:`compare`).
    """
    from calibrate.serve_replay import replay

    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY_FILE).is_file():
        raise FileNotFoundError(f"{run_dir / SUMMARY_FILE}: missing (not a calibrate serve run)")
    saved = json.loads((run_dir / SUMMARY_FILE).read_text())
    conf = saved["config"]
    if hardware is not None:
        conf["hardware"] = hardware
    if clock is not None:
        conf["clock"] = clock
    conf["allow_other_host"], conf["allow_extrapolation"] = bool(allow_other_host), bool(allow_extrapolation)
    cfg = ServeConfig(**conf)
    it = pd.read_parquet(run_dir / "iterations.parquet")
    rows = it[[c for c in REAL_COLUMNS if c in it.columns]].dropna(subset=["cpu_s"]).reset_index(drop=True)
    rq = pd.read_parquet(run_dir / "requests.parquet")
    rq = rq[[c for c in rq.columns if not c.startswith("sim_")]]
    host = {}
    if saved.get("fingerprint"):   # the run's host against the profile's: refused when they differ
        check_host(cfg.hardware, saved["fingerprint"], allow_other_host=cfg.allow_other_host)
        host = profile_host_fields(cfg.hardware, saved["fingerprint"])
    sim_rows, sim_req, info = replay(cfg, rq)
    return {**compare(rows, sim_rows, rq.merge(sim_req, on="rid"), cfg.clock), "hardware": info["hardware"],
            "hardware_source": info["hardware_source"], "clock": cfg.clock, **host,
            "extrapolated": info["extrapolated"]}


def phases_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The iterations as ``calibrate run``'s ``phases.parquet`` rows (one forward + its sampling each).

    So ``rksim calibrate fit DIR`` fits a hardware profile on serving iterations
    (every row counts as an op-sweep row, ``problem = -1``: an iteration mixes problems).
    ``seconds`` is wall time and ``cpu_seconds`` the thread's CPU time, as ``calibrate run``
    records them (``calibrate fit --clock`` picks one); ``sampled`` counts the rows sampled, so
    the sampling term is fitted on them.
    """
    from calibrate.timing import PhaseRow, phases_frame

    out = []
    for r in rows.itertuples(index=False):
        row = PhaseRow("serve-iteration", kind="forward", problem=-1, policy="serve").items(
            list(r.n), list(r.c), logits=[1 if x else 0 for x in r.sample],
            shared=list(getattr(r, "shared", None) if getattr(r, "shared", None) is not None else [0] * len(r.n)))
        row.seconds = float(r.wall_s)
        row.cpu_seconds = float(r.cpu_s)
        row.sampled = int(sum(bool(x) for x in r.sample))
        out.append(row)
    return phases_frame(out)


def run_serve(cfg: ServeConfig, out: Path | None = None, progress: bool = True, lm=None) -> dict:
    """Real run, replay, comparison; writes the run folder when ``out`` is given. Returns the summary."""
    import torch
    from traces.capture import stop_ids
    from traces.models import load_model

    cfg.validate_targets()
    if out is not None:
        check_out(Path(out))
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    if lm is None:
        lm = load_model(cfg.model, device=cfg.device)
    stop = stop_ids(lm.tokenizer)
    if cfg.warmup:
        # first calls allocate and pick kernels: one short unrecorded run, not part of any measurement
        wcfg = dataclasses.replace(cfg, problems=1, concurrency=1, max_new_tokens=2)
        real_loop(lm, wcfg, build_requests(lm, wcfg), stop, progress=False, record=False)
    from calibrate.runner import model_fingerprint
    fp = model_fingerprint(lm)
    check_host(cfg.hardware, fp, allow_other_host=cfg.allow_other_host)   # before the run: nothing is lost
    reqs = build_requests(lm, cfg)
    rows, rq, sim_rows, sim_info, cmp, loop_wall = serve_requests(lm, cfg, reqs, stop, progress=progress)
    it = rows.merge(sim_rows.add_prefix("sim_").rename(columns={"sim_iteration": "iteration", "sim_sim_s": "sim_s"}),
                    on="iteration", how="outer")
    summary = {
        **{k: cmp[k] for k in ("scheduling_parity", "makespan_error", "throughput_error",
                               "e2e_median_abs_pct_error", "n_iterations")},
        "preemptions": int(sum(len(p) for p in rows["preempted"])),
        "comparison": cmp,
        "clock": cfg.clock,
        "recompute_tokens": int(rows["recompute_tokens"].sum()),
        "prefix_hit_tokens": int(rows["cache_hit_tokens"].sum()),
        "generated_tokens": int(rq["gen_len"].sum()),
        "prompt_tokens": int(rq["prompt_len"].sum()),
        "kv_capacity_tokens": int(cfg.num_blocks * cfg.block_size),
        "kv_capacity_blocks": int(cfg.num_blocks),
        "kv_capacity_bytes": int(cfg.num_blocks * cfg.block_size * 2 * lm.n_layers * lm.n_kv_heads * lm.head_dim
                                 * torch.tensor([], dtype=lm.dtype).element_size()),
        "max_running_seqs": int(rows["n_running"].max()),
        "peak_kv_blocks": int(rows["kv_blocks_used"].max()),
        "makespan_wall_s": float(rows["wall_s"].sum()), "makespan_cpu_s": float(rows["cpu_s"].sum()),
        "sched_wall_s": float(rows["sched_wall_s"].sum()), "loop_wall_s": float(loop_wall),
        "sim": sim_info,
        **profile_host_fields(cfg.hardware, fp),
        "config": dataclasses.asdict(cfg),
        "model": lm.info(), "device": str(lm.device), "threads": torch.get_num_threads(),
        "fingerprint": fp,
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform()},
        "command": " ".join(sys.argv),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if out is not None:
        # run.json: what `rksim calibrate fit DIR` reads next to phases.parquet
        run_json = {"kind": "calibrate serve", "problems": [], "model": lm.info(), "device": str(lm.device),
                    "threads": torch.get_num_threads(), "created": summary["created"], "clock": cfg.clock,
                    "fingerprint": fp}
        write_run(Path(out), {
            "iterations.parquet": _parquet_bytes(it),
            "requests.parquet": _parquet_bytes(rq),
            "phases.parquet": _parquet_bytes(phases_table(rows)),
            "run.json": (json.dumps(run_json, indent=1, sort_keys=True, default=float) + "\n").encode(),
            SUMMARY_FILE: (json.dumps(summary, indent=1, sort_keys=True, default=float) + "\n").encode(),
        })
        summary["out"] = str(out)
    return summary


def format_serve(s: dict) -> str:
    c = s["comparison"]
    return (f"calibrate serve: {s['n_iterations']} iterations, {s['preemptions']} preemptions, "
            f"scheduling parity {s['scheduling_parity']:.1%}; makespan real {c['makespan_real_s']:.2f} s "
            f"({s['clock']}) vs simulated {c['makespan_sim_s']:.2f} s ({s['makespan_error']:+.1%}), "
            f"throughput {s['throughput_error']:+.1%}, e2e median |error| {s['e2e_median_abs_pct_error']:.1f}%"
            + (f"; wrote {s['out']}" if s.get("out") else ""))
