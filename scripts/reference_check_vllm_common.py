"""Request streams, the step loop and the step comparison shared by both sides of
``make reference-check-vllm`` (standard library only: it runs in the project venv and in
vLLM's own venv, which never imports rksim).

A *stream* (JSON) is a scheduler setting plus groups of requests::

    {"name": ..., "about": ...,
     "config": {"block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens",
                "long_prefill_token_threshold", "prefix_caching"},
     "arrival": {"kind": "closed", "concurrency": C} | {"kind": "poisson"},
     "groups": [{"arrive": tick | null, "requests": [
         {"id": int, "prompt": [[segment, start, length], ...], "out": segment, "max_tokens": M}]}]}

Token ``j`` of a segment ``s`` is :func:`token` ``(s, j)`` (a 64-bit mix, so two segments
never share a block by accident); requests share a prefix by naming the same segment.
Output token ``i`` of a request is ``token(out, i)``: the fake model "samples" it when the
request's known tokens are all computed, so both schedulers see the same token ids and
the same block hashes, generated blocks included.

The loop (:func:`drive`) is the same on both sides: closed loop adds the next group
while fewer than ``C`` groups are unfinished; Poisson adds every group whose arrival
tick has come (one tick per loop turn, idle turns included). Each step records

* ``s``: the scheduled requests in the scheduler's order, ``[id, computed_before, new]``
  (``computed_before`` includes a prefix-cache hit at admission),
* ``p``: requests preempted while forming the step, in order,
* ``f``: requests finished by the step, in order,
* ``fs`` / ``fu``: free KV blocks (clean + evictable cache) after schedule / after update.
"""
from __future__ import annotations

import json
import os
import random

MASK = (1 << 64) - 1
VOCAB = 50000           # token ids are 1..VOCAB-1 (0 unused)
FIELDS = ("s", "p", "f", "fs", "fu")


