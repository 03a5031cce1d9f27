"""The reproduction report's claims, one small unit per claim family (``rksim reproduce``).

Each module holds one family's units (:class:`app.claims.base.ClaimUnit`: a dataclass of its parameters
with ``rows(ctx)``); :data:`CLAIMS` lists them in the order the report prints them. A new claim is a
unit in its family's module, or a new module and its line here; :mod:`app.reproduce` (the driver:
context, numbering, inputs) is not edited.
"""
from __future__ import annotations

from app.claims.asks import Asks
from app.claims.base import ClaimUnit
from app.claims.cgee import Cgee, EntropyCollapse
from app.claims.compat import Compat
from app.claims.rksc import RkscSpeedups
from app.claims.rsbcm import Rsbcm
from app.claims.shape import Shape
from app.claims.vase import VaseQuality, VaseThroughput

# report order; Compat reads the table Rsbcm leaves, so it comes after it
CLAIMS: tuple[ClaimUnit, ...] = (RkscSpeedups(), Asks(), Cgee(), EntropyCollapse(), Shape(), VaseQuality(),
                                 VaseThroughput(), Rsbcm(), Compat())

_names = [c.name for c in CLAIMS]
assert len(set(_names)) == len(_names) and all(_names), f"app.claims.CLAIMS: names must be unique: {_names}"

__all__ = ["CLAIMS", "ClaimUnit"]
