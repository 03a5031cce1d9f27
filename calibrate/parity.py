"""Decision parity: the recorded signals of a real run, replayed through the same policy objects.

Each decision record of ``calibrate run`` holds the signals its decisions were
made from (the gate's per-layer cosines, the vote shares / mean token
probabilities, the logit-lens entropies of the layers the pass actually ran).
Replaying them through the batch entry points the simulator uses
(``plan``, ``skip``, ``exit_layer`` / ``decide``) must give the decisions the
live run took layer by layer (``should_exit``) — 100% on every run.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

# A layer the real pass never ran has no entropy; replay it as "cannot exit there".
NOT_RUN = 1e9


def replay_one(rec: dict, pol) -> dict[str, bool]:
    out = {}
    ids = [np.asarray(x, dtype=np.int64) for x in rec["prompt_ids"]]
    cos = None if rec.get("cos") is None else np.asarray([np.asarray(r, dtype=np.float64) for r in rec["cos"]])
    spans = np.asarray([np.asarray(s, dtype=np.int64) for s in rec["spans"]])
    if hasattr(pol, "plan"):
        plan = pol.plan(ids, cos=cos, variant_spans=spans)
        out["share_root"] = plan.share_root.tolist() == list(rec["share_root"])
        out["reused"] = plan.reused.tolist() == list(rec["reused"])
    exit_pol = getattr(pol, "cgee", pol if getattr(pol, "name", "") == "cgee" else None)
    if exit_pol is not None:
        conf = np.asarray(rec["vote_share"] if exit_pol.confidence == "vote" else rec["mean_prob"], dtype=np.float64)
        skipped, winner = exit_pol.skip(conf, list(rec["answers"]))
        out["skipped"] = bool(skipped) == bool(rec["skipped"])
        if not skipped:
            ent = np.asarray([np.asarray(r, dtype=np.float64) for r in rec["entropy"]])
            ent = np.where(np.isnan(ent), NOT_RUN, ent)
            layers = [exit_pol.exit_layer(row) for row in ent]
            out["exit_layer"] = layers == list(rec["exit_layer"])
            out["selected"] = int(np.argmax(np.asarray(rec["scores"], dtype=np.float64))) == int(rec["selected"])
    return out


def replay_agreement(dec: pd.DataFrame, pols: dict) -> float:
    """Share of decision records whose every replayed decision matches."""
    ok = [all(replay_one(rec, pols[rec["policy"]]).values()) for rec in dec.to_dict("records")]
    return float(np.mean(ok)) if ok else float("nan")


def parity_vs_trace(dec: pd.DataFrame, trace_path, pols: dict, policy_params: dict) -> pd.DataFrame:
    """Per (problem, policy, decision): does the simulator's replay of ``trace_path`` decide as the run did?

    The trace must hold the same problems, branches, seeds and sampling settings (``calibrate run
    --capture`` captures it with ``traces.capture`` on the same loaded model). The simulator is
    ``sim.api.simulate`` with ``verify_reuses_kv = False`` (the runner recomputes verification).
    Decisions compared: the sharing plan (which branches share the root's KV, tokens reused), the
    CGEE skip, every branch's exit layer, and the selected branch.
    """
    from sim.api import Session, simulate
    from traces.store import load_trace

    tr = load_trace(trace_path)
    session = Session(tr)  # this check's: the trace's features are built once
    pos_of = {int(p.index): i for i, p in enumerate(tr.problems)}
    rows = []
    for rec in dec.to_dict("records"):
        pol = rec["policy"]
        pos = pos_of.get(int(rec["problem"]))
        if pos is None:
            continue
        r = simulate(session, pol, params=policy_params.get(pol, {}), hardware="h200", problems=[pos],
                     workload={"verify_reuses_kv": False}, baselines=False)
        br = r.branches.sort_values("branch")
        pr = r.problems.iloc[0]
        got = {
            "shared": [bool(x) for x in br["shared"]] == [bool(x) for x in rec["share_root"]],
            "reused": int(pr["reused_tokens"]) == int(np.sum(rec["reused"])),
            "skipped": bool(pr["skipped"]) == bool(rec["skipped"]),
            "exit_layer": [int(x) for x in br["exit_layer"]] ==
                          ([int(x) for x in rec["exit_layer"]] if not rec["skipped"] else [0] * len(br)),
            "selected": int(np.flatnonzero(br["selected"].to_numpy())[0]) == int(rec["selected"]),
        }
        own = tr.problems[pos].branches
        got_tokens = [list(map(int, g)) for g in own["gen_ids"]]
        for k, v in got.items():
            rows.append({"problem": int(rec["problem"]), "policy": pol, "decision": k, "match": bool(v),
                         "detail": float("nan")})
        if any(np.isfinite(rec["sigma"])):
            # not a decision: how far the live gate's sigma is from the trace's (see docs/calibration.md)
            diff = float(np.nanmax(np.abs(np.asarray(rec["sigma"], float) - br["sigma"].to_numpy(float))))
            rows.append({"problem": int(rec["problem"]), "policy": pol, "decision": "sigma_info",
                         "match": diff == 0.0, "detail": diff})
        if not any(rec["share_root"]):
            rows.append({"problem": int(rec["problem"]), "policy": pol, "decision": "gen_tokens",
                         "match": got_tokens == [list(map(int, g)) for g in rec["gen_ids"]], "detail": float("nan")})
    return pd.DataFrame(rows)
