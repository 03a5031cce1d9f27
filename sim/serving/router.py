"""Routers: which replica (of ``data_parallel_size``) each arriving request goes to.

Each router is a small dataclass with one decision method, ``route(arrival, outstanding) -> replica``;
``outstanding[i]`` is the number of requests replica ``i`` has in flight (arrived, not finished), kept by
the caller (the multi-replica driver). Routers that remember something (a round-robin counter, a
problem's first replica) keep it in their own fields; the caller owns the router object.

* ``round-robin``: requests in turn, ``i, i + 1, ...`` (vLLM's and SGLang's ``round_robin``).
* ``least-outstanding``: the replica with the fewest requests in flight, lowest index on ties
  (SGLang's ``shortest_queue``, llm-d's queue scorer).
* ``prefix-affinity``: the request's shared prefix (the problem's prompt, common to all its branches)
  hashed to a replica, ``blake2b(prefix) mod N``, so requests with one prefix meet one cache (llm-d's
  prefix-hash routing; SGLang's cache-aware router reaches the same affinity with a radix tree per
  worker). Like SGLang's cache-aware policy it yields to load when the replicas are imbalanced:
  ``max - min > balance_abs_threshold and max > min * balance_rel_threshold`` sends the request to the
  least-outstanding replica instead (SGLang's defaults: 32 and 1.0001).
* ``vllm-dp``: vLLM's internal data-parallel load balancer (``DPLBAsyncMPClient.get_core_engine_for_request``,
  vllm/v1/engine/core_client.py, vLLM 0.33): the replica with the lowest ``4 waiting + running``, the lowest
  index on ties (one API server: its ``eng_start_index`` is 0). ``waiting`` = in flight but not running
  (``outstanding - running``). vLLM reads the counts its coordinator publishes every 100 ms, raised by the
  requests its client sent since; here they are exact at each arrival (the staleness is not modelled).
* ``branch-spread``: a problem's branches on different replicas: branch ``b`` of a problem goes to
  ``(r0 + b) mod N``, ``r0`` the least-outstanding replica when its first branch arrives (a problem's
  branches run in parallel on as many replicas as it has branches).

KV sharing (exact prefix, ASKS's fork of the root's KV) happens only inside one replica's cache;
:func:`lost_shares` counts the shares a routing made impossible.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

ROUTERS = ("round-robin", "least-outstanding", "prefix-affinity", "branch-spread", "vllm-dp")


class RouterError(ValueError):
    """An unknown router or a bad router setting (the message names the flag)."""


@dataclass(frozen=True)
class Arrival:
    """One request at the router: problem ``problem``'s branch ``branch`` of ``n_branches``, with the
    problem's shared prefix (token ids, or any bytes-like key)."""

    problem: int
    branch: int = 0
    n_branches: int = 1
    prefix: tuple | bytes | np.ndarray = ()


