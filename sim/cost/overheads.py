"""What an engine step and a request cost beyond the GPU's kernels: host time and front-end time.

vLLM V1 runs three kinds of CPU work around the kernels (``vllm/v1/engine/core.py``,
``vllm/v1/worker/gpu_model_runner.py``, ``vllm/v1/engine/output_processor.py``, vLLM 0.33):

* **engine core** (one process, one thread): ``Scheduler.schedule()`` and
  ``Scheduler.update_from_output()`` every step;
* **worker** (the GPU model runner, in the engine core process at TP=1): input preparation
  (``_prepare_inputs``: block tables, positions, slot mappings, copies to the device), kernel
  launches and the sampler's host side (sampling metadata, the device-to-host copy of the
  sampled ids);
* **front-end** (the API server process): tokenising the prompt, HTTP, and per step the output
  processor (``OutputProcessor.process_outputs``: incremental detokenisation, one
  ``RequestOutput`` per request) and the SSE write of each streamed chunk.

The first two are the *host time of a step* (:class:`HostStepCost`)::

    host_s = (base_s + per_running_s * running + per_token_s * scheduled_tokens
              + per_output_s * sampled + per_admit_s * admitted
              + per_admit_token_s * admitted_tokens) / host_speed

with ``running`` the requests in the step, ``scheduled_tokens`` the tokens it computes,
``sampled`` the requests that sample a token in it (decodes plus prefills whose last chunk it is)
and ``admitted`` / ``admitted_tokens`` the requests (and their prompt tokens) the engine core
took in before the step (``EngineCore.add_request``: the ``Request`` with its prompt's block
hashes, then ``Scheduler.add_request``, on the same thread between steps);
``host_speed`` is the target host's single-thread speed relative to the host the coefficients
were measured on (1: the same). The third is the front-end (:class:`FrontendCost`), which runs
in another process: it adds latency to a request, never time to a step, unless it falls behind.

Sync and async scheduling (:func:`step_seconds`). Without ``--async-scheduling`` the engine core
loop is ``schedule -> execute_model (prepare inputs, launch, sample, wait) -> update_from_output``:
the GPU idles while the host works, so a step costs ``gpu_s + host_s``. With it
(``EngineCore.step_with_batch_queue``, a queue of two batches; vLLM PR #19970 "Implement Async
Scheduling", https://github.com/vllm-project/vllm/pull/19970; input preparation and sampling
overlapped by PR #23569 "[Perf][V1] Fully overlap model execution",
https://github.com/vllm-project/vllm/pull/23569) step ``k + 1`` is scheduled and its inputs are
prepared while the GPU runs step ``k``; the output of step ``k`` is applied
(``update_from_output``) while step ``k + 1`` runs, and must be applied before step ``k + 2`` is
scheduled. So the host work of one step (update of ``k``, schedule and prepare of ``k + 2``) runs
beside one GPU step, and in steady state::

    step_s = max(gpu_s + host_serial_s, host_s)

``host_serial_s`` (``<= host_s``) is the host work that stays on the GPU's critical path even so:
the wait for the sampled ids and whatever launch work the GPU must wait for. The form makes
async never slower than sync (``max(g + s, h) <= g + h`` when ``s <= h``).

Everything here is pure numpy / python: :meth:`HostStepCost.seconds` and :func:`step_seconds`
take arrays, so the cost of many steps is one vectorised call.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from sim.cost.fields import check_field
from sim.base.errors import PresetError


# ---------------------------------------------------------------------------------- host step


@dataclass(frozen=True)
class HostStepCost:
    """Host (CPU) seconds of one engine step, beyond the GPU's kernels.

    ``seconds = (base_s + per_running_s * running + per_token_s * scheduled_tokens
    + per_output_s * sampled + per_admit_s * admitted + per_admit_token_s * admitted_tokens)
    / host_speed``; the serial part under async scheduling is
    ``serial_fraction * seconds`` (see :func:`step_seconds`).

    Parameters
    ----------
    base_s, per_running_s, per_token_s, per_output_s, per_admit_s, per_admit_token_s
        Coefficients in seconds (per step, per running request, per scheduled token, per request
        sampling a token, per request admitted, per prompt token admitted), on the host they
        were measured on.
    host_speed
        Single-thread speed of the target host relative to the measurement host (2: twice as
        fast, so half the seconds).
    serial_fraction
        Part of the host time that cannot overlap the GPU under async scheduling, in ``[0, 1]``.
    max_running, max_tokens
        The largest running count and scheduled-token count the coefficients were measured at
        (None: unbounded); :meth:`seconds` refuses more.
    source
        Where the coefficients come from (file, commit, measurement date).
    runner_base_s, runner_per_running_s
        The parts of ``base_s`` / ``per_running_s`` that are the model runner's host work (input
        preparation, the sampler's host side) taken from a cited older engine rather than measured on
        vLLM V1 (0: none); the low edge of a figure's band drops them (:meth:`engine_core_only`).
    """

    base_s: float
    per_running_s: float = 0.0
    per_token_s: float = 0.0
    per_output_s: float = 0.0
    per_admit_s: float = 0.0
    per_admit_token_s: float = 0.0
    host_speed: float = 1.0
    serial_fraction: float = 0.0
    max_running: int | None = None
    max_tokens: int | None = None
    source: str = ""
    runner_base_s: float = 0.0
    runner_per_running_s: float = 0.0

    def __post_init__(self) -> None:
        for rule, names in (("nonneg", ("base_s", "per_running_s", "per_token_s", "per_output_s", "per_admit_s",
                                        "per_admit_token_s", "runner_base_s", "runner_per_running_s")),
                            ("positive", ("host_speed",)), ("fraction", ("serial_fraction",)),
                            ("count or null", ("max_running", "max_tokens"))):
            for f in names:
                check_field(f"host_step.{f}", getattr(self, f), rule)
        for part, whole in (("runner_base_s", "base_s"), ("runner_per_running_s", "per_running_s")):
            if getattr(self, part) > getattr(self, whole):
                raise PresetError(f"field 'host_step.{part}' ({getattr(self, part)!r}) is a part of "
                                  f"'host_step.{whole}' ({getattr(self, whole)!r}): it cannot be larger")

    @property
    def has_runner_part(self) -> bool:
        """Whether some of the coefficients are a cited model runner's (:meth:`engine_core_only` differs)."""
        return self.runner_base_s > 0 or self.runner_per_running_s > 0

    def engine_core_only(self) -> "HostStepCost":
        """The same host time without the cited model runner's part (``runner_base_s``, ``runner_per_running_s``)::

            base_s' = base_s - runner_base_s,   per_running_s' = per_running_s - runner_per_running_s

        What was measured on vLLM V1 itself (engine core, admission), with no input preparation or sampler host
        time at all: the low edge of the host-time range (V1's persistent batch prepares its inputs incrementally,
        so the older engine's runner is its high edge)."""
        import dataclasses

        return dataclasses.replace(
            self, base_s=self.base_s - self.runner_base_s,   # parts no larger than their wholes (__post_init__)
            per_running_s=self.per_running_s - self.runner_per_running_s, runner_base_s=0.0,
            runner_per_running_s=0.0, source=f"{self.source} [engine core only: the cited model runner's part "
                                             f"({self.runner_base_s:g} s + {self.runner_per_running_s:g} s per "
                                             f"request) left out]")

    def seconds(self, running, scheduled_tokens, sampled=None, admitted=0, admitted_tokens=0):
        """Host seconds of steps with ``running`` requests computing ``scheduled_tokens`` tokens.

        ``sampled`` (default: ``running``, every request samples: a decode step) counts the
        requests that sample a token; ``admitted`` / ``admitted_tokens`` the requests (prompt
        tokens) taken in before the step. Scalars or numpy arrays (broadcast); a float or an array.
        One step given as Python numbers is priced without numpy (the engine prices every stepped
        iteration so): the same checks and the same floating-point operations, so the same float.
        """
        if all(type(x) in (int, float) for x in (running, scheduled_tokens, admitted, admitted_tokens)) and \
                (sampled is None or type(sampled) in (int, float)):
            r, t, a, at = float(running), float(scheduled_tokens), float(admitted), float(admitted_tokens)
            s = r if sampled is None else float(sampled)
            self._check(min(r, t, s, a, at), r, t)
            return self._line(r, t, s, a, at)
        r = np.asarray(running, dtype=float)
        t = np.asarray(scheduled_tokens, dtype=float)
        s = r if sampled is None else np.asarray(sampled, dtype=float)
        a = np.asarray(admitted, dtype=float)
        at = np.asarray(admitted_tokens, dtype=float)
        self._check(min((float(x.min()) for x in (r, t, s, a, at) if x.size), default=0.0),
                    float(r.max()) if r.size else 0.0, float(t.max()) if t.size else 0.0)
        out = self._line(r, t, s, a, at)
        return float(out) if out.ndim == 0 else out

    def _line(self, r, t, s, a, at):
        """The formula of the class docstring (floats or arrays)."""
        return (self.base_s + self.per_running_s * r + self.per_token_s * t + self.per_output_s * s
                + self.per_admit_s * a + self.per_admit_token_s * at) / self.host_speed

    def _check(self, low: float, r_max: float, t_max: float) -> None:
        """Counts must be >= 0 and within the measured range (``max_running``, ``max_tokens``)."""
        if low < 0:
            raise ValueError("host_step: running, scheduled_tokens, sampled, admitted and admitted_tokens must be >= 0")
        if self.max_running is not None and r_max > self.max_running:
            raise ValueError(f"host_step: {int(r_max)} running requests, more than the {self.max_running} "
                             f"the coefficients were measured at ({self.source or 'no source'})")
        if self.max_tokens is not None and t_max > self.max_tokens:
            raise ValueError(f"host_step: {int(t_max)} scheduled tokens, more than the {self.max_tokens} "
                             f"the coefficients were measured at ({self.source or 'no source'})")

    def seconds_and_serial(self, running, scheduled_tokens, sampled=None, admitted=0, admitted_tokens=0):
        """``(seconds(...), serial_seconds(...))`` with the host seconds computed once (the same floats)."""
        h = self.seconds(running, scheduled_tokens, sampled, admitted, admitted_tokens)
        out = self.serial_fraction * np.asarray(h)
        return h, (float(out) if out.ndim == 0 else out)

    def serial_seconds(self, running, scheduled_tokens, sampled=None, admitted=0, admitted_tokens=0):
        """The part of :meth:`seconds` that stays on the GPU's critical path under async scheduling."""
        out = self.serial_fraction * np.asarray(self.seconds(running, scheduled_tokens, sampled, admitted,
                                                             admitted_tokens))
        return float(out) if out.ndim == 0 else out

    def scaled(self, host_speed: float) -> "HostStepCost":
        """The same coefficients on a host ``host_speed`` times as fast as the measurement host."""
        import dataclasses

        return dataclasses.replace(self, host_speed=float(host_speed))


