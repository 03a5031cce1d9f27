"""The hardware profile: the cost model's second input (an accelerator's peaks, fitted efficiencies, host and
front-end costs, and the range its fit holds over). Loaded from presets by :func:`sim.cost.profiles.load_hardware`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.base.errors import OutOfCalibrationError, PresetError
from sim.cost.fields import check_choice, check_field
from sim.cost.model_shape import CANON_DTYPE, DTYPE_BYTES, UNPRICED_DTYPES, ModelShape
from sim.cost.roofline import ROOFLINES, seconds
from sim.cost.overheads import FrontendCost, HostStepCost, frontend_from_preset, host_step_from_preset


DECODE_ATTENTION = ("paged", "padded")
# HardwareProfile.fp8_weights: FP8 GEMMs on FP8 tensor cores (Hopper, Ada) or FP8 weights dequantised into
# 16-bit GEMMs (vLLM's FP8 Marlin on Ampere); None: --quantization fp8 refused
FP8_WEIGHTS = (None, "w8a8", "w8a16")
# HardwareProfile.mxfp4_moe: the kernel vLLM 0.33.0 runs MXFP4 MoE experts with on the GPU (select_mxfp4_moe_backend,
# vllm/model_executor/layers/fused_moe/oracle/mxfp4.py: "triton" = OpenAI's triton_kernels matmul_ogs, SM 9.0 and
# up, SM 12.0 excluded in the source rtx-pro-6000.yaml cites; "marlin" = the Marlin MoE kernel, SM >= 7.5); both
# are weight-only (BF16 activations, the 4-bit weights
# dequantised in the GEMM), so they are priced alike: expert bytes at MXFP4_BYTES, flops at the 16-bit rate.
# None: --quantization mxfp4 refused
MXFP4_MOE = (None, "triton", "marlin")   # HardwareProfile.decode_attention (sim.cost.terms, "Padded decode attention")
# what a refusal adds where the format is the model's release, priced by default (sim.cost.profiles.load_model)
_RELEASED = "; {} is released in it and served so by default: --quantization none prices its 16-bit weights"
UNCALIBRATED_NOTE = "uncalibrated: datasheet numbers with assumed efficiencies"
# What a profile's coefficients stand on: datasheet peaks with assumed efficiencies; fitted on public
# per-operator profiles of the device (not end to end); fitted end to end on measured runs on this device
# (``calibrated``); fitted on a trace capture's phases (``provisional``).
CALIBRATION_STATUSES = ("datasheet", "public-profiles", "end-to-end", "provisional")


@dataclass(frozen=True)
class HardwareProfile:
    """An accelerator for the roofline cost model.

    The time of an operation with terms (see :class:`sim.cost.terms.OpTerms`) is::

        t = roof + kernels * per_kernel_s + graph_kernels * per_kernel_graph_s + layers * per_layer_s
              + samples * sample_s_per_vocab + iters * host_per_iter_s

    with ``rc = peak_flops * eff_c``, ``rm = mem_bw * eff_m`` and ``roof`` either the
    whole-iteration roofline (``roofline: iteration``, the default)::

        roof = max(flops / rc, bytes / rm)

    which assumes compute-bound matrix products and memory-bound attention of one
    iteration overlap perfectly, or the per-operator roofline (``roofline: operator``,
    GenZ's)::

        roof = sum_op max(flops_op / rc, bytes_op / rm) + b_elem / (mem_bw * eff_elem)

    over the operator groups (linear layers, attention, LM head / probes, the rest),
    plus the element-wise traffic (norms, RoPE, activation, residual adds) that the
    whole-iteration form treats as fused away. ``samples`` counts vocabulary entries
    sorted by top-p sampling (rows sampled x V), ``iters`` forward calls (host time per
    iteration); ``per_kernel_graph_s`` (None: ``per_kernel_s``) prices kernels replayed
    from a CUDA graph.

    Matrix-vector regime: the weight bytes of a forward with a single token row
    (``b_lin_mv``, ``b_head_mv``: BLAS's GEMV path) are read at ``mem_bw * eff_mv``
    instead of ``rm`` (None: ``eff_m``, off). In the per-operator roofline the linear
    and LM-head operators become ``max(f / rc, (b - b_mv) / rm + b_mv / rmv)``; in the
    whole-iteration one ``roof = max(flops / rc, (bytes - b_mv) / rm + b_mv / rmv)``.

    Small-M path (``gemm_row_block`` = ``mr``, ``gemm_small_m_max`` = ``m_small``; None: off):
    an iteration of ``2 <= rows <= m_small`` token rows (``rows``, :mod:`sim.cost.terms`) streams
    the linear and LM-head weights ``ceil(rows / mr)`` times at ``mem_bw * eff_mv``, the
    matrix-vector rate (one row is the case ``mr >= 1``): ``(b_lin - b_sm) / rm +
    ceil(rows / mr) b_sm / rmv`` with ``b_sm = b_lin`` in that range. Above ``m_small`` the GEMM
    packs the weights and the roofline of the matrix-matrix regime applies.

    Attention at its own efficiencies: the attention operator's flops (``f_att``) run at
    ``ra = peak_flops * eff_att`` and its KV traffic (``b_att``) at ``rkv = mem_bw * eff_kv``
    (None: ``eff_c`` / ``eff_m``, the same formula as without them). A fused attention
    kernel is neither a GEMM nor a weight stream: on a CPU, eager SDPA with grouped-query
    heads expands and copies the KV every step; on an A100, Vidur's profile reads decode
    KV at about 1.1 TB/s where the weight stream reaches 1.6. In the per-operator roofline
    the attention term becomes ``max(f_att / ra, b_att / rkv)``; in the whole-iteration
    one ``roof = max((flops - f_att) / rc + f_att / ra, (bytes - b_mv - b_att) / rm
    + b_mv / rmv + b_att / rkv)``.

    Shared KV reads (``eff_kv_shared``; None: off): the part ``b_kv_shared`` of ``b_att``
    re-read from blocks another item of the iteration reads too (:mod:`sim.cost.terms`) runs at
    ``rks = mem_bw * eff_kv_shared``: ``b_att / rkv`` above becomes ``(b_att - b_kv_shared) / rkv
    + b_kv_shared / rks``.

    Padded decode attention (``decode_attention: padded``; ``paged``, the default, is vLLM's
    kernel): one-token rows attend in one call padded to their longest context, so the
    attention term adds ``f_att_pad`` to ``f_att`` and ``b_att_pad / rkv`` to its KV time
    (:mod:`sim.cost.terms`). The CPU loop that ``calibrate`` measures runs that kernel.

    Wave quantisation (``sm_count``, the datasheet's SM count; None: off; per-operator
    roofline only): each matrix product's compute is whole waves of ``sm_count`` CTA tiles,
    ``F_q = ceil(tiles / sm) sm tm tn 2 K`` (:func:`sim.cost.gemm.gemm_wave_flops`, fixed
    cuBLAS-like tiles), and the linear layers and LM head become one roofline per product
    (:func:`sim.cost.gemm.wave_linear_head`), which needs the model's shape: :meth:`time` takes
    ``model``.

    ``fitted_range`` (None for analytical datasheet profiles) bounds the
    queries a *fitted* profile may answer: ``max_context_tokens``,
    ``max_new_tokens`` (tokens of one forward item), ``max_batch``, ``models``
    (names of the models it was fitted on), ``device`` and ``dtypes`` (what the
    measurements ran on). Anything outside is refused.

    ``calibrated`` is True only for a profile fitted end to end on measured runs;
    ``calibration_status`` (one of :data:`CALIBRATION_STATUSES`; empty: derived from
    ``calibrated`` / ``provisional``, else ``datasheet``) tells ``datasheet``,
    ``public-profiles`` and ``end-to-end`` apart; :attr:`calibration_note` says in words
    what the numbers are.
    """

    name: str
    peak_flops: float
    mem_bw: float
    mem_capacity: float
    eff_c: float = 1.0
    eff_m: float = 1.0
    per_kernel_s: float = 0.0
    per_layer_s: float = 0.0
    calibrated: bool = False
    provisional: bool = False
    fitted_range: dict | None = None
    source: str = ""
    sample_s_per_vocab: float = 0.0
    host_per_iter_s: float = 0.0
    per_kernel_graph_s: float | None = None
    roofline: str = "iteration"
    eff_elem: float | None = None   # element-wise kernels' fraction of bandwidth (None: eff_m); operator roofline only
    eff_mv: float | None = None     # matrix-vector products' (one token row) fraction of bandwidth (None: eff_m)
    eff_att: float | None = None    # attention's (QK^T, AV) fraction of peak flops (None: eff_c)
    eff_kv: float | None = None     # attention's KV traffic's fraction of bandwidth (None: eff_m)
    eff_kv_shared: float | None = None  # KV re-read from blocks another item of the iteration read (None: eff_kv)
    decode_attention: str = "paged"     # DECODE_ATTENTION: paged (vLLM) or padded to the longest context (CPU loop)
    calibration_status: str = ""    # CALIBRATION_STATUSES; "" = derived from calibrated / provisional
    gemm_row_block: int | None = None      # rows per weight pass of the small-M path (None: only 1 row is)
    gemm_small_m_max: int | None = None    # most token rows the small-M path takes (None: every count)
    sm_count: int | None = None     # streaming multiprocessors (datasheet): matrix products wave-quantised (None: off)
    cuda_graphs: bool = False       # the engine replays CUDA graphs (vLLM V1 on a CUDA GPU): sim.cost.graphs
    eager_launch_s: float = 0.0     # host seconds to launch one kernel eagerly: bounds an eager iteration from below
    fp8_weights: str | None = None  # FP8_WEIGHTS: how --quantization fp8 runs here (None: refused)
    peak_flops_fp8: float | None = None   # FP8 tensor-core peak, dense (datasheet); needed by fp8_weights: w8a8
    eff_c_fp8: float | None = None  # FP8 matrix products' fraction of peak_flops_fp8 (None: eff_c's fraction)
    eff_c_fp8_low: float | None = None   # another public kernel's eff_c_fp8 (lower): an FP8 run's band (sim.cost.bands)
    # host time per engine step and the API server's time (sim.cost.overheads; None: not priced). A GPU preset's
    # kernels are fitted on device-side timings, so these are not inside eff_* / per_kernel_s; a profile fitted
    # end to end (local-cpu) holds its host time in host_per_iter_s instead and carries neither.
    host_step: HostStepCost | None = None
    frontend: FrontendCost | None = None
    mxfp4_moe: str | None = None    # MXFP4_MOE: vLLM's MXFP4 MoE kernel here (None: --quantization mxfp4 refused)
    # the routed experts' grouped GEMMs (vLLM's fused-MoE kernels) at their own compute fraction, per weight format
    # (sim.cost.gemm.expert_rate; fitted by calibrate/moe_kernels.py on per-operator kernel timings); None: the
    # dense products' rate (eff_c, or eff_c_fp8 for FP8 weights on FP8 tensor cores)
    eff_c_moe: float | None = None        # 16-bit experts (Triton fused_moe), fraction of peak_flops
    eff_c_moe_fp8: float | None = None    # FP8 w8a8 experts (Triton fused_moe), fraction of peak_flops_fp8
    eff_c_moe_mxfp4: float | None = None  # MXFP4 experts (mxfp4_moe's kernel, weight-only), fraction of peak_flops
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        where = f"hardware preset {self.source or self.name}"
        if isinstance(self.host_step, dict):   # to_dict()'s form back (HardwareProfile(**d))
            object.__setattr__(self, "host_step", host_step_from_preset({"host_step": self.host_step}, where))
        if isinstance(self.frontend, dict):
            object.__setattr__(self, "frontend", frontend_from_preset({"frontend": self.frontend}, where))
        for f, cls in (("host_step", HostStepCost), ("frontend", FrontendCost)):
            v = getattr(self, f)
            if v is not None and not isinstance(v, cls):
                raise PresetError(f"{where}: field {f!r} must be a mapping of {cls.__name__}'s fields or null, got {v!r}")
        # host_step's model-runner part holds the sampler's host side and its kernels (Vidur's sampler_e2e) and
        # the engine core's per-step work: a fitted per-forward host time or sampling term beside it counts twice
        if self.host_step is not None and (self.host_per_iter_s or self.sample_s_per_vocab):
            raise PresetError(f"{where}: fields 'host_per_iter_s' / 'sample_s_per_vocab' must be 0 when 'host_step' "
                              "is given (both would price the step's host time and sampling)")
        label = f"hardware preset {self.source or self.name}: field"
        for rule, names in (("positive", ("peak_flops", "mem_bw", "mem_capacity", "eff_c", "eff_m")),
                            ("positive or null", ("eff_elem", "eff_mv", "eff_att", "eff_kv", "eff_kv_shared",
                                                  "peak_flops_fp8", "eff_c_fp8", "eff_c_fp8_low", "eff_c_moe",
                                                  "eff_c_moe_fp8",
                                                  "eff_c_moe_mxfp4")),
                            ("count or null", ("gemm_row_block", "gemm_small_m_max", "sm_count")),
                            ("nonneg", ("per_kernel_s", "per_layer_s", "sample_s_per_vocab", "host_per_iter_s",
                                        "eager_launch_s")),
                            ("bool", ("cuda_graphs",))):
            for f in names:
                check_field(f"{label} {f!r}", getattr(self, f), rule)
        if self.per_kernel_graph_s is not None:
            check_field(f"{label} 'per_kernel_graph_s'", self.per_kernel_graph_s, "nonneg")
        for f, choices in (("fp8_weights", FP8_WEIGHTS), ("mxfp4_moe", MXFP4_MOE)):
            check_choice(f"{label} {f!r}", getattr(self, f), choices)
        if self.fp8_weights == "w8a8" and self.peak_flops_fp8 is None:
            raise PresetError(f"hardware preset {self.source or self.name}: field 'peak_flops_fp8' is needed by "
                              "fp8_weights: w8a8 (FP8 tensor cores)")
        for f, choices in (("decode_attention", DECODE_ATTENTION), ("roofline", ROOFLINES)):
            check_choice(f"{label} {f!r}", getattr(self, f), choices)
        st = self.calibration_status or ("end-to-end" if self.calibrated else
                                         "provisional" if self.provisional else "datasheet")
        if st not in CALIBRATION_STATUSES or (st == "end-to-end") != bool(self.calibrated):
            raise PresetError(f"hardware preset {self.source or self.name}: field 'calibration_status' must be one of "
                              f"{', '.join(CALIBRATION_STATUSES)} and 'end-to-end' exactly when calibrated is true; "
                              f"got {self.calibration_status!r} with calibrated {self.calibrated!r}")
        object.__setattr__(self, "calibration_status", st)

    @property
    def calibration_note(self) -> str:
        """In words: fitted end to end, fitted on published operator profiles, provisional, or uncalibrated."""
        note = self.extra.get("calibration_note")
        if note:
            return str(note)
        if self.calibrated:
            fo = self.extra.get("fitted_on") or {}
            what = " ".join(str(x) for x in (fo.get("model"), fo.get("dtype")) if x)
            dev = self.extra.get("device") or (self.fitted_range or {}).get("device") or "?"
            return f"fitted end to end on {dev}" + (f" ({what})" if what else "")
        if self.provisional:
            return "provisional: fitted on the phases a trace capture measured, not by `rksim calibrate fit`"
        if self.calibration_status == "public-profiles":
            return "fitted on public per-operator profiles; not end to end"
        return UNCALIBRATED_NOTE

    @property
    def priced_dtypes(self) -> tuple[str, ...]:
        """Dtypes the coefficients stand for: ``fitted_range.dtypes``, else the 16-bit types of a datasheet peak."""
        fr = self.fitted_range or {}
        dts = fr.get("dtypes") or ([fr["dtype"]] if fr.get("dtype") else ["float16", "bfloat16"])
        return tuple(CANON_DTYPE.get(str(x), str(x)) for x in dts)

    def check_dtype(self, dtype: str) -> None:
        """Refuse, by name, a dtype this profile cannot price (FP8, INT8, 4-bit: :data:`UNPRICED_DTYPES`).

        Such a model is never priced as if it were bf16: the peak and efficiencies are the
        16-bit tensor cores' (or the fitted dtypes'), not the 8-/4-bit rates.
        """
        name = CANON_DTYPE.get(str(dtype), str(dtype))
        if name in UNPRICED_DTYPES and name not in self.priced_dtypes:
            raise OutOfCalibrationError(
                f"hardware {self.name}: dtype {name} cannot be priced: the profile's peak_flops and efficiencies are "
                f"for {'/'.join(self.priced_dtypes)}, and {name}'s tensor-core rate and scale traffic are not modelled; "
                f"refusing rather than pricing it as {self.priced_dtypes[-1]}")

    def time(self, terms, roofline: str | None = None, model: ModelShape | None = None) -> np.ndarray | float:
        """Seconds for ``terms`` (an :class:`sim.cost.terms.OpTerms`, scalar or array fields).

        ``roofline`` overrides the profile's (``"iteration"`` or ``"operator"``); ``model``, the
        shape the terms are of, is needed where ``sm_count`` quantises matrix products.
        """
        return seconds(self, terms, roofline=roofline, model=model)

    def check_precision(self, model: ModelShape) -> None:
        """Refuse, naming the flag, a ``--quantization`` / ``--kv-cache-dtype`` this profile cannot price.

        ``--quantization fp8`` needs ``fp8_weights`` (``w8a8``: FP8 tensor cores at
        ``peak_flops_fp8``; ``w8a16``: FP8 weights dequantised into 16-bit GEMMs, vLLM's FP8 Marlin
        kernel on GPUs without FP8 tensor cores). A profile fitted end to end on measured runs timed
        its attention at the dtypes it ran (``fitted_range.dtypes``), so an fp8 KV cache is refused
        there unless fp8 was among them; datasheet and public-profile GPU profiles price KV reads as
        bytes over bandwidth, whatever the element size.
        """
        if model.quantization == "mxfp4" and self.mxfp4_moe is None:
            raise OutOfCalibrationError(
                f"hardware {self.name}: --quantization mxfp4 cannot be priced: the profile names no MXFP4 MoE kernel "
                "(mxfp4_moe: vLLM runs MXFP4 experts with its Triton kernels on SM 9.0+ and Marlin on SM 7.5+ GPUs)"
                + (_RELEASED.format(model.name) if model.weights_format == "mxfp4" else ""))
        if model.quantization == "fp8" and self.fp8_weights is None:
            raise OutOfCalibrationError(
                f"hardware {self.name}: --quantization fp8 cannot be priced: the profile has no fp8_weights "
                "(FP8 tensor-core peak or FP8 weight-only kernel)"
                + (_RELEASED.format(model.name) if model.weights_format == "fp8" else ""))
        fr = self.fitted_range or {}
        dts = [CANON_DTYPE.get(str(x), str(x)) for x in (fr.get("dtypes") or [])]
        end_to_end = self.calibration_status in ("end-to-end", "provisional")
        if model.kv_cache_dtype and end_to_end and not any(x.startswith("float8") for x in dts):
            raise OutOfCalibrationError(
                f"hardware {self.name}: --kv-cache-dtype {model.kv_cache_dtype} cannot be priced: the profile was "
                f"fitted on {'/'.join(dts)} KV only")

    def check_query(self, model: ModelShape, max_context: int, max_new: int = 0, max_batch: int = 0,
                    device: str | None = None, tokens: int = 0, mixed: bool = False,
                    allow_extrapolation: bool = False) -> list[str]:
        """Refuse a query outside the fitted range (raises :class:`OutOfCalibrationError`).

        Sizes are checked per dimension by :func:`sim.cost.ranges.check` (sequences ``max_batch`` and
        ``tokens`` of one iteration, ``max_context``, ``max_new`` tokens of one item, ``mixed``
        prefill + decode iterations); with ``allow_extrapolation`` a size outside is let through
        and the returned notes (one per dimension) mark the result. Model, dtype and device are
        always refused.

        The range covers the device and dtype the fit measured as well as sizes: a
        ``model`` in another dtype (``model.dtype_name``), or a ``device`` (when the
        caller knows where it runs, e.g. ``calibrate report``) other than the fit's,
        is refused with a message naming both; a dtype no profile prices (FP8, INT8, 4-bit) is
        refused by name (:meth:`check_dtype`).
        """
        self.check_dtype(model.dtype_name)
        self.check_precision(model)
        if model.weight_bytes > self.mem_capacity:
            raise OutOfCalibrationError(
                f"hardware {self.name}: model {model.name} needs {model.weight_bytes / 1e9:.1f} GB of weights, "
                f"more than the {self.mem_capacity / 1e9:.1f} GB of memory")
        fr = self.fitted_range
        if not fr:
            return []
        fdev = fr.get("device")
        if device is not None and fdev and not _same_device(str(device), str(fdev)):
            raise OutOfCalibrationError(
                f"hardware {self.name}: fitted on device {fdev}; refusing a query on device {device} "
                f"(fit this device with `rksim calibrate fit`)")
        dts = fr.get("dtypes") or ([fr["dtype"]] if fr.get("dtype") else [])
        if dts:
            dts = [CANON_DTYPE.get(str(x), str(x)) for x in dts]
            mine = model.dtype_name
            ok = (mine in dts) if model.dtype else any(DTYPE_BYTES.get(x) == model.dtype_bytes for x in dts)
            if not ok:
                raise OutOfCalibrationError(
                    f"hardware {self.name}: fitted on dtype {'/'.join(dts)} on device {fdev or '?'}; refusing to "
                    f"extrapolate to model {model.name} in dtype {mine or '?'} ({model.dtype_bytes}-byte elements)")
        models = fr.get("models")
        if models and model.name not in models:
            raise OutOfCalibrationError(
                f"hardware {self.name}: calibrated on model(s) {', '.join(models)} only; refusing to extrapolate to "
                f"{model.name} (fit this hardware for that model with `rksim calibrate fit`)")
        from sim.cost.ranges import RangeQuery, check
        return check(self.name, fr, RangeQuery(seqs=max_batch, tokens=tokens, context=max_context,
                                               item_tokens=max_new, mixed=mixed), allow_extrapolation)

    @property
    def fingerprint(self) -> dict | None:
        """The host (CPU) or device (GPU) the profile was fitted on (:mod:`sim.cost.fingerprint`); None if not recorded."""
        fp = self.extra.get("fingerprint")
        return dict(fp) if isinstance(fp, dict) else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("extra", None)
        d["calibration_note"] = self.calibration_note
        return d


def _same_device(a: str, b: str) -> bool:
    """``cuda:0`` and ``cuda`` are one device kind; names compare case-insensitively."""
    norm = lambda x: x.strip().lower().split(":")[0]  # noqa: E731
    return norm(a) == norm(b)
