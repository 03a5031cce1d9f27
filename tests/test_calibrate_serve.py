"""calibrate serve: the real continuous-batching loop, its paged KV, its replay by the simulator, the CLI.

Fast tests use a tiny random Llama (hand-built requests); the ``slow`` one the real SmolLM2-135M.
"""
from __future__ import annotations

import json
import types

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from tiny_hf import tiny_llama  # noqa: E402

from calibrate import serve as S  # noqa: E402
from calibrate import serve_workload as W  # noqa: E402
from calibrate.serve_forward import Item, PagedKV, run_iteration  # noqa: E402

SUMMARY_KEYS = {"scheduling_parity", "makespan_error", "throughput_error", "e2e_median_abs_pct_error",
                "n_iterations", "preemptions"}


@pytest.fixture(scope="module")
def tiny():
    model = tiny_llama(0)
    return types.SimpleNamespace(model=model, dtype=torch.float32, device=torch.device("cpu"))


def _logits_alone(model, tokens):
    """Reference: last-position logits of one sequence, computed from scratch (no KV cache)."""
    with torch.inference_mode():
        return model(torch.tensor([list(tokens)])).logits[0, -1].float()


def test_paged_forward_equals_model_forward(tiny):
    """Packed chunks + decode over paged KV (with a prefix read from another sequence's blocks) = HF forward."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 300, (21,), generator=g).tolist()
    b = a[:8] + torch.randint(0, 300, (5,), generator=g).tolist()   # shares a's first block (block size 8)
    kv = PagedKV(tiny, num_blocks=8, block_size=8, initial_blocks=1)   # grows as block ids 3, 5, 6 appear
    ta, tb = [3, 0, 5], [3, 6]                                     # b's block 0 *is* a's block 3
    r1 = run_iteration(tiny, kv, [Item("a", a[:12], 0, kv.slots(ta, 12), False)])
    assert r1 == {}
    r2 = run_iteration(tiny, kv, [Item("a", a[12:], 12, kv.slots(ta, 21), True),
                                  Item("b", b[8:], 8, kv.slots(tb, 13), True)])
    r3 = run_iteration(tiny, kv, [Item("a", [7], 21, kv.slots(ta, 22), True),
                                  Item("b", [9], 13, kv.slots(tb, 14), True)])
    with torch.inference_mode():
        ref = {k: tiny.model(torch.tensor([s])).logits[0, -1] for k, s in
               (("a", a), ("b", b), ("a7", a + [7]), ("b9", b + [9]))}
    for got, want in ((r2["a"], ref["a"]), (r2["b"], ref["b"]), (r3["a"], ref["a7"]), (r3["b"], ref["b9"])):
        torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-4)


def test_paged_kv_memory_follows_blocks_used_not_capacity(tiny):
    kv = PagedKV(tiny, num_blocks=10 ** 12, block_size=16)
    assert kv.n_slots == 64 * 16
    kv.slots([200], 1)
    assert kv.n_slots == 256 * 16
    with pytest.raises(RuntimeError, match="capacity"):
        PagedKV(tiny, num_blocks=4, block_size=16).slots([4], 1)


def _tiny_cfg(**kw):
    base = dict(problems=3, capacity_tokens=64, concurrency=2, branches=2, max_new_tokens=10, block_size=8,
                temperature=0.0, model_preset="smollm2-135m", hardware="local-cpu", warmup=False)
    base.update(kw)
    return S.ServeConfig(**base)


def _tiny_requests(cfg, seed=0):
    """Problem j: a shared 16-token system prefix, then its own text; its branches differ in the last tokens."""
    rng = np.random.default_rng(seed)
    system = rng.integers(3, 300, 16).tolist()
    users = W.closed_loop_users(cfg.problems, cfg.concurrency)
    user_of = {p: u for u, ps in enumerate(users) for p in ps}
    reqs = []
    for j in range(cfg.problems):
        body = rng.integers(3, 300, 9 + 3 * j).tolist()
        for b in range(cfg.branches):
            tail = rng.integers(3, 300, 3).tolist()
            reqs.append(W.Request(rid=j * cfg.branches + b, problem=j, problem_index=j, branch=b, user=user_of[j],
                                  prompt=system + body + tail, max_new=cfg.max_new_tokens))
    return reqs


@pytest.mark.parametrize("scheduler, policy, budget", [("vllm-v1", "lru", 24), ("prefill-first", "fifo", 2048)])
def test_tiny_loop_agrees_with_replay_and_computes_the_right_logits(tiny, scheduler, policy, budget):
    cfg = _tiny_cfg(scheduler=scheduler, block_policy=policy, max_num_batched_tokens=budget)
    reqs = _tiny_requests(cfg)
    seen = {}
    rows, rq, sim_rows, info, cmp, _ = S.serve_requests(
        tiny, cfg, reqs, stop=[], logits_hook=lambda rid, lg: seen.setdefault(rid, []).append(lg.clone()))
    # the capacity binds: preemption by recompute happened, and prefix blocks were reused
    assert sum(len(p) for p in rows["preempted"]) > 0
    assert rows["recompute_tokens"].sum() > 0
    assert rows["cache_hit_tokens"].sum() > 0
    assert rows["kv_blocks_used"].max() <= cfg.num_blocks
    chunked = any(n > 1 and not smp for ns, ss in zip(rows["n"], rows["sample"]) for n, smp in zip(ns, ss))
    assert chunked == (scheduler == "vllm-v1")      # a 24-token budget splits prompts into chunks
    # iteration for iteration, the replay scheduled the same items and preemptions
    assert cmp["scheduling_parity"] == 1.0
    assert len(rows) == len(sim_rows) == cmp["n_iterations"]
    for col in ("seqs", "n", "c", "sample", "preempted", "finished"):
        assert [list(x) for x in rows[col]] == [list(x) for x in sim_rows[col]], col
    # KV reuse (prefix hits, blocks shared in place) and recompute after preemption change no logit:
    # every row a token was sampled from equals a from-scratch forward of the tokens before it
    for r in reqs:
        assert len(r.out) == cfg.max_new_tokens == len(seen[r.rid])
        for k, lg in enumerate(seen[r.rid]):
            torch.testing.assert_close(lg, _logits_alone(tiny.model, r.prompt + r.out[:k]), atol=1e-4, rtol=1e-4)
    assert (rows["cpu_s"] > 0).all() and (sim_rows["sim_s"] > 0).all()
    assert np.isfinite([cmp["makespan_error"], cmp["throughput_error"], cmp["e2e_median_abs_pct_error"]]).all()


def test_tiny_loop_stop_token_ends_requests_early_and_replay_follows(tiny):
    cfg = _tiny_cfg()
    reqs = _tiny_requests(cfg)
    stop = int(_logits_alone(tiny.model, reqs[0].prompt).argmax())   # request 0's first greedy token
    rows, rq, sim_rows, info, cmp, _ = S.serve_requests(tiny, cfg, reqs, stop=[stop])
    assert reqs[0].out == [stop]
    assert all(r.out[-1] == stop or len(r.out) == cfg.max_new_tokens for r in reqs)
    assert (rq["gen_len"] == rq["sim_gen_len"]).all()
    assert cmp["scheduling_parity"] == 1.0 and len(rows) == len(sim_rows)


def test_closed_loop_submits_next_problem_when_previous_answered():
    cfg = _tiny_cfg(problems=5, concurrency=2)
    reqs = _tiny_requests(cfg)
    loop = W.ClosedLoop(reqs, cfg.concurrency)
    first = loop.first()
    assert [(r.problem, r.branch) for r in first] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert loop.finished([first[0]]) == []                          # problem 0 still has a branch running
    nxt = loop.finished([first[1]])
    assert [(r.problem, r.user) for r in nxt] == [(2, 0), (2, 0)]   # user 0's next problem
    assert [r.problem for r in loop.finished(first[2:])] == [3, 3]


@given(n=st.integers(1, 12), k=st.integers(1, 5), b=st.integers(1, 3), seed=st.integers(0, 10 ** 6))
@settings(max_examples=60, deadline=None)
def test_closed_loop_submits_each_problem_once_in_user_order(n, k, b, seed):
    cfg = _tiny_cfg(problems=n, concurrency=k, branches=b)
    reqs = _tiny_requests(cfg)
    loop = W.ClosedLoop(reqs, k)
    live = loop.first()
    submitted = [r.problem for r in live]
    rng = np.random.default_rng(seed)
    while live:
        done = live.pop(int(rng.integers(len(live))))      # requests finish in any order
        new = loop.finished([done])
        submitted += [r.problem for r in new]
        live += new
        assert len({r.problem for r in live}) <= k
    assert sorted(submitted) == sorted(p for p in range(n) for _ in range(b))
    for u, ps in enumerate(W.closed_loop_users(n, k)):
        assert [p for p in dict.fromkeys(submitted) if p % k == u] == ps


def test_compare_counts_a_differing_iteration():
    rows = pd.DataFrame({"seqs": [[0, 1], [0, 1], [0]], "n": [[5, 4], [1, 1], [1]], "c": [[0, 0], [5, 4], [6]],
                         "preempted": [[], [], [1]], "cpu_s": [1.0, 0.1, 0.1]})
    sim = rows.rename(columns={"cpu_s": "sim_s"}).copy()
    rq = pd.DataFrame({"problem": [0, 0], "arrival_iter": [0, 0], "finish_iter": [2, 1], "gen_len": [3, 2]})
    assert S.compare(rows, sim, rq, "cpu")["scheduling_parity"] == 1.0
    sim.at[2, "preempted"] = []
    res = S.compare(rows, sim, rq, "cpu")
    assert res["scheduling_parity"] == pytest.approx(2 / 3) and res["first_mismatch_iteration"] == 2
    assert S.compare(rows, sim.iloc[:2], rq.assign(finish_iter=[1, 1]), "cpu")["scheduling_parity"] == pytest.approx(2 / 3)
    sim["sim_s"] = [1.1, 0.11, 0.11]
    res = S.compare(rows, sim, rq, "cpu")
    assert res["makespan_error"] == pytest.approx(0.1) and res["e2e_median_abs_pct_error"] == pytest.approx(10.0)
    assert res["throughput_error"] == pytest.approx(1 / 1.1 - 1)


def test_phases_table_records_both_clocks_and_the_rows_sampled():
    """What `calibrate fit DIR` reads from a serve run: CPU time as cpu_seconds (not wall time under
    another name), wall time as seconds, and the rows sampled, so the sampling term is fitted on them."""
    from calibrate.fit import phase_terms
    from calibrate.timing import select_clock
    from sim.cost.terms import TERM_NAMES
    from sim.cost.profiles import load_model

    rows = pd.DataFrame({"n": [[30, 1, 1], [1]], "c": [[0, 40, 50], [41]], "sample": [[False, True, True], [True]],
                         "wall_s": [0.9, 0.2], "cpu_s": [0.5, 0.04]})
    ph = S.phases_table(rows)
    assert list(ph["seconds"]) == [0.9, 0.2] and list(ph["cpu_seconds"]) == [0.5, 0.04]
    assert list(ph["sampled"]) == [2, 1]
    secs, _, used, _ = select_clock(ph, None, "cpu", "cpu")
    assert used == "cpu" and list(secs) == [0.5, 0.04]
    A = phase_terms(load_model("smollm2-135m"), ph)
    V = load_model("smollm2-135m").vocab_size
    assert list(A[TERM_NAMES.index("samples")]) == [2 * V, V]
    mv = A[TERM_NAMES.index("b_lin_mv")]
    assert mv[0] == 0 and mv[1] == A[TERM_NAMES.index("b_lin")][1] > 0   # the lone decode is a GEMV


def test_write_run_is_atomic_and_never_clobbers_other_folders(tmp_path):
    out = tmp_path / "run"
    S.write_run(out, {S.SUMMARY_FILE: b"{}\n", "iterations.parquet": b"x"})
    assert sorted(p.name for p in out.iterdir()) == ["iterations.parquet", S.SUMMARY_FILE]
    S.write_run(out, {S.SUMMARY_FILE: b'{"a": 1}\n'})          # an earlier run is replaced whole
    assert [p.name for p in out.iterdir()] == [S.SUMMARY_FILE]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="--out"):
        S.write_run(other, {S.SUMMARY_FILE: b"{}"})
    assert (other / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("args, flag", [
    (["--problems", "0"], "--problems"), (["--problems", "-2"], "--problems"), (["--problems", "two"], "--problems"),
    (["--capacity-tokens", "0"], "--capacity-tokens"), (["--capacity-tokens", "1e3"], "--capacity-tokens"),
    (["--capacity-tokens", "8"], "--capacity-tokens"),            # less than one block
    (["--concurrency", "0"], "--concurrency"), (["--concurrency", "1.5"], "--concurrency"),
    (["--max-num-seqs", "-1"], "--max-num-seqs"), (["--max-num-batched-tokens", "x"], "--max-num-batched-tokens"),
    (["--block-size", "0"], "--block-size"), (["--clock", "sundial"], "--clock"),
    (["--clock", "cpu", "--threads", "2"], "--clock"),
    (["--scheduler", "sjf"], "--scheduler"), (["--block-policy", "h2o"], "--block-policy"),
    (["--layout", "zigzag"], "--layout"), (["--hardware", "tpu-v9"], "--hardware"),
    (["--concurrency", None], "--concurrency"),
])
def test_bad_flags_are_one_line_naming_the_flag(args, flag, capsys, tmp_path):
    from app.cli import main
    base = {"--capacity-tokens": "256", "--concurrency": "2"}
    argv = ["calibrate", "serve", "--out", str(tmp_path / "o")]
    given = dict(zip(args[::2], args[1::2]))
    for k, v in {**base, **given}.items():
        if v is not None:
            argv += [k, v]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rksim: error:") and "\n" not in err and flag in err, err
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- real model (slow)

@pytest.mark.slow
def test_real_model_serve_agrees_with_simulator_iteration_for_iteration(tmp_path, capsys):
    """SmolLM2-135M, 3 problems x 2 branches, 256 KV tokens: preemption happens; the replay schedules the same."""
    from app.cli import main

    out = tmp_path / "serve"
    # --allow-other-host: this test checks the scheduling, not the prices, so it runs on any CPU (the shipped
    # local-cpu is refused on a host it was not fitted on without it: test_host_profiles)
    assert main(["calibrate", "serve", "--problems", "3", "--branches", "2", "--concurrency", "2",
                 "--capacity-tokens", "256", "--max-new-tokens", "10", "--out", str(out), "--json",
                 "--allow-other-host"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert SUMMARY_KEYS <= set(s)
    assert s["scheduling_parity"] == 1.0
    assert s["preemptions"] > 0 and s["prefix_hit_tokens"] > 0
    it = pd.read_parquet(out / "iterations.parquet")
    rq = pd.read_parquet(out / "requests.parquet")
    assert len(it) == s["n_iterations"] and len(rq) == 6
    assert (it["kv_blocks_used"] <= 256 // 16).all()
    assert [list(x) for x in it["seqs"]] == [list(x) for x in it["sim_seqs"]]
    assert json.loads((out / S.SUMMARY_FILE).read_text())["scheduling_parity"] == 1.0
    for k in ("makespan_error", "throughput_error"):
        assert abs(s[k]) < 1.0, (k, s[k])     # sanity (the goal, 5 %, is measured and reported, not asserted)
    # the replay is deterministic: rescoring the saved run gives the same simulated makespan
    assert main(["calibrate", "serve", "--rescore", str(out), "--json", "--allow-other-host"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["makespan_sim_s"] == s["comparison"]["makespan_sim_s"] and again["scheduling_parity"] == 1.0
