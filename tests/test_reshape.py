"""Workload reshaping (sim/workload/reshape.py): identity, determinism, distributions, layouts, bad specs. No torch."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import main
from policies import get_policy
from sim.workload import features
from sim.api import Session as api_session
from sim.api import compare_policies, evaluate, simulate
from sim.workload.decisions import ConfigError, decide, make_config
from sim.workload.reshape import MAX_BRANCHES, MAX_GEN_TOKENS, MAX_PREFIX_TOKENS, ReshapeSpec, build_reshaped, reshape_trace
from tests.synthetic import write_synthetic_trace

from trace_files import BUNDLED  # noqa: E402
pytestmark = pytest.mark.skipif(not (BUNDLED / "manifest.json").is_file(), reason="bundled trace missing")
RESHAPE_KEYS = ("reshaped", "reshape_spec", "reshape_source")
PAPER = "prefix_tokens=1024,branches=8,gen_tokens=256"


@pytest.fixture(scope="module")
def tf():
    return features.load(BUNDLED)


def _arrays(f) -> list:
    """Every array of a ProblemFeatures, in a fixed order (for bit-identity checks)."""
    out = list(f.prompt_ids) + [f.prompt_len, f.spans, f.verify_len]
    for g in ("own", "cf"):
        out += [f.gen[g][k] for k in sorted(f.gen[g])]
    out += [f.cos[k] for k in sorted(f.cos)]
    for key in sorted(f.lens, key=repr):
        out += [f.lens[key][k] for k in sorted(f.lens[key])]
    return out


def _same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in RESHAPE_KEYS}


# ---------------------------------------------------------------------------- spec parsing
@pytest.mark.parametrize("text, field", [
    ("prefix_tokens=abc", "prefix_tokens: must be an integer"),
    ("branches=8.0", "branches: must be an integer"),
    ("gen_tokens=1e3", "gen_tokens: must be an integer"),
    ("branches=0", "branches: must be >= 1"),
    ("prefix_tokens=-4", "prefix_tokens: must be >= 1"),
    ("gen_tokens=0", "gen_tokens: must be >= 1"),
    ("seed=-1", "seed: must be >= 0"),
    (f"prefix_tokens={MAX_PREFIX_TOKENS + 1}", f"prefix_tokens: at most {MAX_PREFIX_TOKENS}"),
    (f"branches={MAX_BRANCHES + 1}", f"branches: at most {MAX_BRANCHES}"),
    (f"gen_tokens={MAX_GEN_TOKENS + 1}", f"gen_tokens: at most {MAX_GEN_TOKENS}"),
    ("gen_tokens=" + "9" * 5000, f"gen_tokens: at most {MAX_GEN_TOKENS}"),
    ("branches=-" + "9" * 5000, "branches: must be >= 1"),
    ("brnaches=8", "unknown key 'brnaches'"),
    ("branches=8,branches=4", "branches: given twice"),
    ("branches", "'branches': expected KEY=N"),
    ("branches=x" + "y" * 5000, "branches: must be an integer, got 'xyyyy"),
    ("branches=8,,gen_tokens=7,", None),
    ("", "empty"),
    (" , ", "empty"),
])
def test_bad_specs_name_the_field(text, field):
    if field is None:  # empty items are skipped
        assert ReshapeSpec.parse(text) == ReshapeSpec(branches=8, gen_tokens=7)
        return
    with pytest.raises(ConfigError) as e:
        ReshapeSpec.parse(text)
    msg = str(e.value)
    assert msg.startswith("reshape: ") and field in msg and "\n" not in msg and len(msg) < 200


def test_spec_objects_validate_and_round_trip():
    with pytest.raises(ConfigError, match="branches: must be an integer"):
        ReshapeSpec(branches=True)
    with pytest.raises(ConfigError, match="unknown key 'prefix'"):
        ReshapeSpec.coerce({"prefix": 3})
    s = ReshapeSpec.parse(" prefix_tokens = 1024 , branches=16,seed=3")
    assert s == ReshapeSpec(prefix_tokens=1024, branches=16, seed=3)
    assert ReshapeSpec.parse(s.text()) == s and s.text() == "prefix_tokens=1024,branches=16,seed=3"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="prefix_tokensbrahgd=,0123456789-+ .e", max_size=60))
def test_any_text_parses_or_fails_in_one_line(text):
    try:
        s = ReshapeSpec.parse(text)
    except ConfigError as exc:
        assert str(exc).startswith("reshape: ") and "\n" not in str(exc)
        return
    assert ReshapeSpec.parse(s.text()) == s


# ---------------------------------------------------------------------------- identity
@pytest.mark.parametrize("policy", ["no-kv", "exact-prefix", "asks", "cgee", "rksc", "lru"])
def test_identity_spec_reproduces_the_trace(policy):
    """The bundled trace's own shape (8 branches, max_new_tokens 128) draws nothing: same results."""
    kw = dict(policy=policy, model_preset="qwen2.5-7b", hardware="h100-sxm")
    a = simulate(BUNDLED, **kw)
    b = simulate(BUNDLED, reshape="branches=8,gen_tokens=128,seed=5", **kw)
    assert b.summary["reshaped"] is True and a.summary["reshaped"] is False
    assert _strip(a.summary) == _strip(b.summary)
    assert a.problems.equals(b.problems) and a.branches.equals(b.branches)


