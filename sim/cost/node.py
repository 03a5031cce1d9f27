"""A node: its GPUs, how many, and the interconnect lines that price collectives (all-reduce, send/recv).

:class:`NodeProfile` and :func:`load_node` (the presets in ``sim/presets/nodes/``); how the collectives enter a
step's cost is :mod:`sim.cost.parallel`'s docstring.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from sim.base.errors import OutOfCalibrationError, PresetError
from sim.cost.profiles import read_preset_file, resolve_preset


# --------------------------------------------------------------------------- nodes
@dataclass(frozen=True)
class NodeProfile:
    """A node: its GPU's hardware preset, how many, and the interconnect that prices collectives.

    ``collectives`` holds either fitted piecewise lines (``all_reduce: {gpus: [segment, ...]}``,
    ``send_recv`` and ``send_recv_inter_node``: ``[segment, ...]``; a segment is ``{max_size, latency_s,
    bw_bytes_per_s}``, ``max_size`` None on the last, open one; :mod:`calibrate.collectives`) or
    ``model: ring`` with ``link_eff`` and ``latency_s`` (datasheet pricing)::

        ring all-reduce over p GPUs:  t(N) = latency_s + N / (link_eff * link_bw * p / (2 (p - 1)))
        send/recv:                    t(N) = latency_s + N / (link_eff * link_bw)

    ``custom_allreduce`` (optional; :func:`calibrate.collectives.custom_block`) prices vLLM's
    ``CustomAllreduce``: ``max_size_bytes`` and ``one_shot_max_bytes`` per GPU count (vLLM's rules; None: one-shot
    at every size), ``lines: {gpus: {one_shot | two_shot: {latency_s, bw_bytes_per_s}}}`` fitted on per-size
    measurements inside CUDA graphs, and ``source``. vLLM runs it on more than two GPUs only when they are all
    NVLink-connected (``custom_all_reduce.py``: "not supported on more than two PCIe-only GPUs"), so a preset
    whose interconnect is not ``nvlink`` may carry lines for two GPUs at most.
    """

    name: str
    gpu: str
    gpus_per_node: int
    interconnect: str
    topology: str
    link_bw_bytes_per_s: float
    inter_node_bw_bytes_per_s: float
    collectives: dict = field(default_factory=dict, compare=False)
    custom_allreduce: dict = field(default_factory=dict, compare=False)
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise PresetError(f"node preset {self.source or self.name}: field 'gpus_per_node' must be a positive "
                              f"integer, got {self.gpus_per_node!r}")
        for f in ("link_bw_bytes_per_s", "inter_node_bw_bytes_per_s"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PresetError(f"node preset {self.source or self.name}: field {f!r} must be a positive number, "
                                  f"got {v!r}")
        c = self.collectives or {}
        if c.get("model") not in (None, "ring"):
            raise PresetError(f"node preset {self.source or self.name}: collectives.model must be 'ring', "
                              f"got {c.get('model')!r}")
        if c.get("model") is None and "all_reduce" not in c:
            raise PresetError(f"node preset {self.source or self.name}: collectives needs fitted 'all_reduce' lines "
                              "(python -m calibrate.collectives --write) or 'model: ring'")
        self._check_custom_allreduce()

    def _check_custom_allreduce(self) -> None:
        ca = self.custom_allreduce or {}
        if not ca:
            return
        where = f"node preset {self.source or self.name}: custom_allreduce"
        if not isinstance(ca, dict):
            raise PresetError(f"{where} must be a mapping, got {ca!r}")
        for key in ("max_size_bytes", "one_shot_max_bytes", "lines", "source"):
            if key not in ca:
                raise PresetError(f"{where} needs {key!r}")
        for g, per in ca["lines"].items():
            if str(g) not in {str(k) for k in ca["max_size_bytes"]} or str(g) not in \
                    {str(k) for k in ca["one_shot_max_bytes"]}:
                raise PresetError(f"{where}.lines.{g}: no max_size_bytes / one_shot_max_bytes for {g} GPUs")
            if int(g) > 2 and self.interconnect != "nvlink":
                raise PresetError(f"{where}.lines.{g}: vLLM disables its custom all-reduce on more than two GPUs "
                                  f"that are not all NVLink-connected (interconnect {self.interconnect!r})")
            if not isinstance(per, dict) or not per or set(per) - {"one_shot", "two_shot"}:
                raise PresetError(f"{where}.lines.{g}: needs one_shot and/or two_shot, got {per!r}")
            for kind, ln in per.items():
                for f in ("latency_s", "bw_bytes_per_s"):
                    v = ln.get(f) if isinstance(ln, dict) else None
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                            or (f == "bw_bytes_per_s" and v <= 0):
                        raise PresetError(f"{where}.lines.{g}.{kind}.{f}: must be a positive number, got {v!r}")

    def custom_allreduce_line(self, nbytes: float, gpus: int) -> tuple[str, float, float] | None:
        """``(kernel, latency_s, bw_bytes_per_s)`` of vLLM's custom all-reduce for this message, or None where vLLM
        would not run it here or no line is measured (then NCCL prices it).

        vLLM (``CustomAllreduce.should_custom_ar``): fewer bytes than ``max_size``; the kernel
        (``csrc/custom_all_reduce.cuh``): one-shot below ``one_shot_max_bytes`` (always at two GPUs), else two-shot.
        """
        ca = self.custom_allreduce or {}
        g = str(int(gpus))
        per = (ca.get("lines") or {}).get(g)
        # (should_custom_ar also wants a multiple of 16 bytes: t d s is one, the hidden sizes being multiples of 8)
        if not per or nbytes <= 0:
            return None
        mx = {str(k): v for k, v in ca["max_size_bytes"].items()}.get(g)
        if mx is None or nbytes >= mx:
            return None
        one = {str(k): v for k, v in ca["one_shot_max_bytes"].items()}.get(g)
        kind = "one_shot" if one is None or nbytes < one else "two_shot"
        ln = per.get(kind)
        if ln is None:
            return None
        return kind, float(ln["latency_s"]), float(ln["bw_bytes_per_s"])

    @property
    def measured(self) -> bool:
        """True when collectives come from a measured profile, False for the datasheet ring model."""
        return (self.collectives or {}).get("model") is None

    def _line(self, kind: str, gpus: int, nbytes: float) -> tuple[float, float]:
        c = self.collectives
        if c.get("model") == "ring":
            eff, lat = float(c.get("link_eff", 1.0)), float(c.get("latency_s", 0.0))
            bw = eff * self.link_bw_bytes_per_s
            return lat, (bw * gpus / (2.0 * (gpus - 1)) if kind == "all_reduce" else bw)
        if kind == "all_reduce":
            lines = c["all_reduce"]
            ln = lines.get(str(gpus)) or lines.get(gpus)
            if ln is None:
                raise OutOfCalibrationError(
                    f"node {self.name}: no measured all-reduce over {gpus} GPUs (measured: "
                    f"{', '.join(sorted(map(str, lines), key=int))}); refusing to extrapolate")
        else:
            ln = c.get(kind)
            if ln is None:
                raise OutOfCalibrationError(f"node {self.name}: no measured {kind} profile")
        if isinstance(ln, dict):
            ln = [ln]
        for seg in ln:
            if seg.get("max_size") is None or nbytes < seg["max_size"]:
                break
        return float(seg["latency_s"]), float(seg["bw_bytes_per_s"])

    def allreduce_seconds(self, nbytes: float, gpus: int, cuda_graph: bool = False, custom: bool = True,
                          launch_s: float = 0.0) -> float:
        """One all-reduce of ``nbytes`` over ``gpus`` GPUs of this node, as vLLM runs it; 0 for one GPU or no bytes.

        Where :meth:`custom_allreduce_line` has a line (``custom``: vLLM's custom all-reduce enabled)::

            t = latency + N / bw                  inside a CUDA graph (the lines' own measurement)
            t = latency + N / bw + launch_s       eager: vLLM first copies the input into its registered buffer
                                                  (CustomAllreduce.all_reduce, registered=False), one more kernel

        else NCCL's ``latency_k + N / bw_k`` of the size's segment (as measured, whatever ``cuda_graph``).
        Beyond the largest measured size (64 MiB) the last segment's line continues: the bandwidth-bound regime,
        where time is linear in size."""
        if gpus <= 1 or nbytes <= 0:
            return 0.0
        if custom:
            ca = self.custom_allreduce_line(nbytes, gpus)
            if ca is not None:
                _, lat, bw = ca
                return lat + nbytes / bw + (0.0 if cuda_graph else float(launch_s))
        lat, bw = self._line("all_reduce", gpus, nbytes)
        return lat + nbytes / bw

    def sendrecv_seconds(self, nbytes: float, inter_node: bool = False) -> float:
        """One point-to-point transfer of ``nbytes`` between two GPUs (of this node, or of two nodes)."""
        if nbytes <= 0:
            return 0.0
        if inter_node and self.collectives.get("model") != "ring":
            lat, bw = self._line("send_recv_inter_node", 2, nbytes)
        elif inter_node:
            lat, bw = float(self.collectives.get("latency_s", 0.0)), self.inter_node_bw_bytes_per_s
        else:
            lat, bw = self._line("send_recv", 2, nbytes)
        return lat + nbytes / bw

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_NODE_FIELDS = {f.name for f in dataclasses.fields(NodeProfile)} - {"source"}
_NODE_OPTIONAL = {"name", "custom_allreduce"}     # a node without vLLM's custom all-reduce lines omits the block


def load_node(name_or_path: str | os.PathLike) -> NodeProfile:
    """A :class:`NodeProfile` from a preset name (``sim/presets/nodes``) or a YAML/JSON file path."""
    try:
        path = resolve_preset("nodes", name_or_path)
    except PresetError as exc:
        raise PresetError(str(exc).replace("unknown hardware preset", "unknown node preset")) from None
    data = read_preset_file(path)
    unknown = set(data) - _NODE_FIELDS
    if unknown:
        raise PresetError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(_NODE_FIELDS))}")
    missing = _NODE_FIELDS - set(data) - _NODE_OPTIONAL
    if missing:
        raise PresetError(f"{path}: missing field(s) {', '.join(sorted(missing))}")
    data.setdefault("name", path.stem)
    for k in ("link_bw_bytes_per_s", "inter_node_bw_bytes_per_s"):
        if isinstance(data[k], (int, str)) and not isinstance(data[k], bool):
            try:
                data[k] = float(data[k])
            except ValueError:
                raise PresetError(f"{path}: field {k!r} must be a number, got {data[k]!r}") from None
    return NodeProfile(source=str(path), **data)


