"""calibrate: real runner, decision parity with the simulator, evicting cache, report, CLI.

Fast tests use a tiny random Llama; ``slow`` ones the real SmolLM2-135M (a few tokens each).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
from tiny_hf import tiny_llama  # noqa: E402

from calibrate import layerwise as LW  # noqa: E402
from calibrate.evicting_cache import EvictingCache  # noqa: E402
from policies import get_policy, run_token_eviction  # noqa: E402

REPORT_KEYS = {"mean_abs_pct_error", "median_abs_pct_error", "p90_abs_pct_error", "speedup_ratio_error",
               "decision_parity", "n_fit", "n_holdout"}
TOKEN_POLICIES = ["streamingllm", "h2o", "snapkv", "rkv", "curdkv", "random", "vase-attnv", "vase-dkv"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(0)


def test_layerwise_equals_model_forward(tiny):
    ids = torch.randint(0, 300, (2, 17))
    with torch.inference_mode():
        ref = tiny(ids, output_hidden_states=True)
        st = LW.begin(tiny, ids)
        for l in range(1, 4):
            h = LW.step(tiny, st)
            if l < 3:
                assert torch.equal(h, ref.hidden_states[l])
        assert torch.equal(LW.final_logits(tiny, st.hidden), ref.logits)


def test_layerwise_stops_early(tiny):
    calls = []
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i)) for i, layer in enumerate(tiny.model.layers)]
    try:
        with torch.inference_mode():
            st = LW.begin(tiny, torch.randint(0, 300, (1, 5)))
            LW.step(tiny, st)
    finally:
        for h in hooks:
            h.remove()
    assert calls == [0]  # layers 2 and 3 never ran


def test_kv_reuse_is_a_view_not_a_copy(tiny):
    from calibrate import kv as KV
    from transformers.cache_utils import DynamicCache

    with torch.inference_mode():
        c = DynamicCache()
        tiny(torch.randint(0, 300, (1, 20)), cache=c, use_cache=True)
        pre = KV.prefix_view(c, 16)
        wide = KV.expand_view(c, 4)
        for li in range(3):
            assert KV.shares_storage(pre.layers[li].keys, c.layers[li].keys)
            assert KV.shares_storage(wide.layers[li].values, c.layers[li].values)
            assert wide.layers[li].keys.stride(0) == 0          # expand: no memory per extra row
        assert KV.seq_len(pre) == 16 and wide.layers[0].keys.shape[0] == 4


def _evict_run(model, pol, P=24, T=30, seed=0):
    L = model.config.num_hidden_layers
    rngs = [np.random.default_rng([seed, l]) for l in range(L)]
    c = EvictingCache(L, pol, P, model.config.num_key_value_heads, rngs).attach(model)
    ids = torch.randint(0, 300, (1, P), generator=torch.Generator().manual_seed(seed))
    with c, torch.inference_mode():
        out = model(ids, cache=c, use_cache=True)
        tok = out.logits[0, -1].argmax()
        for i in range(T):
            out = model(tok.view(1, 1), cache=c, use_cache=True, position_ids=torch.tensor([[P + i]]))
            tok = out.logits[0, -1].argmax()
    return c, rngs


@pytest.mark.parametrize("name", TOKEN_POLICIES)
def test_evicting_cache_decides_as_the_simulator_loop(tiny, name):
    pol = get_policy(name, budget=8, buffer=4)
    c, _ = _evict_run(tiny, pol)
    assert c.n_events > 0
    for li in range(tiny.config.num_hidden_layers):
        K, V, Q = c.ev[li].arrays()
        res = run_token_eviction(pol, K, V, Q, 24, np.random.default_rng([0, li]))
        assert len(res.steps) == len(c.ev[li].events)
        for (t1, k1), (t2, k2) in zip(res.steps, c.ev[li].events):
            assert t1 == t2 and np.array_equal(k1, k2)
        # the torch cache really holds what the loop keeps: same positions, same length
        assert np.array_equal(c.ev[li].cache, res.kept_final)
        assert c.layers[li].keys.shape[2] == res.kept_final.shape[1] < 24 + 30


def test_window_layers_never_evict(tmp_path):
    """A model's sliding-window layers keep every token (their window mask limits attention), as kvpress skips them
    and the simulator prices them; its full-attention layers evict as the simulator's loop decides."""
    from transformers import AutoModelForCausalLM

    from calibrate.evicting_cache import window_layers
    from tiny_hf import save_tiny
    model = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path / "g", "gemma3")).eval()
    keep = window_layers(model)
    assert keep == {0, 1} and window_layers(tiny_llama(0)) == frozenset()
    pol, P, T = get_policy("vase-attnv", budget=8, buffer=4), 24, 30
    rngs = [np.random.default_rng([0, l]) for l in range(3)]
    c = EvictingCache(3, pol, P, 1, rngs, keep_layers=keep).attach(model)
    ids = torch.randint(0, model.config.vocab_size, (1, P), generator=torch.Generator().manual_seed(0))
    with c, torch.inference_mode():
        out = model(ids, cache=c, use_cache=True)
        for i in range(T):
            out = model(out.logits[0, -1].argmax().view(1, 1), cache=c, use_cache=True,
                        position_ids=torch.tensor([[P + i]]))
    assert c.n_events == len(c.ev[2].events) > 0 and not c.ev[0].events and not c.ev[1].events
    assert c.layers[0].keys.shape[2] == c.layers[1].keys.shape[2] == P + T > c.layers[2].keys.shape[2]
    res = run_token_eviction(pol, *c.ev[2].arrays(), P, np.random.default_rng([0, 2]))
    assert [t for t, _ in res.steps] == [t for t, _ in c.ev[2].events]


