"""Serving at capacity: the engine on the scheduler and block manager (sim/serving/engine.py, sim/serving/capacity.py)."""
from __future__ import annotations

import numpy as np
import pytest

from app.cli import main
from sim import api
from sim.serving.capacity import CapacityError, ServingConfig, activation_reserve, kv_capacity
from sim.serving.engine import Engine
from sim.cost.profiles import load_hardware, load_model
from sim.serving.scheduler import SchedulerConfig
from sim.workload.job import Job

from trace_files import BUNDLED, HAS_BUNDLED  # noqa: E402
UNLIMITED = {"scheduler": "prefill-first", "max_num_seqs": 1 << 20, "max_num_batched_tokens": 1 << 24,
             "kv_capacity_bytes": 1e18,
             # the GPU's kernels alone, eager, as isolated mode prices them (a served run adds its host time and
             # CUDA graphs by default: test_served_steps_price_host_time_and_graphs)
             "no_host_time": True, "enforce_eager": True}


@pytest.fixture(scope="module")
def syn(syn_factory):
    return syn_factory(n_problems=4, seed=11)


@pytest.mark.parametrize("policy,params", [("no-kv", {}), ("exact-prefix", {}), ("asks", {"tau": 0.8}),
                                           ("cgee", {}), ("rksc", {"tau": 0.8})])
def test_unlimited_capacity_one_at_a_time_serving_equals_isolated(syn, policy, params):
    """Unlimited KV and token budget, prefill-first, one problem at a time: serving is isolated mode exactly."""
    from sim.workload.decisions import decide, job_for, make_config
    lt = api.loaded(syn)
    cfg = make_config(policy, params, None)
    keep = range(len(lt.tf.problems))  # plan and block manager cap a whole-prompt hit alike: every problem
    for k in keep:
        iso = api.simulate(syn, policy, params, hardware="h100-sxm", problems=[k], baselines=False)
        srv = api.simulate(syn, policy, params, hardware="h100-sxm", mode="serving", problems=[k],
                           baselines=False, workload={"concurrency": 1}, serving=UNLIMITED)
        for col in ("latency_s", "gate_s", "prefill_s", "decode_s", "verify_s", "ttft_s", "iterations"):
            assert srv.problems[col].iloc[0] == pytest.approx(iso.problems[col].iloc[0], rel=1e-9, abs=1e-15), col
    # No-KV shares nothing across problems either: the whole run, problems one after another
    iso = api.simulate(syn, "no-kv", {}, hardware="h100-sxm", baselines=False)
    srv = api.simulate(syn, "no-kv", {}, hardware="h100-sxm", mode="serving", baselines=False,
                       workload={"concurrency": 1}, serving=UNLIMITED)
    np.testing.assert_allclose(srv.problems["latency_s"], iso.problems["latency_s"], rtol=1e-9)
    assert srv.summary["makespan_s"] == pytest.approx(iso.problems["latency_s"].sum(), rel=1e-9)


def test_served_steps_price_host_time_and_graphs(syn):
    """A served run prices each step as vLLM serves it (``sim.cost.pricing.served_costs``): without async
    scheduling every step gains exactly its host time (``HostStepCost.seconds`` of the step's counts, summed over
    the run: ``info["overheads"]``); with it (the default) a step costs ``max(gpu, host)``, never less than
    kernels alone; ``--enforce-eager`` and ``--no-host-time`` price the kernels alone, as isolated mode."""
    kw = dict(hardware="h100-sxm", mode="serving", baselines=False, workload={"concurrency": 1})
    base = {k: v for k, v in UNLIMITED.items() if k not in ("no_host_time", "enforce_eager")}
    runs = {name: api.simulate(syn, "exact-prefix", {}, serving={**base, **extra}, **kw) for name, extra in (
        ("kernels", {"no_host_time": True, "enforce_eager": True}),
        ("sync", {"no_async_scheduling": True, "enforce_eager": True}),
        ("async", {"enforce_eager": True}), ("served", {}))}
    k, sync = runs["kernels"].summary["makespan_s"], runs["sync"]
    host = sync.info["overheads"]["host_step"]
    assert host["priced"] and not host["async_scheduling"] and host["host_seconds"] > 0
    assert sync.summary["makespan_s"] == pytest.approx(k + host["host_seconds"], rel=1e-9)
    assert k <= runs["async"].summary["makespan_s"] < sync.summary["makespan_s"]
    assert runs["async"].info["overheads"]["host_step"]["async_scheduling"]
    assert "host time per step priced (async scheduling on" in runs["served"].info["note"]
    assert runs["served"].info["note"].endswith("; CUDA graphs") and runs["async"].info["note"].endswith("; eager kernels")
    assert runs["kernels"].info["overheads"]["host_step"]["why"].startswith("turned off")
    # isolated mode says it priced the kernels alone
    iso = api.simulate(syn, "exact-prefix", {}, hardware="h100-sxm", baselines=False)
    assert not iso.info["overheads"]["host_step"]["priced"] and "no host time per step (isolated mode" in iso.info["note"]
    # CUDA graphs: a launch-bound model (the bundled trace's 135M model on an H100) replays its steps instead of
    # launching every kernel
    from trace_files import BUNDLED
    eager, graphs = (api.simulate(str(BUNDLED), "exact-prefix", {}, serving={**base, **extra}, **kw).summary["makespan_s"]
                     for extra in ({"enforce_eager": True}, {}))
    assert graphs < 0.8 * eager