def add(a: HostStepCost, b: HostStepCost, source: str = "") -> HostStepCost:
    """Two host parts of one step that run one after the other (e.g. engine core + worker).

    Both must be on the same ``host_speed``; the serial fractions combine weighted by nothing
    (the larger is kept: a conservative bound) and the ranges by the tighter one.
    """
    if a.host_speed != b.host_speed:
        raise ValueError("host_step: cannot add parts priced on hosts of different speed")

    def tight(x, y):
        return y if x is None else x if y is None else min(x, y)

    return HostStepCost(base_s=a.base_s + b.base_s, per_running_s=a.per_running_s + b.per_running_s,
                        per_token_s=a.per_token_s + b.per_token_s, per_output_s=a.per_output_s + b.per_output_s,
                        per_admit_s=a.per_admit_s + b.per_admit_s,
                        per_admit_token_s=a.per_admit_token_s + b.per_admit_token_s,
                        host_speed=a.host_speed, serial_fraction=max(a.serial_fraction, b.serial_fraction),
                        max_running=tight(a.max_running, b.max_running), max_tokens=tight(a.max_tokens, b.max_tokens),
                        source=source or f"{a.source}; {b.source}", runner_base_s=a.runner_base_s + b.runner_base_s,
                        runner_per_running_s=a.runner_per_running_s + b.runner_per_running_s)