def test_full_cache_never_evicts(tiny):
    c, _ = _evict_run(tiny, get_policy("full"))
    assert c.n_events == 0 and c.layers[0].keys.shape[2] == 24 + 30


def _fake_run_dir(tmp_path: Path) -> Path:
    """A calibration directory with synthetic phases and decisions (no model)."""
    from calibrate.timing import PhaseRow, phases_frame

    rows, recs = [], []
    rng = np.random.default_rng(0)
    for prob in range(4):
        for pol, scale in (("no-kv", 1.0), ("exact-prefix", 0.8), ("rksc", 0.4)):
            ctx = {"problem": prob, "policy": pol}
            t = 0.0
            for n in (100 * scale, 40):
                r = PhaseRow("prefill", **ctx).items([int(n)], [0])
                r.seconds = 2e-3 * n * (1 + 0.01 * rng.normal())
                rows.append(r)
                t += r.seconds
            for s in range(5):
                r = PhaseRow("decode", **ctx).items([1, 1], [120 + s, 110 + s])
                r.seconds = 0.05 * (1 + 0.01 * rng.normal())
                rows.append(r)
                t += r.seconds
            recs.append({"problem": prob, "policy": pol, "seconds": t * 1.02})
    for n in (16, 64, 256):
        r = PhaseRow("sweep-prefill", problem=-1, policy="sweep").items([n], [0])
        r.seconds = 2e-3 * n
        rows.append(r)
    d = tmp_path / "run"
    d.mkdir()
    phases_frame(rows).to_parquet(d / "phases.parquet")
    pd.DataFrame(recs).to_parquet(d / "decisions.parquet")
    model = {"name": "smollm2-135m", "n_layers": 30, "hidden_size": 576, "n_heads": 9, "n_kv_heads": 3,
             "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "dtype": "float32", "source": "x"}
    (d / "run.json").write_text(json.dumps({"model": model, "device": "cpu", "threads": 1, "problems": [0, 1, 2, 3],
                                            "decision_parity": 1.0, "created": "now"}))
    return d


def test_fit_and_report_json_keys(tmp_path):
    from calibrate.fit import fit_run_dir
    from calibrate.report import fidelity_report

    d = _fake_run_dir(tmp_path)
    info = fit_run_dir(d, name="test-cpu", out=tmp_path / "test-cpu.yaml", holdout=0.5)
    assert len(info["holdout_problems"]) == 2 and set(info["fit_problems"]).isdisjoint(info["holdout_problems"])
    rep = fidelity_report(d)
    assert REPORT_KEYS <= set(rep)
    assert rep["n_fit"] == 2 and rep["n_holdout"] == 2 and rep["decision_parity"] == 1.0
    assert 0 <= rep["median_abs_pct_error"] <= rep["p90_abs_pct_error"]
    assert set(rep["speedup_vs_no_kv"]) == {"exact-prefix", "rksc"}
    html = (d / "report.html").read_text()
    assert "<html>" in html and "plotly" in html.lower()


def test_report_refuses_without_fit(tmp_path):
    from calibrate.report import fidelity_report

    d = _fake_run_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="fit.json"):
        fidelity_report(d)