def test_identity_prefix_tokens_on_one_problem(tf):
    n0 = int(tf.problems[3].prompt_len[0])
    kw = dict(policy="asks", params={"tau": 0.975}, problems=[3], hardware="h100-sxm", model_preset="qwen2.5-7b")
    a = simulate(BUNDLED, **kw)
    b = simulate(BUNDLED, reshape=f"prefix_tokens={n0},branches=8,gen_tokens=128", **kw)
    assert _strip(a.summary) == _strip(b.summary)
    rt = reshape_trace(tf, f"prefix_tokens={n0}")
    assert all(_same(x, y) for x, y in zip(_arrays(tf.problems[3]), _arrays(rt.features.problems[3])))


# ---------------------------------------------------------------------------- determinism
def test_same_inputs_bit_identical_and_seed_matters(tf):
    spec = "prefix_tokens=1024,branches=16,gen_tokens=200,seed=3"
    r1, r2 = build_reshaped(tf, spec), build_reshaped(tf, spec)
    assert r1.features is not r2.features
    for f1, f2 in zip(r1.features.problems, r2.features.problems):
        a1, a2 = _arrays(f1), _arrays(f2)
        assert len(a1) == len(a2) and all(_same(x, y) for x, y in zip(a1, a2))
    other = build_reshaped(tf, spec.replace("seed=3", "seed=4"))
    assert any(not all(_same(x, y) for x, y in zip(_arrays(f1), _arrays(f2)))
               for f1, f2 in zip(r1.features.problems, other.features.problems))
    kw = dict(policy="rksc", hardware="h100-sxm", model_preset="qwen2.5-7b")
    assert simulate(r1, **kw).summary == simulate(r2, **kw).summary
    session = api_session(BUNDLED)
    assert session.reshaped(spec) is session.reshaped(ReshapeSpec.parse(spec))  # memoised in the caller's session
    assert reshape_trace(BUNDLED, spec).features.manifest == reshape_trace(tf, spec).features.manifest