def step_seconds(gpu_s, host_s, async_scheduling: bool, host_serial_s=0.0):
    """Wall seconds of an engine step with ``gpu_s`` of kernels and ``host_s`` of host work.

    Sync (``async_scheduling=False``)::

        step_s = gpu_s + host_s

    Async (``--async-scheduling``: the host prepares step k+1 and applies step k's output while
    the GPU runs step k+1; module docstring)::

        step_s = max(gpu_s + host_serial_s, host_s),   0 <= host_serial_s <= host_s

    so async is never slower. Scalars or numpy arrays (broadcast).
    """
    if type(gpu_s) in (int, float) and type(host_s) in (int, float) and type(host_serial_s) in (int, float):
        # one step in Python numbers (the engine's stepped iterations): the same checks and floats, no numpy
        g, h, s = float(gpu_s), float(host_s), float(host_serial_s)
        _check_step(min(g, h, s), s > h * (1 + 1e-12) + 1e-300)
        if async_scheduling:
            return g + s if g + s >= h else h
        return g + h
    if type(gpu_s) is np.ndarray and gpu_s.ndim == 1 and gpu_s.dtype == np.float64 and type(host_s) is float \
            and type(host_serial_s) is float:
        # a window's steps of one batch size: its host floats checked once (the same floats as broadcasting)
        h, s = host_s, host_serial_s
        _check_step(min(float(gpu_s.min()) if gpu_s.size else 0.0, h, s), s > h * (1 + 1e-12) + 1e-300)
        return np.maximum(gpu_s + s, h) if async_scheduling else gpu_s + h
    g = np.asarray(gpu_s, dtype=float)
    h = np.asarray(host_s, dtype=float)
    s = np.asarray(host_serial_s, dtype=float)
    _check_step(min((float(x.min()) for x in (g, h, s) if x.size), default=0.0),
                bool(np.any(s > h * (1 + 1e-12) + 1e-300)))
    out = np.maximum(g + s, h) if async_scheduling else g + h
    return float(out) if out.ndim == 0 else out


