"""The verdict rules of ``rksim reproduce``, each written once.

A claim row is judged in three steps, the same for every rule:

1. **Is the data able to test it?** Each *condition* (a trace, a shape, a target, a run) is first
   checked by the caller for what would make the claim untestable there — the policy never acted,
   the metric sits on its floor or ceiling, the sample is too small — and then by the rule for a
   95% interval that is wider than the claim's own scale. An untestable condition says
   ``not measurable here, because …`` with the number.
2. **Is the answer outside the noise?** Every figure carries a 95% interval: a Wilson interval for
   a rate (``k`` of ``n``), a seeded percentile bootstrap over problems (or seeds) for a ratio or a
   difference. An interval on the failing side of the bar fails; one on the passing side passes;
   one that contains the bar (or a difference below the tie margin) is a *tie*, which never passes.
3. **Whose evidence?** Only *primary* conditions — the paper's target and shape — decide. The others
   are listed as ``also: …`` with their kind (simulated on which profile and whether it is
   calibrated, or real on which model and machine). An ``also`` condition of the primary's own kind
   (the same target at another shape) may turn ``does not hold`` into ``holds only when …``, and only
   when the paper's own condition was measurable and failed; other kinds never change a verdict.

The legend of the report (:func:`legend`) and the rule table of ``docs/reproduce.md``
(:func:`rule_table`) are generated from :data:`RULES`; every reason is generated from the numbers.
Figures are judged raw, never rounded. The interval functions are :mod:`sim.replay.intervals`'s, the ones
the simulator's tables use. Every bootstrap draws from ``numpy.random.default_rng(seed)`` with an
explicit seed, so the same inputs give the same verdicts byte for byte.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# the intervals live in sim.replay.intervals (the simulator's CLI tables use the same code); re-exported here
from sim.replay.intervals import N_BOOT, Z, bootstrap_mean, bootstrap_ratio, bootstrap_stat, wilson  # noqa: F401

VERDICTS = ("holds", "holds only when", "does not hold", "not measurable here")
TOL = 0.8            # a ratio claim passes at 80% of the paper's figure
MIN_UNITS = 4        # fewer problems (or seeds) than this: a bootstrap has at most 10 distinct resamples
TIE_MARGIN = 0.01    # a direction whose mean relative change is below 1% is a tie, whatever its interval
COMPAT_TOL = 0.02    # a compatibility option "changes nothing" below 2% relative (0.01 absolute on rates)

PASS, FAIL, TIE, UNTESTABLE = "pass", "fail", "tie", "untestable"


# ---------------------------------------------------------------------------- conditions
def fmt(x) -> str:
    """A raw figure as text (6 significant digits: what was judged, never a rounded stand-in)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{float(x):.6g}"


@dataclass
class Cond:
    """One condition of a claim: a figure, its 95% interval, and what kind of evidence it is.

    ``n``: the units behind the interval (``None``: one deterministic figure, no sampling to
    resample); ``untestable``: the caller's reason, with its number, why the data cannot test the
    claim here (the policy never acted, a floor or ceiling); ``primary``: the paper's target and
    shape; ``same_kind``: an ``also`` condition on the primary's target (another shape).
    """

    label: str
    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int | None = None
    unit: str = "problems"
    kind: str = ""
    primary: bool = True
    same_kind: bool = False
    untestable: str | None = None
    note: str = ""
    outcome: str = ""
    text: str = ""

    def interval(self) -> str:
        if self.lo is None or self.hi is None:
            return ""
        return f" [{fmt(self.lo)}, {fmt(self.hi)}]"

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("label", "value", "lo", "hi", "n", "unit", "kind", "primary",
                                              "same_kind", "untestable", "outcome", "text", "note")}


def _finite(*xs) -> bool:
    return all(x is not None and isinstance(x, (int, float)) and math.isfinite(float(x)) for x in xs)


def _pre(c: Cond) -> str | None:
    """The reasons every rule shares for not judging a condition (or None)."""
    if c.untestable:
        return c.untestable
    if not _finite(c.value):
        return "no figure could be computed"
    if c.n is not None and c.n < MIN_UNITS:
        return f"it rests on {c.n} {c.unit} (fewer than {MIN_UNITS})"
    return None


def _bounds(c: Cond) -> tuple[float, float]:
    lo = c.lo if _finite(c.lo) else c.value
    hi = c.hi if _finite(c.hi) else c.value
    return float(lo), float(hi)


