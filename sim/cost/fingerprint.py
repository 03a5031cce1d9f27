"""Host fingerprints: which machine a fitted CPU profile belongs to, and whether this one is it.

A hardware profile fitted on a CPU prices the kernels *that* CPU's BLAS chose:
the same model on a CPU with other vector units (AVX2 only, AVX-512, AMX), or
under another torch / BLAS build, or with another number of threads, runs other
kernels at other speeds. Every CPU-fitted profile records the fingerprint of the
host it was measured on (``fingerprint`` in the preset)::

    kind: cpu
    cpu_model: "Intel(R) Xeon(R) Processor"     # /proc/cpuinfo "model name" (platform.processor() elsewhere)
    isa: [amx_bf16, ..., avx2, avx512f, ...]      # the flags that decide BLAS kernels: avx2, avx512*, amx*
    threads: 1                                   # torch intra-op threads of the measurements
    torch: 2.13.0+cpu                            # torch's version and its BLAS backend
    blas: mkl
    dtype: float32

A GPU-fitted profile records ``kind: gpu`` and ``device_name`` (the device's
name plays this part). This module reads the current host without torch
(``/proc/cpuinfo``, the installed torch's version from its package metadata:
the simulator never imports torch) and compares two fingerprints; the
``calibrate`` side (:mod:`calibrate.hostinfo`) adds what only torch knows
(BLAS backend, threads in use) at fit time. Everything here is a pure function
of its arguments, except :func:`current_cpu_fingerprint`, which reads the host.
"""
from __future__ import annotations

import os
import platform
import re

# keys compared, in the order a difference is reported
CPU_KEYS = ("cpu_model", "isa", "threads", "torch", "blas", "dtype")
_ISA_RE = re.compile(r"^(avx2|avx512.*|amx.*)$")


def isa_flags(flags) -> list[str]:
    """The BLAS-relevant ISA flags among ``flags`` (avx2, avx512*, amx*), sorted."""
    return sorted({f for f in flags if _ISA_RE.match(str(f))})


def parse_cpuinfo(text: str) -> dict:
    """``{"cpu_model", "isa", "logical_cpus"}`` from the text of ``/proc/cpuinfo`` (first processor's)."""
    model, flags, n = "", [], 0
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k = k.strip().lower()
        if k == "processor":
            n += 1
        elif k == "model name" and not model:
            model = " ".join(v.split())
        elif k in ("flags", "features") and not flags:
            flags = v.split()
    return {"cpu_model": model, "isa": isa_flags(flags), "logical_cpus": n}


def _torch_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def current_cpu_fingerprint(cpuinfo_path: str = "/proc/cpuinfo") -> dict:
    """This host as far as it can be read without torch: CPU model, ISA flags, torch version.

    ``threads``, ``blas`` and ``dtype`` describe a measurement, not the host, and are absent
    (the simulator runs no kernel; ``calibrate`` fills them in from the run it times).
    """
    try:
        with open(cpuinfo_path) as fh:
            info = parse_cpuinfo(fh.read())
    except OSError:
        info = {"cpu_model": platform.processor() or platform.machine(), "isa": [], "logical_cpus": os.cpu_count()}
    fp = {"kind": "cpu", "cpu_model": info["cpu_model"] or platform.processor() or platform.machine(),
          "isa": info["isa"]}
    tv = _torch_version()
    if tv:
        fp["torch"] = tv
    return fp


def _norm(key: str, v):
    if key == "isa":
        return tuple(sorted(str(x) for x in (v or ())))
    if key == "threads":
        return int(v)
    return str(v).strip()


def fingerprint_differences(recorded: dict | None, current: dict | None) -> list[str]:
    """What differs between a profile's recorded fingerprint and the current one, in words.

    Only keys both sides know are compared (the simulator does not know the threads or the
    BLAS a future run will use; ``calibrate serve`` does). ``isa`` differences name the flags
    one side has and the other lacks. GPU fingerprints compare ``device_name``. Empty: same host
    (or nothing to compare).
    """
    if not recorded or not current:
        return []
    if recorded.get("kind", "cpu") != current.get("kind", "cpu"):
        return [f"kind {recorded.get('kind', 'cpu')} vs {current.get('kind', 'cpu')}"]
    if recorded.get("kind") == "gpu":
        a, b = recorded.get("device_name"), current.get("device_name")
        return [] if not a or not b or a.strip().lower() == b.strip().lower() else [f"device {a!r} vs {b!r}"]
    out = []
    for k in CPU_KEYS:
        if k not in recorded or k not in current or recorded[k] is None or current[k] is None:
            continue
        a, b = _norm(k, recorded[k]), _norm(k, current[k])
        if a == b:
            continue
        if k == "isa":
            only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            parts = ([f"fitted host has {','.join(only_a)}"] if only_a else []) + \
                    ([f"this host has {','.join(only_b)}"] if only_b else [])
            out.append("ISA flags differ (" + "; ".join(parts) + ")")
        else:
            out.append(f"{k} {recorded[k]!r} vs {current[k]!r} here")
    return out


