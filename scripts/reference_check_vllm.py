"""``make reference-check-vllm``: rksim's serving scheduler against vLLM 0.33's V1 scheduler.

1. Streams (:func:`reference_check_vllm_common.make_streams`, seeded): eight request streams
   of 1,000+ steps each — closed loop, Poisson, multi-branch problems sharing prefixes, long
   prompts cut by ``max_num_batched_tokens``, KV exhaustion (preemption and resumption),
   whole-prompt hits (the ``n - 1`` rule), same-step hits — written to ``OUT/streams.json``.
2. vLLM's side (its own venv, ``scripts/reference_check_vllm_driver.py``): vLLM's
   ``Scheduler`` runs every stream with its default ``scheduler_reserve_full_isl=True`` and
   with ``False``; step logs in ``OUT/vllm-*.json``.
3. rksim's side (this process): ``sim.serving.scheduler.Scheduler`` over ``sim.serving.kvcache.BlockManager``
   (the objects the simulator and ``calibrate serve`` call) runs the same streams with
   ``--scheduler vllm-v1`` (the default) and ``vllm-v1-chunk-admit``.
4. Per step: scheduled request ids and token counts (in order), tokens computed before the
   step per scheduled request, preemptions, finished requests, free blocks after schedule and
   after update. Report: ``OUT/report.{md,json}`` with ``steps_compared``, ``steps_agreeing``
   and the first divergence of each stream with both sides. Exit 1 when a matched pair
   (rksim ``vllm-v1`` vs vLLM's default; ``vllm-v1-chunk-admit`` vs ``reserve_full_isl=False``)
   agrees on fewer than all steps of a stream (a regression); the crossed pairs show what
   the admission rule changes, for information.

``--record DIR`` also writes compact recorded vLLM step logs (``DIR/*.json.gz``: stream +
vLLM's steps, the first ``--record-steps`` steps of the streams ``make test`` replays).

Usage: ``python scripts/reference_check_vllm.py --vllm-python .venv-vllm/bin/python
[--out runs/reference-check-vllm] [--seed 0] [--record tests/data/vllm_steps]``
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "scripts")):
    if p not in sys.path:
        sys.path.insert(0, p)

from reference_check_vllm_common import (FIELDS, compare, drive, make_streams, output_tokens,  # noqa: E402
                                         prompt_tokens, write_json)

# (rksim --scheduler, vLLM scheduler_reserve_full_isl, checked: must agree on every step)
PAIRS = [("vllm-v1", "true", True), ("vllm-v1-chunk-admit", "false", True),
         ("vllm-v1-chunk-admit", "true", False), ("vllm-v1", "false", False)]
# recorded for make test: (stream, vLLM scheduler_reserve_full_isl)
RECORD = (("same-step-hits", "true"), ("whole-prompt-hits", "true"), ("kv-exhaustion", "true"),
          ("closed-loop", "true"), ("closed-loop", "false"))


class RksimSide:
    """rksim's scheduler + block manager behind the loop of :func:`reference_check_vllm_common.drive`.

    ``kv_factory``: builds the block manager (tests pass one with a rule removed).
    """

    def __init__(self, config: dict, policy: str, kv_factory=None):
        from sim.serving.kvcache import BlockManager
        from sim.serving.scheduler import Scheduler, SchedulerConfig

        self.bs = int(config["block_size"])
        make = kv_factory or BlockManager
        self.kv = make(int(config["num_blocks"]), self.bs, caching=bool(config["prefix_caching"]))
        self.s = Scheduler(SchedulerConfig(max_num_seqs=int(config["max_num_seqs"]),
                                           max_num_batched_tokens=int(config["max_num_batched_tokens"]),
                                           long_prefill_token_threshold=int(config["long_prefill_token_threshold"]),
                                           policy=policy), self.kv)

    def add(self, req: dict) -> None:
        from sim.serving.scheduler import Request

        toks = prompt_tokens(req) + output_tokens(req)
        bs = self.bs

        def content(k, toks=toks):
            return tuple(toks[k * bs:(k + 1) * bs])

        self.s.add(Request(req_id=int(req["id"]), prompt_tokens=len(prompt_tokens(req)),
                           max_output_tokens=int(req["max_tokens"]), content=content))

    def has_unfinished(self) -> bool:
        return self.s.has_unfinished()

    def step(self) -> dict:
        out = self.s.schedule()
        fs = self.kv.num_free
        done = self.s.update(out)
        return {"s": [[it.req.req_id, int(it.num_cached), int(it.num_new)] for it in out.items],
                "p": [r.req_id for r in out.preempted], "f": [r.req_id for r in done],
                "fs": int(fs), "fu": int(self.kv.num_free)}


def run_rksim(streams: list, policy: str, kv_factory=None) -> dict:
    return {st["name"]: drive(st, RksimSide(st["config"], policy, kv_factory)) for st in streams}


def record(path: Path, stream: dict, vllm_log: list, n_steps: int, meta: dict) -> None:
    """A recorded vLLM step log for ``make test``: vLLM's first ``n_steps`` steps (gzip JSON) and the
    stream cut to the groups those steps reach (plus a few queued behind them)."""
    steps = vllm_log[:n_steps]
    seen = {it[0] for rec in steps for it in rec["s"]}
    last = max(g for g, grp in enumerate(stream["groups"]) if any(r["id"] in seen for r in grp["requests"]))
    cut = {**stream, "groups": stream["groups"][:last + 1 + 8]}
    obj = {"about": "vLLM 0.33.0 V1 Scheduler decisions on this stream, recorded by "
                    "scripts/reference_check_vllm.py (fields: scripts/reference_check_vllm_common.py)",
           **meta, "stream": cut, "steps": steps}
    tmp = path.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as f:
        f.write(json.dumps(obj, separators=(",", ":")).encode())
    os.replace(tmp, path)


def _fmt_step(rec) -> str:
    if rec is None:
        return "(no step)"
    return json.dumps({k: rec[k] for k in FIELDS}, separators=(",", ":"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="rksim's scheduler against vLLM 0.33's V1 scheduler")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm/bin/python"))
    ap.add_argument("--out", default=str(ROOT / "runs/reference-check-vllm"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", default=None, metavar="DIR", help="write recorded vLLM step logs for make test")
    ap.add_argument("--record-steps", type=int, default=300)
    ap.add_argument("--reuse-vllm", action="store_true",
                    help="reuse OUT's vLLM step logs when OUT/streams.json holds the same streams (rksim side only)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not Path(a.vllm_python).exists():
        print(f"--vllm-python: {a.vllm_python} does not exist (make reference-check-vllm builds .venv-vllm)",
              file=sys.stderr)
        return 2
    streams = make_streams(a.seed)
    same = False
    if a.reuse_vllm and (out / "streams.json").exists():
        with open(out / "streams.json") as f:
            same = json.load(f) == streams
    write_json(str(out / "streams.json"), streams)

    vllm_logs, vllm_meta = {}, {}
    for rfi in ("true", "false"):
        dst = out / f"vllm-reserve-full-isl-{rfi}.json"
        if same and dst.exists():
            with open(dst) as f:
                d = json.load(f)
            vllm_logs[rfi] = d["logs"]
            vllm_meta[rfi] = {"vllm_version": d["vllm_version"], "vllm_scheduler": d["scheduler"],
                              "scheduler_reserve_full_isl": d["scheduler_reserve_full_isl"]}
            print(f"vLLM {d['vllm_version']} (scheduler_reserve_full_isl={rfi}): reused {dst}")
            continue
        t0 = time.time()
        cmd = [a.vllm_python, str(ROOT / "scripts/reference_check_vllm_driver.py"), str(out / "streams.json"),
               str(dst), "--reserve-full-isl", rfi if rfi == "false" else "default"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout[-4000:], r.stderr[-4000:], file=sys.stderr)
            print(f"vLLM side failed ({' '.join(cmd)})", file=sys.stderr)
            return 2
        with open(dst) as f:
            d = json.load(f)
        if str(d["scheduler_reserve_full_isl"]).lower() != rfi:
            print(f"vLLM side ran with scheduler_reserve_full_isl={d['scheduler_reserve_full_isl']}, "
                  f"expected {rfi}", file=sys.stderr)
            return 2
        vllm_logs[rfi] = d["logs"]
        vllm_meta[rfi] = {"vllm_version": d["vllm_version"], "vllm_scheduler": d["scheduler"],
                          "scheduler_reserve_full_isl": d["scheduler_reserve_full_isl"]}
        print(f"vLLM {d['vllm_version']} (scheduler_reserve_full_isl={rfi}): {time.time() - t0:.1f} s", flush=True)

    rk_logs = {}
    for pol in ("vllm-v1", "vllm-v1-chunk-admit"):
        t0 = time.process_time()
        rk_logs[pol] = run_rksim(streams, pol)
        print(f"rksim --scheduler {pol}: {time.process_time() - t0:.1f} s CPU", flush=True)

    rows, fail = [], False
    for pol, rfi, checked in PAIRS:
        for st in streams:
            c = compare(rk_logs[pol][st["name"]], vllm_logs[rfi][st["name"]])
            ok = c["steps_agreeing"] == c["steps_compared"]
            if checked and not ok:
                fail = True
            rows.append({"stream": st["name"], "about": st["about"], "rksim_scheduler": pol,
                         "vllm_scheduler_reserve_full_isl": rfi == "true", "checked": checked,
                         "agree": ok, **c})
    report = {"vllm": vllm_meta, "seed": a.seed, "fields": list(FIELDS),
              "config_of_stream": {st["name"]: st["config"] for st in streams},
              "rows": rows, "regression": fail}
    write_json(str(out / "report.json"), report)
    (out / "report.md").write_text(_markdown(report, streams))
    for r in rows:
        print(f"{r['stream']:18s} rksim {r['rksim_scheduler']:20s} vs vLLM reserve_full_isl="
              f"{str(r['vllm_scheduler_reserve_full_isl']):5s}: {r['steps_agreeing']}/{r['steps_compared']} steps"
              f" agree; preemptions {r['preemptions'][0]} / {r['preemptions'][1]}"
              + ("" if r["checked"] else "  (information)"))
    if a.record:
        rec = Path(a.record)
        rec.mkdir(parents=True, exist_ok=True)
        by = {st["name"]: st for st in streams}
        for name, rfi in RECORD:
            record(rec / f"{name}-reserve-full-isl-{rfi}.json.gz", by[name], vllm_logs[rfi][name],
                   a.record_steps, {**vllm_meta[rfi], "seed": a.seed})
        print(f"recorded vLLM step logs in {rec}")
    print(f"report: {out / 'report.md'}")
    return 1 if fail else 0


def _markdown(rep: dict, streams: list) -> str:
    v = rep["vllm"]["true"]
    lines = ["# rksim's serving scheduler against vLLM's V1 scheduler", "",
             f"vLLM {v['vllm_version']} `vllm.v1.core.sched.scheduler.{v['vllm_scheduler']}` on CPU, one "
             "full-attention KV group with one more block than rksim's (vLLM's null block), prefix caching "
             "on (sha256 block hashes), chunked prefill on; the fake model samples each stream's next "
             "output token for every request whose known tokens are all computed. rksim: "
             "`sim.serving.scheduler.Scheduler` over `sim.serving.kvcache.BlockManager` (LRU). Compared per step: "
             + ", ".join(f"`{f}`" for f in rep["fields"]) + f". Seed {rep['seed']}.", "",
             "Fields: `s` the scheduled requests in order, `[id, tokens computed before the step (prefix hit "
             "included), tokens scheduled]`; `p` requests preempted while forming the step, in order; `f` "
             "requests finished by the step; `fs` / `fu` free blocks (clean + evictable cache) after schedule / "
             "after update. A row marked (information) crosses the admission rules: it shows where "
             "`scheduler_reserve_full_isl` changes the schedule, and is not checked.", "",
             "| stream | rksim `--scheduler` | vLLM `scheduler_reserve_full_isl` | steps_compared | "
             "steps_agreeing | preemptions rksim / vLLM | first divergence |",
             "| --- | --- | --- | ---: | ---: | --- | --- |"]
    for r in rep["rows"]:
        fd = r["first_divergence"]
        lines.append(f"| {r['stream']} | {r['rksim_scheduler']} | {r['vllm_scheduler_reserve_full_isl']}"
                     f"{'' if r['checked'] else ' (information)'} | {r['steps_compared']} | {r['steps_agreeing']} | "
                     f"{r['preemptions'][0]} / {r['preemptions'][1]} | "
                     f"{'none' if fd is None else 'step ' + str(fd['step']) + ': ' + ', '.join(fd['fields'])} |")
    lines += ["", "## Streams", ""]
    for st in streams:
        lines.append(f"- **{st['name']}**: {st['about']}; `{json.dumps(st['config'])}`")
    lines += ["", "## First divergences", ""]
    for r in rep["rows"]:
        fd = r["first_divergence"]
        if fd is None:
            continue
        lines += [f"**{r['stream']}**, rksim `{r['rksim_scheduler']}` vs vLLM reserve_full_isl="
                  f"{r['vllm_scheduler_reserve_full_isl']}, step {fd['step']} ({', '.join(fd['fields'])}):", "",
                  f"- previous step (agreeing): `{_fmt_step(fd['previous'])}`",
                  f"- rksim: `{_fmt_step(fd['rksim'])}`", f"- vLLM:  `{_fmt_step(fd['vllm'])}`", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