# ---------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    """A verdict rule: what it applies to, when a condition is testable, passes, fails or ties."""

    key: str
    applies: str
    testable: str
    passes: str
    fails: str
    ties: str

    def legend(self) -> str:
        return (f"*{self.applies}* — testable when {self.testable}; passes when {self.passes}; fails when "
                f"{self.fails}; {self.ties}.")


RULES = {
    "at_least": Rule(
        "at_least", "a ratio or a gain (speedup, throughput, extra reuse, AUC)",
        "the policy acted and the metric is off its floor and ceiling, there are at least "
        f"{MIN_UNITS} problems, and a 95% interval that contains the bar is narrower than the claim's scale "
        "(a speedup P: P - 1, the distance to no gain; a fraction p: min(p, 1 - p))",
        f"the 95% bootstrap interval over problems lies at or above the bar ({TOL:.0%} of the paper's figure)",
        "it lies below the bar", "an interval that contains the bar is a tie, which does not pass"),
    "rate_low": Rule(
        "rate_low", "a rate that should be low (CGEE-induced error)",
        "the policy acted (skipped or exited early) on some problem and, when the 95% Wilson interval "
        "contains the paper's rate p, it is narrower than 2p",
        "the Wilson interval contains the paper's rate or lies below it",
        "it lies above the paper's rate", "a wide interval that contains it is not measurable"),
    "rate_reach": Rule(
        "rate_reach", "a rate that should reach the paper's (CGEE skip rate)",
        "the paper gives a figure for this benchmark and, when the 95% Wilson interval contains it, the "
        "interval is narrower than 2 min(p, 1 - p)",
        "the Wilson interval contains the paper's rate or lies above it",
        "it lies below the paper's rate", "a wide interval that contains it is not measurable"),
    "no_loss": Rule(
        "no_loss", "a quality that should be kept (accuracy under sharing)",
        "the baseline solves at least 2 problems (so a loss of more than one problem is possible) and "
        "the policy changed some answer",
        "the bootstrap interval of the paired per-problem change does not lie below zero and its lower "
        "end is above minus half the baseline's accuracy",
        "it lies below zero (a loss beyond noise)",
        "an interval reaching below minus half the baseline is not measurable"),
    "better": Rule(
        "better", "a direction (an ablation, a policy against a baseline)",
        f"there are at least {MIN_UNITS} problems or seeds (a deterministic simulation: one figure) and, for "
        "block policies, their choices can differ (they do not all evict the same blocks)",
        f"the paired bootstrap interval of the change lies on the better side of zero and the mean change "
        f"is at least {TIE_MARGIN:.0%}",
        "it lies on the worse side (by at least the same margin)",
        f"an interval containing zero, or a change below {TIE_MARGIN:.0%}, is a tie"),
    "unchanged": Rule(
        "unchanged", "a compatibility option (the public code's shortcut)",
        "the option could change the figure: the policy acted and was not at its ceiling, or the "
        "policies it chooses between differ",
        f"no headline figure moves by more than {COMPAT_TOL:.0%} (0.01 on rates)",
        "one does", "the figures are deterministic simulations, so no interval"),
    "premise": Rule(
        "premise", "a premise (logit-lens entropy collapse)",
        "the entropy curve has a peak before its last layer",
        "mean entropy falls to half its peak before the last layer",
        "it does not, or only at the last layer", "the curve is a mean over every branch, so no interval"),
}

AGGREGATION = (
    "A row is judged on its primary conditions (the paper's target and shape): all testable ones pass "
    "→ **holds**; some pass → **holds only when …** (those named); none passes → **does not hold**, "
    "unless the same target passes at another shape, named as **holds only when …** while the paper's own "
    "failing figure is quoted; no primary condition testable → **not measurable here, because …** (the "
    "number). Other conditions are listed as *also: …* with their kind (simulated on which hardware "
    "profile and whether that profile is calibrated, or real on which model and machine); besides the "
    "same target at another shape, as just said, none of them changes a verdict.")


def legend() -> str:
    """The report's legend: every rule, then how conditions combine (generated, never hand-written)."""
    return " ".join(r.legend() for r in RULES.values()) + " " + AGGREGATION


def rule_table() -> str:
    """The Markdown rule table of ``docs/reproduce.md`` (a test checks the doc holds it verbatim)."""
    lines = ["| rule | applies to | testable when | passes when | fails when | otherwise |", "|---|---|---|---|---|---|"]
    for r in RULES.values():
        lines.append(f"| `{r.key}` | {r.applies} | {r.testable} | {r.passes} | {r.fails} | {r.ties} |")
    return "\n".join(lines) + "\n\n" + AGGREGATION + "\n"


