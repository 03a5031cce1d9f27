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
