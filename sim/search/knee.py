"""The latency-rate curve of one deployment and its knee: pure data, no plotting, no I/O.

One workload is served at each of a list of offered request rates (an *evaluator*, a callable
``rate -> point``, runs the simulation); :func:`sweep` collects the points and finds two rates:

* **knee**: the highest offered rate ``r`` such that every evaluated rate ``<= r`` meets the SLO
  (:class:`KneeSLO`, limits on ``vllm bench serve``'s aggregate result keys, e.g. ``p99_ttft_ms`` and
  ``mean_tpot_ms``) and is not saturated. A later rate that passes again (noise, a non-monotone curve)
  does not extend it: capacity planning wants the rate below which *everything* passes. With
  ``refine = N``, N bisection steps between the knee and the first failing swept rate narrow it
  (each step one more evaluation; the knee is then known to within ``gap / 2**N``).
* **saturation**: the lowest evaluated rate whose queue grows without bound. By Loynes' theorem
  (R. M. Loynes, "The stability of a queue with non-independent inter-arrival and service times",
  Proc. Cambridge Philos. Soc. 58, 1962) a work-conserving queue fed at rate ``lambda`` with
  service capacity ``mu`` is stable iff ``rho = lambda / mu < 1``; above it the fluid limit (H. Chen and
  A. Mandelbaum, "Discrete flow networks: bottleneck analysis and fluid approximations", Math. Oper.
  Res. 16(2), 1991) has the backlog grow linearly, ``Q(t) = (lambda - mu) t``, so a FIFO arrival at
  ``t`` waits ``Q(t) / mu = (rho - 1) t``. A finite benchmark of ``num_prompts`` requests never grows
  without bound, so the test is on that slope. Precisely (:func:`queue_growth`): over the requests
  *sent in the second half of the send window* ``(t_first + t_last) / 2 < s_i <= t_last`` (the first half
  is the warm-up from an empty server; the drain after the last send is excluded), the least-squares
  slope ``g`` of each request's wait to its first token, ``w_i = (sent_i - due_i) + ttft_i`` (the
  client's concurrency queue plus the server's), against its due time ``s_i``. In steady state ``w``
  is stationary and ``g ~ 0``; saturated ``g = rho - 1``. A point is **saturated** iff
  ``g > tolerance`` (default 0.05: the offered load exceeds the capacity by more than 5%), and
  undetermined (None) when the window holds fewer than :data:`MIN_WINDOW` requests. Rates between
  ``mu`` and ``mu (1 + tolerance)`` are unstable but grow too slowly to tell from a finite run; a
  stable rate close to ``mu`` can be flagged when its waiting-time fluctuations (which grow like
  ``1 / (1 - rho)``) are large against the window: more prompts narrow both bands.
  The window's completion rate is not the test: with an end-to-end latency comparable to half the
  send window the second half still holds the server's fill-up, and completions lag sends while the
  queue is stable. At a saturated point the server is busy from the first send to the last
  completion, so the run's achieved throughput (completed / duration) estimates ``mu``
  (``capacity_rps``: the highest over the saturated points; a little low, the fill and the last
  batch's drain run below full batch).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from sim.serving.metrics import percentile_word

STATS_METRICS = ("ttft", "tpot", "itl", "e2el")   # vllm bench serve's --percentile-metrics
DEFAULT_SLO = "p99_ttft_ms=1000,mean_tpot_ms=50"
DEFAULT_TOLERANCE = 0.05
MIN_WINDOW = 20          # requests in the second half of the sends below which saturation is not judged
MAX_RATES = 200
MAX_REFINE = 20
_KEY = re.compile(r"^(mean|median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")


class KneeError(ValueError):
    """A bad --slo, --request-rate list, --refine or tolerance (the message names the flag)."""


@dataclass(frozen=True)
class KneeSLO:
    """Limits on a run's aggregate latencies, in milliseconds: ``((key, limit_ms), ...)``.

    Keys are ``vllm bench serve``'s result keys: ``{mean|median|pNN}_{ttft|tpot|itl|e2el}_ms``
    (``pNN`` a percentile in (0, 100]); a run meets the SLO when ``result[key] <= limit`` for every key.
    """

    limits: tuple = ()
    flag: str = "--slo"

    @classmethod
    def parse(cls, text: str | None, flag: str = "--slo") -> "KneeSLO":
        """``"p99_ttft_ms=1000,mean_tpot_ms=50"``; None: :data:`DEFAULT_SLO`."""
        text = DEFAULT_SLO if text is None else str(text)
        out: dict = {}
        for part in text.split(","):
            key, sep, val = part.partition("=")
            key = key.strip()
            m = _KEY.match(key)
            if not sep or not m or (m.group(2) is not None and not 0 < float(m.group(2)) <= 100):
                raise KneeError(f"{flag}: {part.strip()!r} is not METRIC=MILLISECONDS with METRIC "
                                "mean|median|pNN _ ttft|tpot|itl|e2el _ms (vllm bench serve's keys, e.g. "
                                "p99_ttft_ms=1000,mean_tpot_ms=50)")
            if key in out:
                raise KneeError(f"{flag}: {key} given twice")
            try:
                v = float(val)
            except ValueError:
                raise KneeError(f"{flag}: {key}={val.strip()!r} is not a number of milliseconds") from None
            if not math.isfinite(v) or v <= 0:
                raise KneeError(f"{flag}: {key} must be a positive number of milliseconds, got {val.strip()}")
            out[key] = v
        return cls(tuple(out.items()), flag)

    @property
    def percentiles(self) -> tuple:
        """The percentiles the keys need (what the evaluator must report)."""
        return tuple(sorted({float(m.group(2)) for k, _ in self.limits for m in [_KEY.match(k)] if m.group(2)}))

    def meets(self, metrics: dict) -> bool:
        for k, v in self.limits:
            if metrics.get(k) is None:
                raise KneeError(f"{self.flag}: {k} is not among the figures this run reports "
                                f"({', '.join(sorted(x for x in metrics if x.endswith('_ms')))})")
            x = float(metrics[k])
            if not (math.isfinite(x) and x <= v):
                return False
        return True

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.limits)


def parse_rates(text, flag: str = "--request-rate") -> list[float]:
    """Ascending distinct rates from ``"1,2,4,8"`` and/or ``START:STOP:STEP`` items (STOP included when
    on the grid), e.g. ``"0.5,1:4:1"``; every rate finite and > 0."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            if ":" in part:
                a, b, c = (float(x) for x in part.split(":"))
                if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)) or c <= 0 or b < a:
                    raise KneeError(f"{flag}: {part!r}: START:STOP:STEP needs STOP >= START and STEP > 0")
                n = int(math.floor((b - a) / c + 1e-9)) + 1
                if n > MAX_RATES:
                    raise KneeError(f"{flag}: {part!r} is {n} rates, more than {MAX_RATES}")
                out += [a + i * c for i in range(n)]
            else:
                out.append(float(part))
        except ValueError as exc:
            if isinstance(exc, KneeError):
                raise
            raise KneeError(f"{flag}: {part!r} is not a rate (R, or START:STOP:STEP; comma-separated)") from None
    bad = [r for r in out if not math.isfinite(r) or r <= 0]
    if bad:
        raise KneeError(f"{flag}: every rate must be finite and > 0 (a sweep has no inf), got {bad[0]:g}")
    rates = sorted(set(round(r, 12) for r in out))
    if len(rates) > MAX_RATES:
        raise KneeError(f"{flag}: {len(rates)} rates, more than {MAX_RATES}")
    return rates