# ---------------------------------------------------------------------------- judging one condition
def judge_at_least(c: Cond, bar: float, scale: float) -> Cond:
    """``at_least``: pass when the interval lies at or above ``bar``; fail when below; else tie/untestable."""
    why = _pre(c)
    if why:
        c.outcome, c.text = UNTESTABLE, why
        return c
    lo, hi = _bounds(c)
    if lo >= bar:
        c.outcome, c.text = PASS, f"{fmt(c.value)}{c.interval()} reaches {fmt(bar)}"
    elif hi < bar:
        c.outcome, c.text = FAIL, f"{fmt(c.value)}{c.interval()} is below {fmt(bar)}"
    elif hi - lo >= scale:
        c.outcome, c.text = UNTESTABLE, (f"its 95% interval{c.interval()} is {fmt(hi - lo)} wide, not narrower than "
                                         f"the claim's scale {fmt(scale)}")
    else:
        c.outcome, c.text = TIE, f"{fmt(c.value)}{c.interval()} contains {fmt(bar)} (a tie)"
    return c


def judge_rate(c: Cond, k: int, n: int, paper: float, allowed: str) -> Cond:
    """``rate_low`` (``allowed="below"``) or ``rate_reach`` (``allowed="above"``) on ``k`` of ``n``.

    Sets ``c.value``, ``c.lo``, ``c.hi`` from the Wilson interval. The scale is ``2 min(p, 1 - p)``:
    an interval that contains the paper's rate and is wider than twice its distance to the bound
    (0 or 1) cannot tell it from that bound (the paper's own 6 of 1,616 gives [0.0017, 0.0081],
    narrower than 0.0074).
    """
    c.value = k / n if n else None
    c.lo, c.hi = wilson(k, n) if n else (None, None)
    c.n = n
    why = c.untestable or (None if n else "no problem was evaluated")
    if why:
        c.outcome, c.text = UNTESTABLE, why
        return c
    scale = 2 * min(paper, 1 - paper)
    ktxt = f"{k:g} of {n} {c.unit}"
    bad = c.lo > paper if allowed == "below" else c.hi < paper
    good = c.hi < paper if allowed == "below" else c.lo > paper
    if bad:
        c.outcome, c.text = FAIL, f"{ktxt}: {fmt(c.value)}{c.interval()} lies {'above' if allowed == 'below' else 'below'} {fmt(paper)}"
    elif good:
        c.outcome, c.text = PASS, f"{ktxt}: {fmt(c.value)}{c.interval()} lies {allowed} {fmt(paper)}"
    elif c.hi - c.lo < scale:
        c.outcome, c.text = PASS, f"{ktxt}: {fmt(c.value)}{c.interval()} contains {fmt(paper)}"
    else:
        c.outcome, c.text = UNTESTABLE, (f"{ktxt} give{'s' if n == 1 else ''} {fmt(c.value)}{c.interval()}, "
                                         f"{fmt(c.hi - c.lo)} wide: not narrower than the claim's scale "
                                         f"{fmt(scale)}")
    return c


def judge_no_loss(c: Cond, base_correct: int, n: int, changed: int) -> Cond:
    """``no_loss`` on a paired per-problem change (``c.value``, ``c.lo``, ``c.hi`` from :func:`bootstrap_mean`)."""
    why = c.untestable or (f"the baseline solves {base_correct} of {n} problems: a loss of more than one problem "
                           "is impossible" if base_correct < 2 else
                           "the policy changed no answer" if changed == 0 else None) or _pre(c)
    if why:
        c.outcome, c.text = UNTESTABLE, why
        return c
    lo, hi = _bounds(c)
    floor = -0.5 * base_correct / n
    if hi < 0:
        c.outcome, c.text = FAIL, f"change {fmt(c.value)}{c.interval()} lies below 0"
    elif lo > floor:
        c.outcome, c.text = PASS, f"change {fmt(c.value)}{c.interval()} stays above {fmt(floor)}"
    else:
        c.outcome, c.text = UNTESTABLE, (f"change {fmt(c.value)}{c.interval()} reaches below {fmt(floor)} (half "
                                         f"the baseline's {base_correct} of {n}): too wide to say")
    return c


