"""Isolated mode in closed form: the numbers the simpy engine produces, without the event loop.

In isolated mode one problem holds the accelerator at a time and the engine's
scheduler (prefill-first iteration-level batching with no token or sequence
cap and unlimited KV, see :mod:`sim.serving.engine`) produces a fixed sequence of
iterations, which this module writes down directly (block policies, whose
evictions and preemptions depend on the block manager, run on the engine):

1. prefill-class iterations ``w = 1..W``: iteration 1 batches every ASKS gate
   pass and every prefill whose KV source is ready at arrival (the root);
   iteration ``w`` batches the prefills whose source prefilled in ``w - 1``
   (:meth:`sim.workload.job.Job.waves`). Branch ``b``'s first token is out at the
   end of its wave;
2. ``J = max_b(gen_b) - 1`` decode iterations; iteration ``j`` batches every
   branch with ``gen_b - 1 >= j``, each over its own context ``ctx_b + j - 1``
   (all branches start decoding together because prefills go first);
3. one verification iteration batching every branch's pass (unless CGEE
   skipped it).

Where the profile prices shared KV reads (``eff_kv_shared``, :mod:`sim.cost.terms`),
each iteration's ``h_i`` follows :mod:`sim.serving.kvshare` over the blocks the engine's
prefix cache would hand out: branch ``b``'s first ``(ctx_b - own_b) / bs``
blocks are its source's (:func:`sim.serving.kvshare.block_names`).

Latency is the sum of the iteration times (:func:`sim.cost.terms.batch_terms` →
``HardwareProfile.time``). The decode sum is evaluated for all steps at once
as a ``(J, B)`` array; results are memoised per distinct job, so a sweep only
pays for the jobs it has not seen.
"""
from __future__ import annotations

import numpy as np

from sim.cost.terms import ScalarCost, decode_steps_terms, with_shared
from sim.serving.kvcache import group_blocks
from sim.serving.kvshare import block_names, shared_per_step, shared_tokens
from sim.workload.job import Job, blocks


def _key(job: Job) -> bytes:
    parts = [job.reused, job.computed, job.copy, job.gate, job.source, job.gen,
             job.v_new, job.v_cached, job.v_layers, job.v_probes, job.v_head]
    return b"|".join(np.ascontiguousarray(a, dtype=np.int64).tobytes() for a in parts) + bytes([job.verify_on, job.v_reuse]) + str(job.bs).encode()


def _with_h(items, hs) -> list:
    return [with_shared(it, h) for it, h in zip(items, hs)]


def _attribute(dt: float, alone: np.ndarray) -> np.ndarray:
    tot = float(alone.sum())
    if tot <= 0:
        return np.full(alone.shape, dt / max(len(alone), 1))
    return dt * alone / tot


