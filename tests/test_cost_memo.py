"""The matrix products' memo of :func:`sim.cost.roofline.seconds` (``ScalarCost._waves``): a priced iteration is the
same float with it as without it, whatever the cost priced before."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost.profiles import load_hardware, load_model
from sim.cost.roofline import FLOAT, seconds
from sim.cost.terms import ScalarCost

_item = st.one_of(
    st.tuples(st.just(1.0), st.integers(0, 9000).map(float)),            # a decode
    st.tuples(st.integers(2, 3000).map(float), st.integers(0, 5000).map(float)))   # a prefill chunk


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["llama-3-8b", "qwen3-30b-a3b", "deepseek-v2-lite", "mixtral-8x7b"]),
       batches=st.lists(st.lists(_item, min_size=1, max_size=12), min_size=2, max_size=12),
       seed=st.integers(0, 1000))
def test_the_wave_memo_never_changes_a_price(model, batches, seed):
    """Iterations of repeated batch sizes and contexts (the memo's hits), priced one by one with the cost's memo and
    without any, and a stretch of decode steps priced by the closed form: equal floats."""
    m, h = load_model(model), load_hardware("h100-sxm")   # the shipped profile with sm_count
    c = ScalarCost(m, h)
    assert h.sm_count and h.roofline == "operator"   # the memo's branch: wave-quantised products
    rng = np.random.default_rng(seed)
    half = float(m.n_layers // 2)
    for items in batches + batches[::-1]:
        tup = [(n, ctx, None, 0.0, 1.0, 0.0) for n, ctx in items]
        n0, c0 = items[0]
        variants = (tup,
                    [(1.0, c0, None, 0.0, 1.0, 0.0), (n0, c0 + 1.0, None, 0.0, 1.0, 0.0)] + tup[1:],  # one more row
                    [(n0 + (items[1][0] if len(items) > 1 else 0.0), c0, None, 0.0, 1.0, 0.0)]
                    + tup[2:],                                   # the same rows, one fewer LM-head row
                    [(n, ctx, None, 0.0, 0.0, 0.0) for n, ctx in items],   # none sampled
                    [(n, ctx, half, 0.0, 1.0, 0.0) for n, ctx in items])   # through half the layers
        for v in variants:
            assert c.seconds(v) == seconds(h, c.terms(v), FLOAT, model=m)
        B = len(items) + int(rng.integers(0, 3))
        S = np.arange(6, dtype=np.int64) * B + int(rng.integers(0, 20000))
        got = c.decode_batch_seconds(B, S, S // B + 1)
        ref = [seconds(h, c.decode_batch_terms(B, int(s), int(s // B + 1), FLOAT), FLOAT, model=m) for s in S]
        assert got.tolist() == ref
    # large batches, where the LM head's rows decide its seconds: the same token rows, half the head rows
    big = int(rng.integers(300, 700))
    for tup in ([(1.0, 500.0 + k, None, 0.0, 1.0, 0.0) for k in range(big)],
                [(1.0, 500.0 + k, None, 0.0, 1.0, 0.0) for k in range(big // 2)]
                + [(float(big - big // 2), 64.0, None, 0.0, 1.0, 0.0)]):
        assert c.seconds(tup) == seconds(h, c.terms(tup), FLOAT, model=m)
    assert c._waves   # the memo was used