def judge_better(c: Cond, ref: float, lower_is_better: bool = True) -> Cond:
    """``better``: ``c.value`` is the mean paired change (policy minus reference, ``ref`` its reference level)."""
    why = _pre(c)
    if why:
        c.outcome, c.text = UNTESTABLE, why
        return c
    lo, hi = _bounds(c)
    rel = c.value / abs(ref) if ref else float("inf") if c.value else 0.0
    sign = -1.0 if lower_is_better else 1.0
    txt = f"change {fmt(c.value)}{c.interval()} ({fmt(100 * rel)}% of {fmt(ref)})"
    if abs(rel) < TIE_MARGIN:
        c.outcome, c.text = TIE, f"{txt}: below the {TIE_MARGIN:.0%} tie margin"
    elif (hi < 0 if sign < 0 else lo > 0):
        c.outcome, c.text = PASS, f"{txt}: better"
    elif (lo > 0 if sign < 0 else hi < 0):
        c.outcome, c.text = FAIL, f"{txt}: worse"
    else:
        c.outcome, c.text = TIE, f"{txt}: the interval contains 0 (a tie)"
    return c


def judge_unchanged(c: Cond, before: float, after: float, is_rate: bool) -> Cond:
    """``unchanged``: the option moves the figure by at most 2% relative (0.01 absolute on rates)."""
    c.value = after - before if _finite(before, after) else None
    why = c.untestable or (None if _finite(before, after) else "no figure could be computed")
    if why:
        c.outcome, c.text = UNTESTABLE, why
        return c
    lim = max(COMPAT_TOL * abs(before), 0.01 if is_rate else 0.0)
    if abs(after - before) > lim:
        c.outcome, c.text = FAIL, f"{fmt(before)} → {fmt(after)} (moves more than {fmt(lim)})"
    else:
        c.outcome, c.text = PASS, f"{fmt(before)} → {fmt(after)} (within {fmt(lim)})"
    return c


# ---------------------------------------------------------------------------- combining conditions
def _line(c: Cond, common: str = "") -> str:
    kind = f" [{c.kind}]" if c.kind and c.kind != common else ""
    return f"{c.label}{kind}: {c.text}"


def combine(conds: list[Cond], what: str = "") -> tuple[str, str, list[str]]:
    """(verdict, reason, also-lines) from judged conditions (see :data:`AGGREGATION`).

    The evidence kind shared by every primary condition is named once, first; a condition of
    another kind names its own.
    """
    prim = [c for c in conds if c.primary]
    others = [c for c in conds if not c.primary]
    kinds = {c.kind for c in prim}
    common = next(iter(kinds)) if len(kinds) == 1 else ""
    head = f"[{common}] " if common else ""
    also = [f"also: {_line(c, common)}{(' — ' + c.note) if c.note else ''}" for c in others]
    if not prim:
        return ("not measurable here", f"because no condition at the paper's {what or 'target and shape'} was evaluated",
                also)
    tested = [c for c in prim if c.outcome in (PASS, FAIL, TIE)]
    untested = [c for c in prim if c.outcome == UNTESTABLE]
    ok = [c for c in tested if c.outcome == PASS]
    bad = [c for c in tested if c.outcome != PASS]

    def lines(cs):
        return "; ".join(_line(c, common) for c in cs)

    nm = ("; not measurable: " + lines(untested)) if untested and tested else ""
    if not tested:
        return "not measurable here", "because " + head + lines(untested), also
    if not bad:
        return "holds", head + lines(ok) + nm, also
    if ok:
        return "holds only when", (" and ".join(c.label for c in ok) + " — " + head + lines(ok) + "; not: "
                                   + lines(bad) + nm), also
    alt = [c for c in others if c.same_kind and c.outcome == PASS]
    if alt:
        return "holds only when", (" or ".join(c.label for c in alt) + " — at the paper's own condition: " + head
                                   + lines(bad) + nm), also
    return "does not hold", head + lines(bad) + nm, also


def judge_premise(peak: float, peak_layer: int, last: float, collapse_layer: int | None, L: int) -> tuple[str, str]:
    """``premise``: mean logit-lens entropy halves from its peak before the last of ``L`` layers (1-based)."""
    if peak_layer >= L:
        return "not measurable here", f"because entropy peaks at the last layer ({peak_layer} of {L}, {fmt(peak)} nats)"
    if collapse_layer and collapse_layer < L:
        return "holds", (f"entropy halves from {fmt(peak)} nats (layer {peak_layer}) to {fmt(last)}; half-way by layer "
                         f"{collapse_layer} of {L}")
    if collapse_layer:
        return "does not hold", f"entropy goes from {fmt(peak)} to {fmt(last)} nats only at the last layer"
    return "does not hold", f"entropy never halves ({fmt(peak)} nats at layer {peak_layer} → {fmt(last)} at layer {L})"
