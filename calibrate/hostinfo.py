"""The fingerprint of the host (or device) a measurement runs on, with what only torch knows.

:func:`sim.cost.fingerprint.current_cpu_fingerprint` reads the CPU model and the ISA flags
without torch; here the measurement's own facts are added: torch's version, its
BLAS backend, the intra-op threads and the dtype. On CUDA the device's name is
the fingerprint (``kind: gpu``). Recorded in every ``run.json`` that
``calibrate`` writes and in every profile ``calibrate fit`` / ``calibrate host``
fits.
"""
from __future__ import annotations

import re


def blas_backend() -> str:
    """torch's BLAS: ``mkl`` when torch was built with MKL, else the ``BLAS_INFO`` of its build config."""
    import torch
    try:
        if torch.backends.mkl.is_available():
            return "mkl"
    except AttributeError:  # pragma: no cover
        pass
    try:
        m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
        if m:
            return m.group(1)
    except Exception:  # pragma: no cover - a build without config text
        pass
    return "unknown"


def fingerprint(device: str = "cpu", threads: int | None = None, dtype: str | None = None) -> dict:
    """This host's fingerprint for a measurement on ``device`` with ``threads`` torch threads in ``dtype``."""
    import torch

    from sim.cost.fingerprint import current_cpu_fingerprint

    dt = str(dtype).replace("torch.", "") if dtype else None
    if str(device).startswith("cuda"):
        fp = {"kind": "gpu", "device_name": str(torch.cuda.get_device_name(torch.device(device))),
              "torch": str(torch.__version__)}
    else:
        fp = current_cpu_fingerprint()
        fp["threads"] = int(threads if threads is not None else torch.get_num_threads())
        fp["torch"] = str(torch.__version__)
        fp["blas"] = blas_backend()
    if dt:
        fp["dtype"] = dt
    return fp