class FastPath:
    """Closed-form isolated-mode simulation of jobs for one (model, hardware) target."""

    def __init__(self, model, hw, cost=None):
        # cost: a tensor-parallel replica's (sim.cost.parallel.ParallelCost: each rank's shard and its all-reduces);
        # None: one GPU, its decode steps in one numpy pass of decode_steps_terms
        self.m, self.hw, self.cost = model, hw, cost
        self.sc = cost if cost is not None else ScalarCost(model, hw)  # waves, verification: plain floats
        self.kvtok = float(model.kv_bytes_per_token)
        self._memo: dict = {}
        self._decode_memo: dict = {}
        self.shared = self.sc.prices_shared
        groups = model.kv_cache_groups
        self.groups = None if groups == (1, 0, 0) else groups   # a hybrid (full + sliding) model's KV groups

    def _extra(self, job: Job, tokens, computed):
        """Blocks each branch holds in its other KV-cache groups with ``tokens`` in its block table, ``computed`` of
        them computed before the iteration (:func:`sim.serving.kvcache.group_blocks`, the rule the engine's block
        manager allocates by); zeros for a model of one group."""
        if self.groups is None:
            return np.zeros(np.shape(tokens))
        return group_blocks(self.groups, job.bs, blocks(tokens, job.bs), np.asarray(computed), np.maximum, np.minimum)

    @staticmethod
    def _hit(job: Job) -> np.ndarray:
        """Tokens each branch's prefill finds in the prefix cache (its reuse less the copied partial block)."""
        return job.reused - np.where(job.share, job.copy, 0)

    def _decode_extra(self, job: Job, stored) -> np.ndarray:
        """Other groups' blocks per branch after ``stored`` decode steps each (array ``(..., B)``): step ``j``
        allocates one token with ``ctx + j - 1`` computed; a branch that has not decoded holds its prefill's."""
        tok = job.ctx + stored
        return self._extra(job, tok, np.where(stored >= 1, tok - 1, self._hit(job)))

    @staticmethod
    def _names(job: Job) -> list:
        """Every branch's prompt blocks, named as :func:`sim.serving.kvshare.block_names` (shared ones alike)."""
        return block_names(job.source, (job.ctx - job.own) // job.bs, job.ctx // job.bs)


    # ------------------------------------------------------------------ decode
    def _decode(self, job: Job, names=None):
        steps = job.decode_steps
        J = int(steps.max()) if job.B else 0
        if J == 0:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        key = (job.ctx.tobytes(), job.gen.tobytes(), job.own.tobytes(), job.bs,
               job.source.tobytes() if self.shared else b"",
               self._hit(job).tobytes() if self.groups is not None else b"")
        hit = self._decode_memo.get(key)
        if hit is not None:
            return hit
        j = np.arange(1, J + 1, dtype=np.float64)[:, None]
        mask = j <= steps[None, :]
        c = job.ctx[None, :] + j - 1.0
        h = shared_per_step(names, job.ctx // job.bs, mask) * job.bs if self.shared else 0.0
        if self.cost is None:
            dts = np.asarray(self.hw.time(decode_steps_terms(self.m, c, mask, shared=h), model=self.m), np.float64)
        else:
            dts = self._replica_decode(c, mask, h)
        stored = np.minimum(j, steps[None, :])
        held = blocks(job.own[None, :] + stored, job.bs).sum(axis=1)
        if self.groups is not None:
            held = held + self._decode_extra(job, stored).sum(axis=1)
        mem = held * job.bs * self.kvtok
        out = self._decode_memo[key] = (dts, np.cumsum(dts), mem)
        return out

    def _replica_decode(self, c, mask, h) -> np.ndarray:
        """Each decode step's seconds on a tensor-parallel replica: its batch of one-token decodes over the masked
        contexts ``c (J, B)`` as the engine prices them (``cost.seconds`` of ``(1, c, None, 0, 1, 0)`` items), in
        one pass of the cost's closed form (``decode_batch_seconds``: the batch size, the contexts' sum and longest,
        a sliding-window shape's window key sum) where it has one, else step by step (shared KV reads ``h``, or a
        window share without a closed form)."""
        cost, W = self.cost, int(self.m.sliding_window or 0)
        k = mask.sum(axis=1).astype(np.int64)
        cc = np.where(mask, c, 0.0).astype(np.int64)
        if not self.shared and (cost.closed_form() or (W and cost.sliding_window() is not None)):
            Ssw = np.where(mask, np.minimum(cc + 1, W), 0).sum(axis=1) if W else None
            return np.asarray(cost.decode_batch_seconds(k, cc.sum(axis=1), cc.max(axis=1), Ssw), np.float64)
        hs = np.broadcast_to(np.asarray(h, np.float64), (len(c),))
        return np.array([cost.seconds(_with_h([(1.0, float(x), None, 0.0, 1.0, 0.0) for x in row[m]],
                                              [float(hj)] + [0.0] * (int(m.sum()) - 1)))
                         for row, m, hj in zip(c, mask, hs)], np.float64)

    # ------------------------------------------------------------------ one job
    def run(self, job: Job) -> dict:
        """Latency, phase breakdown, first-token times and the KV timeline of one isolated job."""
        key = _key(job)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        m, hw, bs, kvtok = self.m, self.hw, job.bs, self.kvtok
        B = job.B
        wave, ready = job.waves()
        W = int(wave.max()) if B else 0
        names = self._names(job) if self.shared else None
        phase = {"gate": 0.0, "prefill": 0.0, "decode": 0.0, "verify": 0.0}
        t = 0.0
        end = np.zeros(W + 1)
        times, mem = [], []
        alloc = np.zeros(B)
        extra = np.zeros(B)       # other KV-cache groups' blocks (a hybrid model)
        iters = 0
        for w in range(1, W + 1):
            gates = np.flatnonzero(job.gate > 0) if w == 1 else np.zeros(0, np.int64)
            pre = np.flatnonzero(job.has_prefill & (wave == w))
            if gates.size + pre.size == 0:
                end[w] = t
                continue
            n_p = job.computed[pre].astype(np.float64)
            c_p = job.reused[pre].astype(np.float64)
            # LM head only for a branch computing prompt tokens of its own (as the engine): a copy-only
            # prefill yields no token (the first one is the source's).
            items = ([(float(job.gate[b]), 0.0, None, 0.0, 0.0, 0.0) for b in gates]
                     + [(float(n_p[i]), float(c_p[i]), None, 0.0, 1.0 if job.computed[b] > 0 else 0.0,
                         float(job.copy[b])) for i, b in enumerate(pre)])
            if self.shared:
                items = _with_h(items, [0] * gates.size + shared_tokens(
                    [names[b] for b in pre], [int(x) for x in c_p], bs))
            dt = self.sc.seconds(items)
            share = _attribute(dt, np.array([self.sc.seconds([it]) for it in items]))
            phase["gate"] += float(share[: gates.size].sum())
            phase["prefill"] += float(share[gates.size:].sum())
            t += dt
            end[w] = t
            iters += 1
            alloc[pre] = blocks(job.own[pre], bs)
            if self.groups is not None:
                extra[pre] = self._extra(job, job.ctx[pre], self._hit(job)[pre])
            times.append(t)
            mem.append(float((alloc.sum() + extra.sum()) * bs * kvtok))
        first = end[np.where(job.has_prefill, wave, ready)] if B else np.zeros(0)
        t_prefill_end = t
        dts, cum, dmem = self._decode(job, names)
        if dts.size:
            phase["decode"] = float(dts.sum())
            times.extend((t_prefill_end + cum).tolist())
            mem.extend(dmem.tolist())
            t = t_prefill_end + float(cum[-1])
            iters += dts.size
        if job.verify_on and B:
            n = job.v_new.astype(np.float64)
            c = job.v_cached.astype(np.float64)
            vitems = [(float(n[b]), float(c[b]), float(job.v_layers[b]), float(job.v_probes[b]),
                       float(job.v_head[b]), 0.0, 0.0) for b in range(B)]  # scores Yes/No: no sampling
            if self.shared and job.v_reuse:
                vitems = _with_h(vitems, shared_tokens(names, [int(x) for x in c], bs))
            dt = self.sc.seconds(vitems)
            phase["verify"] = dt
            t += dt
            iters += 1
            times.append(t)
            mem.append(self.verify_mem(job))
        res = {"latency_s": t, **{f"{k}_s": v for k, v in phase.items()},
               "ttft_s": float(first.mean()) if B else 0.0, "first_token_times": first,
               "peak_kv_bytes": float(max(mem)) if mem else 0.0,
               "kv_times": np.asarray(times), "kv_bytes": np.asarray(mem), "iterations": iters,
               "recompute_tokens": 0, "evictions": 0}
        self._memo[key] = res
        return res

    def peak_blocks(self, job: Job) -> int:
        """:meth:`sim.workload.job.Job.peak_blocks` with, on a hybrid model, each branch's other KV-cache groups'
        blocks (:meth:`_extra`) at the end of its decode and, where the verification extends the branch, its growth."""
        if self.groups is None:
            return job.peak_blocks()
        bs, steps = job.bs, job.decode_steps
        end = self._decode_extra(job, steps)
        gen = int(blocks(job.own + steps, bs).sum() + end.sum())
        if not job.verify_on:
            return gen
        if job.v_reuse:
            ver = blocks(job.own + steps + job.v_new, bs).sum() + np.maximum(
                end, self._extra(job, job.ctx + steps + job.v_new, job.ctx + steps)).sum()
        else:
            ver = blocks(job.v_new, bs).sum() + self._extra(job, job.v_new, np.zeros_like(job.v_new)).sum()
        return max(gen, int(ver))

    def verify_mem(self, job: Job) -> float:
        """KV bytes resident at the end of the verification iteration: every branch's blocks at the end of its
        decode, plus the verification's new blocks over its share of the layers (``v_layers / L``); on a hybrid
        model the other groups' too (:meth:`_extra`: their new blocks at most, none given back)."""
        bs, kvtok = job.bs, self.kvtok
        stored = job.decode_steps
        base = float(blocks(job.own + stored, bs).sum() * bs * kvtok)
        if job.v_reuse:
            extra_blocks = blocks(job.own + stored + job.v_new, bs) - blocks(job.own + stored, bs)
        else:
            extra_blocks = blocks(job.v_new, bs)
        if self.groups is not None:
            end = self._decode_extra(job, stored)
            grown = (self._extra(job, job.ctx + stored + job.v_new, job.ctx + stored) if job.v_reuse else
                     self._extra(job, job.v_new, np.zeros_like(job.v_new)))
            base += float(end.sum() * bs * kvtok)
            extra_blocks = extra_blocks + (np.maximum(grown - end, 0) if job.v_reuse else grown)
        return float(base + np.sum(extra_blocks * bs * kvtok * job.v_layers / job.L))
