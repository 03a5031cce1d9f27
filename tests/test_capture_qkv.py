"""Q/K/V are recorded from inside attention (traces.capture_qkv), on Llama-, Qwen3- and Gemma3-shaped models.

Tiny random-weight models built from transformers configs (seeded, no weights to load).
The reference is an independent spy that wraps the registered attention function itself
(``ALL_ATTENTION_FUNCTIONS``): whatever the model hands to attention, the recorder must
have recorded — post ``q_norm``/``k_norm`` (Qwen3, Gemma 3), post-RoPE, new cache rows.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          Qwen3Config, Qwen3ForCausalLM)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

from traces import capture_ops as ops  # noqa: E402
from traces.capture_qkv import ATTN_IMPL, AttentionTap  # noqa: E402
from traces.models import LoadedModel  # noqa: E402

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
P, T_DEC = 13, 6


def _llama():
    return LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True))


def _qwen3():
    return Qwen3ForCausalLM(Qwen3Config(**SHAPE, tie_word_embeddings=True))


def _gemma3():
    # one sliding layer (window shorter than the sequence) and full ones; query_pre_attn_scalar != head_dim
    cfg = Gemma3TextConfig(**SHAPE, sliding_window=8, query_pre_attn_scalar=32,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    return Gemma3ForCausalLM(cfg)


BUILDERS = {"llama": _llama, "qwen3": _qwen3, "gemma3": _gemma3}


def _lm(name: str) -> LoadedModel:
    torch.manual_seed(0)
    model = BUILDERS[name]()
    model.config._attn_implementation = "sdpa"
    model.eval().requires_grad_(False)
    c = model.config
    return LoadedModel(model=model, tokenizer=None, name=name, source="random", device=torch.device("cpu"),
                       dtype=torch.float32, n_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                       n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                       intermediate_size=c.intermediate_size, vocab_size=c.vocab_size)


@pytest.fixture(scope="module", params=list(BUILDERS))
def lm(request):
    return _lm(request.param)


class Spy:
    """Wraps registered attention functions: records every call's (layer, query, key, value).

    It wraps both ``sdpa`` and ``rksim_sdpa``, so it sees the attention call whichever the
    model dispatches to (independent of how the recorder hooks in).
    """

    def __init__(self, inner, calls: list):
        self.inner, self.calls = inner, calls

    def __call__(self, module, query, key, value, attention_mask, **kw):
        n = query.shape[2]
        self.calls.append((module.layer_idx, query[0].transpose(0, 1).clone(),
                           key[0, :, -n:].transpose(0, 1).clone(), value[0, :, -n:].transpose(0, 1).clone()))
        return self.inner(module, query, key, value, attention_mask, **kw)

    def per_layer(self, layer0: int):
        rows = [c[1:] for c in self.calls if c[0] == layer0]
        return [torch.cat([r[i] for r in rows]).numpy() for i in range(3)]  # Q, K, V (T, H, D)


def _prompt():
    return torch.randint(0, 300, (1, P), generator=torch.Generator().manual_seed(1))


def _prefill_and_decode(lm):
    """Prefill P tokens, then T_DEC greedy decode steps through capture_ops (as capture_long does)."""
    ids = _prompt()
    logits, cache, _ = ops.prefill(lm, ids)
    mask = torch.ones((1, P), dtype=torch.long)
    res = ops.sample_decode(lm, logits, cache, mask, torch.tensor([P]), T_DEC, [None], temperature=0.0)
    return res


@pytest.fixture(scope="module")
def recorded(lm):
    layers = [1, lm.n_layers]
    mapping = ALL_ATTENTION_FUNCTIONS._global_mapping
    saved = {k: mapping[k] for k in ("sdpa", ATTN_IMPL)}
    calls: list = []
    for k, f in saved.items():
        mapping[k] = Spy(f, calls)
    try:
        with ops.QKVRecorder(lm, layers) as rec:
            res = _prefill_and_decode(lm)
    finally:
        mapping.update(saved)
    return layers, rec.arrays(), Spy(None, calls), res


def test_recorded_qkv_equal_the_attention_calls_inputs(lm, recorded):
    layers, (K, V, Q), spy, res = recorded
    T = P + res.steps - 1  # the last sampled token is never fed
    assert K.shape == (2, T, lm.n_kv_heads, lm.head_dim) and Q.shape == (2, T, lm.n_heads, lm.head_dim)
    for i, l in enumerate(layers):
        q, k, v = spy.per_layer(l - 1)
        # bit for bit: the recorder holds exactly what attention received
        assert np.array_equal(Q[i], q) and np.array_equal(K[i], k) and np.array_equal(V[i], v)


def test_keys_equal_what_the_layer_caches(lm, recorded):
    """The recorded K/V of the prompt are the cache a plain sdpa forward writes (no tap)."""
    layers, (K, V, _), _, _ = recorded
    assert lm.model.config._attn_implementation == "sdpa"  # the recorder restored it
    with torch.inference_mode():
        _, cache, _ = ops.prefill(lm, _prompt())
    for i, l in enumerate(layers):
        k = cache.layers[l - 1].keys[0].transpose(0, 1).numpy()
        v = cache.layers[l - 1].values[0].transpose(0, 1).numpy()
        n = k.shape[0]  # a sliding layer's cache may hold fewer than P rows: its last n
        np.testing.assert_allclose(K[i][P - n:P], k, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(V[i][P - n:P], v, rtol=1e-6, atol=1e-6)


def test_recomputing_outside_attention_is_wrong_where_the_architecture_norms_q_and_k(lm, recorded):
    """What the old recorder did (q_proj + RoPE, no q_norm): right for Llama only."""
    import importlib

    layers, (_, _, Q), _, _ = recorded
    attn = lm.layers[0].self_attn
    rope = importlib.import_module(type(attn).__module__).apply_rotary_pos_emb
    ids = _prompt()
    seen = {}
    h = lm.layers[0].self_attn.register_forward_pre_hook(
        lambda m, a, kw: seen.update(h=kw.get("hidden_states", a[0] if a else None), pe=kw["position_embeddings"]),
        with_kwargs=True)
    try:
        with torch.inference_mode():
            lm.model(ids)
    finally:
        h.remove()
    x = seen["h"]
    q = attn.q_proj(x).view(1, P, -1, lm.head_dim).transpose(1, 2)
    q, _ = rope(q, q, *seen["pe"])
    recomputed = q[0].transpose(0, 1).numpy()
    same = np.allclose(recomputed, Q[0][:P], atol=1e-6)
    assert same == (lm.name == "llama")


def test_tap_changes_no_output(lm):
    ids = _prompt()
    with torch.inference_mode():
        ref = lm.model(ids).logits
        with ops.QKVRecorder(lm, list(range(1, lm.n_layers + 1))):
            got = lm.model(ids).logits
    assert torch.equal(ref, got)


def test_evicting_cache_records_through_the_same_tap(lm):
    """One way to see Q/K/V: the real runner's cache records what capture records (float16)."""
    from calibrate.evicting_cache import EvictingCache
    from policies import get_policy

    ids = _prompt()
    with torch.inference_mode():
        with ops.QKVRecorder(lm, [1, lm.n_layers]) as rec:
            lm.model(ids)
        c = EvictingCache(lm.n_layers, get_policy("full"), P, lm.n_kv_heads).attach(lm.model)
        with c:
            lm.model(ids, cache=c, use_cache=True)
    K, V, Q = rec.arrays()
    for i, l in enumerate([1, lm.n_layers]):
        k, v, q = c.ev[l - 1].arrays()
        assert np.array_equal(k, K[i].astype(np.float16)) and np.array_equal(v, V[i].astype(np.float16))
        assert np.array_equal(q, Q[i].astype(np.float16))


def test_tap_refuses_eager_and_a_second_tap():
    lm = _lm("llama")
    with AttentionTap(lm.model, lambda *a: None, [0]):
        with pytest.raises(ValueError, match="already carry a Q/K/V tap"):
            AttentionTap(lm.model, lambda *a: None, [0, 1]).attach()
    assert lm.model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="layers"):
        AttentionTap(lm.model, lambda *a: None, [3])
    lm.model.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="needs 'sdpa'"):
        AttentionTap(lm.model, lambda *a: None).attach()
