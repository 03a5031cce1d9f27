"""A ``transformers`` cache that evicts tokens during decode exactly as a ``policies/`` token policy says.

Built on ``DynamicCache`` / ``DynamicLayer`` (transformers 5.x): every layer's
keys and values live in ``[1, H_kv, S, D]`` tensors as usual. The schedule is
the one of ``policies.token_loop.run_token_eviction`` (what the simulator
replays): at decode position ``t`` with ``s = t - P + 1`` generated tokens, if
``s % buffer == 0`` and the cache holds more than ``budget + buffer`` tokens,
the candidates (all but the last ``buffer``) are cut to ``budget`` per KV head
by ``policy.select``, and *the query at t already sees the reduced cache*.

That last point is why the eviction runs inside the attention call: the tap
of ``traces.capture_qkv`` (the one way rksim sees Q/K/V, shared with capture's
``QKVRecorder``) receives the layer's query of position ``t`` and its
keys/values after the cache update; the hook records the new K, V, Q rows
(float16, exactly what a trace stores), runs the policy's decision on those
recorded arrays — the same gathers, windows and state updates as
``run_token_eviction`` — gathers the kept rows of the torch tensors per KV
head, and hands the reduced K, V to attention. Replaying the recorded K/V/Q
with ``run_token_eviction`` therefore takes the very same decisions
(``tests/test_calibrate.py`` checks it on a real model).

Kept tokens keep their original positions (RoPE was applied when they were
cached), so the decode loop passes explicit ``position_ids``.
"""
from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from traces.capture_qkv import ATTN_IMPL, AttentionTap, new_rows  # noqa: F401  (ATTN_IMPL: re-exported)


def window_layers(model) -> frozenset:
    """0-based layers of ``model`` whose ``config.layer_types`` entry is ``sliding_attention`` (none for a model
    without layer types): where token eviction does not apply."""
    from calibrate.layerwise import SLIDING, layer_types
    return frozenset(i for i, t in enumerate(layer_types(model)) if t == SLIDING)


class LayerEviction:
    """One layer's eviction state: recorded K/V/Q (float16), kept positions, policy state, rng."""

    def __init__(self, policy, n_kv_heads: int, rng: np.random.Generator | None):
        self.pol, self.H, self.rng = policy, n_kv_heads, rng
        self.K: list[np.ndarray] = []   # per position (H_kv, D) float16
        self.V: list[np.ndarray] = []
        self.Q: list[np.ndarray] = []   # per position (H_q, D) float16
        self.cache: np.ndarray | None = None  # (H_kv, n) positions held, slot order
        self.state = None
        self.pending = 0
        self.events: list[tuple[int, np.ndarray]] = []

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.stack(self.K), np.stack(self.V), np.stack(self.Q)


class EvictingCache(DynamicCache):
    """KV cache for one sequence (batch 1) evicting with ``policy`` on every layer.

    Parameters
    ----------
    n_layers : decoder layers of the model.
    policy : a token-eviction policy from ``policies`` (``full`` never evicts).
    prompt_len : P, tokens of the prompt (prefilled in one forward).
    rngs : one ``numpy.random.Generator`` per layer (stochastic policies), or None.
    record_layers : 0-based layers whose decisions are kept in ``events`` (default: all).
    keep_layers : 0-based layers that never evict: a model's sliding-window layers (:func:`window_layers`), which
        keep their window whatever the policy, as kvpress skips them and the simulator prices them.
    """

    def __init__(self, n_layers: int, policy, prompt_len: int, n_kv_heads: int, rngs=None, keep_layers=()):
        super().__init__()
        self.keep = frozenset(int(i) for i in keep_layers)
        self.layers = [DynamicLayer() for _ in range(n_layers)]
        self.layer_class_to_replicate = None
        self.policy = policy
        self.P = int(prompt_len)
        self.ev = [LayerEviction(policy, n_kv_heads, None if rngs is None else rngs[i]) for i in range(n_layers)]
        self._tap: AttentionTap | None = None
        self.n_events = 0

    # -- wiring
    def attach(self, model) -> "EvictingCache":
        self._tap = AttentionTap(model, self._hook).attach()
        return self

    def detach(self) -> None:
        if self._tap is not None:
            self._tap.detach()
            self._tap = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()
        return False

    # -- the hook: record, maybe evict, return what attention sees
    def _hook(self, li: int, query, key, value):
        from policies.token_loop import gather_rows, observe

        if li in self.keep:   # a window layer: every token stays (the model's window mask limits what it sees)
            return key, value
        ev = self.ev[li]
        q_len = query.shape[2]
        t0 = len(ev.K)  # position of the first new row
        newq, newk, newv = (x.to(torch.float16).cpu().numpy() for x in new_rows(query, key, value))
        ev.K.extend(newk)
        ev.V.extend(newv)
        ev.Q.extend(newq)
        pos_new = np.tile(np.arange(t0, t0 + q_len, dtype=np.int64), (ev.H, 1))
        ev.cache = pos_new if ev.cache is None else np.concatenate([ev.cache, pos_new], axis=1)
        if ev.state is None:
            ev.state = self.policy.init_state(ev.H, self.P)
            ev.pending = 0  # as run_token_eviction: the prompt's queries count too (H2O)
        t = t0 + q_len - 1
        pol = self.policy
        s = t - self.P + 1
        if not pol.evicts or q_len != 1 or s <= 0 or s % pol.buffer:
            return key, value
        n = ev.cache.shape[1]
        if n <= pol.budget + pol.buffer:
            return key, value
        # Exactly run_token_eviction's event at position t, on the recorded float16 arrays.
        K = np.stack(ev.K).astype(np.float64)
        V = np.stack(ev.V).astype(np.float64)
        Q = np.stack(ev.Q).astype(np.float64)
        if pol.needs_history:
            observe(pol, ev.state, K, Q, ev.cache, ev.pending, t)
            ev.pending = t
        cand = n - pol.buffer
        w = min(pol.window, t + 1)
        keep = pol.select(gather_rows(K, ev.cache), gather_rows(V, ev.cache), Q[t + 1 - w: t + 1], cand, ev.rng, ev.state,
                          k_pos=ev.cache, q_pos=np.arange(t + 1 - w, t + 1))
        slots = np.concatenate([keep, np.tile(np.arange(cand, n), (ev.H, 1))], axis=1)
        ev.cache = np.take_along_axis(ev.cache, slots, axis=1)
        pol.compact(ev.state, slots)
        ev.events.append((t, ev.cache.copy()))
        self.n_events += 1
        idx = torch.from_numpy(slots).to(key.device).unsqueeze(0).unsqueeze(-1).expand(1, ev.H, slots.shape[1], key.shape[-1])
        lay = self.layers[li]
        lay.keys = torch.gather(key, 2, idx)
        lay.values = torch.gather(value, 2, idx)
        return lay.keys, lay.values
