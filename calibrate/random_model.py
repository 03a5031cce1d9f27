"""Random-weight models in a preset's shape, built on the device (``--model random:<preset>``).

DESIGN §6: on a GPU, timings do not depend on weight values, so a model with
random weights built from a model preset's shape (``sim/presets/models``)
times like the real one, and no weights have to travel to the machine. Its
decisions are meaningless but they are its own: ``calibrate run`` captures
its parity trace from the same random model, so decision parity and timing
fidelity are both checked against it.

The architecture class follows the preset's ``hf_id`` (Qwen2 for Qwen2.5 —
q/k/v biases —, Qwen3 for Qwen3 — q/k norms —, Llama otherwise); the cost
model's shape is the preset's (biases and q/k norms are not in
``params_per_layer``: < 0.1% of a layer's weights).

The tokenizer only turns the workload's text into ids: SmolLM2's (49,152
tokens, ids valid in every preset's larger vocabulary; decoding ignores ids
beyond it). It is read from ``tokenizer`` (a folder with ``tokenizer.json``),
else ``$RKSIM_TOKENIZER``, else the SmolLM2 preset's cache folder.

``tiny`` is a 16-layer, 64-wide shape for CPU smoke tests (``scripts/gpu_calibrate.sh --smoke``).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from sim.cost.model_shape import ModelShape
from sim.cost.profiles import load_model as load_shape

# A shape small enough for a CPU smoke run; SmolLM2's vocabulary so the tokenizer covers it.
TINY = ModelShape(name="tiny", n_layers=16, hidden_size=64, n_heads=4, n_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=49152, dtype_bytes=4, tied_embeddings=True,
                  source="calibrate.random_model.TINY")


def shape_for(preset: str) -> tuple[ModelShape, str]:
    """(shape, hf_id) of a model preset name / file, or the ``tiny`` smoke shape."""
    if preset == "tiny":
        return TINY, "tiny-llama"
    from sim.base.errors import PresetError
    try:
        m = load_shape(preset)
    except PresetError as exc:
        raise ValueError(f"--model random:{preset}: {exc} (or 'tiny')") from None
    hf_id = ""
    try:
        import yaml
        hf_id = str((yaml.safe_load(Path(m.source).read_text()) or {}).get("hf_id", ""))
    except (OSError, ValueError):
        pass
    return m, hf_id


def hf_config(m: ModelShape, hf_id: str):
    """A transformers config of the family named by ``hf_id`` with the preset's shape."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    low = hf_id.lower()
    common = dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                  num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
                  head_dim=m.head_dim, max_position_embeddings=32768, tie_word_embeddings=m.tied_embeddings,
                  rms_norm_eps=1e-6)
    if "qwen3" in low:
        return Qwen3Config(**common, rope_theta=1_000_000.0)
    if "qwen2" in low:
        return Qwen2Config(**common, rope_theta=1_000_000.0)
    return LlamaConfig(**common, rope_theta=500_000.0)


def tokenizer_folder(tokenizer: str | None = None) -> Path:
    """Where the tokenizer files are (see the module docstring)."""
    spec = tokenizer or os.environ.get("RKSIM_TOKENIZER")
    if spec:
        p = Path(spec).expanduser()
        if not (p / "tokenizer.json").is_file():
            raise ValueError(f"--tokenizer: {p} holds no tokenizer.json")
        return p
    from traces.models import cache_dir, model_folder

    p = cache_dir() / "models" / "smollm2-135m"
    if (p / "tokenizer.json").is_file():
        return p
    folder, _, _ = model_folder("smollm2-135m")   # builds the SmolLM2 cache (tokenizer included)
    return folder


def build_random_model(preset: str, device: str = "auto", dtype=None, tokenizer: str | None = None,
                       seed: int = 0):
    """A :class:`traces.models.LoadedModel` with seeded random weights in ``preset``'s shape.

    The weights are initialised on the device itself (``torch.device`` context): nothing
    proportional to the model size is built on the host.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from traces.models import LoadedModel, resolve_device, torch_dtype

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    m, hf_id = shape_for(preset)
    dev = resolve_device(device)
    dt = torch_dtype(dtype, dev)
    cfg = hf_config(m, hf_id)
    torch.manual_seed(int(seed))
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dt, attn_implementation="sdpa")
    model.eval()
    model.requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(tokenizer_folder(tokenizer))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return LoadedModel(
        model=model, tokenizer=tok, name=m.name, source=f"random:{preset} (random weights, seed {seed}, {hf_id or 'llama'} "
        f"architecture, SmolLM2 tokenizer)", device=dev, dtype=dt, n_layers=m.n_layers, hidden_size=m.hidden_size,
        n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, intermediate_size=m.intermediate_size,
        vocab_size=m.vocab_size, load_seconds=time.perf_counter() - t0,
        extra={"rope_theta": cfg.rope_theta if hasattr(cfg, "rope_theta") else None,
               "tie_word_embeddings": bool(m.tied_embeddings), "random_weights": True})
