"""Decode fast-forward (:mod:`sim.serving.fastforward`) against the stepped engine: every figure equal.

The property tests run the same plain workload twice through :func:`sim.bench.plain.run`, once with quiet decode
windows advanced at once and once step by step (``step_by_step=True``), and compare the results bit for bit:
per-request timings and token times, the run's info, the engine's records, counters and timelines, and the
scheduler's and block manager's statistics. Small workloads; KV capacities small enough to preempt.
"""
from __future__ import annotations

import contextlib
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sim.serving import engine as engine_mod
from sim.bench import plain
from sim.serving.capacity import ServingConfig
from sim.cost.terms import TERM_NAMES, ScalarCost
from sim.serving.fastforward import TokenTimes, exact_delays
from sim.cost.graphs import engine_graphs
from sim.cost.profiles import load_hardware, load_model

MODEL = load_model("llama-3-8b")
HW = {h: load_hardware(h) for h in ("h100-sxm", "a100-80gb", "l4")}


@contextlib.contextmanager
def _kept(method: str, keep):
    """``keep(engine, result)`` of every call of ``Engine.<method>`` inside the block, in call order."""
    got = []
    orig = getattr(engine_mod.Engine, method)

    def wrapper(self, *a, **k):
        res = orig(self, *a, **k)
        got.append(keep(self, res))
        return res
    setattr(engine_mod.Engine, method, wrapper)
    try:
        yield got
    finally:
        setattr(engine_mod.Engine, method, orig)


def captured():
    """The engines :func:`sim.bench.plain.run` builds, with their results and every record, taken when the run
    ends (plain.run keeps only the fields it reads and lets the problems go)."""
    return _kept("run", lambda eng, res: (eng, res, res.records()))


def _both(wl, hw, model=MODEL, **kw):
    out = []
    for sbs in (False, True):
        with captured() as got:
            r = plain.run(model, hw, wl, step_by_step=sbs, **kw)
        out.append((r, got[0][0], got[0][1], got[0][2]))
    return out


def _same(a, b, where=""):
    """Equal, floats bit for bit (NaN equal to NaN), recursing through lists, dicts and arrays."""
    if isinstance(a, TokenTimes) or isinstance(b, TokenTimes):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
        return
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
        return
    if isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
        return
    assert a == b and type(a) is type(b) or (isinstance(a, (int, float, np.number)) and a == b), (where, a, b)


def _check(pair):
    (ra, ea, xa, reca), (rb, eb, xb, recb) = pair
    assert len(reca) == len(ea.jobs) and reca and "decode_s" in reca[0]
    _same(reca, recb, "records")
    for f in ("scheduled", "start", "ttft", "e2el"):
        _same(getattr(ra, f), getattr(rb, f), f)
    assert ra.duration == rb.duration
    _same(list(ra.itls), list(rb.itls), "itls")
    _same(ra.info, rb.info, "info")
    for f in ("timeline_t", "timeline_b", "timeline_running", "iterations", "makespan", "busy", "mean_running",
              "tokens", "stats", "gen_tokens"):
        _same(getattr(xa, f), getattr(xb, f), f)
    assert ea.items_scheduled == eb.items_scheduled and ea.run_time == eb.run_time
    ka, kb = ea.kv, eb.kv
    for f in ("n_clean", "evictions", "hits", "queries", "peak_used", "evicted_log", "tick", "_next_id"):
        _same(getattr(ka, f), getattr(kb, f), f"kv.{f}")
    assert sorted(ka.cached) == sorted(kb.cached)
    assert sorted(ka._evictable) == sorted(kb._evictable)
    ka.check()
    # the serve result (every metric vllm bench serve prints) and the throughput result
    sa = plain.serve_result(ra, percentiles=(50.0, 90.0, 99.0), metrics=("ttft", "tpot", "itl", "e2el"))
    sb = plain.serve_result(rb, percentiles=(50.0, 90.0, 99.0), metrics=("ttft", "tpot", "itl", "e2el"))
    _same(sa, sb, "serve_result")
    _same(plain.throughput_result(ra), plain.throughput_result(rb), "throughput_result")
    return ea._ff


def _kv_bytes(blocks: int, bs: int, model=MODEL) -> float:
    return float(blocks * bs * model.kv_bytes_per_token)


# mixtures of experts (DeepSeek's with MLA and dense first layers): their windows price the experts their rows read
MOE = {name: load_model(name) for name in ("qwen3-30b-a3b", "deepseek-v2-lite")}


