"""VASE: value-range reservation and stochastic sampling improve quality at 4× compression, VASE beats the
baselines, and VASE-DKV's throughput over a full cache at 16K-token decodes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from app.claims.base import ClaimUnit
from app.claims.common import VASE_TARGETS, rounded as rnd
from app.verdicts import TOL, Cond, bootstrap_mean, combine, fmt, judge_at_least, judge_better


@dataclass(frozen=True)
class VaseQuality(ClaimUnit):
    """VASE paper, quality at 4× KV compression (DESIGN §7; the policies DESIGN §4): value-range reservation
    +16.2% GSM8K accuracy over the baselines, stochasticity +9.2%; and VASE beats SnapKV, H2O,
    StreamingLLM, R-KV and CurDKV.

    Each ablation pairs a VASE variant with itself without the mechanism (``value_frac=0``,
    ``deterministic=true``): simulated attention-output error on each long-decode trace's own K/V/Q
    (paired by seed) and the real model's KL / answer agreement / accuracy (``calibrate quality``,
    paired by problem).
    """

    name = "vase-quality"
    group = "VASE"
    reservation: float = 0.162
    stochastic: float = 0.092
    baselines: tuple = ("snapkv", "h2o", "streamingllm", "rkv", "curdkv")
    variants: tuple = ("vase-attnv", "vase-dkv")
    compression: int = 4

    def specs(self) -> list[str]:
        return [*self.baselines, *self.variants, *(f"{v}:value_frac=0" for v in self.variants),
                *(f"{v}:deterministic=true" for v in self.variants)]

    def rows(self, ctx) -> list[dict]:
        infos = ctx.pick(long=True)
        q = ctx.measured["quality"]
        seeds = [ctx.cfg.seed + k for k in range(ctx.cfg.vase_seeds)]
        sim_rows, per_seed, kinds = self._simulated(ctx, infos, seeds)
        sim_df = pd.DataFrame(sim_rows)
        ctx.tables["vase_sim"] = sim_df
        meas_rows, full_acc = [], {}
        for name, res in q.items():
            full_acc[name] = (res.get("full_accuracy"), res.get("n_problems"))
            for t in res.get("table", []):
                if float(t.get("compression", 0)) == float(self.compression):
                    meas_rows.append({"run": name, "policy": t["policy"], "kl": rnd(t.get("kl")),
                                      "agreement": rnd(t.get("agreement")), "accuracy": rnd(t.get("accuracy")),
                                      "proxy_attn_err": rnd(t.get("proxy"))})
        meas_df = pd.DataFrame(meas_rows)
        ctx.tables["vase_measured"] = meas_df
        ctx.figures["vase"] = {"sim": sim_rows, "measured": meas_rows}
        acc_floor = {run: (f"full-cache accuracy is {fmt(a)} on {n} problems ({int(round((a or 0) * (n or 0)))} "
                           f"solved): an accuracy gain cannot be measured") for run, (a, n) in full_acc.items()}
        out = []
        for claim, suffix, paper in (("Value-range reservation improves quality at 4× compression", ":value_frac=0",
                                      self.reservation),
                                     ("Stochastic sampling improves quality at 4× compression",
                                      ":deterministic=true", self.stochastic)):
            conds, parts = [], []
            for v in self.variants:
                for run in q:
                    rk = _real_kind(q[run])
                    self._compare(ctx, conds, f"{v} KL, {run}", rk, self._real_pair(ctx, run, v, v + suffix, "kl_mean"),
                                  True)
                    self._compare(ctx, conds, f"{v} answer agreement, {run}", rk,
                                  self._real_pair(ctx, run, v, v + suffix, "agree"), False)
                    self._compare(ctx, conds, f"{v} accuracy, {run}", rk,
                                  self._real_pair(ctx, run, v, v + suffix, "correct"), False,
                                  untestable=acc_floor[run] if (full_acc[run][0] or 0) * (full_acc[run][1] or 0) < 2
                                  else None)
                    kl_on, kl_off = (meas_df[(meas_df["policy"] == p)]["kl"].mean() for p in (v, v + suffix))
                    parts.append(f"{v}: KL {fmt(kl_on)} vs {fmt(kl_off)} without")
                for i in infos:
                    a, b = per_seed.get((i.name, v)), per_seed.get((i.name, v + suffix))
                    self._compare(ctx, conds, f"{v} attention error, {i.model}", kinds[i.name],
                                  (a, b) if a is not None and b is not None else None, True)
            out.append(self.row(
                claim, f"+{paper * 100:.1f}% GSM8K accuracy over the ablation",
                "; ".join(f"{c.label}: {fmt(c.value)}" for c in conds if "attention" in c.label) or "—",
                "; ".join(parts) or "not run",
                ctx.src(infos, target=None,
                        extra=f"4× compression, budget K = round((P+T)/4) - buffer; simulated error: mean over "
                              f"{len(seeds)} seeds, paired by seed; measured: `rksim calibrate quality` "
                              "teacher-forced KL and free-generation answer agreement, paired by problem"),
                combine(conds), {}, conds))
        out.append(self._beats_baselines(ctx, infos, q, per_seed, kinds, sim_df, meas_df))
        return out

    def _simulated(self, ctx, infos, seeds) -> tuple[list, dict, dict]:
        """Every spec's attention-output error at 4× on each long-decode trace, over ``seeds``."""
        from policies.registry import parse_spec
        sim_rows, per_seed, kinds = [], {}, {}
        tgt = VASE_TARGETS[0]
        for i in infos:
            lt = ctx.lts[i.name]
            n_long = len(lt.tf.longs)
            kinds[i.name] = (f"simulated: the trace's own K/V/Q ({i.model}, {n_long} long-decode sequence"
                             f"{'s' if n_long != 1 else ''}), no cost model")
            for spec in self.specs():
                name, params = parse_spec(spec)
                K = ctx.api.token_budgets(lt, name, [self.compression])[f"{self.compression}x"]
                errs, recs = [], []
                for k, sd in enumerate(seeds):
                    if k == 2 and errs[0] == errs[1] and recs[0] == recs[1]:
                        # the same figure under two seeds: a deterministic policy, the same under every seed
                        errs += errs[:1] * (len(seeds) - 2)
                        recs += recs[:1] * (len(seeds) - 2)
                        break
                    # the quality proxies come from the trace's own K/V/Q; the cost target only prices time
                    r = ctx.api.simulate(lt, name, {**params, "budget": K}, model_preset=tgt[0], hardware=tgt[1],
                                         baselines=False, seed=sd)
                    errs.append(float(r.summary["attn_output_rel_error"]))
                    recs.append(float(r.summary["attn_mass_recall"]))
                per_seed[(i.name, spec)] = np.array(errs)
                sim_rows.append({"trace": i.name, "model": i.model, "policy": spec, "budget": K,
                                 "attn_output_rel_error": float(np.mean(errs)), "seeds": len(seeds),
                                 "err_min": min(errs), "err_max": max(errs), "attn_mass_recall": float(np.mean(recs))})
        return sim_rows, per_seed, kinds

    def _beats_baselines(self, ctx, infos, q, per_seed, kinds, sim_df, meas_df) -> dict:
        conds = []
        for v in self.variants:
            for bl in self.baselines:
                for run in q:
                    self._compare(ctx, conds, f"{v} vs {bl}: KL, {run}", _real_kind(q[run]),
                                  self._real_pair(ctx, run, v, bl, "kl_mean"), True)
                for i in infos:
                    a, b = per_seed.get((i.name, v)), per_seed.get((i.name, bl))
                    self._compare(ctx, conds, f"{v} vs {bl}: attention error, {i.model}", kinds[i.name],
                                  (a, b) if a is not None and b is not None else None, True)
        return self.row(
            "VASE beats SnapKV, H2O, StreamingLLM, R-KV and CurDKV at 4× compression",
            f"+{self.reservation * 100:.1f}% / +{self.stochastic * 100:.1f}% accuracy over baselines",
            "; ".join(f"{m}: " + ", ".join(f"{r.policy} {fmt(r.attn_output_rel_error)}" for r in g.itertuples()
                                            if ":" not in r.policy)
                      for m, g in sim_df.groupby("model", sort=True)) if not sim_df.empty else "—",
            "; ".join(f"{r.policy}: KL {fmt(r.kl)}, agree {fmt(r.agreement)}" for r in meas_df.itertuples()
                      if ":" not in r.policy) or "not run",
            ctx.src(infos, target=None, extra="4× compression; each VASE variant against each baseline, "
                                              "paired by problem (real) or by seed (simulated)"),
            combine(conds), {}, conds)

    def _real_pair(self, ctx, run: str, a: str, b: str, col: str):
        """Paired per-problem values of two policies in one real run (None when absent)."""
        t = ctx.measured["per_problem"]["quality"].get(run)
        if t is None or col not in t:
            return None
        t = t[t["compression"] == float(self.compression)] if "compression" in t else t
        x = t[t["policy"] == a].set_index("problem")[col]
        y = t[t["policy"] == b].set_index("problem")[col]
        idx = x.index.intersection(y.index)
        if not len(idx):
            return None
        return x.loc[idx].to_numpy(np.float64), y.loc[idx].to_numpy(np.float64)

    @staticmethod
    def _compare(ctx, conds, label, kind, xy, lower_is_better, primary=True, untestable=None):
        """A paired difference (bootstrap over problems or seeds) judged better-or-not, appended to ``conds``."""
        if xy is None:
            return
        x, y = xy
        v, lo, hi = bootstrap_mean(x - y, seed=ctx.cfg.seed)
        conds.append(judge_better(Cond(label, v, lo, hi, n=len(x), unit="problems" if "real" in kind else "seeds",
                                       kind=kind, primary=primary, untestable=untestable),
                                  float(np.mean(y)), lower_is_better))


