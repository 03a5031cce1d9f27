"""``app.claims``: each claim family is one registered unit; a new unit's rows reach the report without
editing the driver (``app/reproduce.py``)."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

from app.claims import CLAIMS, ClaimUnit
from app.reproduce import Reproducer, ReproduceConfig
from app.reproduce_report import write_report
from app.verdicts import Cond, combine, judge_at_least

from trace_files import BUNDLED


@dataclass(frozen=True)
class TraceCount(ClaimUnit):
    """A test claim: every trace given has at least ``at_least`` problems (no paper; DESIGN §7 style)."""

    name = "trace-count"
    group = "Test claim"
    at_least: int = 1

    def rows(self, ctx) -> list[dict]:
        conds = [judge_at_least(Cond(i.name, float(i.n_problems), n=None, kind="counted"), self.at_least, 1.0)
                 for i in ctx.infos]
        ctx.tables["trace_count"] = __import__("pandas").DataFrame(
            [{"trace": i.name, "problems": i.n_problems} for i in ctx.infos])
        return [self.row(f"Every trace has at least {self.at_least} problems", f"≥ {self.at_least}",
                         "; ".join(f"{c.label}: {c.value:g}" for c in conds) or "—", "counted from the manifests",
                         ctx.src(ctx.infos), combine(conds), {}, conds)]


def test_a_unit_registered_in_a_copy_of_the_registry_adds_its_rows(tmp_path):
    cfg = ReproduceConfig(traces=[])              # no trace: every registered family says so, quickly
    base = Reproducer(cfg, progress=False).run()
    res = Reproducer(cfg, progress=False, claims=(*CLAIMS, TraceCount())).run()
    assert res["rows"][:len(base["rows"])] == base["rows"]      # the registered rows are untouched
    extra = res["rows"][len(base["rows"]):]
    assert [r["id"] for r in extra] == ["test-claim-1"] and extra[0]["verdict"] == "not measurable here"
    write_report(res, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| test-claim-1 | Every trace has at least 1 problems |" in md
    assert "test-claim-1" in json.dumps(json.loads((tmp_path / "claims.json").read_text())["rows"])


def test_a_unit_reads_the_shared_context_and_its_parameters():
    cfg = ReproduceConfig(traces=[str(BUNDLED)])
    n = Reproducer(cfg, progress=False, claims=()).ctx.infos[0].n_problems
    ok = Reproducer(cfg, progress=False, claims=(TraceCount(at_least=n),)).run()
    no = Reproducer(cfg, progress=False, claims=(TraceCount(at_least=n + 1),)).run()
    assert [r["verdict"] for r in ok["rows"] + no["rows"]] == ["holds", "does not hold"]
    assert ok["rows"][0]["simulated"] == f"{BUNDLED.name}: {n:g}" and ok["tables"]["trace_count"][0]["problems"] == n


def test_the_driver_runs_the_registry_in_report_order():
    rp = Reproducer(ReproduceConfig(traces=[]), progress=False)
    assert rp.claims == CLAIMS
    groups = [r["group"] for r in rp.run()["rows"]]
    assert groups[:3] == ["RKSC speedup"] * 3 and groups[3] == "ASKS"
    order = list(dict.fromkeys(groups))
    assert order == ["RKSC speedup", "ASKS", "CGEE", "Shape", "VASE", "RSBCM"]  # Compatibility: no rows without traces


def test_every_registered_claim_is_a_named_unit_citing_its_paper_section():
    names = [c.name for c in CLAIMS]
    assert len(set(names)) == len(names) and all(names), names
    for c in CLAIMS:
        cls = type(c)
        assert dataclasses.is_dataclass(c) and isinstance(c, ClaimUnit) and c.group, cls
        doc = cls.__dict__.get("__doc__") or ""                     # its own docstring, not the base class's
        assert re.search(r"\b(RKSC|VASE) papers?\b", doc), f"{cls.__name__}: docstring names no paper"
        assert re.search(r"DESIGN §\d", doc), f"{cls.__name__}: docstring cites no section (DESIGN §4 / §7)"
        assert cls.__module__.startswith("app.claims."), cls


def test_the_moe_rows_are_priced_on_the_moe_target():
    """Issue 33: each cost-dependent headline claim has a row on a mixture-of-experts target, whose
    conditions are that target's costs (not the dense target's relabelled) and whose figures are its table's."""
    from app.claims.rksc import RkscSpeedups
    from app.claims.vase import VaseThroughput
    cfg = ReproduceConfig(traces=[str(BUNDLED)]).quick()
    units = (RkscSpeedups(), VaseThroughput())
    res = Reproducer(cfg, progress=False, claims=units).run()
    moe = [r for r in res["rows"] if "on an MoE target" in r["claim"]]
    assert len(moe) == 4 and {r["group"] for r in moe} == {"RKSC speedup", "VASE"}
    m, hw = units[0].moe_target
    for r in moe:
        conds = r["data"]["conditions"]
        targets = units[1].moe_targets if r["group"] == "VASE" else (units[0].moe_target,)
        assert conds and all(any(f"costs {tm} on {th}" in c["kind"] for tm, th in targets) for c in conds), r["claim"]
        assert "no MoE figure" in r["paper"] and r["verdict"] and r["why"]
    dense = [r for r in res["rows"] if r not in moe]
    assert all(t not in c["kind"] for r in dense for c in r["data"].get("conditions", [])
               for t in ("qwen3-30b-a3b", "gpt-oss"))
    sp = {t["vs_no_kv"] for t in res["tables"]["rksc_speedups_moe"] if t["policy"] == "rksc"}
    head = next(r for r in moe if r["claim"].startswith("RKSC (ASKS"))
    assert {c["value"] for c in head["data"]["conditions"]} <= sp and len(sp) >= 1
    thr = next(r for r in moe if r["group"] == "VASE")
    assert [c["value"] for c in thr["data"]["conditions"]] == [
        t["throughput_vs_full"] for t in res["tables"]["vase_throughput_moe"]]
    # one condition per MoE target, each priced on its own target (gpt-oss-20b: sliding-window layers, MXFP4)
    assert [c["label"] for c in thr["data"]["conditions"]] == [f"{tm} on {th}" for tm, th in units[1].moe_targets]
    assert all(f"costs {tm} on {th}" in c["kind"]
               for c, (tm, th) in zip(thr["data"]["conditions"], units[1].moe_targets))
