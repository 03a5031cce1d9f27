"""SLO goodput: requests per second that meet every stated latency SLO.

DistServe (Zhong et al., OSDI 2024) judges a serving system by goodput under SLOs on time to first
token (TTFT) and time per output token (TPOT); ``vllm bench serve --goodput`` reports it per run as::

    goodput = #{requests r : ttft_r <= SLO_ttft and tpot_r <= SLO_tpot and e2e_r <= SLO_e2e} / duration

over the SLOs stated (any subset), with vLLM's per-request TPOT ``(e2e - ttft) / (output_tokens - 1)``
(0 for a request of one output token). :func:`goodput` computes that; :func:`max_goodput_rate` gives
DistServe's headline form over a sweep of arrival rates: the highest rate whose SLO attainment (the
fraction of requests meeting every SLO) is at least a target, e.g. 90%.

``duration`` is the run's span (first arrival to last completion, the makespan), as vLLM's benchmark
uses for throughput.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SLO_KEYS = ("ttft", "tpot", "e2e")


class SLOError(ValueError):
    """A malformed ``--slo`` (the message names it)."""


@dataclass(frozen=True)
class SLO:
    """Latency objectives in seconds; None = not stated."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for k in SLO_KEYS:
            v = getattr(self, f"{k}_s")
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                  or v <= 0):
                raise SLOError(f"--slo: {k} must be a positive number of seconds, got {v!r}")

    @classmethod
    def parse(cls, text: str | None) -> "SLO":
        """``"ttft=0.5,tpot=0.05,e2e=30"`` (seconds, any subset; empty or None: no SLO)."""
        if text is None or not str(text).strip():
            return cls()
        out = {}
        for part in str(text).split(","):
            key, sep, val = part.partition("=")
            key = key.strip()
            if not sep or key not in SLO_KEYS:
                raise SLOError(f"--slo: {part.strip()!r} is not KEY=SECONDS with KEY one of {', '.join(SLO_KEYS)}")
            if key in out:
                raise SLOError(f"--slo: {key} given twice")
            try:
                out[key] = float(val)
            except ValueError:
                raise SLOError(f"--slo: {key}={val.strip()!r} is not a number of seconds") from None
        return cls(**{f"{k}_s": v for k, v in out.items()})

    @property
    def stated(self) -> dict:
        return {k: getattr(self, f"{k}_s") for k in SLO_KEYS if getattr(self, f"{k}_s") is not None}

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.stated.items()) or "none"


def tpot(ttft, e2e, output_tokens) -> np.ndarray:
    """vLLM's per-request TPOT: ``(e2e - ttft) / (output_tokens - 1)``, 0 where one token or none."""
    ttft, e2e = np.asarray(ttft, np.float64), np.asarray(e2e, np.float64)
    n = np.asarray(output_tokens, np.float64)
    return np.where(n > 1, (e2e - ttft) / np.maximum(n - 1, 1), 0.0)


def meets(slo: SLO, ttft, tpot_s, e2e) -> np.ndarray:
    """Boolean per request: every stated SLO met (a request with a NaN latency meets none)."""
    e2e = np.asarray(e2e, np.float64)
    ok = np.isfinite(e2e)
    for v, x in ((slo.ttft_s, ttft), (slo.tpot_s, tpot_s), (slo.e2e_s, e2e)):
        if v is not None:
            x = np.asarray(x, np.float64)
            ok &= np.isfinite(x) & (x <= v)
    return ok


def goodput(slo: SLO, ttft, tpot_s, e2e, duration_s: float) -> dict:
    """``{goodput_rps, throughput_rps, slo_attainment, requests, requests_meeting_slo, slo}`` of one run."""
    ok = meets(slo, ttft, tpot_s, e2e)
    n = int(ok.size)
    good = int(ok.sum())
    d = float(duration_s)
    return {"goodput_rps": good / d if d > 0 else None, "throughput_rps": n / d if d > 0 else None,
            "slo_attainment": good / n if n else None, "requests": n, "requests_meeting_slo": good, "slo": str(slo)}


def max_goodput_rate(rates, attainment, target: float = 0.9) -> float | None:
    """DistServe's goodput over a rate sweep: the highest rate at which the SLO attainment is >= ``target``,
    linearly interpolated where attainment crosses the target between two measured rates; None if it is
    below the target at every rate. ``rates`` ascending."""
    r = np.asarray(rates, np.float64)
    a = np.asarray(attainment, np.float64)
    if r.size == 0 or r.shape != a.shape or np.any(np.diff(r) <= 0):
        raise ValueError("max_goodput_rate: rates must be ascending, one attainment each")
    if not 0 < target <= 1:
        raise ValueError(f"max_goodput_rate: target must be in (0, 1], got {target!r}")
    ok = a >= target
    if not ok.any():
        return None
    i = int(np.max(np.nonzero(ok)[0]))
    if i == r.size - 1:
        return float(r[i])
    # attainment falls below the target between r[i] and r[i+1]
    return float(r[i] + (r[i + 1] - r[i]) * (a[i] - target) / (a[i] - a[i + 1]))