# ---------------------------------------------------------------------------- distributions
def test_copies_resample_whole_rows_of_the_same_problem(tf):
    """Every reshaped branch is one source row: cosines, lens curves and answers all from that row."""
    rt = build_reshaped(tf, "branches=16,seed=1")
    for f0, f in zip(tf.problems, rt.features.problems):
        assert f.B == 16
        for b in range(f.B):
            rows = [j for j in range(f0.B) if all(np.array_equal(f.cos[c][b], f0.cos[c][j]) for c in f0.cos)]
            assert rows, "a branch's cosines are not one source row"
            j = rows[0] if b < f0.B else next(j for j in rows if j > 0)
            assert b >= f0.B or j == b
            for key in f0.lens:
                for k in f0.lens[key]:
                    assert np.array_equal(f.lens[key][k][b], f0.lens[key][k][j])
            for g in ("own", "cf"):
                for k in ("answer", "correct", "mean_prob", "verify_score", "len"):
                    assert f.gen[g][k][b] == f0.gen[g][k][j]
            a = f.gen["own"]["answer"]
            assert f.gen["own"]["vote_share"][b] == (0.0 if a[b] == "" else np.mean(a == a[b]))


def test_resampled_marginals_match_the_trace_over_many_seeds(tf):
    """Copies (branches 8..15) drawn over 150 seeds: per-branch means equal the trace's non-root means."""
    asks = get_policy("asks")
    want = {"correct": [], "mean_prob": [], "sigma": [], "cf_correct": []}
    got = {k: [] for k in want}
    for f in tf.problems:
        want["correct"].append(f.gen["own"]["correct"][1:].mean())
        want["cf_correct"].append(f.gen["cf"]["correct"][1:].mean())
        want["mean_prob"].append(f.gen["own"]["mean_prob"][1:].mean())
        want["sigma"].append(asks.sigma(f.cos[asks.trace_column])[1:].mean())
    seeds = range(150)
    for s in seeds:
        for f in build_reshaped(tf, f"branches=16,seed={s}").features.problems:
            got["correct"].append(f.gen["own"]["correct"][8:].mean())
            got["cf_correct"].append(f.gen["cf"]["correct"][8:].mean())
            got["mean_prob"].append(f.gen["own"]["mean_prob"][8:].mean())
            got["sigma"].append(asks.sigma(f.cos[asks.trace_column])[8:].mean())
    n = len(tf.problems)
    for k in want:
        g = np.asarray(got[k]).reshape(len(seeds), n)  # seeds x problems
        se = g.std(axis=0, ddof=1) / np.sqrt(len(seeds))
        assert np.all(np.abs(g.mean(axis=0) - np.asarray(want[k])) <= 4 * se + 1e-12), k


def test_skip_and_accuracy_kept_when_branches_are_added(tf):
    """B > B0 keeps every branch and adds copies: the best verification score and CGEE's winner/runner-up
    (mean-prob confidence) are unchanged, so accuracy and skip decisions are the trace's for every seed;
    with vote confidence the skip rate over seeds stays within sampling tolerance of the trace's."""
    kw = dict(hardware="h100-sxm", model_preset="qwen2.5-7b")
    MP = {"confidence": "mean_prob", "tau_conf": 0.5, "delta_rel": 0.05}
    base_acc = evaluate(BUNDLED, policy="no-kv", **kw)["accuracy"]
    base_skip = evaluate(BUNDLED, policy="cgee", params=MP, **kw)
    base_vote = evaluate(BUNDLED, policy="cgee", params={"tau_conf": 0.3}, **kw)["skip_rate"]
    assert 0 < base_skip["skip_rate"] < 1 and 0 < base_vote < 1
    votes = []
    for s in range(12):
        spec = f"branches=16,seed={s}"
        assert evaluate(BUNDLED, policy="no-kv", reshape=spec, **kw)["accuracy"] == base_acc
        m = evaluate(BUNDLED, policy="cgee", params=MP, reshape=spec, **kw)
        assert m["skip_rate"] == base_skip["skip_rate"] and m["accuracy"] == base_skip["accuracy"]
        votes.append(evaluate(BUNDLED, policy="cgee", params={"tau_conf": 0.3}, reshape=spec, **kw)["skip_rate"])
    # Vote shares over 16 branches are not the 8-branch ones: close, not equal (one skip = 0.083).
    assert abs(np.mean(votes) - base_vote) <= 0.15