def _two_branches(bs=4):
    z = np.zeros(2, np.int64)
    ctx, gen = np.array([8, 8]), np.array([9, 9])
    return Job(B=2, L=24, bs=bs, reused=z, computed=ctx, copy=z, gate=z, source=np.array([-1, -1]),
               share=np.zeros(2, bool), ctx=ctx, gen=gen, own=ctx, verify_on=False, v_new=z, v_cached=z,
               v_layers=np.array([24, 24]), v_probes=z, v_head=np.ones(2, np.int64), v_kv_tokens=z, v_reuse=False,
               score=np.array([0.5, 0.5]))


def test_preemption_and_recompute_hand_built():
    """5 blocks of 4 tokens; two branches of 8 prompt tokens + 8 decode steps each.

    Iteration 1 prefills both (4 blocks). Iteration 2: A's step at position 8 takes the last block; B's needs
    one more and none is free: B, the newest, is preempted (its 2 full blocks go to the cache). B cannot come
    back beside A (9 tokens = 3 blocks, 2 free counting its cached ones); A's 4th block (position 12) evicts
    B's block 1 (LRU: vLLM frees tail first). When A is done B re-enters: the chain hits block 0 only, so it
    computes positions 4..8, of which 4..7 had been computed before: recompute 4 tokens."""
    m, hw = load_model("qwen3-4b"), load_hardware("h100-sxm")
    job = _two_branches()
    eng = Engine(m, hw, [(0, job)], kv_blocks=5, caching=True, scheduler=SchedulerConfig(policy="vllm-v1"),
                 prompt_ids=[[np.arange(8), np.arange(100, 108)]], log_evictions=True)
    res = eng.run()
    st = res.stats
    assert st["preemptions"] == 1 and st["recompute_tokens"] == 4
    from sim.serving.kvcache import chain_keys
    # the first eviction is B's block 1 (A's 4th block); then B, regrowing, evicts 3 of A's cached blocks
    assert res.kv.evicted_log[0] == chain_keys(np.arange(100, 108), 4)[1] and res.kv.evictions == 4
    assert res.timeline_b.max() <= 5 * 4 * m.kv_bytes_per_token
    rec = res.records()[0]
    assert rec["recompute_tokens"] == 4
    free = Engine(m, hw, [(0, _two_branches())], scheduler=SchedulerConfig(policy="vllm-v1"),
                  prompt_ids=[[np.arange(8), np.arange(100, 108)]]).run()
    assert free.stats["preemptions"] == 0 and res.makespan > free.makespan


def test_isolated_refuses_a_problem_that_cannot_fit_saying_by_how_much(syn):
    with pytest.raises(CapacityError, match=r"short"):
        api.simulate(syn, "exact-prefix", {}, hardware="h100-sxm", baselines=False,
                     serving={"kv_capacity_bytes": 1000.0})


def test_serving_queues_instead_of_failing(syn):
    one = api.simulate(syn, "no-kv", {}, hardware="h100-sxm", baselines=False)
    need = float(one.problems["peak_kv_bytes"].max())
    r = api.simulate(syn, "no-kv", {}, hardware="h100-sxm", mode="serving", baselines=False,
                     workload={"concurrency": 4, "n_requests": 12}, serving={"kv_capacity_bytes": 1.2 * need})
    assert len(r.problems) == 12 and r.summary["peak_kv_bytes"] <= 1.2 * need
    assert r.summary["queue_mean_s"] > 0                    # branches waited for blocks
    free = api.simulate(syn, "no-kv", {}, hardware="h100-sxm", mode="serving", baselines=False,
                        workload={"concurrency": 4, "n_requests": 12}, serving=UNLIMITED)
    assert free.summary["queue_mean_s"] == 0.0