def describe(fp: dict | None) -> str:
    """One short phrase for a fingerprint: ``Intel(R) Xeon(R) ... (avx512f, amx_tile, ...; 1 thread, torch 2.13.0)``."""
    if not fp:
        return "unknown host"
    if fp.get("kind") == "gpu":
        return str(fp.get("device_name", "unknown GPU"))
    isa = fp.get("isa") or []
    top = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if x in isa]
    bits = [", ".join(top) if top else "no avx2"]
    if fp.get("threads") is not None:
        bits.append(f"{fp['threads']} thread{'s' if int(fp['threads']) != 1 else ''}")
    if fp.get("torch"):
        bits.append(f"torch {fp['torch']}" + (f" {fp['blas']}" if fp.get("blas") else ""))
    return f"{fp.get('cpu_model') or '?'} ({'; '.join(bits)})"


def host_status(profile_name: str, recorded: dict | None, calibrated: bool, current: dict | None = None) -> dict:
    """Does a profile belong to this host? ``{"host_match", "host_differences", "host_note"}``.

    ``host_match``: True (same fingerprint), False (differs), None (nothing to compare: a
    datasheet or GPU profile, or a CPU fit that recorded no fingerprint). ``host_note`` is the
    one line every output priced on a mismatching (or unfingerprinted fitted CPU) profile prints;
    empty when it matches or does not apply. A GPU profile is not checked against the host the
    simulator runs on (it describes a remote device); ``calibrate`` checks the device it times.
    """
    if not recorded:
        if calibrated:
            return {"host_match": None, "host_differences": [],
                    "host_note": (f"hardware {profile_name}: fitted on a CPU that recorded no fingerprint; it may "
                                  f"not be this host (fit this one: rksim calibrate host)")}
        return {"host_match": None, "host_differences": [], "host_note": ""}
    if recorded.get("kind") == "gpu" and (current or {}).get("kind", "cpu") != "gpu":
        return {"host_match": None, "host_differences": [], "host_note": ""}
    cur = current if current is not None else current_cpu_fingerprint()
    diff = fingerprint_differences(recorded, cur)
    if not diff:
        return {"host_match": True, "host_differences": [], "host_note": ""}
    return {"host_match": False, "host_differences": diff,
            "host_note": (f"hardware {profile_name}: fitted on another host ({'; '.join(diff)}); its prices are "
                          f"not this machine's, hardware_calibrated=false (fit this one: rksim calibrate host)")}


def profile_host_status(hw, current: dict | None = None) -> dict:
    """Whether the hardware profile ``hw`` belongs to this host (:func:`host_status`), plus
    ``hardware_calibrated``: fitted end to end *and* not on another host."""
    fr = hw.fitted_range or {}
    cpu_fit = bool(hw.calibrated) and str(fr.get("device", hw.extra.get("device", ""))).startswith("cpu")
    st = host_status(hw.name, hw.fingerprint, cpu_fit, current)
    st["hardware_calibrated"] = bool(hw.calibrated) and st["host_match"] is not False
    return st


def host_fields(hw, strict: bool = False, current: dict | None = None) -> dict:
    """What a result says about its profile's host: ``hardware_calibrated``, ``host_match``, ``host_note``.

    ``hardware_calibrated`` is True only for a profile fitted end to end on this host (not
    refuted by a fingerprint). ``strict``: a profile fitted on another host is refused
    (:class:`sim.cost.profiles.OutOfCalibrationError` naming the difference) instead of noted.
    """
    from sim.base.errors import OutOfCalibrationError

    st = profile_host_status(hw, current)
    if strict and st["host_match"] is False:
        raise OutOfCalibrationError(f"--strict: hardware {hw.name} was fitted on another host "
                                    f"({'; '.join(st['host_differences'])}); fit this one: rksim calibrate host")
    return {"hardware_calibrated": st["hardware_calibrated"], "host_match": st["host_match"],
            "host_note": st["host_note"]}


def profile_line(hw, current: dict | None = None) -> str:
    """One line for a newcomer: does ``hw`` (the shipped CPU profile) belong to this host, and how to get one that does."""
    st = profile_host_status(hw, current)
    fix = "rksim calibrate host (about 3 minutes of CPU) fits this machine into your user profile directory"
    if st["host_match"] is True:
        return f"hardware {hw.name}: fitted on this host ({describe(hw.fingerprint)}); its prices are this machine's"
    if st["host_match"] is False:
        return (f"hardware {hw.name}: fitted on another host ({'; '.join(st['host_differences'])}), so its CPU "
                f"prices are not this machine's; {fix}")
    if hw.calibrated:
        return f"hardware {hw.name}: fitted on a host that recorded no fingerprint; {fix}"
    return f"hardware {hw.name}: {hw.calibration_note}"
