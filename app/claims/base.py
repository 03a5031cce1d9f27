"""What a claim unit is: a small dataclass holding its parameters, with one method that computes its rows.

The shape of a policy (``policies/base.py``): the fields are the claim's parameters (the paper's
figures, the policies compared), ``rows(ctx)`` reads the shared :class:`app.reproduce.Context`
(traces, measured runs, simulator, targets) and returns claim rows built with :meth:`ClaimUnit.row`
(:func:`app.claims.common.claim_row`); tables and figures it wants in the report go to ``ctx.tables`` /
``ctx.figures``. A unit's docstring cites the paper's claim it tests (DESIGN §7 quotes the figures).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from app.claims.common import claim_row


@dataclass(frozen=True)
class ClaimUnit:
    """One claim family: ``name`` (unique in the registry), ``group`` (the report's row group)."""

    name: ClassVar[str] = ""
    group: ClassVar[str] = ""

    def rows(self, ctx) -> list[dict]:
        """The family's claim rows, in report order."""
        raise NotImplementedError(f"{type(self).__name__}.rows")

    def row(self, claim: str, paper: str, simulated: str, measured: str, source: str, verdict: tuple,
            data: dict | None = None, conds: list | None = None) -> dict:
        """A row of this unit's group (:func:`app.claims.common.claim_row`)."""
        return claim_row(self.group, claim, paper, simulated, measured, source, verdict, data, conds)

    def unmeasurable(self, claim: str, paper: str, because: str) -> dict:
        """A row whose data cannot test the claim (no figure invented): ``because`` says what is missing."""
        return self.row(claim, paper, "—", "—", "—", ("not measurable here", because))