def prefix_hash(prefix) -> int:
    """A process-independent 64-bit hash of a prefix (token ids as int64, or bytes)."""
    if isinstance(prefix, (bytes, bytearray)):
        b = bytes(prefix)
    else:
        b = np.asarray(prefix, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")


def _least(outstanding: Sequence[int]) -> int:
    return int(np.argmin(np.asarray(outstanding)))   # argmin: the first of equal minima


@dataclass
class RoundRobin:
    """``round-robin``: the next replica in turn."""

    n: int
    next: int = 0

    def route(self, arrival: Arrival, outstanding: Sequence[int]) -> int:
        r = self.next % self.n
        self.next = r + 1
        return r


@dataclass
class LeastOutstanding:
    """``least-outstanding``: fewest requests in flight; the lowest index among equals."""

    n: int

    def route(self, arrival: Arrival, outstanding: Sequence[int]) -> int:
        return _least(outstanding)


@dataclass
class PrefixAffinity:
    """``prefix-affinity``: ``prefix_hash(prefix) mod N``, unless the replicas are imbalanced (then the least
    outstanding one): ``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``."""

    n: int
    balance_abs_threshold: int | None = 32       # SGLang cache-aware default; None: never yield to load
    balance_rel_threshold: float = 1.0001        # SGLang cache-aware default

    def route(self, arrival: Arrival, outstanding: Sequence[int]) -> int:
        if self.balance_abs_threshold is not None and len(outstanding):
            hi, lo = max(outstanding), min(outstanding)
            if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
                return _least(outstanding)
        return prefix_hash(arrival.prefix) % self.n


@dataclass
class VllmDpBalance:
    """``vllm-dp``: the lowest ``4 (outstanding - running) + running`` (module docstring); reads the replicas'
    running counts, which the driver passes as ``running`` when ``reads_running`` is set."""

    n: int
    reads_running = True

    def route(self, arrival: Arrival, outstanding: Sequence[int], running: Sequence[int] | None = None) -> int:
        if running is None:
            raise RouterError("--router vllm-dp: the driver must pass each replica's running count")
        best, score = 0, None
        for i, (o, r) in enumerate(zip(outstanding, running)):
            s = 4 * (o - r) + r
            if score is None or s < score:
                best, score = i, s
        return best


@dataclass
class BranchSpread:
    """``branch-spread``: branch ``b`` of a problem to ``(r0 + b) mod N``, ``r0`` the least-outstanding
    replica when the problem's first routed branch arrived."""

    n: int
    first: dict = field(default_factory=dict)    # problem -> (r0, branches routed so far)

    def route(self, arrival: Arrival, outstanding: Sequence[int]) -> int:
        r0, seen = self.first.get(arrival.problem, (None, 0))
        if r0 is None:
            r0 = _least(outstanding)
        seen += 1
        if seen >= arrival.n_branches:
            self.first.pop(arrival.problem, None)   # the problem is fully routed: forget it
        else:
            self.first[arrival.problem] = (r0, seen)
        return (r0 + arrival.branch) % self.n


def choose(router, arrival: Arrival, outstanding: Sequence[int], engines) -> int:
    """The replica ``router`` picks, given each engine's running requests where it reads them (``vllm-dp``): the
    one call both multi-replica drivers make."""
    if getattr(router, "reads_running", False):
        return int(router.route(arrival, outstanding, [len(e.sched.running) for e in engines]))
    return int(router.route(arrival, outstanding))


def make_router(name: str, n_replicas: int, **options):
    """The router named ``name`` (``--router``) for ``n_replicas`` replicas (``--data-parallel-size``)."""
    if isinstance(n_replicas, bool) or not isinstance(n_replicas, int) or n_replicas < 1:
        raise RouterError(f"--data-parallel-size: must be an integer >= 1, got {n_replicas!r}")
    cls = {"round-robin": RoundRobin, "least-outstanding": LeastOutstanding, "prefix-affinity": PrefixAffinity,
           "branch-spread": BranchSpread, "vllm-dp": VllmDpBalance}.get(name)
    if cls is None:
        raise RouterError(f"--router: {name!r} is not one of {', '.join(ROUTERS)}")
    try:
        return cls(n_replicas, **options)
    except TypeError as exc:
        raise RouterError(f"--router {name}: {exc}") from None


def lost_shares(replica_of: Sequence[int], source_of: Sequence[int]) -> int:
    """Shares a routing made impossible: branches whose KV source (``source_of[b] >= 0``: the branch whose
    prefix or whole KV it was to reuse) was routed to another replica::

        lost = sum_b [source_b >= 0 and replica_b != replica_{source_b}]
    """
    r = np.asarray(replica_of, dtype=np.int64)
    s = np.asarray(source_of, dtype=np.int64)
    if r.shape != s.shape:
        raise ValueError("lost_shares: replica_of and source_of need one entry per branch")
    has = s >= 0
    return int(np.sum(has & (r != r[np.where(has, s, 0)])))