def latency_metrics(ttft_s, tpot_s, e2el_s, percentiles=(50.0, 99.0)) -> dict:
    """``vllm bench serve``'s mean / median / pNN keys in ms for TTFT, TPOT and E2EL (what a run that is
    not a ``bench serve`` reports, e.g. the planner's problems)."""
    out = {}
    for name, x in (("ttft", ttft_s), ("tpot", tpot_s), ("e2el", e2el_s)):
        a = np.asarray(x, np.float64)
        a = a[np.isfinite(a)]
        if not a.size:
            continue
        out[f"mean_{name}_ms"], out[f"median_{name}_ms"] = float(a.mean()) * 1000, float(np.median(a)) * 1000
        for p in percentiles:
            out[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(a, p)) * 1000
    return out


def queue_growth(due, wait_to_first_s, tolerance: float = DEFAULT_TOLERANCE) -> dict:
    """The saturation test of the module docstring on one run.

    ``due``: each request's scheduled send time; ``wait_to_first_s``: due to first token (s);
    Returns ``{"growth_s_per_s": g, "saturated": bool | None, "window_requests": n}``.
    """
    tol = check_tolerance(tolerance)
    s = np.asarray(due, np.float64)
    w = np.asarray(wait_to_first_s, np.float64)
    t0, t1 = float(s.min()), float(s.max())
    mid = 0.5 * (t0 + t1)
    m = s > mid
    n = int(m.sum())
    g = None
    if n >= 2 and np.ptp(s[m]) > 0:
        g = float(np.polyfit(s[m], w[m], 1)[0])
    sat = None if n < MIN_WINDOW or g is None else bool(g > tol)
    return {"growth_s_per_s": g, "saturated": sat, "window_requests": n}