def token(seg: int, j: int) -> int:
    """Token ``j`` of segment ``seg`` (splitmix64 of the pair; stable across Python versions)."""
    z = (seg * 0x9E3779B97F4A7C15 + j * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return 1 + z % (VOCAB - 1)


def prompt_tokens(req: dict) -> list[int]:
    out = []
    for seg, start, length in req["prompt"]:
        out.extend(token(seg, start + j) for j in range(length))
    return out


def output_tokens(req: dict) -> list[int]:
    return [token(req["out"], i) for i in range(req["max_tokens"])]


class StreamError(ValueError):
    pass


def drive(stream: dict, side, max_steps: int = 200_000, stop_after: int | None = None) -> list[dict]:
    """Run ``stream`` through ``side`` (``add(req)``, ``has_unfinished()``, ``step() -> record``);
    ``stop_after``: return after that many steps."""
    groups = stream["groups"]
    kind = stream["arrival"]["kind"]
    conc = int(stream["arrival"].get("concurrency", 0))
    gi, tick = 0, 0
    open_groups: dict[int, set] = {}
    group_of: dict[int, int] = {}
    log: list[dict] = []
    while True:
        if kind == "closed":
            while gi < len(groups) and len(open_groups) < conc:
                _add_group(side, groups, gi, open_groups, group_of)
                gi += 1
        else:
            while gi < len(groups) and groups[gi]["arrive"] <= tick:
                _add_group(side, groups, gi, open_groups, group_of)
                gi += 1
        if not side.has_unfinished():
            if gi >= len(groups):
                return log
            tick += 1
            continue
        rec = side.step()
        if not rec["s"] and not rec["p"]:
            raise StreamError(f"stream {stream['name']}: step {len(log)} scheduled nothing with requests "
                              f"unfinished (a request larger than the KV capacity?)")
        log.append(rec)
        if stop_after is not None and len(log) >= stop_after:
            return log
        for rid in rec["f"]:
            g = group_of.pop(rid)
            open_groups[g].discard(rid)
            if not open_groups[g]:
                del open_groups[g]
        tick += 1
        if len(log) > max_steps:
            raise StreamError(f"stream {stream['name']}: more than {max_steps} steps")


def _add_group(side, groups, gi, open_groups, group_of):
    reqs = groups[gi]["requests"]
    open_groups[gi] = {r["id"] for r in reqs}
    for r in reqs:
        group_of[r["id"]] = gi
        side.add(r)


# ---------------------------------------------------------------------------------- comparison
def compare(a: list[dict], b: list[dict], names=("rksim", "vllm")) -> dict:
    """Per-step agreement of two step logs (every field of :data:`FIELDS` equal)."""
    n = max(len(a), len(b))
    agree, first = 0, None
    mism = {k: 0 for k in FIELDS}
    for i in range(n):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x is not None and y is not None and all(_norm(x[k]) == _norm(y[k]) for k in FIELDS):
            agree += 1
            continue
        if x is not None and y is not None:
            for k in FIELDS:
                if _norm(x[k]) != _norm(y[k]):
                    mism[k] += 1
        if first is None:
            first = {"step": i, "fields": [k for k in FIELDS if x is None or y is None or _norm(x[k]) != _norm(y[k])],
                     names[0]: x, names[1]: y,
                     "previous": a[i - 1] if i > 0 and i - 1 < len(a) else None}
    return {"steps_compared": n, "steps_agreeing": agree, "steps": [len(a), len(b)],
            "mismatching_steps_by_field": mism, "first_divergence": first,
            "preemptions": [sum(len(r["p"]) for r in a), sum(len(r["p"]) for r in b)]}


def _norm(v):
    return json.loads(json.dumps(v))


# ---------------------------------------------------------------------------------- streams
def _req(rid, prompt, max_tokens):
    return {"id": rid, "prompt": prompt, "out": 1_000_000 + rid, "max_tokens": int(max_tokens)}


def make_streams(seed: int = 0) -> list[dict]:
    """The eight streams of the check (each runs 1,000+ steps on both schedulers)."""
    rng = random.Random(seed)
    out = []
    seg = [10]

    def new_seg():
        seg[0] += 1
        return seg[0]

    def cfg(**kw):
        c = {"block_size": 16, "num_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 256,
             "long_prefill_token_threshold": 0, "prefix_caching": True}
        c.update(kw)
        return c

    # 1. closed loop, independent requests, mixed lengths, moderate KV pressure
    rid = 0
    groups = []
    for _ in range(260):
        groups.append({"arrive": None, "requests": [_req(rid, [[new_seg(), 0, rng.randint(8, 300)]],
                                                         rng.randint(8, 60))]})
        rid += 1
    out.append({"name": "closed-loop", "about": "closed loop of 12 users, prompts 8-300, outputs 8-60, "
                "60 blocks of 16", "config": cfg(num_blocks=60, max_num_seqs=8),
                "arrival": {"kind": "closed", "concurrency": 12}, "groups": groups})

    # 2. Poisson arrivals (bursts queue, gaps drain), a few requests repeating a system prompt
    sys_seg = new_seg()
    groups, t = [], 0.0
    for _ in range(300):
        t += rng.expovariate(0.28)
        pre = [[sys_seg, 0, 48]] if rng.random() < 0.4 else []
        groups.append({"arrive": int(t), "requests": [_req(rid, pre + [[new_seg(), 0, rng.randint(8, 200)]],
                                                           rng.randint(4, 40))]})
        rid += 1
    out.append({"name": "poisson", "about": "Poisson arrivals, 0.28 per step, 40% share a 48-token system "
                "prompt, 80 blocks", "config": cfg(num_blocks=80, max_num_seqs=8),
                "arrival": {"kind": "poisson"}, "groups": groups})

    # 3. multi-branch problems: 4-8 branches share a problem prefix, each with its own suffix
    groups = []
    for _ in range(80):
        p = new_seg()
        plen = rng.randint(40, 200)
        reqs = []
        for _b in range(rng.randint(4, 8)):
            reqs.append(_req(rid, [[p, 0, plen], [new_seg(), 0, rng.randint(1, 40)]], rng.randint(10, 80)))
            rid += 1
        groups.append({"arrive": None, "requests": reqs})
    out.append({"name": "multi-branch", "about": "problems of 4-8 branches sharing a 40-200-token prefix, "
                "2 problems in flight, 64 blocks", "config": cfg(num_blocks=64, max_num_seqs=12),
                "arrival": {"kind": "closed", "concurrency": 2}, "groups": groups})

    # 4. long prompts cut by max_num_batched_tokens (chunked prefill over many steps)
    groups = []
    for _ in range(140):
        groups.append({"arrive": None, "requests": [_req(rid, [[new_seg(), 0, rng.randint(300, 1400)]],
                                                         rng.randint(4, 30))]})
        rid += 1
    out.append({"name": "long-prompts", "about": "prompts 300-1400 tokens, 128-token budget per step, "
                "closed loop of 4, 200 blocks", "config": cfg(num_blocks=200, max_num_batched_tokens=128,
                                                              max_num_seqs=6),
                "arrival": {"kind": "closed", "concurrency": 4}, "groups": groups})

    # 5. KV exhaustion: long decodes in a small cache force preemption and resumption
    groups = []
    for _ in range(70):
        groups.append({"arrive": None, "requests": [_req(rid, [[new_seg(), 0, rng.randint(16, 120)]],
                                                         rng.randint(60, 200))]})
        rid += 1
    out.append({"name": "kv-exhaustion", "about": "outputs 60-200 tokens, 8 running, 40 blocks: preemption "
                "by recompute and resumption", "config": cfg(num_blocks=40, max_num_seqs=8),
                "arrival": {"kind": "closed", "concurrency": 10}, "groups": groups})

    # 6. whole-prompt hits: prompts repeated exactly (many a whole number of blocks: the n-1 rule
    #    recomputes the last block)
    pool = []
    for _ in range(12):
        n_blk = rng.randint(1, 8)
        pool.append([new_seg(), n_blk * 16 if rng.random() < 0.6 else n_blk * 16 + rng.randint(1, 15)])
    groups = []
    for _ in range(320):
        s, n = rng.choice(pool)
        groups.append({"arrive": None, "requests": [_req(rid, [[s, 0, n]], rng.randint(4, 40))]})
        rid += 1
    out.append({"name": "whole-prompt-hits", "about": "12 distinct prompts (60% a whole number of blocks) "
                "repeated, closed loop of 6, 48 blocks", "config": cfg(num_blocks=48, max_num_seqs=8),
                "arrival": {"kind": "closed", "concurrency": 6}, "groups": groups})

    # 7. same-step hits: groups of 4 arriving together, later ones repeating the first's tokens
    #    (they hit the full blocks the first allocated in the same step)
    groups, t = [], 0.0
    for _ in range(110):
        t += rng.expovariate(0.08)
        a = new_seg()
        la = rng.randint(60, 240)
        reqs = [_req(rid, [[a, 0, la]], rng.randint(6, 40))]
        rid += 1
        for _k in range(3):
            kind = rng.random()
            if kind < 0.4:        # the same prompt
                pr = [[a, 0, la]]
            elif kind < 0.8:      # a prefix of it plus its own tail
                pr = [[a, 0, rng.randint(16, la)], [new_seg(), 0, rng.randint(1, 30)]]
            else:                 # unrelated
                pr = [[new_seg(), 0, rng.randint(8, 100)]]
            reqs.append(_req(rid, pr, rng.randint(6, 40)))
            rid += 1
        groups.append({"arrive": int(t), "requests": reqs})
    out.append({"name": "same-step-hits", "about": "groups of 4 arriving together (Poisson, 0.08 groups per "
                "step), later members repeating all or part of the first's prompt, 96 blocks",
                "config": cfg(num_blocks=96, max_num_seqs=8), "arrival": {"kind": "poisson"}, "groups": groups})

    # 8. long_prefill_token_threshold (applied only while more than one request runs or waits),
    #    prefix caching off (a preempted request recomputes everything)
    groups, t = [], 0.0
    for _ in range(150):
        t += rng.expovariate(0.06)
        n = rng.randint(200, 900) if rng.random() < 0.5 else rng.randint(8, 80)
        groups.append({"arrive": int(t), "requests": [_req(rid, [[new_seg(), 0, n]], rng.randint(8, 60))]})
        rid += 1
    out.append({"name": "threshold-no-caching", "about": "long_prefill_token_threshold 48 with a 256-token "
                "budget, half the prompts 200-900 tokens, Poisson 0.06 per step, prefix caching off, 64 blocks",
                "config": cfg(num_blocks=64, max_num_seqs=8, long_prefill_token_threshold=48, prefix_caching=False),
                "arrival": {"kind": "poisson"}, "groups": groups})
    return out


def write_json(path: str, obj) -> None:
    """Atomic write (a temporary file in the same folder, then a rename)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)