def _check_step(low: float, serial_over_host: bool) -> None:
    if low < 0:
        raise ValueError("step_seconds: gpu_s, host_s and host_serial_s must be >= 0")
    if serial_over_host:
        raise ValueError("step_seconds: host_serial_s cannot exceed host_s (the serial part is part of the host time)")


# ---------------------------------------------------------------------------------- front-end


@dataclass(frozen=True)
class FrontendCost:
    """Per-request and per-token time in vLLM's API server (``vllm serve``), beyond the engine.

    The API server runs in its own process (``--api-server-count`` of them; vLLM PR #17546,
    https://github.com/vllm-project/vllm/pull/17546): its work delays a request's tokens but
    does not lengthen an engine step, unless one pass over a step's outputs takes longer than
    the step (then the front-end sets the pace). ``vllm bench serve`` stops the TTFT clock when
    the client has parsed the first SSE chunk holding ``choices``
    (``vllm/benchmarks/lib/endpoint_request_func.py`` in vLLM 0.33,
    ``async_request_openai_completions``: ``output.ttft = timestamp - st``), so::

        ttft_s += request_s + per_prompt_token_s * prompt_tokens + per_output_s
        itl_s  = max(step_s, frontend_step_s(running) / api_servers)     # the pace of tokens
        frontend_step_s(running) = step_base_s + per_output_s * running

    ``request_s`` is HTTP handling and request set-up, ``per_prompt_token_s`` tokenisation,
    ``per_output_s`` the output processor's and the SSE write's cost per streamed token.
    ``frontend=False`` (an in-process ``LLM`` run, :func:`frontend_or_none`) prices none.
    All divided by ``host_speed`` as in :class:`HostStepCost`.
    """

    request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_s: float = 0.0
    step_base_s: float = 0.0
    api_servers: int = 1
    host_speed: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        for rule, names in (("nonneg", ("request_s", "per_prompt_token_s", "per_output_s", "step_base_s")),
                            ("count", ("api_servers",)), ("positive", ("host_speed",))):
            for f in names:
                check_field(f"frontend.{f}", getattr(self, f), rule)

    def ttft_s(self, prompt_tokens):
        """Front-end seconds a request's TTFT gains (HTTP, tokenisation, its first chunk's delivery)."""
        p = np.asarray(prompt_tokens, dtype=float)
        if np.any(p < 0):
            raise ValueError("frontend: prompt_tokens must be >= 0")
        out = (self.request_s + self.per_prompt_token_s * p + self.per_output_s) / self.host_speed
        return float(out) if out.ndim == 0 else out

    def step_s(self, running):
        """Front-end seconds of one pass over a step's outputs (all ``running`` requests' chunks)."""
        r = np.asarray(running, dtype=float)
        out = (self.step_base_s + self.per_output_s * r) / self.host_speed / self.api_servers
        return float(out) if out.ndim == 0 else out

    def itl_s(self, step_s, running):
        """The pace of a request's tokens: ``max(step_s, step_s(running))`` (front-end bound when slower)."""
        out = np.maximum(np.asarray(step_s, dtype=float), np.asarray(self.step_s(running)))
        return float(out) if out.ndim == 0 else out


