"""calibrate on a Gemma-3-shaped model: sliding-window and full-attention layers, run layer by layer.

A tiny random Gemma3 (window 8, sequences longer than it, one full layer between
two sliding ones, per-type rotary bases, q/k norms, query_pre_attn_scalar !=
head_dim, final logit soft-capping at 0.5 so that it bends the tiny model's
logits) built in process: ``calibrate.layerwise`` must give bit-for-bit ``model(...).logits`` and HF's hidden states, with and
without a cache; ``calibrate.kv`` must never cut a view out of a sliding layer
that has dropped tokens; and the runner's sharing policies, which cut such
views, must decode what No-KV decodes.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
from transformers import Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402
from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer  # noqa: E402

from calibrate import kv as KV  # noqa: E402
from calibrate import layerwise as LW  # noqa: E402

W = 8          # sliding window: every test sequence is longer
V = 300
TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def tiny_gemma3(seed: int = 0, softcap: float | None = 0.5):
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=len(TYPES),
                           num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                           sliding_window=W, query_pre_attn_scalar=32, layer_types=TYPES,
                           final_logit_softcapping=softcap)
    cfg._attn_implementation = "sdpa"
    m = Gemma3ForCausalLM(cfg).eval()
    # random norm weights: Gemma's RMSNorm scales by (1 + w) and initialises w = 0, which would hide a wrong norm
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    return m


@pytest.fixture(scope="module")
def gemma():
    torch.set_num_threads(1)
    return tiny_gemma3(0)


def _ids(shape, seed):
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


def test_tiny_model_has_what_the_test_needs(gemma):
    c = gemma.config
    assert set(c.layer_types) == {"sliding_attention", "full_attention"} and c.sliding_window == W
    assert c.rope_parameters["sliding_attention"]["rope_theta"] != c.rope_parameters["full_attention"]["rope_theta"]
    assert LW._rope_per_type(gemma)


@pytest.mark.parametrize("softcap", [0.5, None])
def test_forward_all_equals_model_logits_without_cache(softcap):
    m = tiny_gemma3(1, softcap)
    ids = _ids((2, 3 * W), 0)
    with torch.inference_mode():
        assert torch.equal(LW.forward_all(m, ids), m(ids).logits)


def test_forward_all_equals_model_logits_left_padded(gemma):
    """The verification batch's shape: left padding, per-row position ids (traces.capture_ops.left_pad)."""
    from traces.capture_ops import left_pad

    seqs = [_ids((1, 3 * W), 1)[0].tolist(), _ids((1, 2 * W + 3), 2)[0].tolist()]
    ids, mask, pos = left_pad(seqs, 0, torch.device("cpu"))
    with torch.inference_mode():
        ref = gemma(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = LW.forward_all(gemma, ids, position_ids=pos, attention_mask=mask)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("make_cache", [lambda m: DynamicCache(config=m.config), lambda m: KV.full_kv_cache(m)],
                         ids=["model-cache", "full-kv-cache"])
def test_forward_all_equals_model_logits_with_cache(gemma, make_cache):
    """Prefill 2W tokens, then a second forward over a cached prefix longer than the window, then one token."""
    c_ref, c_lw = make_cache(gemma), make_cache(gemma)
    with torch.inference_mode():
        for n, seed in ((2 * W, 3), (5, 4), (1, 5)):
            x = _ids((2, n), seed)
            ref = gemma(x, cache=c_ref, use_cache=True).logits
            got = LW.forward_all(gemma, x, cache=c_lw)
            assert torch.equal(got, ref)
    assert c_lw.get_seq_length() == 2 * W + 6 > W
    for a, b in zip(c_ref.layers, c_lw.layers):
        assert type(a) is type(b) and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_layer_l_equals_hf_hidden_states_and_upper_layers_never_run(gemma):
    ids = _ids((2, 3 * W), 6)
    L = LW.n_layers(gemma)
    with torch.inference_mode():
        ref = gemma(ids, output_hidden_states=True)
        for stop in range(1, L):
            calls = []
            hooks = [lay.register_forward_hook(lambda mod, a, o, i=i: calls.append(i))
                     for i, lay in enumerate(gemma.model.layers)]
            try:
                st = LW.begin(gemma, ids)
                for _ in range(stop):
                    h = LW.step(gemma, st)
            finally:
                for hk in hooks:
                    hk.remove()
            assert calls == list(range(stop))
            assert torch.equal(h, ref.hidden_states[stop])   # [L] is final-normed in HF, so l < L here
        h = LW.step(gemma, st) if st.next_layer < L else h
        assert torch.equal(LW.final_logits(gemma, h), ref.logits)
        # at l = L the lens is the model's own output, soft-capping included (one position: a (B, d)
        # matmul instead of (B, T, d), so equal up to rounding); a lens without the cap is far off
        torch.testing.assert_close(LW.lens_logits(gemma, h[:, -1, :]), ref.logits[:, -1, :], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(gemma.lm_head(gemma.model.norm(h[:, -1, :])), ref.logits[:, -1, :], atol=1e-3)


def test_verify_batch_lens_and_exit_on_gemma(gemma):
    """engine.verify_batch (left-padded, layer by layer): the lens is HF's hidden states through the
    model's head; without exit the score is the model's own output; CGEE rows leave at their layer."""
    from policies import get_policy, yes_score
    from traces import capture_ops as CO

    from calibrate import real_phases as E

    lm = _lm(gemma)
    seqs = [_ids((1, 3 * W), 10)[0].tolist(), _ids((1, 2 * W + 1), 11)[0].tolist()]
    yes, no = [5, 6], [7]
    ids, mask, pos = CO.left_pad(seqs, 0, lm.device)
    with torch.inference_mode():
        ref = gemma(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        full = E.verify_batch(lm, seqs, yes, no, pad_id=0)
        _, ly, ln, _ = CO._lens_stats(ref.logits[:, -1, :], torch.tensor(yes), torch.tensor(no))
        np.testing.assert_allclose(full.scores, yes_score(ly.exp().double().numpy(), ln.exp().double().numpy()),
                                   rtol=1e-6)
        assert (full.exit_layer == 3).all()
        early = E.verify_batch(lm, seqs, yes, no, pad_id=0,
                               exit_policy=get_policy("cgee", theta=1e9, eps=1e9, l_min=2))
        assert (early.exit_layer == 2).all() and np.isnan(early.entropy[:, 2]).all()
        inner = gemma.model
        for l in (1, 2):
            e, _, _, _ = CO._lens_stats(LW._head(gemma, inner.norm(ref.hidden_states[l][:, -1, :])),
                                        torch.tensor(yes), torch.tensor(no))
            np.testing.assert_allclose(early.entropy[:, l - 1], e.double().numpy(), rtol=1e-6)


def _lm(model):
    from traces.models import LoadedModel

    c = model.config
    return LoadedModel(model=model, tokenizer=None, name="tiny-gemma3", source="test", device=torch.device("cpu"),
                       dtype=torch.float32, n_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                       n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                       intermediate_size=c.intermediate_size, vocab_size=c.vocab_size)


def test_kv_refuses_a_view_of_a_sliding_layer_that_dropped_tokens(gemma):
    c = DynamicCache(config=gemma.config)
    with torch.inference_mode():
        gemma(_ids((1, 2 * W), 7), cache=c, use_cache=True)
    assert isinstance(c.layers[0], DynamicSlidingWindowLayer) and c.layers[0].keys.shape[-2] == W - 1
    with pytest.raises(ValueError, match="layer 0 .*full_kv_cache"):
        KV.prefix_view(c, W + 2)


def test_prefix_view_past_the_window_continues_as_a_straight_prefill(gemma):
    """Reuse W + 4 tokens of a full-KV prefill, prefill the rest: the logits of one straight prefill."""
    x = _ids((1, 3 * W), 8)
    r = W + 4
    with torch.inference_mode():
        ref = gemma(x).logits[:, -1]
        base = KV.full_kv_cache(gemma)
        gemma(x[:, :r + 3], cache=base, use_cache=True)   # a source longer than the reused part
        past = KV.prefix_view(base, r)
        assert KV.shares_storage(past.layers[0].keys, base.layers[0].keys) and KV.seq_len(past) == r
        got = gemma(x[:, r:], cache=past, use_cache=True,
                    position_ids=torch.arange(r, x.shape[1]).unsqueeze(0)).logits[:, -1]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_expand_view_keeps_sliding_layers_and_decodes_as_batch_one(gemma):
    x = _ids((1, 2 * W), 9)
    with torch.inference_mode():
        c1 = DynamicCache(config=gemma.config)
        gemma(x, cache=c1, use_cache=True)
        wide = KV.expand_view(c1, 3)
        assert [type(a) for a in wide.layers] == [type(a) for a in c1.layers]
        assert wide.layers[0].keys.stride(0) == 0 and KV.seq_len(wide) == 2 * W
        tok = torch.full((3, 1), 5)
        got = gemma(tok, cache=wide, use_cache=True).logits[:, -1]
        ref = gemma(tok[:1], cache=c1, use_cache=True).logits[:, -1]
    assert c1.get_seq_length() == 2 * W + 1 and wide.get_seq_length() == 2 * W + 1   # the copy did not touch c1
    torch.testing.assert_close(got, ref.expand(3, -1), rtol=1e-5, atol=1e-5)


def test_run_calibration_on_a_tiny_gemma3_folder(tmp_path):
    """`calibrate run` end to end on a saved tiny Gemma3 (window 16, prompts longer): every policy runs;
    the sharing policies, which cut KV views past the window (hint-suffix: the problem is the shared
    prefix), decode the tokens No-KV decodes."""
    from tiny_hf import save_tiny

    from calibrate.runner import RealRunConfig, run_calibration

    folder = save_tiny(tmp_path / "g3", family="gemma3")
    cfg = RealRunConfig(model=str(folder), problems=1, branches=3, max_new_tokens=4, repeats=1, sweep=True, layout="hint-suffix",
                    sweep_prefill=(20,), sweep_decode_batch=(2,), sweep_decode_ctx=(24,), capture=False)
    run_calibration(cfg, tmp_path / "out", progress=False)
    dec = pd.read_parquet(tmp_path / "out" / "decisions.parquet")
    assert set(dec["policy"]) == {"no-kv", "exact-prefix", "asks", "cgee", "rksc"}
    assert min(min(r) for r in dec["prompt_len"]) > 16
    by = {r["policy"]: r for r in dec.to_dict("records")}
    reused = sum(int(np.sum(by[p]["reused"])) for p in ("exact-prefix", "asks"))
    assert reused > 16, "no branch reused a prefix longer than the window: the test would not test the views"
    for p in ("exact-prefix", "asks"):
        shared = np.asarray(by[p]["share_root"], bool)
        for b in np.flatnonzero(~shared):   # a branch decoding on the root's KV generates the root's continuation
            assert list(by[p]["gen_ids"][b]) == list(by["no-kv"]["gen_ids"][b]), (p, b)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["model"]["architecture"] == "Gemma3ForCausalLM"
