"""``rksim reproduce``: every headline claim of the RKSC and VASE papers (DESIGN §7), one row each.

A row holds the paper's figure, rksim's figure *simulated* for the paper's model and hardware
target (decisions replayed from a real trace, costs from the analytical model), rksim's figure
*measured* on the real module where one was run (``rksim calibrate speedup`` / ``quality`` output
under ``--measured``), the trace and workload it came from (reshaped or not), and a verdict from
the rules of :mod:`app.verdicts` (each rule written once there; the report's legend is generated
from them): a row first asks whether its data can test the claim, judges figures with their 95%
intervals (Wilson for rates, a seeded bootstrap over problems for ratios and differences), decides
on the paper's target and shape only and lists every other condition, with its kind, as "also".

The claims themselves are small units in :mod:`app.claims` (one module per claim family, registered
in report order in :data:`app.claims.CLAIMS`); this module is the driver: the inputs, the shared
:class:`Context` the units read, the row builder, and :class:`Reproducer`, which runs the units and
numbers their rows.

Everything is computed from stored files (traces, measured JSON and Parquet) with fixed seeds: the
same inputs give the same ``claims.json``, ``report.md`` and ``report.html`` byte for byte.
No torch here: the simulator and the stored measurements only.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from app.claims.common import (PAPER_SHAPE, PROFILE_PHRASE, RKSC_TARGET, SHARING_LAYOUTS,  # noqa: F401
                               VASE_TARGETS, acted, claim_row, profile_status, reused_timings)
from app.verdicts import fmt



@dataclass
class ReproduceConfig:
    """What ``rksim reproduce`` reads and how far it looks.

    ``traces``: trace folders (each a ``manifest.json``); ``measured``: a folder of real-module
    runs (``*/speedup.json``, ``*/quality.json``); ``expected``: names the report should list as
    missing when absent (the ``make reproduce-traces`` set).
    """

    traces: list = field(default_factory=list)
    measured: Path | None = None
    expected: dict = field(default_factory=dict)       # name -> folder the capture writes
    seed: int = 0
    heat_prefix: tuple = (128, 512, 1024, 2048)
    heat_branches: tuple = (4, 8, 16)
    heat_gen: tuple = (64, 256, 1024)
    vase_seeds: int = 4          # seeds per simulated VASE quality figure (a policy that gives the same
                                 # figure under two seeds is deterministic and run once)
    vase_decode_tokens: int = 16384
    vase_requests: int = 128
    block_capacity_frac: float = 0.6
    serve_requests: int = 64
    serve_concurrency: int = 16

    def quick(self) -> "ReproduceConfig":
        """A smaller grid and VASE serving run (``--quick``): a first look in seconds, not the report."""
        return dataclasses.replace(self, heat_prefix=(128, 1024), heat_branches=(4, 8), heat_gen=(64, 256),
                                   vase_decode_tokens=2048, vase_requests=16, serve_requests=16, serve_concurrency=8)


# ---------------------------------------------------------------------------- helpers


# ---------------------------------------------------------------------------- inputs
@dataclass
class TraceInfo:
    name: str
    path: str
    model: str
    dataset: str
    layout: str
    n_problems: int
    n_branches: int
    has_long: bool
    has_tree: bool
    manifest_sha256: str
    command: str
    missing_files: int = 0

    @property
    def label(self) -> str:
        return f"{self.model} · {self.dataset} · {self.layout}"


REPO = Path(__file__).resolve().parents[1]


def _shown(p: Path) -> str:
    """A path as the report shows it: relative to the checkout when inside it (the same in every clone)."""
    try:
        return str(Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def trace_info(path) -> TraceInfo:
    """One trace's identity from its manifest (the trace itself is validated when first loaded)."""
    p = Path(path)
    mf = p / "manifest.json"
    if not mf.is_file():
        raise ValueError(f"--traces {str(path)!r}: no manifest.json (not a trace folder)")
    try:
        m = json.loads(mf.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--traces {str(mf)!r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        cap = m["capture"]
        sh = m.get("shards") or {}
        return TraceInfo(name=p.name, path=_shown(p), model=str(m["model"]["name"]), dataset=str(m["dataset"]),
                         layout=str(m["layout"]), n_problems=int(m["n_problems"]), n_branches=int(m["n_branches"]),
                         has_long=bool(sh.get("long")), has_tree=bool(sh.get("trees")),
                         manifest_sha256=str(m.get("manifest_sha256", "")), command=str(m.get("command", "")),
                         missing_files=sum(not (p / f).is_file() for f in (m.get("files") or {})))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"--traces {str(mf)!r}: missing or bad field {exc}") from None


DEFAULT_ROOT = REPO / "examples" / "reproduce"
DEFAULT_MEASURED = REPO / "docs" / "reproduction" / "measured"


def discover(paths=None) -> tuple[list[str], dict]:
    """(trace folders to read, {name: why} of the kept manifests whose data is absent).

    ``paths``: trace folders or folders of trace folders (default ``examples/reproduce``). A folder
    with a ``manifest.json`` whose listed files are not all there is a trace kept as its manifest
    only (too large for the repository): reported, not read.
    """
    roots = [Path(p) for p in (paths or [DEFAULT_ROOT])]
    found, missing = [], {}
    for r in roots:
        if not r.is_dir():
            raise ValueError(f"--traces {str(r)!r}: no such folder")
        cands = [r] if (r / "manifest.json").is_file() else sorted(d for d in r.iterdir() if (d / "manifest.json").is_file())
        if not cands:
            raise ValueError(f"--traces {str(r)!r}: neither a trace (manifest.json) nor a folder of traces")
        for d in cands:
            info = trace_info(d)
            if info.missing_files:
                missing[info.name] = (f"{info.missing_files} data files absent; its manifest is kept: "
                                      f"`{info.command}`")
            else:
                found.append(str(d))
    return found, missing


MEASURED_TABLES = {"speedup": "speedup_decisions.parquet", "quality": "quality.parquet"}


def _read_measured(root: Path | None) -> dict:
    """``{"speedup": {name: json}, "quality": {name: json}, "per_problem": {kind: {name: DataFrame}}}``.

    The per-problem Parquet beside each JSON (``speedup_decisions.parquet``, ``quality.parquet``)
    is what the verdicts bootstrap over; a run without it is judged on its JSON alone.
    """
    out: dict = {"speedup": {}, "quality": {}, "files": {}, "per_problem": {"speedup": {}, "quality": {}}}
    if root is None or not Path(root).is_dir():
        return out
    from traces.store import sha256_file
    for kind in ("speedup", "quality"):
        for f in sorted(Path(root).glob(f"*/{kind}.json")):
            try:
                out[kind][f.parent.name] = json.loads(f.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"--measured {str(f)!r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
            out["files"][str(f.relative_to(root))] = sha256_file(f)
            pq = f.parent / MEASURED_TABLES[kind]
            if pq.is_file():
                try:
                    out["per_problem"][kind][f.parent.name] = pd.read_parquet(pq)
                except Exception as exc:  # pyarrow raises several types for a damaged file
                    raise ValueError(f"--measured {str(pq)!r}: not a readable Parquet file ({exc})") from None
                out["files"][str(pq.relative_to(root))] = sha256_file(pq)
    return out


# ---------------------------------------------------------------------------- the claims
# ---------------------------------------------------------------------------- the context every claim reads
class Context:
    """What every claim unit reads: the loaded traces (caller-owned memo, see ``sim.api.loaded``), the
    measured runs, the targets and the simulator; and what the units leave for the report (``tables``,
    ``figures``, the hardware ``profiles`` a figure used)."""

    def __init__(self, cfg: ReproduceConfig, progress: bool = True):
        from sim import api
        self.api = api
        self.cfg = cfg
        self.progress = progress
        self.infos = [trace_info(t) for t in cfg.traces]
        if len({i.name for i in self.infos}) != len(self.infos):
            raise ValueError("--traces: two traces share a folder name; rename one (rows name traces by folder)")
        self.paths = {i.name: str(Path(t).resolve()) for i, t in zip(self.infos, cfg.traces)}
        self.lts = {i.name: api.loaded(self.paths[i.name]) for i in self.infos}
        self.measured = _read_measured(cfg.measured)
        self.figures: dict = {}
        self.tables: dict = {}
        self.profiles: dict = {}   # hardware profile -> what it rests on (every one a row's figure used)

    # -- selection
    def pick(self, model_prefix=None, dataset=None, layout=None, long=False, tree=False) -> list[TraceInfo]:
        return [i for i in self.infos if (model_prefix is None or i.model.startswith(model_prefix))
                and (dataset is None or i.dataset == dataset) and (layout is None or i.layout == layout)
                and (not long or i.has_long) and (not tree or i.has_tree)]

    def sharing(self) -> list[TraceInfo]:
        """The traces whose branches share a prompt (:data:`SHARING_LAYOUTS`): what RKSC's claims read."""
        return [i for i in self.infos if i.layout in SHARING_LAYOUTS]

    # -- simulation
    def ev(self, info: TraceInfo, policy: str, params=None, target=RKSC_TARGET, reshape=None, verify_reuses_kv=True,
           **kw) -> dict:
        wl = {"verify_reuses_kv": bool(verify_reuses_kv), **kw.pop("workload", {})}
        return self.api.evaluate(self.lts[info.name], policy, params or {}, model_preset=target[0],
                                 hardware=target[1], reshape=reshape, workload=wl, seed=self.cfg.seed, **kw)

    def sim(self, info: TraceInfo, policy: str, params=None, target=RKSC_TARGET, reshape=None, verify_reuses_kv=True,
            **kw):
        """One simulation with its per-problem rows (no baselines: the verdicts pair problems themselves)."""
        wl = {"verify_reuses_kv": bool(verify_reuses_kv), **kw.pop("workload", {})}
        return self.api.simulate(self.lts[info.name], policy, params or {}, model_preset=target[0], hardware=target[1],
                                 reshape=reshape, workload=wl, seed=kw.pop("seed", self.cfg.seed), baselines=False, **kw)

    # -- evidence kinds and sources (the words every row uses)
    def sim_kind(self, summary: dict, what: str = "") -> str:
        """The evidence kind of a simulated figure: which costs, which profile and its calibration status."""
        hw = summary.get("hardware")
        self.profiles[hw] = profile_status(hw)
        return self.target_kind(summary.get("cost_model"), hw, what)

    def target_kind(self, model, hw, what: str = "") -> str:
        """``simulated: costs MODEL on HW (STATUS profile)`` with the profile's status
        (:data:`sim.cost.catalog.STATUS_WORDS`: datasheet, public profiles, fitted end to end, provisional);
        the decisions' model is in each condition's label."""
        status = self.profile(hw)
        return f"simulated: costs {model} on {hw} ({PROFILE_PHRASE.get(status, status + ' profile')}){what}"

    def profile(self, hw: str) -> str:
        """``hw``'s profile status, recorded for the report's inputs."""
        return self.profiles.setdefault(hw, profile_status(hw))

    @staticmethod
    def real_kind(res: dict, what: str = "") -> str:
        s = res.get("shape") or {}
        th = res.get("threads")
        return (f"real: {res.get('model', 'smollm2-135m')} on this CPU ({th} thread{'s' if th != 1 else ''}), "
                f"{s.get('problems')} problems, one timing each{what}")

    @staticmethod
    def src(infos, target=RKSC_TARGET, extra: str = "") -> str:
        names = ", ".join(f"`{i.name}` ({i.label}, {i.n_problems}×{i.n_branches})" for i in infos)
        what = ("quality from each trace's own recorded K/V/Q (no cost model)" if target is None
                else f"costs {target[0]} on {target[1]}, isolated")
        return f"traces {names}; {what}{('; ' + extra) if extra else ''}"


# ---------------------------------------------------------------------------- the driver
class Reproducer:
    """Runs every registered claim unit (:data:`app.claims.CLAIMS`, in report order) on one shared
    :class:`Context` and numbers their rows (``GROUP-k``, in report order).

    ``claims``: the units to run (default the registry); a unit is a small dataclass with a ``rows(ctx)``
    method (:class:`app.claims.base.ClaimUnit`), so a new claim is one module, not an edit here.
    """

    def __init__(self, cfg: ReproduceConfig, progress: bool = True, claims=None):
        from app.claims import CLAIMS
        self.cfg = cfg
        self.ctx = Context(cfg, progress)
        self.claims = tuple(CLAIMS if claims is None else claims)
        self.rows: list[dict] = []

    def _number(self, row: dict) -> dict:
        g = row["group"]
        k = sum(r["group"] == g for r in self.rows) + 1
        return {"id": f"{g.lower().replace(' ', '-')}-{k}", **row}

    def run(self) -> dict:
        from tqdm import tqdm
        ctx = self.ctx
        for unit in tqdm(self.claims, desc="reproduce", unit="claim group", disable=not ctx.progress):
            for row in unit.rows(ctx):
                self.rows.append(self._number(row))
        return {"rows": self.rows, "tables": {k: v.to_dict("records") for k, v in ctx.tables.items()},
                "figures": ctx.figures,
                "inputs": {"traces": [dataclasses.asdict(i) for i in ctx.infos],
                           "missing_traces": {k: v for k, v in self.cfg.expected.items()
                                              if k not in {i.name for i in ctx.infos}},
                           "measured": ctx.measured["files"], "seed": self.cfg.seed,
                           "rksc_target": list(RKSC_TARGET), "vase_targets": [list(t) for t in VASE_TARGETS],
                           "paper_shape": PAPER_SHAPE,
                           "profiles": {k: ctx.profiles[k] for k in sorted(ctx.profiles, key=str)},
                           "settings": {k: v for k, v in dataclasses.asdict(self.cfg).items()
                                        if k not in ("traces", "measured", "expected")}}}
