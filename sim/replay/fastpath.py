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

    def __init__(self, model, hw):
        self.m, self.hw = model, hw
        self.sc = ScalarCost(model, hw)  # small iterations (waves, verification): plain floats beat numpy
        self.kvtok = float(model.kv_bytes_per_token)
        self._memo: dict = {}
        self._decode_memo: dict = {}
        self.shared = self.sc.prices_shared

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
               job.source.tobytes() if self.shared else b"")
        hit = self._decode_memo.get(key)
        if hit is not None:
            return hit
        j = np.arange(1, J + 1, dtype=np.float64)[:, None]
        mask = j <= steps[None, :]
        c = job.ctx[None, :] + j - 1.0
        h = shared_per_step(names, job.ctx // job.bs, mask) * job.bs if self.shared else 0.0
        dts = np.asarray(self.hw.time(decode_steps_terms(self.m, c, mask, shared=h), model=self.m), np.float64)
        stored = np.minimum(j, steps[None, :])
        mem = blocks(job.own[None, :] + stored, job.bs).sum(axis=1) * job.bs * self.kvtok
        out = self._decode_memo[key] = (dts, np.cumsum(dts), mem)
        return out

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
            times.append(t)
            mem.append(float(alloc.sum() * bs * kvtok))
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

    def verify_mem(self, job: Job) -> float:
        """KV bytes resident at the end of the verification iteration."""
        bs, kvtok = job.bs, self.kvtok
        stored = job.decode_steps
        base = float(blocks(job.own + stored, bs).sum() * bs * kvtok)
        if job.v_reuse:
            extra_blocks = blocks(job.own + stored + job.v_new, bs) - blocks(job.own + stored, bs)
        else:
            extra_blocks = blocks(job.v_new, bs)
        return float(base + np.sum(extra_blocks * bs * kvtok * job.v_layers / job.L))
