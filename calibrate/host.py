"""``rksim calibrate host``: fit the machine it runs on, over the shapes serving uses, in minutes.

A profile belongs to the host it was fitted on (:mod:`sim.cost.fingerprint`). On a new
machine, ``calibrate host`` measures the iterations ``calibrate serve`` (and
the simulator's serving mode) price, on the same code path — one packed
forward over a paged KV pool (:func:`calibrate.serve_forward.run_iteration`),
then top-p sampling of every row that samples, timed on the thread's CPU
time with one torch thread (DESIGN §6) — and fits the cost model's
coefficients on them (:func:`calibrate.fit.fit_profile`):

* **decode** iterations of ``b`` sequences, ``b = 1 .. max_num_seqs`` (every
  batch up to 16, then steps of 8: BLAS changes kernels with the number of
  token rows), each at a short, a middle and the longest context a binding
  capacity allows (``b * context <= capacity_tokens``); and the same decodes over one shared prefix
  (kind ``shared``: three quarters of the context in one set of blocks, as branches of one prompt
  read it), which fit ``eff_kv_shared`` (:mod:`sim.serving.kvshare`);
* **prefill** chunks of ``n`` tokens up to ``max_num_batched_tokens``, over
  no cached tokens and over a cached context;
* **mixed** iterations: one prefill chunk beside ``b`` decode steps (vLLM V1's
  chunked prefill with running decodes first).

The plan is ordered in rounds (:func:`plan_shapes`): the first covers every
dimension at its extremes, later ones fill in, each dimension in spread order
(:func:`spread`: ends, middle, quarters, ...), so a budget cut keeps the range
and thins every part of it (BLAS changes kernels at row counts anywhere in it). Every shape runs ``repeats`` times (its fastest kept: a neighbour
slows a run, never speeds it). The budget (``--minutes``, default 3, on the
process's CPU time, fit included) is enforced by :func:`measure`: a shape is
started only if the time spent plus its estimated cost (its last repeat, or
the slowest repeat so far) plus the reserve for the fit stays within the
budget.

Output: a hardware profile named after the host (``host-<hostname>``, or
``--name``) in the user profile directory (``sim.cost.profiles.user_profile_dir``)
or ``--out FILE``, with the host's fingerprint and the fitted range of every
dimension; ``--keep DIR`` also keeps the measured phases (``phases.parquet``,
``run.json``: what ``calibrate fit DIR`` reads).
"""
from __future__ import annotations

import dataclasses
import json
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# Serving shapes on a CPU host: 8 closed-loop users x 8 branches in flight at most
HOST_MAX_NUM_SEQS = 64
FIT_RESERVE_S = 15.0     # CPU seconds kept for the least-squares fit (about 4 s on 120 shapes) and the write


@dataclass
class HostConfig:
    """What ``calibrate host`` measures (recorded in the profile's ``fitted_on``)."""

    model: str = "smollm2-135m"
    device: str = "cpu"
    threads: int = 1
    dtype: str | None = None
    minutes: float = 3.0                  # CPU-time budget of the whole command (measurements + fit)
    max_num_seqs: int = HOST_MAX_NUM_SEQS
    max_num_batched_tokens: int = 2048    # vLLM V1's default
    capacity_tokens: int = 16384          # a binding capacity: b sequences hold <= capacity / b tokens each
    block_size: int = 16
    repeats: int = 2
    seed: int = 0
    temperature: float = 0.7
    top_p: float = 0.95
    name: str | None = None

    def __post_init__(self) -> None:
        for f in ("threads", "max_num_seqs", "max_num_batched_tokens", "capacity_tokens", "block_size", "repeats"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"--{f.replace('_', '-')}: must be a positive integer, got {v!r}")
        if not (isinstance(self.minutes, (int, float)) and 0 < self.minutes <= 120):
            raise ValueError(f"--minutes: must be in (0, 120], got {self.minutes!r}")
        if self.capacity_tokens < self.max_num_seqs:
            raise ValueError(f"--capacity-tokens: {self.capacity_tokens} cannot hold {self.max_num_seqs} sequences")


