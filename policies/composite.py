"""RKSC: ASKS sharing + CGEE early exit + RSBCM block eviction, composed (DESIGN §4)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from .base import PolicyBase, register
from .blocks import RSBCM
from .exit import CGEE
from .sharing import ASKS

_PARTS = (("asks", ASKS), ("cgee", CGEE), ("rsbcm", RSBCM))


class _RKSCBase(PolicyBase):
    """RKSC: the three RKSC mechanisms with one flat parameter set.

    Every parameter of :class:`ASKS`, :class:`CGEE` and :class:`RSBCM` is a parameter of
    RKSC under the same name (the names do not collide) and is routed to its component:
    ``rksc.asks``, ``rksc.cgee``, ``rksc.rsbcm`` are the component policies, and
    ``plan``, ``decide``, ``skip``, ``exit_layer``, ``should_exit`` and ``victim_order``
    delegate to them. Its block part runs in ``sim.serving.kvcache.BlockManager``
    (``BlockManager(blocks, block_size, rksc.rsbcm)``).
    """

    kind: ClassVar[str] = "composite"
    name: ClassVar[str] = "rksc"

    def __post_init__(self) -> None:
        values = dataclasses.asdict(self)
        for attr, cls in _PARTS:
            names = [f.name for f in dataclasses.fields(cls)]
            try:
                part = cls(**{k: values[k] for k in names})
            except Exception as exc:  # re-label the component's error as RKSC's
                raise self._fail(attr, str(exc)) from None
            object.__setattr__(self, attr, part)

    def plan(self, *args, **kwargs):
        return self.asks.plan(*args, **kwargs)

    def decide(self, *args, **kwargs):
        return self.cgee.decide(*args, **kwargs)

    def skip(self, *args, **kwargs):
        return self.cgee.skip(*args, **kwargs)

    def exit_layer(self, *args, **kwargs):
        return self.cgee.exit_layer(*args, **kwargs)

    def should_exit(self, *args, **kwargs):
        return self.cgee.should_exit(*args, **kwargs)

    def victim_order(self, *args, **kwargs):
        return self.rsbcm.victim_order(*args, **kwargs)


def _fields():
    seen: dict[str, str] = {}
    out = []
    for attr, cls in _PARTS:
        for f in dataclasses.fields(cls):
            if f.name in seen:
                raise RuntimeError(f"rksc: parameter {f.name!r} of {attr} collides with {seen[f.name]}")
            seen[f.name] = attr
            out.append((f.name, f.type, dataclasses.field(default=f.default)))
    return out


RKSC = register(dataclasses.make_dataclass("RKSC", _fields(), bases=(_RKSCBase,),
                                           namespace={"__module__": __name__,
                                                      "__doc__": _RKSCBase.__doc__}))
