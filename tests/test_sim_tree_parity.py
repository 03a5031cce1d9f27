"""Decision parity of tree mode: calibrate.real_tree.run_tree (real model, the serving block manager) vs sim.replay.tree.walk_tree.

The real runner grows a tree on SmolLM2-135M under a block budget; the simulator replays the tree
it grew. Both drive the one walk (sim.replay.tree.TreeBlocks / select_frontier / unconstrained_budget);
this checks that the runner feeds it the same segments, scores and depths as the trace replay and
that what it really computes and times follows it: every block touch (block, score, depth, time,
hit), every eviction, the preemptions, and every operation the runner timed (items of each verify / prefill /
recompute / decode / assemble phase) must be equal.
Slow (real model, ~40 s on one core); the rest of tree mode is tested without torch in test_sim_tree.py.
"""
from __future__ import annotations

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lm():
    from traces.models import load_model
    torch.set_num_threads(1)
    return load_model("smollm2-135m", device="cpu")


def _grow(lm, monkeypatch, policy, budget, D=2, K=2, B=3, S=16):
    from calibrate import real_phases as E
    from calibrate.timing import PhaseTimer
    from calibrate.real_tree import run_tree
    from policies import get_policy
    from traces import capture_ops as CO
    from traces.capture import stop_ids
    from traces.datasets import load_dataset
    from traces.workload import WorkloadConfig, build_prompts, verify_suffix_ids, yes_no_ids

    from sim.replay.tree import TreeSpec, select_frontier

    rec: dict = {"gens": [], "scores": []}

    sd, vb = CO.sample_decode, E.verify_batch

    def rec_sd(*a, **k):
        r = sd(*a, **k)
        rec["gens"].append([list(g) for g in r.gen_ids])
        return r

    def rec_vb(*a, **k):
        r = vb(*a, **k)
        rec["scores"].append([float(s) for s in r.scores])
        return r

    monkeypatch.setattr(CO, "sample_decode", rec_sd)
    monkeypatch.setattr(E, "verify_batch", rec_vb)
    tk = lm.tokenizer
    p = load_dataset("gsm8k", limit=1)[0]
    prompt = build_prompts(tk, p.prompt_text(), p.answer_kind, WorkloadConfig(n_branches=1, shuffle_variants=False),
                           0).branches[0].prompt_ids
    yes, no = yes_no_ids(tk)
    stop, suffix = sorted(set(stop_ids(tk))), verify_suffix_ids(tk)
    timer = PhaseTimer()
    res = run_tree(lm, prompt, p, get_policy(policy), budget, timer=timer, depth=D, expand_k=K, branching=B,
                   step_tokens=S, stop=set(stop), yes=yes, no=no, suffix=suffix, pad_id=tk.pad_token_id)
    # the tree the run grew: generations in call order, children of the frontier chosen by the runner's rule
    rows = [dict(node=0, parent=-1, depth=0, n_tokens=len(prompt), context_len=0, token_ids=list(prompt),
                 score=rec["scores"][0][0])]
    paths, frontier, calls, done = {0: []}, [0], iter(rec["gens"]), {}
    for d in range(1, D + 1):
        if not frontier:
            break
        level = []
        for par in frontier:
            for g in next(calls):
                nid = len(rows) + len(level)
                level.append(dict(node=nid, parent=par, depth=d, n_tokens=len(g),
                                  context_len=len(prompt) + len(paths[par]), token_ids=g))
                paths[nid], done[nid] = paths[par] + g, bool(g and g[-1] in stop)
        for n, s in zip(level, rec["scores"][d]):
            n["score"] = s
        rows += level
        frontier = select_frontier([n["node"] for n in level], {n["node"]: n["score"] for n in level}, done, K)
    for r in rows:
        r["expanded"] = any(q["parent"] == r["node"] for q in rows)
    spec = TreeSpec(pd.DataFrame(rows), {"depth": D, "expand_k": K, "branching": B, "step_tokens": S}, suffix, stop,
                    name="grown")
    monkeypatch.undo()
    return res, timer.frame(), spec


def _same(res, phases, spec, policy, budget):
    from sim.replay.tree import walk_tree

    w = walk_tree(spec, policy, budget_blocks=budget, budget_frac=None)
    tb = w.blocks
    assert [(t.block, t.score, t.depth, t.now, t.hit) for t in tb.touches] == res.touches
    assert tb.evicted_log == res.eviction_order
    assert (tb.bm.evictions, tb.refetches, tb.recompute_tokens, tb.peak, tb.preemptions, tb.floor) == \
           (res.evictions, res.refetches, res.recompute_tokens, res.peak_blocks, res.preemptions, res.floor_blocks)
    for phase in ("verify", "prefill", "recompute", "decode", "assemble"):
        rows = phases[phases["phase"] == phase]
        real = [([int(r["cand"])], []) if phase == "assemble" else ([int(x) for x in r["n"]], [int(x) for x in r["c"]])
                for _, r in rows.iterrows()]
        assert real == w.ops[phase], phase
    return w


def test_tree_walk_equals_the_real_runner(lm, monkeypatch):
    free, ph, spec = _grow(lm, monkeypatch, "rsbcm", None)
    _same(free, ph, spec, "rsbcm", None)
    # between one expansion's working set (the floor: referenced blocks are never evicted) and the peak
    budget = max(free.floor_blocks, int(round(0.5 * free.peak_blocks)))
    assert budget < free.peak_blocks
    for policy in ("rsbcm", "fifo"):
        res, ph, spec = _grow(lm, monkeypatch, policy, budget)
        w = _same(res, ph, spec, policy, budget)
        assert w.blocks.bm.evictions > 0
