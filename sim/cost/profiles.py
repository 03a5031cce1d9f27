"""Presets of the cost model's two inputs: model shapes (:mod:`sim.cost.model_shape`) and hardware profiles
(:mod:`sim.cost.hardware`), found by name or path and loaded.

Presets are YAML (or JSON) files under ``sim/presets/models`` and
``sim/presets/hardware``; every value carries its public source in a comment.
Users add their own by passing a file path instead of a name, or by pointing
``RKSIM_PRESETS`` at a directory holding ``models/*.yaml`` and/or
``hardware/*.yaml`` (user files shadow the shipped ones of the same name).

Profiles a user fits (``rksim calibrate fit``, ``rksim calibrate host``) live
outside the package, in the *user profile directory*
(:func:`user_profile_dir`: ``$RKSIM_PROFILE_DIR``, else
``$XDG_CONFIG_HOME/rksim``, else ``~/.config/rksim``; profiles in its
``hardware/``). A name resolves from ``RKSIM_PRESETS``, then the user profile
directory, then the package: a user's fit shadows a shipped preset of the same
name and never overwrites it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from sim.base.errors import PresetError
from sim.base.yamlio import safe_load
from sim.cost.hardware import HardwareProfile
from sim.cost.model_shape import CANON_DTYPE, DTYPE_BYTES, RELEASE_QUANTIZATIONS, VARIANT_INT_FIELDS, ModelShape
from sim.cost.overheads import frontend_from_preset, host_step_from_preset

PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"   # sim/presets
USER_PRESETS_ENV = "RKSIM_PRESETS"
PROFILE_DIR_ENV = "RKSIM_PROFILE_DIR"


def user_profile_dir() -> Path:
    """Where a user's fitted profiles go: ``$RKSIM_PROFILE_DIR``, ``$XDG_CONFIG_HOME/rksim`` or ``~/.config/rksim``."""
    d = os.environ.get(PROFILE_DIR_ENV)
    if d:
        return Path(d)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "rksim"


def model_from_manifest(manifest: dict) -> ModelShape:
    """The shape of the model that produced a trace (``manifest.json`` ``model``)."""
    m = manifest.get("model") or {}
    try:
        dtype = str(m.get("dtype", "float32")).replace("torch.", "")
        if dtype not in DTYPE_BYTES:
            raise PresetError(f"manifest.json: model.dtype: unknown dtype {dtype!r}")
        name = str(m.get("name", "trace-model"))
        tied = m.get("tied_embeddings")
        if tied is None:
            # The manifest does not record tying: take it from a shipped preset of the same model.
            tied = False
            low = name.lower()
            for pname in list_presets("models"):
                pm = read_preset_file(_preset_path("models", pname))
                if str(pm.get("hf_id", "")).lower() in low or pname in low.replace("-instruct", ""):
                    tied = bool(pm.get("tied_embeddings", False))
                    break
            else:
                if "smollm2" in low:
                    tied = True
        return ModelShape(
            name=name, n_layers=int(m["n_layers"]), hidden_size=int(m["hidden_size"]),
            n_heads=int(m["n_heads"]), n_kv_heads=int(m["n_kv_heads"]), head_dim=int(m["head_dim"]),
            intermediate_size=int(m["intermediate_size"]), vocab_size=int(m["vocab_size"]),
            dtype_bytes=DTYPE_BYTES[dtype], tied_embeddings=bool(tied), source="trace manifest",
            dtype=CANON_DTYPE.get(dtype, dtype),
            # a model with sliding-window layers (Gemma 3): the manifest records them (traces.models.LoadedModel.info)
            sliding_window=int(m.get("sliding_window") or 0), layer_types=tuple(m.get("layer_types") or ()))
    except KeyError as exc:
        raise PresetError(f"manifest.json: model.{exc.args[0]}: missing (needed for the cost model)") from None


_HW_FIELDS = {f.name for f in dataclasses.fields(HardwareProfile)} - {"extra", "source"}
_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelShape)} - {"source"}