# ----------------------------------------------------------------------------- real model (slow)

@pytest.mark.slow
def test_tiny_real_run_parity_fit_report_cli(tmp_path):
    """CLI end to end on 2 problems x 3 branches x 6 tokens: every policy, parity 100% with the simulator."""
    from app.cli import main

    out = tmp_path / "cal"
    rc = main(["calibrate", "run", "--problems", "2", "--branches", "3", "--max-new-tokens", "6",
               "--repeats", "1", "--no-sweep", "--out", str(out)])
    assert rc == 0
    run = json.loads((out / "run.json").read_text())
    par = pd.read_parquet(out / "parity.parquet")
    assert set(par["policy"]) == {"no-kv", "exact-prefix", "asks", "cgee", "rksc"}
    assert set(par["decision"]) >= {"shared", "reused", "skipped", "exit_layer", "selected", "gen_tokens"}
    dec_rows = par[par["decision"] != "sigma_info"]
    # Every decision of every policy matches the simulator's replay of the trace: 100%. ASKS included:
    # capture and the live gate both pool the variant span alone (traces.capture_ops.gate_pool).
    assert dec_rows["match"].all(), dec_rows[~dec_rows["match"]].to_string()
    assert run["decision_parity"] == 1.0
    assert (par["decision"] == "sigma_info").any() and run["asks_sigma_max_abs_diff_vs_trace"] == 0.0
    assert run["replay_parity"] == 1.0
    dec = pd.read_parquet(out / "decisions.parquet")
    cg = dec[dec["policy"] == "cgee"]
    # level 2 really stopped some pass before layer L, or level 1 skipped the whole verification
    assert any(r["skipped"] or min(r["exit_layer"]) < 30 for r in cg.to_dict("records"))
    ph = pd.read_parquet(out / "phases.parquet")
    assert (ph["seconds"] > 0).all() and {"prefill", "decode", "verify", "gate"} <= set(ph["phase"])
    assert main(["calibrate", "fit", str(out), "--name", "tiny", "--out", str(tmp_path / "tiny.yaml")]) == 0
    assert main(["calibrate", "report", str(out), "--json"]) == 0
    from calibrate.report import fidelity_report
    assert REPORT_KEYS <= set(fidelity_report(out))


@pytest.mark.slow
def test_real_model_eviction_parity():
    """On SmolLM2 the evicting cache's decisions replay identically through run_token_eviction."""
    from traces.models import load_model
    from traces.workload import pad_ids

    torch.set_num_threads(1)
    lm = load_model("smollm2-135m", device="cpu")
    P, T = 32, 16
    ids = pad_ids(lm.tokenizer, P)
    for name in ("vase-attnv", "h2o"):
        pol = get_policy(name, budget=12, buffer=8)
        L = lm.n_layers
        c = EvictingCache(L, pol, P, lm.n_kv_heads, [np.random.default_rng([1, l]) for l in range(L)]).attach(lm.model)
        with c, torch.inference_mode():
            out = lm.model(torch.tensor([ids]), cache=c, use_cache=True)
            tok = out.logits[0, -1].argmax()
            for i in range(T):
                out = lm.model(tok.view(1, 1), cache=c, use_cache=True, position_ids=torch.tensor([[P + i]]))
                tok = out.logits[0, -1].argmax()
        assert c.n_events == 2 * L
        for li in (0, L - 1):
            res = run_token_eviction(pol, *c.ev[li].arrays(), P, np.random.default_rng([1, li]))
            assert [t for t, _ in res.steps] == [t for t, _ in c.ev[li].events]
            assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(res.steps, c.ev[li].events))