def test_generation_lengths_scale_with_the_trace_shape(tf):
    rt = build_reshaped(tf, "gen_tokens=200,seed=2")
    old = np.concatenate([f.gen[g]["len"] for f in tf.problems for g in ("own", "cf")])
    new = np.concatenate([f.gen[g]["len"] for f in rt.features.problems for g in ("own", "cf")])
    assert new.max() <= 200 and new.min() >= 1
    assert np.array_equal(old == 128, new == 200)          # capped stays capped, nothing else reaches the cap
    assert np.all(np.abs(new - old * 200 / 128) < 1.0)     # stochastic rounding of the scaled length
    assert abs(new.mean() / old.mean() - 200 / 128) < 0.01
    for f in rt.features.problems:                          # the root's counterfactual is its own generation
        assert f.gen["own"]["len"][0] == f.gen["cf"]["len"][0]


# ---------------------------------------------------------------------------- layouts
def test_persona_prefix_at_1024_tokens(tf):
    """Variant first: exact prefix reuses (almost) nothing; ASKS shares exactly the branches its sigmas pass."""
    rt = reshape_trace(tf, "prefix_tokens=1024,branches=16")
    kw = dict(hardware="h100-sxm", model_preset="qwen2.5-7b")
    ep = simulate(rt, policy="exact-prefix", **kw)
    assert ep.summary["kv_reuse"] < 0.01
    tau = 0.975
    asks = simulate(rt, policy="asks", params={"tau": tau}, **kw)
    pol = get_policy("asks", tau=tau)
    cfg = make_config("asks", {"tau": tau}, None)
    n_share = 0
    for f in rt.features.problems:
        assert f.prompt_len[0] == 1024 and np.all(f.spans[:, 0] == tf.problems[0].spans[0, 0])
        assert np.all(f.prompt_len - (f.spans[:, 1] - f.spans[:, 0]) == 1024 - (f.spans[0, 1] - f.spans[0, 0]))
        sig = pol.sigma(f.cos[pol.trace_column])
        d = decide(f, cfg)
        assert np.array_equal(d.share[1:], sig[1:] >= tau)
        assert np.all(d.plan.reused[d.share] == 1024)
        n_share += int(d.share.sum())
    assert 0 < n_share < 15 * len(rt.features.problems)
    rows = asks.problems
    assert asks.summary["kv_reuse"] == pytest.approx(rows["reused_tokens"].sum() / rows["prompt_tokens"].sum())
    assert rows["reused_tokens"].sum() >= n_share * 1024


def test_copies_reuse_under_exact_prefix_what_their_source_does(tf):
    """A copy diverges where its source diverged from its closest sibling: with block_size 1 its exact-prefix
    reuse equals the source's best match over the trace's own branches (not the whole prompt)."""
    rt = build_reshaped(tf, "prefix_tokens=512,branches=24,seed=9")
    pol = get_policy("exact-prefix", block_size=1)
    for f0, f in zip(tf.problems, rt.features.problems):
        plan = pol.plan(f.prompt_ids)
        for b in range(f0.B, f.B):
            src = next(j for j in range(1, f0.B) if np.array_equal(f.cos["cos_mean_raw"][b], f0.cos["cos_mean_raw"][j])
                       and f.gen["own"]["answer"][b] == f0.gen["own"]["answer"][j])
            lcp_src = max(int(np.argmax(np.r_[f.prompt_ids[src][:min(len(f.prompt_ids[src]), len(f.prompt_ids[k]))]
                                              != f.prompt_ids[k][:min(len(f.prompt_ids[src]), len(f.prompt_ids[k]))],
                                              True]))
                          for k in range(f0.B) if k != src)
            assert plan.reused[b] == lcp_src < f.prompt_len[b] - 1


