"""rksim's serving scheduler against recorded decisions of vLLM 0.33's V1 scheduler (no vLLM here).

``tests/data/vllm_steps/*.json.gz`` hold the first 300 steps vLLM's ``Scheduler`` took on streams
of ``make reference-check-vllm`` (``scripts/reference_check_vllm.py --record``): scheduled
requests and token counts, tokens computed before the step, preemptions, finished requests, free
blocks. rksim's scheduler + block manager replay each stream and must take the same steps; with
the ``n - 1`` rule, the same-step-hit rule or the duplicate-block rule removed they must not.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from sim.serving.kvcache import BlockManager
from sim.serving.scheduler import Request, Scheduler, SchedulerConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vllm_steps"
FILES = sorted(DATA.glob("*.json.gz"))


def _load_module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RC = _load_module("reference_check_vllm")
C = _load_module("reference_check_vllm_common")
POLICY = {True: "vllm-v1", False: "vllm-v1-chunk-admit"}


def _load(name):
    with gzip.open(DATA / name) as f:
        return json.loads(f.read())


def _replay(d, kv_factory=None, side_cls=None):
    side = (side_cls or RC.RksimSide)(d["stream"]["config"], POLICY[d["scheduler_reserve_full_isl"]], kv_factory)
    return C.compare(C.drive(d["stream"], side, stop_after=len(d["steps"])), d["steps"])


def test_recorded_logs_present():
    names = {f.name for f in FILES}
    assert {"same-step-hits-reserve-full-isl-true.json.gz", "whole-prompt-hits-reserve-full-isl-true.json.gz",
            "kv-exhaustion-reserve-full-isl-true.json.gz", "closed-loop-reserve-full-isl-true.json.gz",
            "closed-loop-reserve-full-isl-false.json.gz"} <= names


@pytest.mark.parametrize("path", FILES, ids=[f.name.split(".")[0] for f in FILES])
def test_rksim_takes_vllms_steps(path):
    d = _load(path.name)
    assert d["vllm_version"] == "0.33.0" and d["vllm_scheduler"] == "Scheduler"
    assert len(d["steps"]) == 300
    c = _replay(d)
    assert c["first_divergence"] is None, json.dumps(c["first_divergence"])
    assert c["steps_agreeing"] == c["steps_compared"] == 300


def test_admission_rule_is_what_the_logs_tell_apart():
    """The two admission settings take different steps on the closed-loop stream; each matches its own."""
    t, f = _load("closed-loop-reserve-full-isl-true.json.gz"), _load("closed-loop-reserve-full-isl-false.json.gz")
    assert C.compare(t["steps"], f["steps"])["first_divergence"] is not None
    assert sum(len(r["p"]) for r in f["steps"]) > sum(len(r["p"]) for r in t["steps"])  # chunk-only admission thrashes
    crossed = dict(t, scheduler_reserve_full_isl=False)   # rksim's chunk-only rule against vLLM's default
    assert _replay(crossed)["first_divergence"] is not None


# ---------------------------------------------------------------------------------- rules removed
class _NoHitCap(BlockManager):
    """The ``n - 1`` rule removed: a whole-prompt hit is used in full."""

    def find_cached(self, req, count=True):
        return super().find_cached(_FullHit(req), count)


class _FullHit:
    def __init__(self, req):
        self.__dict__["_r"] = req

    def __getattr__(self, k):
        return True if k == "allow_full_hit" else getattr(self._r, k)


class _KeyAfterStep(BlockManager):
    """The same-step-hit rule removed: blocks are keyed once the step that computes them has run,
    so a request admitted in the same step cannot hit them."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.pending = []

    def _register(self, req, blks, full):
        self.pending.append((req, blks, full))

    def flush(self):
        for req, blks, full in self.pending:
            if self.req_blocks.get(req.req_id) is blks:
                BlockManager._register(self, req, blks, full)
        self.pending = []


class _FlushSide(RC.RksimSide):
    def step(self):
        rec = super().step()
        self.kv.flush()
        return rec