@pytest.mark.slow
def test_quality_cli_tiny(tmp_path):
    from app.cli import main

    out = tmp_path / "q"
    assert main(["calibrate", "quality", "--problems", "1", "--long-decode", "32", "--policies",
                 "streamingllm,vase-dkv", "--compression", "2,4", "--out", str(out), "--json"]) == 0
    res = json.loads((out / "quality.json").read_text())
    assert len(res["table"]) == 4 and res["spearman_proxy_vs_kl"] is not None
    df = pd.read_parquet(out / "quality.parquet")
    ev = df[df["policy"] != "full"]
    assert (ev["kl_mean"] >= 0).all() and (ev["evictions"] > 0).all()


@pytest.mark.slow
def test_quality_without_free_generation_measures_kl_and_proxy_only(tmp_path):
    from calibrate.quality import QualityConfig, run_quality

    cfg = QualityConfig(problems=1, long_decode=32, policies=("streamingllm",), compression=(2, 4, 8),
                        free_generation=False)
    res = run_quality(cfg, tmp_path / "q", progress=False)
    assert [set(r) for r in res["table"]] == [{"policy", "compression", "kl", "proxy"}] * 3
    assert res["spearman_proxy_vs_kl"] is not None and res["full_accuracy"] in (0.0, 1.0)
    df = pd.read_parquet(tmp_path / "q" / "quality.parquet")
    ev = df[df["policy"] != "full"]
    assert len(ev) == 3 and ev["answer"].isna().all() and ev["seconds"].isna().all()
    assert (ev["kl_mean"] > 0).all() and (ev["proxy_attn_err"] > 0).all()
    assert ev["budget"].is_monotonic_decreasing and (df[df["policy"] == "full"]["kl_mean"] == 0).all()


@pytest.mark.slow
def test_tree_block_pool_recomputes_evicted_blocks():
    """RSBCM tree mode: under a tight budget evicted blocks are recomputed for real; unconstrained: none."""
    from policies import get_policy
    from traces.capture import stop_ids
    from traces.datasets import load_dataset
    from traces.models import load_model
    from traces.workload import WorkloadConfig, build_prompts, verify_suffix_ids, yes_no_ids

    from calibrate.timing import PhaseTimer
    from calibrate.real_tree import run_tree

    torch.set_num_threads(1)
    lm = load_model("smollm2-135m", device="cpu")
    tk = lm.tokenizer
    p = load_dataset("gsm8k", limit=1)[0]
    prompt = build_prompts(tk, p.prompt_text(), p.answer_kind, WorkloadConfig(n_branches=1, shuffle_variants=False),
                           0).branches[0].prompt_ids
    yes, no = yes_no_ids(tk)
    # expand_k=2: a waiting node is resumed after another's expansion, so its evicted blocks are needed again
    kw = dict(depth=2, expand_k=2, branching=2, step_tokens=20, stop=set(stop_ids(tk)), yes=yes, no=no,
              suffix=verify_suffix_ids(tk), pad_id=tk.pad_token_id)
    free = run_tree(lm, prompt, p, get_policy("rsbcm"), None, **kw)
    assert free.evictions == 0 and free.recompute_tokens == 0
    t = PhaseTimer()
    budget = free.floor_blocks  # the smallest budget that holds one expansion (referenced blocks stay)
    tight = run_tree(lm, prompt, p, get_policy("fifo"), budget, timer=t, **kw)
    assert tight.peak_blocks <= budget and tight.evictions > 0 and tight.refetches > 0
    rec = t.frame()
    assert tight.recompute_tokens == int(rec.loc[rec["phase"] == "recompute", "n_new"].sum()) > 0
    # recompute_seconds spans each recompute phase (timer entry and exit included): at least their sum
    assert free.recompute_seconds == 0.0
    assert tight.recompute_seconds >= rec.loc[rec["phase"] == "recompute", "seconds"].sum() > 0