def check_tolerance(tolerance, flag: str = "--saturation-tolerance") -> float:
    t = tolerance
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t < 1:
        raise KneeError(f"{flag}: must be in (0, 1), got {t!r}")
    return float(t)


def point(rate: float, metrics: dict, growth: dict, slo: KneeSLO, refined: bool = False) -> dict:
    """One point of the curve: the offered rate, the run's figures, the saturation test, the SLO verdict."""
    ok = slo.meets(metrics)
    return {"rate": float(rate), "refined": bool(refined), **metrics, **growth, "meets_slo": ok,
            "passes": bool(ok and growth.get("saturated") is not True)}


def knee(points: list[dict]) -> dict:
    """``{"knee_rate", "first_failing_rate", "saturation_rate", "capacity_rps", "knee_bounded"}`` of
    evaluated points (module docstring); ``knee_rate`` None when the lowest rate fails,
    ``knee_bounded`` False when no evaluated rate fails (the knee is at least the highest rate)."""
    pts = sorted(points, key=lambda p: p["rate"])
    kr, fail = None, None
    for p in pts:
        if not p["passes"]:
            fail = p["rate"]
            break
        kr = p["rate"]
    sat = [p for p in pts if p.get("saturated") is True]
    caps = [p["request_throughput"] for p in sat if p.get("request_throughput") is not None]
    return {"knee_rate": kr, "first_failing_rate": fail, "knee_bounded": fail is not None,
            "saturation_rate": sat[0]["rate"] if sat else None,
            "capacity_rps": float(max(caps)) if caps else None}


def sweep(evaluate: Callable[[float], tuple[dict, dict]], rates: Iterable[float], slo: KneeSLO, *,
          refine: int = 0, progress: Callable | None = None,
          evaluate_many: Callable[[list], list] | None = None) -> dict:
    """Evaluate ``rates`` (ascending), then ``refine`` bisection steps between the knee and the first
    failing rate; returns ``{"points": [...] (by rate), "slo", **knee(points), "refine"}``.

    ``evaluate(rate) -> (metrics, growth)``: the run's ``vllm bench serve`` keys and its
    :func:`queue_growth`. ``progress``: wraps an iterable (tqdm), or None. ``evaluate_many(rates) ->
    [(metrics, growth), ...]``: the independent runs of the given rates at once (e.g. on Dask); the
    bisection steps, each depending on the last, run through ``evaluate``.
    """
    if isinstance(refine, bool) or not isinstance(refine, int) or not 0 <= refine <= MAX_REFINE:
        raise KneeError(f"--refine: must be an integer in 0..{MAX_REFINE}, got {refine!r}")
    rates = list(rates)
    if not rates or any(b <= a for a, b in zip(rates, rates[1:])):
        raise KneeError("--request-rate: give at least one rate, ascending")
    wrap = progress or (lambda it, **_: it)
    pts = []
    if evaluate_many is not None:
        for r, (m, g) in zip(rates, evaluate_many([float(r) for r in rates])):
            pts.append(point(r, m, g, slo))
    else:
        for r in wrap(rates, desc="rates", unit="rate"):
            m, g = evaluate(float(r))
            pts.append(point(r, m, g, slo))
    k = knee(pts)
    if refine and k["knee_rate"] is not None and k["first_failing_rate"] is not None:
        lo, hi = k["knee_rate"], k["first_failing_rate"]
        for _ in wrap(range(refine), desc="refine", unit="step"):
            mid = 0.5 * (lo + hi)
            m, g = evaluate(mid)
            p = point(mid, m, g, slo, refined=True)
            pts.append(p)
            lo, hi = (mid, hi) if p["passes"] else (lo, mid)
        pts.sort(key=lambda p: p["rate"])
        k = knee(pts)
    return {"points": sorted(pts, key=lambda p: p["rate"]), "slo": str(slo), "refine": int(refine), **k}


def caption(info: dict, curve: dict, unit: str = "req/s") -> str:
    """What every figure of a curve holds under, in one line: the knee, the saturation rate, the SLO and
    ``info["provenance"]`` (which target priced it, under what scheduler, batch and capacity)."""
    def r(x):
        return "none" if x is None else f"{x:.4g} {unit}"
    kn = r(curve["knee_rate"]) + ("" if curve["knee_bounded"] or curve["knee_rate"] is None else " or more")
    return (f"knee {kn} (SLO {curve['slo']}), saturation {r(curve['saturation_rate'])}"
            + (f", capacity ~{curve['capacity_rps']:.4g} {unit}" if curve.get("capacity_rps") else "")
            + f"; {info.get('provenance', '')}")