NO_FRONTEND = FrontendCost(source="in-process LLM run: no API server")


def frontend_or_none(cost: FrontendCost | None, frontend: bool) -> FrontendCost:
    """``cost`` when requests go through ``vllm serve`` (``frontend=True``), else :data:`NO_FRONTEND`."""
    if not frontend or cost is None:
        return NO_FRONTEND
    return cost


# ---------------------------------------------------------------------------------- presets

_HOST_KEYS = {f.name for f in fields(HostStepCost)}
_FRONT_KEYS = {f.name for f in fields(FrontendCost)}


def host_step_from_preset(preset: dict, where: str = "hardware preset") -> HostStepCost | None:
    """The ``host_step:`` mapping of a hardware preset (None when absent).

    ::

        host_step:
          base_s: ...            # seconds per step
          per_running_s: ...     # per running request
          per_token_s: ...       # per scheduled token
          per_output_s: ...      # per request sampling a token
          per_admit_s: ...       # per request admitted (engine core)
          per_admit_token_s: ... # per prompt token admitted (block hashes)
          host_speed: 1.0        # target host / measurement host, single thread
          serial_fraction: 0.0   # part that cannot overlap under --async-scheduling
          max_running: 512
          max_tokens: 8192
          source: "..."          # required: where the numbers come from
          runner_base_s: ...     # optional: the parts of base_s / per_running_s from a cited model
          runner_per_running_s:  #   runner, not measured on vLLM V1 (the band's low edge drops them)

    A bad field raises :class:`PresetError` naming ``where`` and the field.
    """
    return _from_preset(preset, "host_step", HostStepCost, _HOST_KEYS, where)


def frontend_from_preset(preset: dict, where: str = "hardware preset") -> FrontendCost | None:
    """The ``frontend:`` mapping of a hardware preset (None when absent); fields of :class:`FrontendCost`."""
    return _from_preset(preset, "frontend", FrontendCost, _FRONT_KEYS, where)