def test_shared_prefix_layout_grows_before_the_variant(tmp_path):
    """A hint-suffix-like prompt ([long shared][variant][short tail]): the shared text before the variant grows,
    so exact prefix reuses nearly all of the new length."""
    from sim.workload.reshape import reshape_problem

    tf = features.load(write_synthetic_trace(tmp_path / "t", n_problems=2, n_branches=4, seed=3))
    f = tf.problems[0]
    tail = np.array([7, 8, 9], np.int64)
    ids, spans = [], []
    shared = f.prompt_ids[0][f.spans[0, 1]:]
    for b in range(f.B):
        var = f.prompt_ids[b][f.spans[b, 0]:f.spans[b, 1]]
        ids.append(np.concatenate([shared, var, tail]))
        spans.append([shared.shape[0], shared.shape[0] + var.shape[0]])
    g = dataclasses.replace(f, prompt_ids=ids, spans=np.array(spans), prompt_len=np.array([len(x) for x in ids]))
    r = reshape_problem(g, ReshapeSpec(prefix_tokens=600), cap=40, vocab=2048)
    assert r.prompt_len[0] == 600 and np.all(r.spans[:, 0] == 600 - 3 - (g.spans[0, 1] - g.spans[0, 0]))
    plan = get_policy("exact-prefix", block_size=16).plan(r.prompt_ids)
    assert np.all(plan.reused[1:] >= (r.spans[1:, 0] // 16) * 16) and plan.reused[1:].min() >= 560
    short = reshape_problem(g, ReshapeSpec(prefix_tokens=40), cap=40, vocab=2048)
    assert short.prompt_len[0] == 40 and np.array_equal(short.prompt_ids[0][-3:], tail)


def test_reshape_errors_name_the_field(tf, tmp_path):
    with pytest.raises(ConfigError, match=r"^reshape: prefix_tokens: 5 is too short for problem"):
        build_reshaped(tf, "prefix_tokens=5")
    one = features.load(write_synthetic_trace(tmp_path / "one", n_problems=1, n_branches=1, seed=0))
    with pytest.raises(ConfigError, match=r"^reshape: branches: problem 0 has only its root branch"):
        build_reshaped(one, "branches=4")
    with pytest.raises(ConfigError, match="already reshaped"):
        build_reshaped(build_reshaped(tf, "branches=4").features, "branches=8")


# ---------------------------------------------------------------------------- outputs and CLI
def test_outputs_say_reshaped_and_from_what(tf):
    r = simulate(BUNDLED, policy="asks", reshape=PAPER + ",seed=7", hardware="h100-sxm", model_preset="qwen2.5-7b")
    assert r.summary["reshaped"] is True and r.summary["reshape_spec"] == PAPER + ",seed=7"
    assert r.info["reshape"]["source"] == tf.path and r.info["reshape"]["seed"] == 7
    assert r.info["reshape"]["source_shape"]["branches"] == 8
    # the paper's shape batches 8 x ~1,030-token prefills: past local-cpu's fitted 2,048 tokens per iteration
    out = compare_policies(BUNDLED, policies=["no-kv", "rksc"], reshape=PAPER, hardware="h100-sxm",
                           model_preset="qwen2.5-7b")
    assert out["reshape"]["spec"] == PAPER + ",seed=0"
    assert all(m["reshaped"] is True for m in out["policies"].values())
    assert "reshape" not in compare_policies(BUNDLED, policies=["no-kv"])


def test_cli_reshape_flag(capsys):
    assert main(["simulate", "--policy", "rksc", "--reshape", "branches=16,gen_tokens=256", "--json",
                 "--model-preset", "qwen2.5-7b", "--hardware", "h100-sxm"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reshaped"] is True and out["info"]["reshape"]["spec"] == "branches=16,gen_tokens=256,seed=0"
    for argv in (["simulate", "--policy", "asks", "--reshape", "branches=0"],
                 ["compare", "--policies", "no-kv", "--reshape", "gen_tokens=x"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("rksim: error: --reshape: ") and "\n" not in err


def test_sweep_options_carry_the_spec():
    from sim.search.sweep import SweepOptions

    assert SweepOptions(reshape="branches=16").kwargs()["reshape"] == "branches=16,seed=0"
    assert "reshape" not in SweepOptions().kwargs()
    with pytest.raises(ValueError, match=r"^--reshape: branches: must be >= 1"):
        SweepOptions(reshape="branches=0")


def test_sweep_cli_reshape_rows_equal_evaluate(tmp_path):
    from sim.search.sweep import read_sweep

    out = tmp_path / "s.parquet"
    spec = "prefix_tokens=1024,branches=16"
    assert main(["sweep", "--trace", str(BUNDLED), "--hardware", "h100-sxm", "--policy", "asks", "--grid",
                 "tau=0.97,0.98", "--reshape", spec, "--quiet", "--out", str(out)]) == 0
    df, meta = read_sweep(out)
    assert meta["options"]["reshape"] == spec + ",seed=0"
    assert df["reshaped"].all() and (df["reshape_spec"] == spec + ",seed=0").all()
    for _, row in df.iterrows():
        m = evaluate(BUNDLED, policy="asks", params={"tau": row["param.tau"]}, hardware="h100-sxm", reshape=spec)
        assert m["latency_mean_s"] == row["latency_mean_s"] and m["kv_reuse"] == row["kv_reuse"]


def test_engine_and_serving_replay_a_reshaped_trace_like_a_loaded_one(tf):
    rt = reshape_trace(tf, "prefix_tokens=1024,branches=12,gen_tokens=256,seed=2")
    kw = dict(policy="rksc", hardware="h100-sxm", model_preset="qwen2.5-7b", problems=[0, 5], baselines=False)
    fast, eng = simulate(rt, **kw), simulate(rt, engine=True, **kw)
    assert eng.summary["latency_mean_s"] == pytest.approx(fast.summary["latency_mean_s"], rel=1e-9)
    srv = simulate(rt, mode="serving", **kw)
    assert srv.summary["reshaped"] is True and srv.summary["n_problems"] == 2


@pytest.fixture(scope="module")
def syn(tmp_path_factory):
    return features.load(write_synthetic_trace(tmp_path_factory.mktemp("rs") / "t", n_problems=3, n_branches=4,
                                               seed=11))


@settings(max_examples=40, deadline=None)
@given(N=st.one_of(st.none(), st.integers(20, 400)), B=st.one_of(st.none(), st.integers(1, 12)),
       T=st.one_of(st.none(), st.integers(1, 300)), seed=st.integers(0, 2 ** 32))
def test_any_shape_is_what_was_asked_and_rows_are_the_sources(syn, N, B, T, seed):
    rt = build_reshaped(syn, ReshapeSpec(prefix_tokens=N, branches=B, gen_tokens=T, seed=seed))
    cap = 40  # the synthetic trace's max_new_tokens
    for f0, f in zip(syn.problems, rt.features.problems):
        assert f.B == (B or f0.B) and f.prompt_len[0] == (N or f0.prompt_len[0])
        assert all(f.prompt_len[b] == len(f.prompt_ids[b]) for b in range(f.B))
        assert np.all(f.spans[:, 1] - f.spans[:, 0] >= 1) and np.all(f.spans[:, 1] <= f.prompt_len)
        for g in ("own", "cf"):
            assert f.gen[g]["len"].max() <= (T or cap) and f.gen[g]["len"].min() >= 1
        for b in range(f.B):  # each branch is one source row: its sigma inputs and its answers together
            src = [j for j in range(f0.B) if np.array_equal(f.cos["cos_mean_raw"][b], f0.cos["cos_mean_raw"][j])
                   and np.array_equal(f.lens[("own", True)]["entropy"][b], f0.lens[("own", True)]["entropy"][j])
                   and f.gen["cf"]["answer"][b] == f0.gen["cf"]["answer"][j]]
            assert src and (b > 0 or 0 in src)