def _real_kind(res: dict) -> str:
    """The evidence kind of one ``calibrate quality`` run."""
    cfg = res.get("config") or {}
    return (f"real: {cfg.get('model', 'smollm2-135m')} on this CPU ({cfg.get('threads')} thread), "
            f"{res.get('n_problems')} problems, {res.get('long_decode')}-token teacher-forced decodes")


@dataclass(frozen=True)
class VaseThroughput(ClaimUnit):
    """VASE paper, throughput (DESIGN §7): VASE-DKV 3.1× throughput over a full cache at 16K-token decodes,
    read through the capacity-aware serving engine at each VASE target's KV capacity
    (:data:`app.reproduce.VASE_TARGETS`), cache sizes from a long-decode trace; a second row on
    ``moe_targets`` (the same decodes, a mixture-of-experts target's costs and KV capacity)."""

    name = "vase-throughput"
    group = "VASE"
    paper_throughput: float = 3.1
    compression: int = 4
    # issue 33: the same claim on a mixture-of-experts Qwen3 (one H100 holds its bf16 weights) and on gpt-oss-20b
    # (MXFP4 experts as released; half its layers attend to a 128-token window, where eviction does not apply)
    moe_targets: tuple = (("qwen3-30b-a3b", "h100-sxm"), ("gpt-oss-20b", "h100-sxm"))

    def rows(self, ctx) -> list[dict]:
        infos = ctx.pick(long=True)
        if not infos:
            return [self.unmeasurable("VASE-DKV throughput over a full cache at 16K tokens", "3.1×",
                                      "because no long-decode trace was given")]
        return [self._row(ctx, infos[0], VASE_TARGETS, "vase_throughput", ""),
                self._row(ctx, infos[0], self.moe_targets, "vase_throughput_moe",
                          ", on an MoE target (" + ", ".join(f"{m} on {h}" for m, h in self.moe_targets) + ")")]

    def _row(self, ctx, i, targets, table: str, on: str) -> dict:
        """The claim on ``targets`` (each a deterministic serving run), its table in ``ctx.tables[table]``."""
        lt = ctx.lts[i.name]
        T, n = ctx.cfg.vase_decode_tokens, ctx.cfg.vase_requests
        conds, rows = [], []
        for model, hw in targets:
            K = ctx.api.token_budgets(lt, "vase-dkv", [self.compression], T)[f"{self.compression}x"]
            r = ctx.api.simulate(lt, "vase-dkv", {"budget": K}, model_preset=model, hardware=hw, mode="serving",
                                 baselines=False, workload={"concurrency": n, "n_requests": n},
                                 serving={"decode_tokens": T}, seed=ctx.cfg.seed)
            s = r.summary
            rows.append({"model": model, "hardware": hw, "budget": K, "throughput_vs_full": s["throughput_vs_full"],
                         "mean_running_seqs": rnd(s["mean_running_seqs"]),
                         "full_cache_mean_running_seqs": rnd(s["full_cache_mean_running_seqs"]),
                         "kv_capacity_bytes": rnd(s["kv_capacity_bytes"], 6)})
            # one deterministic serving run: no problems to resample (every request decodes T tokens at once)
            conds.append(judge_at_least(Cond(f"{model} on {hw}", s["throughput_vs_full"], n=None,
                                             kind=ctx.sim_kind(s, f", {n} requests, one deterministic run; cache "
                                                                  f"sizes from {i.model}'s long decodes")),
                                        TOL * self.paper_throughput, self.paper_throughput - 1.0))
        ctx.tables[table] = pd.DataFrame(rows)
        paper = "3.1× at 16K tokens" + (" (the paper's dense Qwen3 targets; no MoE figure)" if on else "")
        return self.row(f"VASE-DKV throughput over a full cache at {T / 1024:g}K-token decodes (capacity-aware "
                        f"serving){on}", paper,
                        "; ".join(f"{r['model']}: {fmt(r['throughput_vs_full'])}× (mean running "
                                  f"{r['mean_running_seqs']:.4g} vs {r['full_cache_mean_running_seqs']:.4g})"
                                  for r in rows),
                        "not measurable here: a 16K-token decode batch does not run on this CPU in the time given",
                        f"`{i.name}` long decodes set the cache sizes; {n} requests closed loop, {T}-token decodes, "
                        f"vLLM V1 scheduler at each target's KV capacity (gpu_memory_utilization 0.90), 4× "
                        "compression", combine(conds), {"table": rows}, conds)