# FF_EXAMPLES=400 runs ten times the examples (a change to the windows is checked that way before it lands)
@settings(max_examples=int(os.environ.get("FF_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), il=st.integers(20, 200), ol=st.integers(1, 160), rr=st.sampled_from([0.0, 0.5, 0.9]),
       prefix=st.sampled_from([0, 0, 20, 64]), seed=st.integers(0, 50),
       blocks=st.sampled_from([None, 40, 80, 160, 400]), bs=st.sampled_from([16, 16, 4, 1]),
       rate=st.sampled_from([math.inf, math.inf, 2.0, 20.0, 200.0]), conc=st.sampled_from([None, None, 3]),
       policy=st.sampled_from(["vllm-v1", "vllm-v1", "prefill-first", "vllm-v1-chunk-admit"]),
       seqs=st.sampled_from([None, 4, 16]), tokens=st.sampled_from([None, 64, 512]),
       caching=st.booleans(), hw=st.sampled_from(sorted(HW)), eager=st.booleans(),
       moe=st.sampled_from([None, None, "qwen3-30b-a3b", "deepseek-v2-lite"]))
def test_fast_forward_equals_step_by_step(n, il, ol, rr, prefix, seed, blocks, bs, rate, conc, policy, seqs, tokens,
                                          caching, hw, eager, moe):
    wl = plain.random_workload(n, il, ol, rr, prefix, seed)
    model = MOE[moe] if moe and hw != "l4" else MODEL    # (their weights do not fit an L4)
    need = int(((wl.input_lens + wl.output_lens).max() + bs - 1) // bs)
    kvb = None if blocks is None else _kv_bytes(max(blocks, need), bs, model)
    sv = ServingConfig(scheduler=policy, max_num_seqs=seqs, max_num_batched_tokens=tokens, prefix_caching=caching,
                       kv_capacity_bytes=kvb, enforce_eager=eager)
    offline = math.isinf(rate) and conc is None and seed % 2 == 0
    kw = dict(serving=sv, block_size=bs, seed=seed, offline=offline, model=model,
              moe_routing="sampled" if model is not MODEL and seed % 3 == 0 else "expected")
    if not offline:
        kw.update(request_rate=rate, max_concurrency=conc)
    _check(_both(wl, HW[hw], **kw))


def test_windows_cover_preemptions_and_finishes():
    """A run under KV pressure: the windows take most steps, preempt and finish inside, and still agree."""
    wl = plain.random_workload(60, 64, 300, 0.5, 0, 3)
    sv = ServingConfig(kv_capacity_bytes=_kv_bytes(600, 16))
    pair = _both(wl, HW["h100-sxm"], serving=sv, offline=True)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 20
    assert ff.windows > 5 and ff.steps > 0.8 * xa.iterations
    # preemptions happened inside windows: more than the stepped iterations could have made
    assert xa.iterations - ff.steps < xa.stats["preemptions"]


@pytest.mark.parametrize("caching", [True, False])
def test_a_hybrid_caches_windows_cover_preemptions_and_admissions(caching):
    """gpt-oss under KV pressure, offline: its windows preempt inside (the decodes' takes and releases followed member
    by member), start with a preemption where the head is admissible but the decodes preempt, and admit in their
    first step; every figure equal to the stepped run's."""
    m = load_model("gpt-oss-20b")
    wl = plain.random_workload(150, 16, 300, 0.0, 0, 3)   # short prompts: the head often fits where decodes preempt
    sv = ServingConfig(kv_capacity_bytes=_kv_bytes(600, 16, m), prefix_caching=caching)
    pair = _both(wl, HW["h100-sxm"], model=m, serving=sv, offline=True)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 20 and ff.admissions > 20 and ff.preempt_first > 0
    assert xa.iterations - ff.steps < xa.stats["preemptions"] and ff.steps > 0.9 * xa.iterations


def test_windows_start_where_the_decodes_leave_the_admissible_head_short():
    """Under arrivals and KV pressure, with a shared prefix (the head's lookups count): where the waiting head fits
    before the step's decodes take their blocks but not after, vLLM V1 tries it and admits nobody; the window starts
    there as a decode step with the head's lookup counted. Every figure equal to the stepped run's."""
    wl = plain.random_workload(200, 64, 100, 0.5, 32, 5)
    sv = ServingConfig(kv_capacity_bytes=_kv_bytes(300, 16))
    pair = _both(wl, HW["h100-sxm"], serving=sv, request_rate=400.0, seed=5)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 20 and ff.head_short > 0


@pytest.mark.parametrize("rate", [math.inf, 400.0])
@pytest.mark.parametrize("running,tokens", [(6, 1000), (1000, 6)])
def test_host_steps_past_the_measured_sizes_are_counted_in_windows(rate, running, tokens):
    """A host_step measured up to ``running`` requests and ``tokens`` tokens: the windows' steps past either
    (long windows offline, a step or two under arrivals) count as the stepped path counts them, priced the same."""
    import dataclasses
    hw = HW["h100-sxm"]
    hw = dataclasses.replace(hw, host_step=dataclasses.replace(hw.host_step, max_running=running, max_tokens=tokens))
    wl = plain.random_workload(24, 40, 60, 0.5, 0, 4)
    kw = dict(offline=True) if math.isinf(rate) else dict(request_rate=rate, seed=4)
    pair = _both(wl, hw, **kw)
    ff = _check(pair)
    (ra, _, xa, _), _ = pair
    beyond = ra.info["overheads"]["host_step"]["steps_beyond_measured"]
    assert 0 < beyond < xa.iterations and ff.steps > 0.5 * xa.iterations


@pytest.mark.parametrize("policy", ["prefill-first", "vllm-v1-chunk-admit"])
def test_other_schedulers_under_pressure(policy):
    """Prefill-first looks the waiting head up before the decodes allocate (and in a preempting step), chunk
    admission keeps windows free of evictions: both counted and timed as stepped."""
    wl = plain.random_workload(40, 100, 200, 0.5, 32, 2)
    pair = _both(wl, HW["h100-sxm"], offline=True,
                 serving=ServingConfig(scheduler=policy, kv_capacity_bytes=_kv_bytes(300, 16)))
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 5 and ff.steps > 0.5 * xa.iterations


def test_serving_with_arrivals_and_prefix():
    wl = plain.random_workload(40, 300, 200, 0.3, 48, 1)
    pair = _both(wl, HW["a100-80gb"], request_rate=5.0, seed=1,
                 serving=ServingConfig(kv_capacity_bytes=_kv_bytes(500, 16)))
    ff = _check(pair)
    assert ff.windows > 10


@pytest.mark.parametrize("rate,prefix,blocks", [(30.0, 0, None), (60.0, 48, 900), (60.0, 0, 200)])
def test_admissions_inside_windows(rate, prefix, blocks):
    """Under steady arrivals (vLLM V1) a window's first step admits the waiting requests beside the decodes, and
    its last step may be the one the next arrival falls in: nearly every step is a window step, and every figure
    equals the stepped run's (an idle engine's admission, several admitted at once, prefix hits, a request that
    does not fit after the admitted ones, preemptions)."""
    wl = plain.random_workload(120, 200, 120, 0.5, prefix, 4)
    sv = ServingConfig(kv_capacity_bytes=None if blocks is None else _kv_bytes(blocks, 16))
    # sync scheduling: under async scheduling each arrival's held-back step is stepped (sim.serving.intake; the
    # test below), which this count of window steps would mix in
    pair = _both(wl, HW["h100-sxm"], request_rate=rate, seed=4, serving=sv, async_scheduling=False)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert ff.admissions > 30 and ff.steps > 0.8 * xa.iterations


def test_async_intake_takes_a_held_arrivals_step_as_a_one_step_window():
    """Async scheduling (the default) holds each arrival under load back a step (sim.serving.intake): that step is a
    window of one step (``FastForward.cap``), the held request admitted in the next window's first step; every
    figure equals the stepped run's."""
    wl = plain.random_workload(120, 200, 120, 0.5, 0, 4)
    pair = _both(wl, HW["h100-sxm"], request_rate=30.0, seed=4, serving=ServingConfig())
    ff = _check(pair)
    (_, fast_eng, xa, _), _ = pair
    assert fast_eng._intake is not None and not fast_eng._intake.held
    assert ff.admissions > 30 and ff.steps > 0.95 * xa.iterations


@pytest.mark.parametrize("tokens,prefix,blocks,caching", [(512, 0, None, True), (300, 48, None, True),
                                                            (700, 0, 400, True), (512, 64, None, False)])
def test_chunked_prefills_past_the_knee_take_windows(tokens, prefix, blocks, caching):
    """Past the knee (vLLM V1, chunked prefill) nearly every step runs the running tail's next prompt chunk and
    admits up to a last chunk: each such mixed step is a window's first step (the tail's chunk, whole prompts, the
    last a chunk that leaves its request mid-prompt and ends the window), and every figure equals the stepped run's
    (a shared prefix the tail keys in the step, KV pressure, no prefix caching)."""
    wl = plain.random_workload(160, 260, 40, 0.5, prefix, 7)
    sv = ServingConfig(max_num_batched_tokens=tokens, prefix_caching=caching,
                       kv_capacity_bytes=None if blocks is None else _kv_bytes(blocks, 16))
    pair = _both(wl, HW["h100-sxm"], request_rate=400.0, seed=7, serving=sv, async_scheduling=False)  # as above
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert ff.tails > 10 and ff.open_ends > 10 and ff.steps > 0.8 * xa.iterations, (ff.tails, ff.open_ends,
                                                                                     ff.steps, xa.iterations)


def test_a_preempting_step_sets_the_peak_with_the_takes_the_pool_gives():
    """Three requests opening blocks in the same decode step, the pool one short for the first time there: the
    takes the pool gives (in one call) fill it, the newest request's preemption frees more than the next take
    needs, so the step's own takes are where KV in use peaks (every figure as stepped)."""
    wl = plain.random_workload(3, 20, 60, 0.0, 0, 1)
    pair = _both(wl, HW["h100-sxm"], offline=True, block_size=16,
                 serving=ServingConfig(kv_capacity_bytes=_kv_bytes(11, 16)))
    ff = _check(pair)
    (_, eng, res, _), _ = pair
    assert ff.windows > 0 and res.stats["preemptions"] > 0 and eng.kv.peak_used == 11


def test_preempted_requests_resume_inside_windows():
    """Offline under KV pressure: a preempted request is admitted again in a window's first step, its hit cut where
    the decodes' takes evict its own freed blocks (the pool's LRU front, tail first), its tokens recomputed; nearly
    every step is a window step, and every figure equals the stepped run's."""
    wl = plain.random_workload(80, 64, 400, 0.5, 0, 7)
    pair = _both(wl, HW["h100-sxm"], serving=ServingConfig(kv_capacity_bytes=_kv_bytes(900, 16)), offline=True)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 30 and ff.resumed > 0.8 * xa.stats["preemptions"]
    assert ff.steps > 0.97 * xa.iterations


@pytest.mark.parametrize("chain", [True, False])
def test_members_carried_between_windows_are_written_where_they_leave_or_the_chain_ends(chain, monkeypatch):
    """Consecutive windows carry their members as arrays and write their objects only where one leaves or the chain
    ends (``FastForward.flush``: before the engine steps, or the result is read); a chain ended before every window
    (every member read and written afresh, as a window that cannot carry does) gives the same figures."""
    from sim.serving.ff_members import Members
    if not chain:
        monkeypatch.setattr(Members, "valid", lambda self, eng: False)
    wl = plain.random_workload(150, 200, 150, 0.5, 0, 6)
    pair = _both(wl, HW["h100-sxm"], request_rate=40.0, seed=6, serving=ServingConfig(kv_capacity_bytes=_kv_bytes(
        700, 16)), async_scheduling=False)   # sync: a held arrival's stepped step ends a chain (sim.serving.intake)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 0 and ff.steps > 0.8 * xa.iterations
    assert (ff.carried > 0.5 * ff.windows) if chain else ff.carried == 0


def test_an_admission_hitting_blocks_keyed_in_the_same_step_is_stepped():
    """Requests sharing a prefix, all waiting at once: the second hits the blocks the first keys in the same step,
    which a plan made before the step cannot see, so that step is stepped (and every figure agrees)."""
    wl = plain.random_workload(16, 100, 40, 0.0, 64, 5)
    _check(_both(wl, HW["h100-sxm"], offline=True, serving=ServingConfig(max_num_seqs=4, max_num_batched_tokens=4096)))


@pytest.mark.parametrize("budget,il,prefix", [(40, 0, 64), (40, 0, 100), (48, 10, 64)])
def test_an_admission_hitting_blocks_the_tail_keys_in_the_same_step_is_stepped(budget, il, prefix):
    """Identical (or nearly) prompts, all waiting at once, a budget short of one prompt: the running tail's chunk keys
    the blocks the next admission of the same step would then hit, which its plan cannot see (so that step is
    stepped); the other mixed steps take windows, and every figure agrees."""
    wl = plain.random_workload(12, il, 30, 0.0, prefix, 5)
    ff = _check(_both(wl, HW["h100-sxm"], offline=True,
                      serving=ServingConfig(max_num_seqs=8, max_num_batched_tokens=budget)))
    assert ff.open_ends > 0


@pytest.mark.parametrize("model,routing,hw", [("qwen3-30b-a3b", "expected", "h100-sxm"),
                                              ("deepseek-v2-lite", "sampled", "h100-sxm"),
                                              ("deepseek-v2-lite*", "expected", "h100-sxm"),
                                              ("qwen3-30b-a3b", "sampled", "a100-80gb")])
def test_mixture_of_experts_and_mla_targets_take_windows(model, routing, hw):
    """An MoE / MLA target's decode batch has a closed form (the experts it reads depend on its rows alone): its
    windows give the stepped figures, under KV pressure and arrivals."""
    wl = plain.random_workload(60, 200, 120, 0.5, 0, 2)
    m = _shape(model)
    pair = _both(wl, HW[hw], model=m, request_rate=20.0, seed=2, moe_routing=routing,
                 serving=ServingConfig(kv_capacity_bytes=float(300 * 16 * m.kv_bytes_per_token)))
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert xa.stats["preemptions"] > 0 and ff.steps > 0.8 * xa.iterations


@settings(max_examples=30, deadline=None)
@given(B=st.sampled_from([1, 2, 3, 8, 100, 256, 257, 600]), seed=st.integers(0, 10 ** 6), tp=st.sampled_from([1, 2, 4, 8]),
       hw=st.sampled_from(["h100-sxm", "a100-80gb", "h200"]),
       model=st.sampled_from(["llama-3-70b", "llama-3-8b", "qwen3-30b-a3b", "deepseek-v2-lite*", "mixtral-8x7b"]),
       eager=st.booleans(), custom=st.booleans(), ep=st.booleans(), dp=st.sampled_from([1, 1, 2, 4]))
def test_a_parallel_decode_batch_has_the_stepped_price(B, seed, tp, hw, model, eager, custom, ep, dp):
    """One pipeline stage, tensor parallel and / or DP attention + EP (an MoE model, ``dp`` ranks): a uniform decode
    batch's closed form (the rank's, then the collectives of its size, added in :meth:`ParallelCost.stage_seconds`'
    order) equals ``seconds`` of its items bit for bit, for one batch size or one per step; so does an admitting
    step (the decodes in closed form, then a prompt's items)."""
    from sim.cost.parallel import ParallelConfig, ParallelCost
    from sim.replay.target import node_for
    m, h = _shape(model), load_hardware(hw)
    try:
        par = ParallelConfig(tensor_parallel_size=tp, enable_expert_parallel=ep or dp > 1, data_parallel_size=dp,
                             disable_custom_all_reduce=not custom)
        c = ParallelCost(m, h, node_for(hw), par, graphs=engine_graphs(h, 512, eager))   # the GPU's shipped node
    except ValueError:   # a layout the model cannot take (TP does not divide its heads or experts)
        return
    if c.single:
        return           # one GPU: ScalarCost's own closed form (test_decode_batch_terms_equal_the_stepped_terms)
    assert c.exact_integers() and c.closed_form()
    ctx = np.random.default_rng(seed).integers(0, 40000, B)
    items = [(1.0, float(x), None, 0.0, 1.0, 0.0) for x in ctx]
    ref, ref1 = c.seconds(items), c.seconds(items[:1])
    assert ref > c.stages[0].seconds(items)       # the collectives are in it
    got = c.decode_batch_seconds(B, np.full(40, ctx.sum()), np.full(40, ctx.max()))
    assert np.all(got == ref)
    assert c.decode_batch_seconds(B, np.array([ctx.sum()]), np.array([ctx.max()]))[0] == ref
    two = c.decode_batch_seconds(np.array([B, 1, B]), np.array([ctx.sum(), ctx[0], ctx.sum()]),
                                 np.array([ctx.max(), ctx[0], ctx.max()]))
    assert two.tolist() == [ref, ref1, ref]
    pre = [(float(B + 7), 0.0, None, 0.0, 1.0, 0.0), (40.0, 16.0, None, 0.0, 0.0, 0.0)]
    assert c.mixed_seconds(B, int(ctx.sum()), int(ctx.max()), pre) == c.seconds(items + pre)


def test_pipeline_stages_have_no_closed_form():
    """More than one pipeline stage (a batch's stages overlap other batches) is not one rank's closed form: such a
    cost says so, and refuses the closed form by name."""
    from sim.cost.parallel import ParallelConfig, ParallelCost
    from sim.cost.node import load_node
    c = ParallelCost(MODEL, HW["h100-sxm"], load_node("dgx-h100"),
                     ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2))
    assert not c.exact_integers() and not c.closed_form()
    with pytest.raises(ValueError, match="one pipeline stage only"):
        c.decode_batch_seconds(2, np.array([10]), np.array([6]))
    with pytest.raises(ValueError, match="one pipeline stage only"):
        c.mixed_seconds(2, 10, 6, [])


@pytest.mark.parametrize("model,tp,extra", [("llama-3-8b", 2, {}), ("llama-3-70b", 4, {}),
                                            ("llama-3-8b", 4, {"disable_custom_all_reduce": True}),
                                            ("qwen3-30b-a3b", 2, {"enable_expert_parallel": True}),
                                            ("deepseek-v2-lite", 2, {})])
def test_tensor_parallel_targets_take_windows(model, tp, extra):
    """A tensor-parallel replica (one stage) takes windows with every figure the stepped run's, under KV pressure,
    arrivals and admissions, eager or with CUDA graphs (the all-reduces' launch cost differs)."""
    wl = plain.random_workload(60, 200, 120, 0.5, 0, 2)
    m = load_model(model)
    for eager in (False, True):
        pair = _both(wl, HW["h100-sxm"], model=m, request_rate=20.0, seed=2, tensor_parallel_size=tp, **extra,
                     serving=ServingConfig(kv_capacity_bytes=float(300 * 16 * m.kv_bytes_per_token),
                                           enforce_eager=eager))
        ff = _check(pair)
        (_, _, xa, _), _ = pair
        assert xa.stats["preemptions"] > 0 and ff.steps > 0.8 * xa.iterations and ff.admissions > 0


def captured_replicas():
    """The engines of a replicated :func:`sim.bench.plain.run` (each one's ``result``), in replica order."""
    return _kept("result", lambda eng, res: (eng, res))


def _check_fleet(wl, hw, model=MODEL, **kw):
    """A replicated run fast and step by step: what the router saw at every arrival (each replica's requests in
    flight and running), every per-request figure, the routing, and each replica's records, counters, timelines and
    block manager equal; the replicas' fast-forward objects."""
    from sim.serving import router as router_mod
    out, seen = [], []
    orig = router_mod.choose
    for sbs in (False, True):
        saw = []

        def choose(rt, arrival, outstanding, engines):
            saw.append((arrival.problem, tuple(outstanding), tuple(len(e.sched.running) for e in engines)))
            return orig(rt, arrival, outstanding, engines)
        router_mod.choose = choose
        try:
            with captured_replicas() as got:
                r = plain.run(model, hw, wl, step_by_step=sbs, **kw)
        finally:
            router_mod.choose = orig
        out.append((r, got))
        seen.append(saw)
    assert seen[0] == seen[1] and len(seen[0]) == wl.n
    (ra, ga), (rb, gb) = out
    assert len(ga) == len(gb) == kw["data_parallel_size"]
    for f in ("scheduled", "start", "ttft", "e2el", "replica"):
        _same(getattr(ra, f), getattr(rb, f), f)
    assert ra.duration == rb.duration
    _same(list(ra.itls), list(rb.itls), "itls")
    _same(ra.info, rb.info, "info")
    for (ea, xa), (eb, xb) in zip(ga, gb):
        _same(xa.records(), xb.records(), "records")
        for f in ("timeline_t", "timeline_b", "timeline_running", "iterations", "makespan", "busy", "mean_running",
                  "tokens", "stats", "gen_tokens"):
            _same(getattr(xa, f), getattr(xb, f), f)
        assert ea.items_scheduled == eb.items_scheduled and ea.run_time == eb.run_time
        for f in ("n_clean", "evictions", "hits", "queries", "peak_used", "_next_id"):
            _same(getattr(ea.kv, f), getattr(eb.kv, f), f"kv.{f}")
        assert eb._ff is None
    pct = dict(percentiles=(50.0, 99.0), metrics=("ttft", "tpot", "itl", "e2el"))
    _same(plain.serve_result(ra, **pct), plain.serve_result(rb, **pct), "serve_result")
    return [e._ff for e, _ in ga]


@settings(max_examples=int(os.environ.get("FF_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 40), il=st.integers(20, 200), ol=st.integers(2, 160), prefix=st.sampled_from([0, 0, 64]),
       seed=st.integers(0, 50), dp=st.sampled_from([2, 3]),
       router=st.sampled_from(["round-robin", "least-outstanding", "prefix-affinity", "vllm-dp"]),
       rate=st.sampled_from([math.inf, 2.0, 20.0, 200.0]), blocks=st.sampled_from([None, 60, 200]),
       frontend=st.booleans(), policy=st.sampled_from(["vllm-v1", "vllm-v1", "prefill-first"]))
# an admitting first step that answers a request and crosses the next arrival (its answer comes after that arrival)
@example(n=7, il=20, ol=2, prefix=0, seed=0, dp=2, router="round-robin", rate=200.0, blocks=None, frontend=False,
         policy="vllm-v1")
def test_replicas_take_windows_with_the_stepped_figures(n, il, ol, prefix, seed, dp, router, rate, blocks, frontend,
                                                        policy):
    """Replicas behind a router share one clock: each takes windows up to the next event no engine made (an
    arrival's), its answers lowering the router's counts before that event, never in the step it falls in; every
    figure equals the stepped run's, under KV pressure, with and without the API server in front."""
    wl = plain.random_workload(n, il, ol, 0.5, prefix, seed)
    need = int(((wl.input_lens + wl.output_lens).max() + 15) // 16)
    kvb = None if blocks is None else _kv_bytes(max(blocks, need), 16)
    ffs = _check_fleet(wl, HW["h100-sxm"], request_rate=rate, seed=seed, data_parallel_size=dp, router=router,
                       frontend=frontend, serving=ServingConfig(scheduler=policy, kv_capacity_bytes=kvb))
    assert all(ff is not None for ff in ffs)


def test_replicas_answer_inside_windows_and_preempt():
    """Under load and KV pressure the replicas' windows cover most iterations, answer requests and preempt."""
    wl = plain.random_workload(90, 200, 120, 0.5, 0, 3)
    ffs = _check_fleet(wl, HW["h100-sxm"], request_rate=12.0, seed=3, data_parallel_size=3, router="least-outstanding",
                       serving=ServingConfig(kv_capacity_bytes=_kv_bytes(50, 16)))
    assert sum(ff.steps for ff in ffs) > 0.7 * sum(ff.eng.iterations for ff in ffs)
    assert sum(ff.eng.sched.preemptions for ff in ffs) > 0


@pytest.mark.parametrize("tp", [1, 2])
def test_dp_attention_ranks_take_windows(tp):
    """vLLM's DP attention + EP (an MoE model, ``--data-parallel-size 2 --enable-expert-parallel``): each DP rank is a
    replica whose decode steps add the experts' dispatch and combine of its own batch size; its windows give the
    stepped figures, under KV pressure."""
    wl = plain.random_workload(60, 200, 120, 0.5, 0, 4)
    m = MOE["qwen3-30b-a3b"]
    ffs = _check_fleet(wl, HW["h100-sxm"], model=m, request_rate=4.0, seed=4, data_parallel_size=2,
                       tensor_parallel_size=tp, enable_expert_parallel=True,
                       serving=ServingConfig(kv_capacity_bytes=float(120 * 16 * m.kv_bytes_per_token)))
    assert ffs[0].eng.cost.dpa and sum(ff.steps for ff in ffs) > 0.5 * sum(ff.eng.iterations for ff in ffs)


def test_replicas_with_client_slots_step():
    """With ``max_concurrency`` an answer on one replica sends the next request, maybe to another: every replica
    steps (a plain clock), with the same figures."""
    wl = plain.random_workload(20, 100, 60, 0.0, 0, 1)
    with captured_replicas() as got:
        plain.run(MODEL, HW["h100-sxm"], wl, request_rate=50.0, max_concurrency=3, data_parallel_size=2)
    assert [e._ff for e, _ in got] == [None, None]


def test_a_sliding_window_target_takes_decode_windows():
    """gpt-oss (sliding-window layers, a hybrid KV cache): its decode steps take windows, priced with their per-step
    window key sums, and so do its admitting steps (the decodes' window key sum, then the prompts' items: each such
    window is its mixed step)."""
    wl = plain.random_workload(20, 200, 60, 0.5, 0, 2)
    pair = _both(wl, HW["h100-sxm"], model=load_model("gpt-oss-20b"), request_rate=4.0, seed=2)
    ff = _check(pair)
    (_, _, xa, _), _ = pair
    assert ff is not None and ff.admissions == 20 and ff.steps > 0.9 * xa.iterations


SLIDING = {name: load_model(name) for name in ("gpt-oss-20b", "gpt-oss-120b")}


@settings(max_examples=int(os.environ.get("FF_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), il=st.integers(20, 400), ol=st.integers(1, 300), rr=st.sampled_from([0.0, 0.5, 0.9]),
       prefix=st.sampled_from([0, 0, 64, 160]), seed=st.integers(0, 50), blocks=st.sampled_from([None, 120, 300, 800]),
       bs=st.sampled_from([16, 16, 8]), rate=st.sampled_from([math.inf, 4.0, 20.0, 80.0]),
       policy=st.sampled_from(["vllm-v1", "vllm-v1", "prefill-first"]), caching=st.booleans(),
       model=st.sampled_from(sorted(SLIDING)), tp=st.sampled_from([1, 1, 2]), tokens=st.sampled_from([None, 96, 512]))
def test_sliding_window_targets_take_windows_with_the_stepped_figures(n, il, ol, rr, prefix, seed, blocks, bs, rate,
                                                                       policy, caching, model, tp, tokens):
    """A hybrid KV cache's windows (``group_events``): each open and each release of blocks before the sliding
    window is the block manager's own allocation; a step that might run the pool short, or let the waiting head
    fit by the blocks releases free (``Window._head_fits``), ends the window. Prefix hits, KV pressure, arrivals,
    both schedulers, tensor parallelism, chunked prefills (a token budget below the prompts): every figure equal to
    the stepped run's."""
    m = SLIDING[model]
    tp = 4 if model == "gpt-oss-120b" else tp   # the larger one on a TP 4 layout (MXFP4 experts, as released)
    wl = plain.random_workload(n, il, ol, rr, prefix, seed)
    need = 2 * int(((wl.input_lens + wl.output_lens).max() + bs - 1) // bs)   # a request's blocks of both groups
    kvb = None if blocks is None else _kv_bytes(max(blocks, need), bs, m)
    sv = ServingConfig(scheduler=policy, prefix_caching=caching, kv_capacity_bytes=kvb, max_num_batched_tokens=tokens)
    offline = math.isinf(rate)
    kw = dict(serving=sv, block_size=bs, seed=seed, offline=offline, model=m, tensor_parallel_size=tp)
    if not offline:
        kw.update(request_rate=rate)
    _check(_both(wl, HW["h100-sxm"], **kw))


def test_step_by_step_flag_and_replicas_step():
    """``step_by_step`` turns the windows off (replicas: ``test_replicas_with_client_slots_step`` and above)."""
    wl = plain.random_workload(8, 32, 64, 0.0, 0, 0)
    with captured() as got:
        plain.run(MODEL, HW["h100-sxm"], wl, offline=True, step_by_step=True)
    assert got[0][0]._ff is None
    with captured() as got:
        plain.run(MODEL, HW["h100-sxm"], wl, offline=True)
    assert got[0][0]._ff is not None and got[0][0]._ff.steps > 0


def _shape(name: str):
    """A preset's shape; ``NAME*``: with every layer a mixture of experts (DeepSeek's presets keep dense first
    layers, so their mean parameters per layer are not integers: the linear flops are then summed one decode at a
    time; ``*`` is the same MLA with integer terms)."""
    import dataclasses
    if name.endswith("*"):
        return dataclasses.replace(load_model(name[:-1]), first_k_dense=0)
    return load_model(name)


@settings(max_examples=60, deadline=None)
@given(B=st.sampled_from([1, 2, 3, 4, 5, 8, 9, 100, 255, 256, 257, 511, 512, 513, 1000]), seed=st.integers(0, 10 ** 6),
       hw=st.sampled_from(["h100-sxm", "a100-80gb", "l4", "h200", "local-cpu"]),
       model=st.sampled_from(["llama-3-8b", "qwen2.5-7b", "smollm2-135m", "falcon3-10b", "qwen3-30b-a3b",
                              "mixtral-8x7b", "deepseek-v2-lite", "deepseek-v3", "deepseek-v2-lite*",
                              "qwen3-235b-a22b"]),
       eager=st.booleans(), seqs=st.sampled_from([8, 256, 1024]), sampled=st.booleans())
def test_decode_batch_terms_equal_the_stepped_terms(B, seed, hw, model, eager, seqs, sampled):
    """The closed form of a uniform decode batch equals :meth:`ScalarCost.terms` / ``seconds`` bit for bit: dense,
    MoE (expected or seeded sampled routing: the experts a batch reads depend on its rows alone) and MLA shapes,
    DeepSeek's non-integer mean parameters per layer included, a batch size given per step (numpy) or as one
    number (floats where it is)."""
    from sim.cost.routing import SampledRouting
    m, h = _shape(model), load_hardware(hw)
    c = ScalarCost(m, h, graphs=engine_graphs(h, seqs, eager), routing=SampledRouting(seed % 7) if sampled else None)
    assert c.exact_integers() and c.closed_form()
    ctx = np.random.default_rng(seed).integers(0, 40000, B)
    items = [(1.0, float(x), None, 0.0, 1.0, 0.0) for x in ctx]
    ts = c.terms(items)
    tv = c.decode_batch_terms(np.array([B, B]), np.array([ctx.sum()] * 2), np.array([ctx.max()] * 2))
    for f in TERM_NAMES:
        assert float(getattr(ts, f)) == float(np.broadcast_to(getattr(tv, f), (2,))[1]), f
    ref = c.seconds(items)
    assert ref == float(c.decode_batch_seconds(np.array([B]), np.array([ctx.sum()]), np.array([ctx.max()]))[0])
    # one batch size over a stretch of steps (MIXED: the batch-size-only terms in floats), long enough for numpy
    got = c.decode_batch_seconds(B, np.full(40, ctx.sum()), np.full(40, ctx.max()))
    assert np.all(got == ref)
    # an admitting step: the decodes in closed form and a prompt's items one by one, as the stepped sum of all
    pre = [(float(B + 7), 0.0, None, 0.0, 1.0, 0.0)]
    assert c.mixed_seconds(B, int(ctx.sum()), int(ctx.max()), pre) == c.seconds(items + pre)


def test_a_sliding_window_shape_prices_decodes_with_their_window_sums():
    """Sliding-window layers attend over ``min(c_i + 1, W)`` keys per request, not a function of the batch's total
    context: a sliding shape (gpt-oss) has no closed form in ``(B, S, cmax)``, and ``mixed_seconds`` refuses it without
    more; given each step's ``Ssw = sum_i min(c_i + 1, W)`` its decode batch has one (``sliding_window``), and so has
    an admitting step's (the decodes in closed form, then the prompts' items), equal to the stepped price bit for
    bit; a share of sliding layers whose sums depend on their order (5 in 6) has none."""
    import dataclasses
    m, h = load_model("gpt-oss-20b"), load_hardware("h100-sxm")
    c = ScalarCost(m, h)
    assert not c.closed_form() and c.sliding_window() == 128
    with pytest.raises(ValueError, match="dense, MoE and MLA"):
        c.mixed_seconds(2, 10, 6, [])
    with pytest.raises(ValueError, match="Ssw"):
        c.decode_batch_seconds(3, np.array([30]), np.array([20]))
    rng = np.random.default_rng(0)
    for B in (1, 2, 3, 9, 64, 300):
        for hi in (100, 128, 129, 600, 40000):   # below, at and past the window
            ctx = rng.integers(0, hi, B)
            ref = c.seconds([(1.0, float(x), None, 0.0, 1.0, 0.0) for x in ctx])
            S, cm, sw = int(ctx.sum()), int(ctx.max()), int(np.minimum(ctx + 1, 128).sum())
            assert c.decode_batch_seconds(B, np.array([S]), np.array([cm]), np.array([sw]))[0] == ref
            assert np.all(c.decode_batch_seconds(B, np.full(9, S), np.full(9, cm), np.full(9, sw)) == ref)
            items = [(1.0, float(x), None, 0.0, 1.0, 0.0) for x in ctx]
            for pre in ([(float(B + 7), 0.0, None, 0.0, 1.0, 0.0)], [(200.0, 96.0, None, 0.0, 0.0, 0.0),
                                                                     (31.0, 0.0, None, 0.0, 1.0, 0.0)]):
                assert c.mixed_seconds(B, S, cm, pre, sw) == c.seconds(items + pre)
    kinds = ["sliding_attention"] * 5 + ["full_attention"]
    five = dataclasses.replace(m, layer_types=tuple(kinds * (m.n_layers // 6)))
    assert ScalarCost(five, h).sliding_window() is None


def test_exact_delays():
    """The clock lands on the window's end exactly, also where no single delay reaches it (a rounding tie)."""
    now, end = 0.029388086064038366, 0.5697567842581105   # now + (end - now) rounds to a neighbour of end
    assert now + (end - now) != end
    dt = np.array([end - 0.3 - now, 0.3])
    t = np.cumsum(np.concatenate(([now], dt)))
    for now_, t_, dt_ in ((now, t, dt), (1234.5678, 1234.5678 + np.cumsum([0.0, 1e-3, 2e-3]), np.array([1e-3, 2e-3]))):
        x = now_
        ds = exact_delays(now_, t_, dt_)
        for d in ds:
            assert d > 0
            x = x + d
        assert x == t_[-1]


def test_an_iteration_observer_sees_every_iteration_and_keeps_the_engine_stepping():
    # issue 31: calibrate/serve_replay.py observes iterations through Engine(on_step=...), not by replacing
    # the scheduler's methods; an observer must see each iteration, so no window may skip one
    from sim.serving.engine import Engine, StepRecord
    wl = plain.random_workload(40, 64, 96, 0.0, 0, 1)
    calls, orig = [], engine_mod.Engine.__init__

    def init(self, *a, **kw):
        calls.append((a, dict(kw)))
        orig(self, *a, **kw)
    engine_mod.Engine.__init__ = init
    try:
        with captured() as got:
            plain.run(MODEL, HW["h100-sxm"], wl, offline=True)
    finally:
        engine_mod.Engine.__init__ = orig
    assert got[0][0]._ff is not None and got[0][0]._ff.windows > 0      # the plain run fast-forwards
    (a, kw), seen = calls[0], []
    eng = Engine(*a, **{**kw, "on_step": seen.append})
    res = eng.run()
    assert eng._ff is None and seen and all(isinstance(r, StepRecord) for r in seen)
    assert len(seen) == res.iterations
    assert all(b.t0 >= a.t0 + a.dt - 1e-12 for a, b in zip(seen, seen[1:]))
    assert sum(len(r.finished) for r in seen) == len(wl.input_lens)   # every request finishes in one of them


def test_a_short_stretch_priced_in_floats_equals_the_numpy_pass():
    """decode_batch_seconds prices a few iterations one by one in plain floats (roofline FLOAT) and more in one
    numpy pass (of one batch size: its batch-size-only terms in floats, roofline MIXED): the same operations, so
    equal floats, across hardware, CUDA-graph padding (batch sizes on and
    between capture sizes, and above the largest), FP8 and graph replay."""
    import numpy as np
    from sim.cost.graphs import CudaGraphs
    from sim.cost.profiles import load_hardware, load_model
    from sim.cost.roofline import NUMPY, seconds
    from sim.cost.scalar import SCALAR_STEPS, ScalarCost
    rng = np.random.default_rng(7)
    for name, q in (("llama-3-8b", ""), ("llama-3-70b", "fp8"), ("qwen2.5-7b", "")):
        m = load_model(name)
        m = m.with_precision(q) if q else m
        for hw in ("h100-sxm", "a100-80gb", "l4"):
            for graphs in (None, CudaGraphs.vllm(256)):
                for cuda_graph in (False, True):
                    c = ScalarCost(m, load_hardware(hw), graphs=graphs, cuda_graph=cuda_graph)
                    B = np.concatenate([[1, 2, 3, 4, 8, 9, 16, 17, 512, 513], rng.integers(1, 900, 30)])
                    for k in range(0, len(B), SCALAR_STEPS):
                        b = B[k:k + SCALAR_STEPS]
                        S = b * rng.integers(1, 4000, len(b))
                        cm = S // b + rng.integers(0, 300, len(b))
                        want = np.broadcast_to(seconds(c.hw, c.decode_batch_terms(b, S, cm), NUMPY, model=c.m),
                                               b.shape)
                        assert np.array_equal(c.decode_batch_seconds(b, S, cm), want), (name, hw, graphs, b)
                        # one batch size as a number (a window's stretch): batch-size-only terms in floats (MIXED)
                        for n in (1, 3, len(b)):
                            one = np.full(n, b[0])
                            want = np.broadcast_to(seconds(c.hw, c.decode_batch_terms(one, S[:n], cm[:n]), NUMPY,
                                                           model=c.m), one.shape)
                            assert np.array_equal(c.decode_batch_seconds(int(b[0]), S[:n], cm[:n]), want), (name, hw, b)


def test_a_window_adds_each_step_share_in_turn():
    """close() adds the per-step decode shares to each problem's phase one step at a time, left to right as the
    stepped path does (column cumsums, chunked), not summed first: equal to a step-by-step loop."""
    from sim.serving.ff_sums import add_in_turn
    rng = np.random.default_rng(3)
    for n, B, cells in ((1, 5, 1 << 20), (7, 1, 1 << 20), (300, 9, 64), (50, 40, 1)):
        ph0 = rng.random(B) * 10.0 ** rng.integers(-3, 3, B)
        mask = rng.random(B) < 0.7
        xs = rng.random(n) * 1e-2
        want = ph0.copy()
        for x in xs.tolist():
            np.add(want, x, out=want, where=mask)
        got = ph0.copy()
        add_in_turn(got, mask, xs, cells)
        assert np.array_equal(got, want), (n, B, cells)


def test_a_window_folds_its_counters_left_to_right():
    """close() adds a window's per-step seconds to the run's counters left to right: as Python floats for a few
    steps, one cumsum for more, the same floats as the stepped loop either way (not numpy's pairwise sum)."""
    from sim.serving.ff_sums import fold
    rng = np.random.default_rng(5)
    for n in (1, 3, 8, 9, 200):
        x0 = float(rng.random() * 1e3)
        xs = rng.random(n) * 10.0 ** rng.integers(-6, 0, n)
        want = x0
        for x in xs.tolist():
            want += x
        assert fold(x0, xs.tolist()) == want and fold(x0, xs) == want, n
    xs = np.full(1000, 0.1)
    assert fold(0.0, xs) != float(np.sum(xs))   # the pairwise sum rounds differently: the order is the point


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 60), start=st.integers(0, 99), raw=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 99)),
                                                                    max_size=12))
@example(k=20, start=0, raw=[(0, 5), (0, 7), (30, 1)])
def test_kv_in_use_is_filled_forward_from_the_steps_that_changed_it(k, start, raw):
    """forward_fill (a window's KV blocks in use after each step): the latest mark at or before each step, the
    last of a step's marks winning, the first mark's count before any (marks in step order, some outside 1..k);
    the per-step loop for a few steps, one searchsorted for more: the same counts."""
    from sim.serving.ff_sums import forward_fill
    marks = sorted(raw, key=lambda m: m[0])
    cur, want = (marks[0][1] if marks else start), []
    for step in range(1, k + 1):
        for s_, v in marks:
            if s_ == step:
                cur = v
        want.append(cur)
    got = forward_fill(marks, k, start)
    assert got.dtype == np.int64 and got.tolist() == want


@settings(max_examples=60, deadline=None)
@given(groups=st.sampled_from([(1, 1, 8), (2, 1, 12), (1, 2, 5), (2, 0, 0)]),
       lens=st.lists(st.integers(1, 40), min_size=1, max_size=8), cached=st.integers(0, 6), spare=st.integers(0, 4))
def test_a_hybrid_caches_decode_takes_are_planned_as_the_block_manager_takes_them(groups, lens, cached, spare):
    """``decode_takes`` on a hybrid cache (full and sliding-window groups in one pool): each running request's decode
    takes blocks of every group and releases the sliding ones wholly before the window, in running order. The free
    blocks, clean blocks and queue-front evictions it plans are the block manager's after the same ``allocate_one``
    calls, or None where one of them fails (a clean pool refilled by releases, evictions of cached blocks)."""
    from types import SimpleNamespace
    from sim.serving.ff_admission import decode_takes
    from sim.serving.kvcache import BlockManager
    from sim.serving.scheduler import Request

    bs = 4
    need = sum((groups[0] + groups[1]) * -(-n // bs) for n in lens)   # the prompts' blocks: a few spare
    bm = BlockManager(need + cached + spare, bs, log_evictions=False)
    bm.set_kv_groups(*groups)
    old = Request("old", max(cached, 1) * bs, 1, content=lambda k: ("old", k))
    if cached and bm.allocate(old, cached * bs):     # cached blocks at the queue's front
        old.num_computed_tokens = cached * bs
        bm.free(old)
    run = []
    for i, n in enumerate(lens):                       # each has computed n tokens and decodes its next
        r = Request(f"r{i}", n, 2, content=lambda k, i=i: (i, k))
        if not bm.allocate(r, n):
            break
        r.num_computed_tokens = n
        r.num_tokens = n + 1
        run.append(r)
    c0 = np.array([r.num_computed_tokens for r in run], np.int64)
    nb = np.array([len(bm.req_blocks[r.req_id]) for r in run], np.int64)
    m = SimpleNamespace(c0=c0, nb=nb, rids=[r.req_id for r in run])
    plan = decode_takes(bm, m, nb * bs - c0 + 1)
    ev0 = bm.evictions
    for r in run:
        if not bm.allocate_one(r):
            assert plan is None
            return
    assert plan == (bm.num_free, bm.n_clean, bm.evictions - ev0)


def _preempted_pool(names, blocks: int, groups=None):
    """A full pool of ``blocks`` 4-token blocks whose requests ``names`` (12 tokens each: 3 full blocks of each group)
    were all preempted: the full group's keyed blocks queue in LRU order (``a2 a1 a0 b2 ...``, tail first), a
    hybrid cache's other groups' blocks are clean."""
    from sim.serving.kvcache import BlockManager
    from sim.serving.scheduler import Request
    bm = BlockManager(blocks, 4)
    if groups is not None:
        bm.set_kv_groups(*groups)
    reqs = [Request(name, 12, 4, content=lambda k, name=name: (name, k)) for name in names]
    for r in reqs:
        assert bm.allocate(r, 12)
        r.num_computed_tokens = 12
    for r in reqs:
        bm.free(r)
        r.num_computed_tokens = 0
    return bm, reqs


def _planned_and_found_hits(pool, decode_takes: int):
    """The hit (in blocks) ``_Victims`` plans for each request of ``pool()`` admitted in turn after ``decode_takes``
    blocks taken by the decodes, and the hit ``find_cached`` finds when the block manager makes the same takes and
    admissions, up to the first that does not fit."""
    from sim.serving.ff_admission import _Victims
    bm, reqs = pool()
    lru, planned = _Victims(bm, bm.n_clean, 0), []
    lru.take(decode_takes)
    for r in reqs:
        blocks, _ = bm.find_cached(r, count=False)
        planned.append(lru.cut(blocks))
        lru.admit(r, r.num_tokens - planned[-1] * 4, blocks[:planned[-1]], planned[-1] * 4)
    bm, reqs = pool()
    bm._take_n(decode_takes)
    found = []
    for r in reqs:
        blocks, hit = bm.find_cached(r, count=False)
        found.append(len(blocks))
        if not bm.allocate(r, r.num_tokens - hit, blocks, hit):
            break
    return planned[:len(found)], found


@pytest.mark.parametrize("groups", [(1, 1, 8), (2, 1, 4), (1, 2, 12)])
@pytest.mark.parametrize("decode_takes", range(0, 9))
def test_a_hybrid_caches_planned_hits_count_every_groups_takes(groups, decode_takes):
    """On a hybrid cache an admission also takes its other groups' blocks (the clean ones its preemption released
    first, then the LRU queue's front): ``_Victims`` counts them, so the hit it plans for the next admission is the
    hit ``find_cached`` then finds (wrong if only the full group's takes were counted)."""
    planned, found = _planned_and_found_hits(lambda: _preempted_pool("abc", 9 * sum(groups[:2]), groups), decode_takes)
    assert planned == found


@pytest.mark.parametrize("decode_takes,hits", [(0, [2, 2]), (1, [2, 2]), (2, [1, 1]), (3, [0, 0])])
def test_the_planned_hits_are_the_hits_the_block_manager_then_finds(decode_takes, hits):
    """``_Victims`` plans a step's admissions against the LRU queue: two preempted requests' freed blocks at its
    front (tail first), ``decode_takes`` blocks taken by the decodes, then each admission's hits held and its new
    blocks taken. The hit it plans for each is the hit ``find_cached`` finds when the block manager does the
    same takes (wrong if an admission's evictable hits were counted as takes, or the held blocks were not
    skipped). The pool of 6 has no room for the second admission: its hit is the point."""
    planned, found = _planned_and_found_hits(lambda: _preempted_pool("ab", 6), decode_takes)
    assert planned == found == hits


@settings(max_examples=300, deadline=None)
@given(B0=st.integers(1, 12), bs=st.sampled_from([1, 4, 16]), a=st.integers(1, 60), span=st.integers(0, 90),
       firsts=st.lists(st.lists(st.integers(-40, 70), min_size=12, max_size=12), min_size=1, max_size=3),
       never=st.booleans(), unique=st.booleans())
def test_block_events_are_each_members_first_step_repeating_every_block(B0, bs, a, span, firsts, never, unique):
    """``block_events``: every ``(step, member)`` with ``step = f + j bs >= a`` (``j >= 0``) up to ``b``, in step
    then running order (one per pair where kinds may coincide): the numpy lanes and the few-members Python lane
    against the definition, one event at a time."""
    from sim.serving import ff_blocks
    b = a + span
    kinds = tuple(np.array(f[:B0], np.int64) for f in firsts) + ((np.full(B0, ff_blocks.NEVER, np.int64),) if never
                                                                  else ())
    want = [(st, i) for kind in kinds for i, f in enumerate(kind.tolist()) for st in range(f, b + 1, bs) if st >= a]
    want = sorted(set(want)) if unique or bs == 1 else sorted(want)
    for small in (0, 8, 64):   # numpy only, the default, Python for every size here
        old = ff_blocks.SMALL_BATCH
        ff_blocks.SMALL_BATCH = small
        try:
            steps, who = ff_blocks.block_events(kinds, bs, a, b, unique)
        finally:
            ff_blocks.SMALL_BATCH = old
        assert list(zip(steps, who)) == want


@settings(max_examples=300, deadline=None)
@given(fa=st.lists(st.integers(-40, 70), min_size=1, max_size=14), bs=st.sampled_from([1, 4, 16]),
       s=st.integers(1, 60), span=st.integers(0, 90), free=st.integers(0, 30))
def test_first_short_is_the_first_step_whose_takes_exceed_the_pool(fa, bs, s, span, free):
    """``first_short``: the first step of ``s..e`` at which the opens so far (member i at ``f_i + j bs``, ``j >= 0``)
    exceed ``free``, or None; the numpy lane and the few-members Python lane against the step-by-step count."""
    from sim.serving import ff_blocks
    e = s + span
    want, n = None, 0
    for stp in range(s, e + 1):
        n += sum(1 for f in fa if stp >= f and (stp - f) % bs == 0)
        if n > free:
            want = stp
            break
    for small in (0, 64):
        old = ff_blocks.SMALL_BATCH
        ff_blocks.SMALL_BATCH = small
        try:
            got = ff_blocks.first_short(np.array(fa, np.int64), bs, s, e, free)
        finally:
            ff_blocks.SMALL_BATCH = old
        assert got == want