def host_name() -> str:
    """``host-<hostname>``, lower case, characters a file name keeps."""
    node = re.sub(r"[^a-z0-9._-]+", "-", (platform.node() or "unknown").lower()).strip("-.") or "unknown"
    return f"host-{node}"


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Shape:
    """One iteration: ``decodes`` decode steps at ``context`` cached tokens, plus ``prefill`` new tokens
    over ``prefill_cached`` (0: none)."""

    kind: str            # decode | shared | prefill | mixed
    decodes: int = 0
    context: int = 0
    prefill: int = 0
    prefill_cached: int = 0
    shared_prefix: int = 0   # kind shared: the decodes' first tokens sit in the same blocks (branches of a prompt)

    def items(self) -> list[tuple[int, int]]:
        """``(n, c)`` of every item: the decodes first (running decodes are scheduled first)."""
        out = [(1, self.context)] * self.decodes
        if self.prefill:
            out.append((self.prefill, self.prefill_cached))
        return out

    def block_lists(self, bs: int) -> list[list]:
        """Names of every item's blocks: the decodes' first ``shared_prefix // bs`` are one set of blocks, the
        rest each item's own."""
        sh = [("s", k) for k in range(self.shared_prefix // bs)]
        return [sh + [(i, k) for k in range(len(sh), -(-(n + c) // bs))] for i, (n, c) in enumerate(self.items())]

    def shared(self, bs: int) -> list[int]:
        """``h_i`` of every item (:func:`sim.serving.kvshare.shared_tokens`)."""
        from sim.serving.kvshare import shared_tokens
        return shared_tokens(self.block_lists(bs), [c for _, c in self.items()], bs)


def spread(xs) -> list:
    """``xs`` reordered so that every prefix covers the whole list: its ends first, then the points of the
    van der Corput sequence (1/2, 1/4, 3/4, 1/8, ...) along it. A budget that cuts the tail of a plan in
    this order thins the dimension instead of dropping its upper part."""
    xs = list(xs)
    n = len(xs)
    if n <= 2:
        return xs

    def vdc(k: int) -> float:
        f, d = 0.0, 0.5
        while k:
            f, k, d = f + d * (k & 1), k >> 1, d / 2
        return f

    seen, out = set(), []
    for i in [0, n - 1] + [int(round(vdc(k) * (n - 1))) for k in range(1, 4 * n)] + list(range(n)):
        if i not in seen:
            seen.add(i)
            out.append(xs[i])
    return out


def batch_sizes(max_seqs: int) -> list[int]:
    return sorted({b for b in list(range(1, 17)) + list(range(24, max_seqs + 1, 8)) + [max_seqs] if b <= max_seqs})


def plan_shapes(cfg: HostConfig) -> list[Shape]:
    """Every shape, in rounds: extremes of every dimension first, then fill-in (deterministic)."""
    S, M, cap = cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.capacity_tokens

    def ctxs(b):
        hi = max(16, min(cap // b, 2048) - 1)
        return sorted({min(48, hi), min(256, hi), hi})

    chunks = sorted({n for n in (16, 32, 64, 128, 256, 512, 1024, 1536, M) if n <= M} | {M})
    def shared(b, c):   # branches of one prompt: three quarters of the context shared, in full blocks
        return Shape("shared", b, c, shared_prefix=(3 * c // 4) // cfg.block_size * cfg.block_size)

    r1 = ([Shape("decode", b, c) for b in (1, 2, 8, S) for c in (ctxs(b)[0], ctxs(b)[-1])]
          + [shared(b, ctxs(b)[-1]) for b in (8, S)]
          + [Shape("prefill", prefill=n) for n in (16, 256, M)]
          + [Shape("prefill", prefill=256, prefill_cached=min(1024, cap - 256))]
          + [Shape("mixed", b, 200, prefill=n, prefill_cached=0) for b, n in ((1, 64), (min(8, S), 512),
                                                                               (min(32, S), min(1024, M)))])
    # every batch at its middle context first, then the short and the long ones, batches in spread
    # order: a budget cut keeps kernel changes anywhere in 1 .. max_num_seqs in reach of the fit
    r2 = ([Shape("decode", b, ctxs(b)[min(ci, len(ctxs(b)) - 1)]) for ci in (1, 0, 2) for b in spread(batch_sizes(S))]
          + [shared(b, ctxs(b)[min(ci, len(ctxs(b)) - 1)]) for ci in (1, 2) for b in spread([b for b in (2, 4, 8, 16, 32, S) if b <= S])]
          + [Shape("prefill", prefill=n) for n in spread(chunks)]
          + [Shape("prefill", prefill=n, prefill_cached=c) for n in (32, 128, 512) for c in (256, 1024)
             if n + c <= cap]
          + [Shape("mixed", b, min(c, cap // (b + 1)), prefill=min(n, M - b), prefill_cached=pc)
             for n, pc in ((128, 64), (16, 0), (1024, 0)) for c in (64, 256)
             for b in spread([b for b in (1, 2, 4, 8, 16, 32, S) if b <= S])])
    # round 2 interleaved by kind, so that a budget cut thins every kind rather than dropping one
    by = [[s for s in r2 if s.kind == k] for k in ("decode", "shared", "prefill", "mixed")]
    r2 = [s for grp in zip(*[g + [None] * (max(map(len, by)) - len(g)) for g in by]) for s in grp if s is not None]
    seen, out = set(), []
    for s in r1 + r2:
        if s not in seen and s.decodes <= S and s.prefill <= M and sum(n for n, _ in s.items()) <= M + S:
            seen.add(s)
            out.append(s)
    return out


# --------------------------------------------------------------------------- the budget
def measure(shapes: list[Shape], run_one, budget_s: float, clock=time.process_time, repeats: int = 2,
            reserve_s: float = FIT_RESERVE_S, start: float | None = None, progress=None) -> tuple[list, dict]:
    """Run ``run_one(shape) -> (wall_s, cpu_s)`` ``repeats`` times per shape within ``budget_s`` of ``clock``.

    A repeat starts only if ``elapsed + estimate + reserve_s <= budget_s``, the estimate
    being that shape's previous repeat, else the slowest repeat measured so far (0 before
    any: the plan's first round holds the costliest shapes, so the estimate is learnt early). Returns ``(rows, info)``: ``rows`` ``(shape, wall_s, cpu_s)`` with the fastest
    repeat (CPU time) of every shape measured; ``info`` the shapes planned / measured / cut
    and the CPU seconds spent. ``clock`` is injectable (tests use a fake one).
    """
    t0 = clock() if start is None else start
    slowest: dict[str, float] = {}
    rows, cut = [], 0
    for s in shapes:
        best = None
        for r in range(repeats):
            est = best[1] if best is not None else max(slowest.values(), default=0.0)
            if clock() - t0 + est + reserve_s > budget_s:
                break
            wall, cpu = run_one(s)
            slowest[s.kind] = max(slowest.get(s.kind, 0.0), cpu)
            if best is None or cpu < best[1]:
                best = (wall, cpu)
        if best is None:
            cut += 1
            continue
        rows.append((s, best[0], best[1]))
        if progress is not None:
            progress(s)
    return rows, {"planned": len(shapes), "measured": len(rows), "cut_by_budget": cut,
                  "measure_cpu_s": float(clock() - t0)}


# --------------------------------------------------------------------------- the real iterations
class PhaseRunner:
    """Runs one :class:`Shape` on the real model as ``calibrate serve`` runs an iteration."""

    def __init__(self, lm, cfg: HostConfig):
        import torch
        from traces import capture_ops as CO

        from calibrate.serve_forward import PagedKV

        self.lm, self.cfg, self.CO = lm, cfg, CO
        bs = cfg.block_size
        # distinct blocks for every sequence (nothing shared in cache): decodes x context + one chunk
        self.nblocks = -(-(cfg.capacity_tokens + cfg.max_num_batched_tokens + 2048) // bs) + cfg.max_num_seqs + 2
        self.kv = PagedKV(lm, self.nblocks, bs)
        self.rng = np.random.default_rng(cfg.seed)
        self.V = int(lm.model.config.vocab_size)
        self.gens = [CO.make_generator(lm, CO.seed_for(cfg.seed, 0, b, 7)) for b in range(cfg.max_num_seqs + 1)]
        self.torch = torch

    def items(self, s: Shape):
        from calibrate.serve_forward import Item

        bs = self.cfg.block_size
        out, ids = [], {}
        for i, ((n, c), names) in enumerate(zip(s.items(), s.block_lists(bs))):
            # one physical block per name: the shared prefix's blocks are the same for every decode
            blocks = [ids.setdefault(x, len(ids)) for x in names]
            toks = [int(x) for x in self.rng.integers(100, self.V - 1, n)]
            out.append(Item(key=i, tokens=toks, start=c, slots=self.kv.slots(blocks, n + c), sample=True))
        return out

    def __call__(self, s: Shape) -> tuple[float, float]:
        from calibrate.serve_forward import run_iteration

        items = self.items(s)
        sync = getattr(self.lm, "sync", None) or (lambda: None)
        w0, c0 = time.perf_counter(), time.thread_time()
        logits = run_iteration(self.lm, self.kv, items)
        sync()
        for k, lg in logits.items():
            self.CO.sample_tokens(lg[None, :], [self.gens[int(k)]], self.cfg.temperature, self.cfg.top_p)
        return time.perf_counter() - w0, time.thread_time() - c0


def phases_from(rows, bs: int) -> pd.DataFrame:
    """The measured shapes as ``phases.parquet`` rows (kind forward, every item sampling; ``bs`` the block size
    the shared prefixes are counted in)."""
    from calibrate.timing import PhaseRow, phases_frame

    out = []
    for s, wall, cpu in rows:
        its = s.items()
        r = PhaseRow(f"host-{s.kind}", kind="forward", problem=-1, policy="host").items(
            [n for n, _ in its], [c for _, c in its], logits=1, shared=s.shared(bs))
        r.seconds, r.cpu_seconds, r.sampled = float(wall), float(cpu), len(its)
        out.append(r)
    return phases_frame(out)


def fit_host_phases(phases: pd.DataFrame, model, name: str):
    """The fit of measured host phases (:func:`calibrate.fit.fit_profile` on their CPU time, from the CPU base
    :func:`calibrate.fit.default_base`): what ``calibrate fit`` of the ``--keep`` folder computes too."""
    from calibrate.fit import cpu_kernels, default_base, fit_profile, phase_terms

    base = dataclasses.replace(default_base(name, "cpu"), **cpu_kernels("cpu"))
    return fit_profile(base, phase_terms(model, phases), phases["cpu_seconds"].to_numpy())


def run_host(cfg: HostConfig, out: Path | None = None, keep: Path | None = None, force: bool = False,
             progress: bool = True, clock=time.process_time) -> dict:
    """Measure, fit and write the host's profile. Returns a summary (path, fingerprint, errors, CPU seconds)."""
    import torch
    from tqdm import tqdm
    from traces.models import load_model
    from traces.store import atomic_write_json

    from calibrate.fit import fitted_range, profile_out_path, write_preset
    from calibrate.hostinfo import fingerprint
    from sim.cost.profiles import model_from_manifest

    t0 = clock()
    name = cfg.name or host_name()
    path = profile_out_path(name, out, force)     # refuse early: before any minute is spent
    torch.set_num_threads(int(cfg.threads))
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    runner = PhaseRunner(lm, cfg)
    shapes = plan_shapes(cfg)
    for s in shapes[:3]:   # warm-up: first calls allocate and pick kernels (not measured)
        runner(s)
    bar = tqdm(total=len(shapes), desc="calibrate host", unit="shape", disable=not progress)
    rows, info = measure(shapes, runner, budget_s=cfg.minutes * 60.0, clock=clock, repeats=cfg.repeats,
                         start=t0, progress=lambda s: bar.update(1))
    bar.close()
    if len(rows) < 12:
        raise RuntimeError(f"calibrate host: only {len(rows)} shapes fitted in --minutes {cfg.minutes}; "
                           "allow more minutes")
    phases = phases_from(rows, cfg.block_size)
    fp = fingerprint(cfg.device, cfg.threads, str(lm.dtype))
    model = model_from_manifest({"model": lm.info()})
    res = fit_host_phases(phases, model, name)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    frange = {**fitted_range(model, phases, device="cpu", dtype=fp.get("dtype")), "device": "cpu"}
    fitted_on = {"run": "rksim calibrate host", "created": created, "model": model.name,
                 "dtype": fp.get("dtype"), "threads": cfg.threads,
                 "shapes": {k: int(v) for k, v in info.items() if k != "measure_cpu_s"},
                 "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "name"}}
    notes = (f"fitted by `rksim calibrate host` on {len(rows)} serving iterations (decode batches 1-"
             f"{max(s.decodes for s, _, _ in rows)}, prefill chunks up to {max(s.prefill for s, _, _ in rows)} "
             f"tokens, mixed iterations) of {model.name} on {fp.get('cpu_model')}, {cfg.threads} thread(s), cpu clock")
    write_preset(path, res, frange, device="cpu", fitted_on=fitted_on, notes=notes, clock="cpu", fingerprint=fp)
    if keep is not None:
        keep = Path(keep)
        keep.mkdir(parents=True, exist_ok=True)
        from calibrate.runner import write_parquet
        write_parquet(keep / "phases.parquet", phases)
        atomic_write_json(keep / "run.json", {"kind": "calibrate host", "problems": [], "model": lm.info(),
                                              "device": "cpu", "threads": cfg.threads, "created": created,
                                              "clock": "cpu", "fingerprint": fp,
                                              "config": dataclasses.asdict(cfg), "shapes": info})
    return {"path": str(path), "name": name, "fingerprint": fp, "n_phases": int(res.n), "rel_rms": res.rel_rms,
            "rel_median_abs": res.rel_median_abs, "roofline": res.roofline, "fitted_range": frange,
            "shapes": info, "cpu_seconds": float(clock() - t0), "budget_s": cfg.minutes * 60.0}


def format_host(r: dict) -> str:
    from sim.cost.fingerprint import describe
    sh = r["shapes"]
    return (f"wrote {r['path']}: {r['name']} fitted on {sh['measured']} of {sh['planned']} serving shapes "
            f"({sh['cut_by_budget']} cut by the budget), rms relative error {r['rel_rms']:.2%}, {r['roofline']} "
            f"roofline, {r['cpu_seconds']:.0f} s CPU of {r['budget_s']:.0f}\nhost: {describe(r['fingerprint'])}")


def load_keep(dir_: Path) -> tuple[dict, pd.DataFrame]:
    """A ``--keep`` directory: its run.json and phases."""
    d = Path(dir_)
    return json.loads((d / "run.json").read_text()), pd.read_parquet(d / "phases.parquet")


# --------------------------------------------------------------------------- the host's speed, later
# Three shapes of the plan's first round (always measured): a matrix-vector decode, a small-M decode, a prefill
PROBE_SHAPES = (Shape("decode", 1, 48), Shape("decode", 8, 48), Shape("prefill", prefill=256))


def probe_reference(phases: pd.DataFrame, shapes=PROBE_SHAPES) -> dict:
    """CPU seconds the fit measured for each probe shape (``phases`` of a ``--keep`` directory); shapes the
    budget cut are left out."""
    out = {}
    for s in shapes:
        its = s.items()
        ns, cs = [n for n, _ in its], [c for _, c in its]
        hit = phases[[list(map(int, n)) == ns and list(map(int, c)) == cs for n, c in zip(phases["n"], phases["c"])]]
        if len(hit):
            out[s] = float(hit["cpu_seconds"].min())
    return out


def speed_drift(run_one, reference: dict, repeats: int = 3) -> dict:
    """How much slower this host runs now than when it was fitted: for every probe shape the fastest of
    ``repeats`` runs of ``run_one(shape) -> (wall_s, cpu_s)`` over the fit's CPU time; ``drift`` is the
    median ratio (1.08: every iteration takes 8% more CPU time than the profile was fitted on).

    On a shared machine the thread's CPU time per operation moves with the neighbours' load (memory
    traffic and caches are shared): a price fitted in one stretch and a run measured in another differ
    by that ratio, whatever the cost model.
    """
    if not reference:
        raise ValueError("speed_drift: no probe shape was measured by the fit")
    ratios = {f"{s.kind}:{s.decodes}x{s.context}+{s.prefill}": min(run_one(s)[1] for _ in range(repeats)) / t
              for s, t in reference.items()}
    return {"drift": float(np.median(list(ratios.values()))), "ratios": ratios}
