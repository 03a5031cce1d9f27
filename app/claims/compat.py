"""The papers' public code's shortcuts (compatibility options): does each give the paper's result?"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from app.claims.base import ClaimUnit
from app.claims.common import RKSC_TARGET, VASE_TARGETS, acted
from app.verdicts import Cond, combine, fmt, judge_unchanged


@dataclass(frozen=True)
class Compat(ClaimUnit):
    """RKSC and VASE papers' rules as written (DESIGN §4) against their public code's shortcuts: ASKS's
    code layer weights, CGEE's notebook level-1 rule, RSBCM unscored, H2O's kvpress mean over queries.
    Each shortcut "gives the paper's result" when it leaves the claim's figures unchanged.

    Reads the ``rsbcm`` table the RSBCM unit leaves in ``ctx.tables`` (registered before this one).
    """

    name = "compat"
    group = "Compatibility"
    options: tuple = (("asks", {"layer_weights": "code"}, ("kv_reuse", "accuracy")),
                      ("cgee", {"level1_rule": "notebook"}, ("skip_rate", "cgee_error_rate")))

    def rows(self, ctx) -> list[dict]:
        infos = ctx.sharing()
        rows, checks = [], []
        self._policies(ctx, infos, rows, checks)
        self._tree(ctx, rows, checks)
        self._tokens(ctx, rows, checks)
        df = pd.DataFrame(rows)
        ctx.tables["compat"] = df
        out = []
        for opt, g in (df.groupby("option", sort=False) if not df.empty else []):
            conds = [c for o, _, c in checks if o == opt]
            out.append(self.row(f"The public code's shortcut `{opt}` ({g['policy'].iloc[0]}) gives the paper's "
                                "result", "(the papers report the rule as written)",
                                "; ".join(f"{r.trace} {r.metric}: {fmt(r.paper)} → {fmt(r.compat)}"
                                          for r in g.itertuples()),
                                "as simulated", ctx.src(infos or ctx.infos), combine(conds),
                                {"table": g.to_dict("records")}, conds))
        return out

    def _policies(self, ctx, infos, rows: list, checks: list) -> None:
        for i in infos:
            for pol, param, metrics in self.options:
                ra, rb = ctx.sim(i, pol), ctx.sim(i, pol, param)
                L = ra.summary["layers"]
                if pol == "asks":
                    refused = [int((r.problems["n_branches"] - 1).sum() - r.problems["shared_branches"].sum())
                               for r in (ra, rb)]
                    why = (f"the gate admitted every branch under both rules ({int(ra.problems['shared_branches'].sum())}"
                           f" of {int((ra.problems['n_branches'] - 1).sum())} shared, reuse at its maximum): the layer "
                           "weights cannot change a decision here" if refused == [0, 0] else None)
                else:
                    why = acted("cgee", ra.problems, L) and acted("cgee", rb.problems, L)
                    why = f"under both rules: {why}" if why else None
                opt = ", ".join(f"{k}={v}" for k, v in param.items())
                for metric in metrics:
                    a, b = ra.summary[metric], rb.summary[metric]
                    rows.append({"trace": i.name, "policy": pol, "option": opt, "metric": metric, "paper": a,
                                 "compat": b, "delta": (b - a) if a is not None and b is not None else None})
                    checks.append((opt, pol, judge_unchanged(Cond(f"{i.name} {metric}", None, kind=ctx.sim_kind(
                        ra.summary), untestable=why), a, b, True)))

    @staticmethod
    def _tree(ctx, rows: list, checks: list) -> None:
        rs = pd.DataFrame(ctx.tables.get("rsbcm", pd.DataFrame()))
        for i in ctx.pick(tree=True)[:1]:
            from sim.replay.tree import simulate_tree
            a = simulate_tree(ctx.paths[i.name], "rsbcm", None, model_preset=RKSC_TARGET[0], hardware=RKSC_TARGET[1])
            b = simulate_tree(ctx.paths[i.name], "rsbcm", {"score_source": "unscored"}, model_preset=RKSC_TARGET[0],
                              hardware=RKSC_TARGET[1])
            t0 = rs[(rs["trace"] == i.name) & rs["where"].str.startswith("tree 0")] if not rs.empty else rs
            same = (not t0.empty and t0["recompute_tokens"].nunique() == 1 and t0["latency_s"].nunique() == 1
                    and t0["evictions"].nunique() == 1)
            why = (f"RSBCM, LRU and FIFO make the same choices on this tree ({int(t0['recompute_tokens'].iloc[0])} "
                   "recompute tokens each): no block score can change an eviction here" if same else None)
            for metric in ("recompute_tokens", "latency_s"):
                rows.append({"trace": i.name, "policy": "rsbcm (tree 0)", "option": "score_source=unscored",
                             "metric": metric, "paper": float(a[metric]), "compat": float(b[metric]),
                             "delta": float(b[metric] - a[metric])})
                checks.append(("score_source=unscored", "rsbcm (tree 0)", judge_unchanged(Cond(
                    f"{i.name} tree 0 {metric}", None, kind=ctx.target_kind(RKSC_TARGET[0], RKSC_TARGET[1], ", one tree"),
                    untestable=why), float(a[metric]), float(b[metric]), False)))

    @staticmethod
    def _tokens(ctx, rows: list, checks: list) -> None:
        for i in ctx.pick(long=True)[:1]:
            lt = ctx.lts[i.name]
            K = ctx.api.token_budgets(lt, "h2o", [4])["4x"]
            tgt = dict(model_preset=VASE_TARGETS[0][0], hardware=VASE_TARGETS[0][1], baselines=False)
            a = ctx.api.simulate(lt, "h2o", {"budget": K}, **tgt).summary["attn_output_rel_error"]
            b = ctx.api.simulate(lt, "h2o", {"budget": K, "mean_over_queries": True}, **tgt).summary["attn_output_rel_error"]
            opt = "mean_over_queries=true (kvpress)"
            rows.append({"trace": i.name, "policy": "h2o (4×)", "option": opt,
                         "metric": "attn_output_rel_error", "paper": a, "compat": b, "delta": b - a})
            checks.append((opt, "h2o (4×)", judge_unchanged(Cond(
                f"{i.name} attn_output_rel_error", None, kind=f"simulated: the trace's own K/V/Q ({i.model})"),
                a, b, False)))
