"""CGEE: the early exit's induced error and skip rates, and its premise (logit-lens entropy collapses)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from app.claims.base import ClaimUnit
from app.claims.common import rounded as rnd, acted
from app.verdicts import Cond, combine, fmt, judge_premise, judge_rate, wilson


@dataclass(frozen=True)
class Cgee(ClaimUnit):
    """RKSC paper, CGEE (DESIGN §7; the policy DESIGN §4): CGEE-induced error 0.37% (6 of 1,616 verification
    calls); skip rate 42% on GPQA to 92% on MMLU-STEM.

    The error is read per problem (the selected answer differs from full-depth verification's), on
    every sharing trace and on the real module's runs; the skip rate per benchmark captured.
    """

    name = "cgee"
    group = "CGEE"
    error: float = 0.0037
    skip_gpqa: float = 0.42
    skip_mmlu: float = 0.92

    def rows(self, ctx) -> list[dict]:
        infos = ctx.sharing()
        rows, err_c, skip = [], [], []
        for i in infos:
            r = ctx.sim(i, "cgee", verify_reuses_kv=True)
            p, s = r.problems, r.summary
            n, L = len(p), int(s["layers"])
            k_err = int(p["cgee_differs"].sum()) if s.get("cgee_error_rate") is not None else None
            k_skip = int(p["skipped"].sum())
            kind = ctx.sim_kind(s)
            c = Cond(f"{i.model}/{i.dataset}/{i.layout}", None, n=n, kind=kind, untestable=acted("cgee", p, L))
            if k_err is None:
                c.untestable = "no CGEE error rate was computed"
                c = judge_rate(c, 0, 0, self.error, "below")
            else:
                c = judge_rate(c, k_err, n, self.error, "below")
            err_c.append(c)
            skip.append((i, k_skip, n, kind))
            lo, hi = wilson(k_err or 0, n)
            rows.append({"trace": i.name, "model": i.model, "benchmark": i.dataset, "layout": i.layout,
                         "n_problems": n, "skipped": k_skip, "early_exit_problems": int(
                             ((~p["skipped"].astype(bool)) & (p["exit_layer_sum"] < p["verified_branches"] * L)).sum()),
                         "errors": k_err, "skip_rate": rnd(s["skip_rate"]), "cgee_error_rate": rnd(s["cgee_error_rate"]),
                         "branch_disagreement": rnd(s["cgee_branch_disagreement_rate"]),
                         "mean_exit_layer": rnd(s["mean_exit_layer"]), "layers": L,
                         "error_ci_low": rnd(lo) if k_err is not None else None,
                         "error_ci_high": rnd(hi) if k_err is not None else None})
        df = pd.DataFrame(rows)
        ctx.tables["cgee"] = df
        if df.empty:
            return [self.unmeasurable("Induced error", "0.37%", "because no trace was given")]
        meas_parts = self._measured(ctx, err_c)
        out = [self.row("CGEE-induced error (answer-level, per problem: the selected answer differs from full-depth "
                        "verification's; the paper counts per verification call)",
                        "0.37% (6 of 1,616 verification calls)",
                        "; ".join(f"{r.model}/{r.benchmark}/{r.layout}: {r.errors} of {r.n_problems} (skipped "
                                  f"{r.skipped}, early exits on {r.early_exit_problems}, mean exit "
                                  f"{fmt(r.mean_exit_layer)} of {r.layers})" for r in df.itertuples()),
                        "; ".join(meas_parts) or "not run",
                        ctx.src(infos, extra="CGEE at the paper's defaults on No-KV sharing; 95% Wilson intervals"),
                        combine(err_c), {"table": rows}, err_c)]
        return out + [self._skip_row(ctx, infos, skip, *b) for b in
                      (("mmlu", self.skip_mmlu, "MMLU-STEM 92%"), ("gsm8k", None, "GSM8K (no figure)"))]

    def _measured(self, ctx, err_c: list) -> list[str]:
        """The real module's answer-level errors (appended to ``err_c``) and their texts."""
        parts = []
        for name, res in ctx.measured["speedup"].items():
            dec = ctx.measured["per_problem"]["speedup"].get(name)
            if dec is None or "answer" not in dec:
                continue
            piv = dec.pivot(index="problem", columns="policy", values="answer")
            sel = dec.pivot(index="problem", columns="policy", values="selected")
            if "cgee" not in piv or "no-kv" not in piv:
                continue
            k = int((piv["cgee"].astype(str) != piv["no-kv"].astype(str)).sum())
            kb = int((sel["cgee"] != sel["no-kv"]).sum())
            nn = len(piv)
            parts.append(f"{name}: selected answer differs from No-KV's on {k} of {nn} problems; selected branch "
                         f"differs on {kb} of {nn} (branch-level, `cgee_induced_error` = "
                         f"{fmt(res.get('cgee_induced_error'))}); skip rate {fmt(res.get('cgee_skip_rate'))}")
            err_c.append(judge_rate(Cond(f"real run {name} (answer-level)", None, kind=ctx.real_kind(res),
                                         primary=False), k, nn, self.error, "below"))
        return parts

    def _skip_row(self, ctx, infos, skip, bench: str, paper_v, label: str) -> dict:
        sel = [x for x in skip if x[0].dataset == bench]
        if not sel:
            return self.unmeasurable(f"Skip rate per benchmark: {bench}", label, f"because no {bench} trace was given")
        conds = []
        for i, k, n, kind in sel:
            c = Cond(f"{i.model}/{i.layout}", None, kind=kind,
                     untestable=None if paper_v is not None else
                     f"the paper gives no {bench.upper()} skip rate (42% is GPQA's, 92% MMLU-STEM's); rksim's is "
                     f"{k} of {n} = {fmt(k / n)}")
            conds.append(judge_rate(c, k, n, paper_v if paper_v is not None else self.skip_gpqa, "above"))
        return self.row(f"Skip rate per benchmark: {bench}", f"{label}; 42% on GPQA (not captured here)",
                        "; ".join(f"{c.label}: {fmt(c.value)} [{fmt(c.lo)}, {fmt(c.hi)}]" for c in conds),
                        "as simulated (the verification curves are measured)",
                        ctx.src([i for i in infos if i.dataset == bench], extra="95% Wilson intervals"),
                        combine(conds), {}, conds)


@dataclass(frozen=True)
class EntropyCollapse(ClaimUnit):
    """RKSC paper, CGEE's premise (DESIGN §4, the two-level confidence gate): the verification pass's
    logit-lens entropy collapses before the last layer, so an early exit can stop there. No figure:
    judged per model on every trace's own generations (:func:`app.verdicts.judge_premise`)."""

    name = "entropy"
    group = "CGEE"

    def rows(self, ctx) -> list[dict]:
        if not ctx.infos:
            return []
        curves, rows = {}, []
        for i in ctx.infos:
            tf = ctx.lts[i.name].tf  # the caller-owned loaded trace, not a module cache
            H = np.stack([f.lens[("own", True)]["entropy"] for f in tf.problems])  # (P, B, L)
            curves.setdefault(i.model, []).append(H.reshape(-1, H.shape[-1]).mean(0))
        for model, cs in sorted(curves.items()):
            c = np.mean(np.stack(cs), 0)
            L = len(c)
            peak = int(np.argmax(c))
            mid = (c[peak] + c[-1]) / 2
            below = [l for l in range(peak, L) if c[l] <= mid]
            collapsed = c[-1] <= 0.5 * c[peak]
            at = below[0] + 1 if (collapsed and below) else None
            rows.append({"model": model, "layers": L, "entropy_first": rnd(c[0]), "entropy_peak": float(c[peak]),
                         "peak_layer": peak + 1, "entropy_last": float(c[-1]), "collapse_layer": at,
                         "collapse_depth": rnd(at / L) if at else None, "curve": [rnd(x) for x in c]})
        ctx.tables["entropy"] = pd.DataFrame(rows).drop(columns="curve") if rows else pd.DataFrame()
        ctx.figures["entropy"] = rows
        out = []
        for r in rows:
            v = judge_premise(r["entropy_peak"], r["peak_layer"], r["entropy_last"], r["collapse_layer"],
                              r["layers"])
            out.append(self.row(f"Logit-lens entropy collapses before the last layer ({r['model']})",
                                "(premise of early exit; no figure)",
                                f"collapse (half-way from peak to final) at layer {r['collapse_layer']} of "
                                f"{r['layers']}" if r["collapse_layer"] else "no collapse",
                                "measured at capture (verification pass, every layer)",
                                f"every trace of {r['model']}, own generations, normalised lens", v,
                                {k: r[k] for k in r if k != "curve"}))
        return out