# --------------------------------------------------------------------------- loading
def read_preset_file(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PresetError(f"{path}: cannot read preset file ({exc.strerror})") from None
    try:
        if str(path).endswith(".json"):
            data = json.loads(text)
        else:
            data = safe_load(text)
    except Exception as exc:  # yaml/json syntax errors: name the file
        raise PresetError(f"{path}: not valid {'JSON' if str(path).endswith('.json') else 'YAML'}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise PresetError(f"{path}: a preset file must hold a mapping of fields")
    return data


def _dirs(kind: str) -> list[Path]:
    dirs = []
    user = os.environ.get(USER_PRESETS_ENV)
    if user:
        dirs.append(Path(user) / kind)
    dirs.append(user_profile_dir() / kind)
    dirs.append(PRESET_DIR / kind)
    return dirs


def preset_origin(path: Path) -> str:
    """``package`` (shipped), ``user`` (the user profile directory), ``RKSIM_PRESETS`` or ``file``."""
    p = Path(path).resolve()
    for name, root in (("package", PRESET_DIR), ("user", user_profile_dir()),
                       (USER_PRESETS_ENV, Path(os.environ.get(USER_PRESETS_ENV) or "/nonexistent"))):
        try:
            p.relative_to(Path(root).resolve())
            return name
        except ValueError:
            continue
    return "file"


def is_shipped(path: Path) -> bool:
    """``path`` lies in the package's presets (a shipped preset: overwritten only with ``--force``)."""
    return preset_origin(path) == "package"


def preset_path(kind: str, name_or_path) -> Path:
    """The file a preset name (or path) resolves to (first match: RKSIM_PRESETS, user directory, package)."""
    return resolve_preset(kind, name_or_path)


def list_presets(kind: str) -> list[str]:
    """Names of the presets of ``kind`` (``"models"`` or ``"hardware"``)."""
    names: set[str] = set()
    for d in _dirs(kind):
        if d.is_dir():
            for p in d.iterdir():
                if p.suffix in (".yaml", ".yml", ".json"):
                    names.add(p.stem)
    return sorted(names)


def _preset_path(kind: str, name: str) -> Path:
    for d in _dirs(kind):
        for ext in (".yaml", ".yml", ".json"):
            p = d / f"{name}{ext}"
            if p.is_file():
                return p
    what = "model" if kind == "models" else "hardware"
    raise PresetError(f"unknown {what} preset {name!r}; valid: {', '.join(list_presets(kind))} "
                      f"(or a path to a .yaml/.json file)")


def resolve_preset(kind: str, name_or_path: str | os.PathLike) -> Path:
    s = str(name_or_path)
    if s.endswith((".yaml", ".yml", ".json")) or os.sep in s:
        p = Path(s)
        if not p.is_file():
            raise PresetError(f"{s}: preset file not found")
        return p
    return _preset_path(kind, s)


def load_model(name_or_path: str | os.PathLike) -> ModelShape:
    """A :class:`ModelShape` from a preset name or a YAML/JSON file path."""
    path = resolve_preset("models", name_or_path)
    data = read_preset_file(path)
    unknown = set(data) - _MODEL_FIELDS - {"hf_id"}
    if unknown:
        raise PresetError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(_MODEL_FIELDS))}")
    missing = _MODEL_FIELDS - set(data) - {"name", "dtype", "quantization", "kv_cache_dtype", "layer_types",
                                           "weights_format", "expert_parallel_size", "expert_rows_factor"} - set(VARIANT_INT_FIELDS)
    if missing:
        raise PresetError(f"{path}: missing field(s) {', '.join(sorted(missing))}")
    data.setdefault("name", path.stem)
    data.pop("hf_id", None)
    # served as released: vLLM reads the checkpoint's quantization_config, so a release in a format the cost model
    # prices (gpt-oss: MXFP4 experts; DeepSeek-V3: FP8) runs in it without --quantization (none: 16-bit weights)
    if not data.get("quantization") and data.get("weights_format") in RELEASE_QUANTIZATIONS:
        data["quantization"] = data["weights_format"]
    return ModelShape(source=str(path), **data)


def load_hardware(name_or_path: str | os.PathLike) -> HardwareProfile:
    """A :class:`HardwareProfile` from a preset name or a YAML/JSON file path."""
    path = resolve_preset("hardware", name_or_path)
    data = read_preset_file(path)
    # host time per step and front-end time: their own mappings, checked field by field (sim.cost.overheads)
    for key, load in (("host_step", host_step_from_preset), ("frontend", frontend_from_preset)):
        if key in data:
            data[key] = load(data, where=str(path))
    extra = {k: data.pop(k) for k in list(data) if k not in _HW_FIELDS}
    allowed_extra = {"fit", "notes", "device", "fitted_on", "residuals", "calibration_note", "reference", "fingerprint",
                     "band_fits"}
    unknown = set(extra) - allowed_extra
    if unknown:
        raise PresetError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}; valid: "
                          f"{', '.join(sorted(_HW_FIELDS | allowed_extra))}")
    for req in ("peak_flops", "mem_bw", "mem_capacity"):
        if req not in data:
            raise PresetError(f"{path}: missing field {req!r}")
    data.setdefault("name", path.stem)
    for k in ("peak_flops", "mem_bw", "mem_capacity", "eff_c", "eff_m", "per_kernel_s", "per_layer_s",
              "sample_s_per_vocab", "host_per_iter_s", "per_kernel_graph_s", "eff_elem", "eff_mv", "eff_att",
              "eff_kv", "eff_kv_shared", "peak_flops_fp8", "eff_c_fp8", "eff_c_fp8_low", "eager_launch_s", "eff_c_moe",
              "eff_c_moe_fp8", "eff_c_moe_mxfp4"):
        if k in data and isinstance(data[k], (int, str)) and not isinstance(data[k], bool):
            try:
                data[k] = float(data[k])
            except ValueError:
                raise PresetError(f"{path}: field {k!r} must be a number, got {data[k]!r}") from None
    return HardwareProfile(source=str(path), extra=extra, **data)


def load_presets() -> dict[str, list[str]]:
    """``{"models": [...], "hardware": [...]}``: every preset name available."""
    return {"models": list_presets("models"), "hardware": list_presets("hardware")}