def _from_preset(preset: dict, key: str, cls, keys: set, where: str):
    if not isinstance(preset, dict):
        raise PresetError(f"{where}: expected a mapping, got {type(preset).__name__}")
    block = preset.get(key)
    if block is None:
        return None
    if not isinstance(block, dict):
        raise PresetError(f"{where}: field {key!r} must be a mapping, got {block!r}")
    unknown = sorted(set(block) - keys)
    if unknown:
        raise PresetError(f"{where}: unknown field(s) {', '.join(f'{key}.{u}' for u in unknown)}; "
                          f"valid: {', '.join(sorted(keys))}")
    if not str(block.get("source", "")).strip():
        raise PresetError(f"{where}: field '{key}.source' is required (where the numbers come from)")
    kw = {}
    for k, v in block.items():
        if k in ("source",):
            kw[k] = str(v)
        elif k in ("max_running", "max_tokens", "api_servers"):
            kw[k] = v
        else:
            if isinstance(v, str):
                try:
                    v = float(v)
                except ValueError:
                    raise PresetError(f"{where}: field '{key}.{k}' must be a number, got {v!r}") from None
            kw[k] = v
    try:
        return cls(**kw)
    except PresetError as e:
        raise PresetError(f"{where}: {e}") from None


def overheads_info(hw, host, fe, async_on: bool, fe_on: bool, host_time: bool, results, fe_why: str | None = None,
                   host_why: str | None = None) -> dict:
    """What a run priced beyond the kernels, and on what it stands (``info["overheads"]``): the host time per step
    (``host``: the :class:`HostStepCost` priced, or None) and the front end (``fe``), each with why not where not;
    ``results``: the engines' results (their host seconds and steps past the measured sizes)."""
    if host is not None:
        h = {"priced": True, "async_scheduling": async_on, "host_speed": host.host_speed,
             "serial_fraction": host.serial_fraction, "source": host.source,
             "host_seconds": float(sum(getattr(x, "host_seconds", 0.0) for x in results)),
             "steps_beyond_measured": int(sum(getattr(x, "host_extrapolated", 0) for x in results))}
    else:
        why = ("turned off: --no-host-time, or a figure's host_time: false" if not host_time and hw.host_step is not None
               else "the profile has no host_step" + (" (its host_per_iter_s holds the host time of its end-to-end "
                                                      "fit)" if hw.host_per_iter_s else ""))
        h = {"priced": False, "async_scheduling": async_on, "why": host_why or why}
    if fe is not None:
        f = {"priced": True, "host_speed": fe.host_speed, "api_servers": fe.api_servers, "source": fe.source}
    else:
        f = {"priced": False, "why": fe_why or ("in-process LLM run (no API server)" if not fe_on
                                                else "the profile has no frontend")}
    return {"host_step": h, "frontend": f}


def overheads_words(info: dict) -> str:
    """The provenance line's clause on host and front-end time (empty for a record without them)."""
    o = info.get("overheads")
    if not o:
        return ""
    h, f = o["host_step"], o["frontend"]
    hs = (f"host time per step priced (async scheduling {'on' if h['async_scheduling'] else 'off'}, host_speed "
          f"{h['host_speed']:g}" + (f", {h['steps_beyond_measured']} steps beyond the measured sizes"
                                    if h.get("steps_beyond_measured") else "") + ")"
          if h["priced"] else f"no host time per step ({h['why']})")
    fs = (f"front-end time priced ({f['api_servers']} API server{'s' if f['api_servers'] > 1 else ''}, host_speed "
          f"{f['host_speed']:g})" if f["priced"] else f"no front-end time ({f['why']})")
    gs = "" if "cuda_graphs" not in o else "; CUDA graphs" if o["cuda_graphs"] else "; eager kernels"
    return f"; {hs}; {fs}{gs}"


__all__ = ["HostStepCost", "FrontendCost", "NO_FRONTEND", "add", "step_seconds", "frontend_or_none",
           "host_step_from_preset", "frontend_from_preset", "overheads_info", "overheads_words"]
