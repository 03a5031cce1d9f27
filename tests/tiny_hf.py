"""Tiny random-weight Hugging Face model folders for fast tests (no download, no GGUF).

A word-level tokenizer (``tokenizers``) that starts every sequence with
``<bos>`` and has no chat template, as a base model's does, and a random
causal LM built from a config: the capture's whole code path runs in seconds.
"""
from __future__ import annotations

from pathlib import Path

WORDS = ("Yes No yes no The the answer is a an of to and in for on with what how many much does do "
         "you are helpful assistant expert problem solver think step by teacher student User System "
         "Assistant Question Notes Explain briefly then end followed final number letter correct this "
         "Answer or . , ? ! : $ ( ) + - = * / 0 1 2 3 4 5 6 7 8 9").split()


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + list(WORDS)))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


def save_tiny(folder: Path, family: str = "llama", seed: int = 0, name_or_path: str | None = None) -> Path:
    """A random ``family`` (llama | gemma3) causal LM with :func:`tokenizer` saved to ``folder``."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    tok = tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if family == "llama":
        cfg = LlamaConfig(**common, tie_word_embeddings=True)
    elif family == "gemma3":
        cfg = Gemma3TextConfig(**{**common, "num_key_value_heads": 1}, sliding_window=16,
                               layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    if name_or_path is not None:  # as a hub checkpoint's config.json records it
        p = folder / "config.json"
        c = json.loads(p.read_text())
        c["_name_or_path"] = name_or_path
        p.write_text(json.dumps(c, indent=2))
    return folder


def tiny_llama(seed: int = 0):
    """A seeded random-weight 3-layer Llama (GQA 4 over 2 heads, sdpa): the calibrate tests' model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()