def test_capacity_is_the_devices_bytes_times_utilisation_minus_weights_and_reserve():
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    assert hw.mem_capacity == 81559 * 2 ** 20
    cap = kv_capacity(m, hw)
    # vLLM's total (cudaMemGetInfo, 79.22 GiB on an H100) x 0.9 - weights - reserve, in whole 16-token blocks
    avail = 79.22 * 2 ** 30 * 0.9 - m.weight_bytes - activation_reserve(m, 8192, 1024)
    assert cap["activation_reserve_bytes"] == pytest.approx(
        cap["activation_peak_bytes"] + cap["non_torch_bytes"] + cap["cudagraph_bytes"])
    assert cap["num_gpu_blocks"] == int(avail // (16 * m.kv_bytes_per_token))
    assert cap["kv_capacity_bytes"] == cap["num_gpu_blocks"] * 16 * m.kv_bytes_per_token
    assert avail - 16 * m.kv_bytes_per_token < cap["kv_capacity_bytes"] <= avail
    # at full utilisation and no reserve, llama-3-8b fits 32 sequences of 16K tokens (GenZ / llm-analysis: ~33)
    full = kv_capacity(m, hw, ServingConfig(gpu_memory_utilization=1.0, activation_reserve_bytes=0))
    assert int(full["kv_capacity_bytes"] // (16384 * m.kv_bytes_per_token)) == 32
    assert load_hardware("a100-80gb").mem_capacity == 81920 * 2 ** 20
    assert load_hardware("h200").mem_capacity == 143771 * 2 ** 20


@pytest.mark.skipif(not HAS_BUNDLED, reason="bundled trace not present")
def test_token_eviction_in_serving_holds_more_sequences():
    # 8 full-cache sequences of ~700 tokens fit; the recorded decodes are 512 tokens long
    sv = {"decode_tokens": 600, "kv_capacity_bytes": 8 * 720 * load_model("qwen3-4b").kv_bytes_per_token}
    r = api.simulate(None, "vase-dkv", {"budget": 64}, model_preset="qwen3-4b", hardware="h100-sxm",
                     mode="serving", baselines=False, workload={"concurrency": 64, "n_requests": 64}, serving=sv)
    s = r.summary
    assert s["length_extrapolated"] is True
    assert s["kv_cap_tokens_per_sequence"] < 720
    assert s["mean_running_seqs"] > 2 * s["full_cache_mean_running_seqs"]
    assert s["throughput_vs_full"] > 1.0
    assert s["attn_output_rel_error"] is not None   # quality from the recorded length


@pytest.mark.parametrize("flag,value", [("--max-num-seqs", "0"), ("--max-num-seqs", "-1"), ("--max-num-seqs", "x"),
                                        ("--max-num-batched-tokens", "0"), ("--gpu-memory-utilization", "1.5"),
                                        ("--gpu-memory-utilization", "0"), ("--gpu-memory-utilization", "abc"),
                                        ("--max-concurrent-problems", "0"), ("--num-problems", "-5"), ("--problem-rate", "-1"),
                                        ("--decode-tokens", "zero"), ("--kv-capacity-bytes", "-1")])
def test_bad_serving_flags_one_line_naming_the_flag(syn, capsys, flag, value):
    rc = main(["serve", "--trace", syn, "--policy", "exact-prefix", "--hardware", "h100-sxm", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and flag in err[0] and err[0].startswith("rksim: error:")


def test_serve_json_has_the_serving_keys(syn, capsys):
    rc = main(["serve", "--trace", syn, "--policy", "rsbcm", "--hardware", "h100-sxm", "--num-problems", "8",
               "--max-concurrent-problems", "4", "--max-num-batched-tokens", "256", "--json"])
    import json
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    for k in ("throughput_tokens_per_s", "throughput_problems_per_s", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s",
              "e2e_p99_s", "queue_p50_s", "preemptions", "recompute_tokens", "max_running_seqs",
              "mean_running_seqs", "kv_capacity_bytes", "peak_kv_bytes", "prefix_hit_rate", "length_extrapolated",
              "capacity_source", "hardware_calibrated", "max_num_batched_tokens", "scheduler"):
        assert k in d, k
    assert d["max_num_batched_tokens"] == 256 and len(d["timeline"]["running_seqs"]) > 0


@pytest.mark.parametrize("replicas", [1, 2])
def test_per_request_latencies_beside_per_problem(syn, replicas):
    """Per-request (per-branch) TTFT/TPOT/ITL percentiles, computed from the engine's token times, beside
    the per-problem figures (a problem's TTFT is the mean over its branches); one replica or several."""
    from sim.serving.metrics import REQUEST_KEYS
    r = api.simulate(syn, policy="exact-prefix", hardware="h100-sxm", mode="serving",
                     workload={"n_requests": 6, "concurrency": 3}, data_parallel_size=replicas)
    s = r.summary
    for k in REQUEST_KEYS:
        assert s[k] is not None and s[k] >= 0, k
    for m in ("ttft", "tpot", "itl"):
        assert s[f"request_{m}_p50_s"] <= s[f"request_{m}_p90_s"] <= s[f"request_{m}_p99_s"]
    # a problem's TTFT is the mean of its branches': the branches' spread reaches past the problems' median
    assert 0 < s["request_ttft_p50_s"] and s["request_ttft_p99_s"] >= s["ttft_p50_s"]
    # TPOT is the mean gap, ITL every gap: their medians differ, and both are positive decode steps
    assert 0 < s["request_tpot_p50_s"] < s["e2e_p50_s"] and 0 < s["request_itl_p50_s"] < s["e2e_p50_s"]


def test_request_summary_by_hand():
    from sim.serving.metrics import request_summary
    recs = [{"first_token_times": np.array([1.0, 3.0]), "token_times": [[11.0, 12.0, 14.0], [13.0]]},
            {"first_token_times": np.array([2.0, np.nan]), "token_times": [[5.0, 6.0], []]}]
    s = request_summary(recs)
    assert s["request_ttft_p50_s"] == pytest.approx(2.0)          # of 1, 3, 2 (NaN: never started)
    assert s["request_tpot_p50_s"] == pytest.approx(1.25)         # of (14-11)/2 = 1.5 and (6-5)/1 = 1
    assert s["request_itl_p50_s"] == pytest.approx(1.0)           # of gaps 1, 2, 1
    assert s["request_itl_p99_s"] == pytest.approx(np.percentile([1, 2, 1], 99))
    no_times = request_summary([{"first_token_times": np.array([1.0])}])
    assert no_times["request_ttft_p50_s"] == 1.0 and no_times["request_tpot_p50_s"] is None


def test_rsbcm_scores_reach_the_cache_when_known():
    """A branch's score is set on its cached blocks once known (here: at the end of its generation), and a
    block shared by two branches keeps the higher score; before that every block ranks with score 0."""
    m, hw = load_model("qwen3-4b"), load_hardware("h100-sxm")
    job = _two_branches()
    job.score = np.array([0.3, 0.8])
    shared = np.arange(8)                      # both branches have the same 8-token prompt: 2 shared blocks
    eng = Engine(m, hw, [(0, job)], caching=True, prompt_ids=[[shared, np.r_[shared[:4], shared[4:]]]],
                 score_at="generation")
    res = eng.run()
    from sim.serving.kvcache import chain_keys
    k0, k1 = chain_keys(shared, 4)
    assert res.kv.cached[k0].score == 0.8 and res.kv.cached[k1].score == 0.8
    own = [b.score for key, b in res.kv.cached.items() if key not in (k0, k1)]
    assert sorted(set(own)) == [0.3, 0.8]      # each branch's generated blocks carry its own score


@pytest.mark.parametrize("name,kw", [("streamingllm", {"budget": 12, "buffer": 4}), ("vase-dkv", {"budget": 10}),
                                     ("snapkv", {"budget": 16, "buffer": 8}), ("full", {})])
def test_eviction_schedule_equals_the_policy_loop(name, kw):
    """The cache sizes priced in serving (from the policy's parameters) are those of a real eviction run."""
    from policies import get_policy, run_token_eviction
    pol = get_policy(name, **kw)
    rng = np.random.default_rng(0)
    T, P, H, D = 120, 20, 2, 8
    K, V, Q = rng.normal(size=(T, H, D)), rng.normal(size=(T, H, D)), rng.normal(size=(T, 2 * H, D))
    res = run_token_eviction(pol, K, V, Q, P, np.random.default_rng(1), record=False)
    sizes, events, cands = api.eviction_schedule(pol, P, T)
    np.testing.assert_array_equal(sizes, res.cache_sizes())
    assert events == list(res.event_positions)
    longer, _, _ = api.eviction_schedule(pol, P, 3 * T)   # extending the length keeps the recorded prefix
    np.testing.assert_array_equal(longer[: T - P], sizes)


def test_the_engine_keeps_only_the_last_evicted_key_unless_asked():
    m, hw = load_model("qwen3-4b"), load_hardware("h100-sxm")
    runs = [Engine(m, hw, [(0, _two_branches())], kv_blocks=5, caching=True,
                   scheduler=SchedulerConfig(policy="vllm-v1"), prompt_ids=[[np.arange(8), np.arange(100, 108)]],
                   log_evictions=log).run() for log in (False, True)]
    assert runs[0].kv.evicted_log == [] and runs[1].kv.evictions == runs[0].kv.evictions == 4
    assert runs[0].kv.last_evicted == runs[1].kv.evicted_log[-1]
    assert runs[0].makespan == runs[1].makespan and runs[0].stats == runs[1].stats   # the same run either way