class _NoDuplicates(BlockManager):
    """A block whose key is already cached stays unkeyed (freed straight to the clean pool)."""

    def _register(self, req, blks, full):
        for k in range(self._n_keyed.get(req.req_id, 0), min(full, len(blks))):
            if self.key(req, k) in self.cached:
                blks[k].key = -1   # mark: skip keying below
        super()._register(req, blks, full)
        for b in blks:
            if b.key == -1:
                b.key = None


def test_removing_the_n_minus_1_rule_breaks_agreement():
    c = _replay(_load("whole-prompt-hits-reserve-full-isl-true.json.gz"), kv_factory=_NoHitCap)
    assert c["first_divergence"] is not None and c["steps_agreeing"] < 300


def test_removing_the_same_step_hit_rule_breaks_agreement():
    d = _load("same-step-hits-reserve-full-isl-true.json.gz")
    c = _replay(d, kv_factory=_KeyAfterStep, side_cls=_FlushSide)
    assert c["first_divergence"] is not None and c["steps_agreeing"] < 300


def test_removing_duplicate_keying_breaks_agreement():
    c = _replay(_load("whole-prompt-hits-reserve-full-isl-true.json.gz"), kv_factory=_NoDuplicates)
    assert c["first_divergence"] is not None


# ---------------------------------------------------------------------------------- unit cases
def _req(rid, n, out=4, content=None):
    return Request(rid, prompt_tokens=n, max_output_tokens=out, content=content)


@pytest.mark.parametrize("policy,admitted", [("vllm-v1", False), ("vllm-v1-chunk-admit", True)])
def test_full_prompt_admission(policy, admitted):
    """10 blocks of 4, 5 tokens per step; a decoding request holds 7 blocks; a 24-token prompt (6 blocks)
    gets the 4 tokens left: chunk-only admission takes it (1 block), full-prompt admission leaves it waiting."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=5, policy=policy), BlockManager(10, 4, caching=False))
    a = _req("a", 24, out=8)
    s.add(a)
    while a.num_output_tokens == 0:            # a's prompt in chunks of 5
        s.update(s.schedule())
    s.add(_req("b", 24))
    out = s.schedule()                         # a decodes its 25th token (7th block); 4 tokens left
    assert [(it.req.req_id, it.num_new) for it in out.items] == [("a", 1)] + ([("b", 4)] if admitted else [])
    assert s.kv.num_free == (2 if admitted else 3)
    assert SchedulerConfig().policy == "vllm-v1" and SchedulerConfig().reserve_full_prompt


def test_long_prefill_threshold_only_with_company():
    """vLLM 0.33 caps a chunk at long_prefill_token_threshold only when more than one request runs or waits."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16), BlockManager(100, 4))
    s.add(_req("a", 40))
    assert [it.num_new for it in s.schedule().items] == [40]
    s2 = Scheduler(SchedulerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16), BlockManager(100, 4))
    s2.add(_req("a", 40))
    s2.add(_req("b", 40))
    assert [it.num_new for it in s2.schedule().items] == [16, 16]


def test_duplicate_blocks_are_cached_and_hand_over_their_key():
    """A whole-prompt hit recomputes the last block: the copy is cached too; evicting the first copy
    leaves the second serving the key (vLLM's BlockHashToBlockMap)."""
    toks = list(range(8))

    def content(k):
        return tuple(toks[4 * k:4 * k + 4])

    bm = BlockManager(6, 4)
    s = Scheduler(SchedulerConfig(), bm)
    s.add(_req("a", 8, out=1, content=content))
    s.update(s.schedule())                     # a: 2 full blocks, finished -> both cached, evictable
    s.add(_req("b", 8, out=1, content=content))
    out = s.schedule()
    assert out.items[0].num_cached == 4 and out.items[0].num_new == 4   # n - 1: the last block is recomputed
    key1 = bm.key(out.items[0].req, 1)
    first = bm.cached[key1]
    s.update(out)
    assert len(bm._dups[key1]) == 1 and first not in bm._dups[key1].values()
    bm.check()
    (second,) = bm._dups[key1].values()
    # 3 clean blocks left, then LRU: a's last block (the first copy) is evicted first
    s.add(_req("c", 16, out=1))
    s.schedule()
    assert bm.evictions == 1 and bm.cached[key1] is second and key1 not in bm._dups
    bm.check()
