"""Fit NCCL collective times on Vidur's measured network profiles: latency + size / bandwidth.

The data are Vidur's (Microsoft, MIT license) ``data/profiling/network/<node>/{all_reduce,send_recv}.csv``,
shipped unchanged in ``calibrate/data/vidur/network/`` (``SOURCE.md`` beside them): rank 0's CUDA time
(milliseconds, median over the active steps) of one NCCL all-reduce or send/recv of ``size`` bytes over
``num_workers`` GPUs, ``devices_per_node`` of them on each node, on DGX A100 / DGX H100 nodes (NVSwitch)
and on nodes whose GPUs are NVLink-connected in pairs (``*_pairwise_nvlink``).

Per (node profile, collective, num_workers, devices_per_node) the fit is the alpha-beta model of
collective communication (Hockney; the form NCCL's own tuning model uses per algorithm and protocol),
piecewise in the message size::

    t(N) = latency_k + N / bw_k        for N in segment k  (N < max_size_k; the last segment is open)

with ``N`` the message size in bytes. NCCL switches protocol and algorithm with the size (LL, LL128,
Simple; ring or tree), and the measured times step where it does (A100, 4 GPUs: 20 us up to 100 KiB,
60 us from 104 KiB), which one line cannot follow; so the sizes are split into at most
:data:`MAX_SEGMENTS` segments at breakpoints on a power-of-two grid, chosen by dynamic programming
to minimise the fit cost, a further segment kept only if it lowers the cost by :data:`SPLIT_GAIN`.
Each segment is fitted by ``scipy.optimize.least_squares`` on the relative residual
``t_pred / t - 1`` (soft-L1, so the jitter of the microsecond-scale small messages does not pull the
bandwidth), over the median time of each size. ``bw`` is the *algorithm* bandwidth (bytes of the
message per second, NCCL's ``algbw``), not the link's; for a ring all-reduce the bus bandwidth is
``2 (p - 1) / p`` times it. Residuals are reported per GPU count and per size range, for the segments
and for a single line (``single_line``) for comparison.

vLLM does not run NCCL for most tensor-parallel all-reduces on an NVLink node: below ``max_size`` its own
``CustomAllreduce`` (``vllm/distributed/device_communicators/custom_all_reduce.py``) runs a one-shot kernel
(every rank reads every peer's buffer and sums) or, above a threshold that depends on the GPU count, a two-shot
kernel (reduce-scatter then all-gather through peer memory; ``csrc/custom_all_reduce.cuh``). :func:`fit_custom_ar`
fits the same line, one per GPU count and kernel, on the public per-size measurements copied into
``calibrate/data/collectives/vllm_custom_ar.yaml`` (:data:`CUSTOM_AR_DATA`; each set names its source and how it
was timed), and :data:`CUSTOM_AR_RULES` carries vLLM's size rules for the node.

``python -m calibrate.collectives`` prints the fits; ``--write`` writes the residual table to
``calibrate/data/vidur/network-fit.json`` and the coefficients into the ``collectives`` block of the
node presets that name a profile (``sim/presets/nodes/*.yaml``, ``collectives.profile``), and the
``custom_allreduce`` block of the presets :data:`CUSTOM_AR_RULES` names and of those sharing their fabric
(:func:`fabric_twin`).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "vidur" / "network"
PROFILES = ("a100_dgx", "h100_dgx", "a100_pairwise_nvlink", "h100_pairwise_nvlink")
COLLECTIVES = ("all_reduce", "send_recv")
SOURCE = ("github:microsoft/vidur data/profiling/network/ (commit 60277c06b41e49483609bdab55f71fe0fb5fdd54, "
          "MIT license, copies in calibrate/data/vidur/network/)")
# Size ranges the residuals are reported over (bytes, [lo, hi)).
SIZE_RANGES = ((0, 1 << 16), (1 << 16, 1 << 20), (1 << 20, 1 << 24), (1 << 24, 1 << 40))
FIT_PATH = DATA.parent / "network-fit.json"
MAX_SEGMENTS = 3
SPLIT_GAIN = 0.7          # a further segment must bring the cost below 0.7 x the cost without it
MIN_POINTS = 12           # sizes per segment at least
BREAKS = tuple(1 << k for k in range(13, 26))   # candidate breakpoints: 8 KiB .. 32 MiB

CUSTOM_AR_DATA = DATA.parent.parent / "collectives" / "vllm_custom_ar.yaml"
VLLM_SOURCE = "github:vllm-project/vllm@00d618aab60448acdf3fac3e9c4e2e22d0c6c753"
MiB = 1 << 20
# vLLM's rules for when CustomAllreduce runs and which kernel, per node preset and GPU count.
# max_size_bytes: should_custom_ar() takes a message of fewer bytes than CustomAllreduce.max_size, which is
#   min(CUSTOM_ALL_REDUCE_MAX_SIZES[capability][world_size], 8 MiB) (custom_all_reduce.py, max_size default
#   8192 * 1024; all_reduce_utils.py, "9.0": 64 MiB / 32 MiB / 512 KiB / 256 KiB at 2 / 4 / 6 / 8 GPUs) when the
#   torch symmetric-memory communicator is enabled, which VLLM_ALLREDUCE_USE_SYMM_MEM=1 (vllm/envs.py default)
#   does on Hopper; larger messages go to that communicator or NCCL (cuda_communicator.py: all_reduce).
# one_shot_max_bytes: csrc/custom_all_reduce.cuh CustomAllreduce::allreduce: 2 GPUs always one-shot
#   (cross_device_reduce_1stage; None: no limit); fully NVLink-connected, one-shot while bytes < 512 KiB (<= 4
#   GPUs) or < 256 KiB (<= 8 GPUs), else two-shot (cross_device_reduce_2stage).
CUSTOM_AR_RULES = {
    "dgx-h100": {"max_size_bytes": {2: 8 * MiB, 4: 8 * MiB, 8: MiB // 4},
                 "one_shot_max_bytes": {2: None, 4: MiB // 2, 8: MiB // 4}},
}


def _profile(node: str):
    """The ``collectives.profile`` a shipped node preset names (the fabric its NCCL lines were measured on), or None."""
    from sim.cost.profiles import PRESET_DIR, read_preset_file
    path = PRESET_DIR / "nodes" / f"{node}.yaml"
    return (read_preset_file(path).get("collectives") or {}).get("profile") if path.is_file() else None


def fabric_twin(node: str):
    """The node of :data:`CUSTOM_AR_RULES` whose measured custom lines ``node`` takes: itself, else the one whose
    preset names the same ``collectives.profile``. One fabric, one set of lines: ``dgx-h200`` names the DGX H100's
    (fourth-generation NVLink through third-generation NVSwitches, compute capability 9.0, so vLLM's same rules).
    None where no node does."""
    if node in CUSTOM_AR_RULES:
        return node
    prof = _profile(node)
    return next((n for n in CUSTOM_AR_RULES if prof is not None and _profile(n) == prof), None)


def _range_name(lo: int, hi: int) -> str:
    def h(x):
        for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if x >= 1 << k:
                return f"{x >> k}{unit}"
        return f"{x}B"
    return f"{h(lo)}-{h(hi)}" if hi < 1 << 40 else f">={h(lo)}"


def load(profile: str, collective: str) -> pd.DataFrame:
    """``size, num_workers, devices_per_node, seconds`` (median over duplicate rows of one size)."""
    path = DATA / profile / f"{collective}.csv"
    d = pd.read_csv(path)
    col = f"time_stats.{collective}.median"
    g = d.groupby(["num_workers", "devices_per_node", "size"], as_index=False)[col].median()
    return g.rename(columns={col: "seconds"}).assign(seconds=lambda x: x["seconds"] * 1e-3)


def fit_line(size: np.ndarray, seconds: np.ndarray) -> tuple[float, float, np.ndarray]:
    """``(latency_s, bw_bytes_per_s, relative residuals)`` of ``t = latency + size / bw``."""
    from scipy.optimize import least_squares

    size = np.asarray(size, np.float64)
    y = np.asarray(seconds, np.float64)
    # parameters: latency in microseconds, inverse bandwidth in seconds per GB (well scaled for the solver)
    def pred(x):
        return x[0] * 1e-6 + size * x[1] * 1e-9

    big = size >= np.quantile(size, 0.75)
    inv0 = float(np.median(y[big] / size[big])) * 1e9
    x0 = [float(np.min(y)) * 1e6, inv0]
    r = least_squares(lambda x: pred(x) / y - 1.0, x0, loss="soft_l1", f_scale=0.05,
                      bounds=([0.0, 1e-6], [1e5, 1e6]))
    return float(r.x[0] * 1e-6), float(1e9 / r.x[1]), pred(r.x) / y - 1.0


def _cost(rel: np.ndarray, f_scale: float = 0.05) -> float:
    z = (rel / f_scale) ** 2
    return float(np.sum(f_scale ** 2 * 2.0 * (np.sqrt(1.0 + z) - 1.0)))   # soft-L1, as least_squares uses


def fit_segments(size: np.ndarray, seconds: np.ndarray) -> tuple[list[dict], np.ndarray]:
    """Segments ``[{max_size (None: open), latency_s, bw_bytes_per_s, n}]`` and the relative residuals."""
    size = np.asarray(size, np.float64)
    y = np.asarray(seconds, np.float64)
    order = np.argsort(size)
    size, y = size[order], y[order]
    cuts = [0] + [int(np.searchsorted(size, b)) for b in BREAKS] + [size.size]
    cuts = sorted(set(c for c in cuts if 0 <= c <= size.size))
    memo: dict = {}

    def seg(i, j):
        if (i, j) not in memo:
            lat, bw, rel = fit_line(size[cuts[i]:cuts[j]], y[cuts[i]:cuts[j]])
            memo[(i, j)] = (_cost(rel), lat, bw)
        return memo[(i, j)]

    m = len(cuts) - 1
    # best[k][j]: cheapest split of cuts[0]..cuts[j] into k segments of >= MIN_POINTS sizes each
    best = [{0: (0.0, [])}]
    for k in range(1, MAX_SEGMENTS + 1):
        cur = {}
        for j in range(1, m + 1):
            for i, (c0, path) in best[k - 1].items():
                if i < j and cuts[j] - cuts[i] >= MIN_POINTS:
                    c = c0 + seg(i, j)[0]
                    if j not in cur or c < cur[j][0]:
                        cur[j] = (c, path + [(i, j)])
        best.append(cur)
    chosen = None
    for k in range(1, MAX_SEGMENTS + 1):
        if m in best[k] and (chosen is None or best[k][m][0] < SPLIT_GAIN * chosen[0]):
            chosen = best[k][m]
    segs, rel = [], np.empty(size.size)
    for n_seg, (i, j) in enumerate(chosen[1]):
        _, lat, bw = seg(i, j)
        last = n_seg == len(chosen[1]) - 1
        segs.append({"max_size": None if last else int(size[cuts[j]]), "latency_s": lat, "bw_bytes_per_s": bw,
                     "n": int(cuts[j] - cuts[i])})
        rel[cuts[i]:cuts[j]] = (lat + size[cuts[i]:cuts[j]] / bw) / y[cuts[i]:cuts[j]] - 1.0
    back = np.empty_like(rel)
    back[order] = rel
    return segs, back


def _by_range(sz: np.ndarray, rel: np.ndarray) -> dict:
    out = {}
    for lo, hi in SIZE_RANGES:
        sel = (sz >= lo) & (sz < hi)
        if sel.any():
            out[_range_name(lo, hi)] = {
                "n": int(sel.sum()), "median_rel_error": float(np.median(rel[sel])),
                "median_abs_rel_error": float(np.median(np.abs(rel[sel]))),
                "max_abs_rel_error": float(np.max(np.abs(rel[sel])))}
    return out


def fit() -> dict:
    """Every (profile, collective, num_workers, devices_per_node) line with its residuals."""
    out = {"source": SOURCE, "model": "t = latency_s + size_bytes / bw_bytes_per_s (relative soft-L1 least squares)",
           "size_ranges": [_range_name(lo, hi) for lo, hi in SIZE_RANGES], "profiles": {}}
    for prof in PROFILES:
        pr = out["profiles"][prof] = {}
        for coll in COLLECTIVES:
            d = load(prof, coll)
            rows = []
            for (nw, dpn), g in d.groupby(["num_workers", "devices_per_node"]):
                sz, y = g["size"].to_numpy(), g["seconds"].to_numpy()
                segs, rel = fit_segments(sz, y)
                lat1, bw1, rel1 = fit_line(sz, y)
                rows.append({"num_workers": int(nw), "devices_per_node": int(dpn), "segments": segs,
                             "sizes": [int(sz.min()), int(sz.max())], "n": int(len(sz)),
                             "median_abs_rel_error": float(np.median(np.abs(rel))),
                             "rel_rms": float(np.sqrt(np.mean(rel ** 2))), "by_size_range": _by_range(sz, rel),
                             "single_line": {"latency_s": lat1, "bw_bytes_per_s": bw1,
                                             "median_abs_rel_error": float(np.median(np.abs(rel1))),
                                             "rel_rms": float(np.sqrt(np.mean(rel1 ** 2))),
                                             "by_size_range": _by_range(sz, rel1)}})
            pr[coll] = rows
    return out


def node_block(res: dict, profile: str) -> dict:
    """The ``collectives`` block of a node preset: the intra-node lines (all GPUs on one node), and the
    two-node send/recv (one GPU per node) as ``send_recv_inter_node``."""
    p = res["profiles"][profile]

    def segs(r):
        return [{"max_size": s["max_size"], "latency_s": float(f"{s['latency_s']:.4g}"),
                 "bw_bytes_per_s": float(f"{s['bw_bytes_per_s']:.4g}")} for s in r["segments"]]

    ar = {str(r["num_workers"]): segs(r) for r in p["all_reduce"] if r["num_workers"] == r["devices_per_node"]}
    sr = [r for r in p["send_recv"] if r["devices_per_node"] == 2]
    sx = [r for r in p["send_recv"] if r["devices_per_node"] == 1]
    blk = {"profile": profile, "source": SOURCE, "residuals": "calibrate/data/vidur/network-fit.json",
           "max_size_bytes": int(max(r["sizes"][1] for r in p["all_reduce"])), "all_reduce": ar}
    if sr:
        blk["send_recv"] = segs(sr[0])
    if sx:
        blk["send_recv_inter_node"] = segs(sx[0])
    return blk


def load_custom_ar(path: Path = CUSTOM_AR_DATA) -> dict:
    """The measurement sets and the fit selection of ``vllm_custom_ar.yaml`` (errors name the file and key)."""
    import yaml

    d = yaml.safe_load(Path(path).read_text())
    for key in ("sets", "fit"):
        if not isinstance(d, dict) or not isinstance(d.get(key), dict):
            raise ValueError(f"{path}: needs a mapping {key!r}")
    for name, st in d["sets"].items():
        for key in ("source", "cuda_graph", "rows"):
            if key not in st:
                raise ValueError(f"{path}: sets.{name} needs {key!r}")
    return d


def fit_custom_ar(path: Path = CUSTOM_AR_DATA) -> dict:
    """Per node, GPU count and kernel (``one_shot``, ``two_shot``) the line ``t = latency_s + bytes / bw``
    (:func:`fit_line`, relative soft-L1) over the points ``vllm_custom_ar.yaml``'s ``fit`` selects, with its
    residuals; and ``eager_vs_graph``: at 4 GPUs, the kernel-bound eager loop's times over the CUDA-graph
    two-shot times at the same sizes (the check that those eager points time the kernel)."""
    d = load_custom_ar(path)
    root = Path(__file__).resolve().parents[1]
    path = Path(path)
    out = {"source": str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path),
           "model": "t = latency_s + size_bytes / bw_bytes_per_s (relative soft-L1 least squares)", "nodes": {}}
    for node, per in d["fit"].items():
        nd = out["nodes"][node] = {}
        for g, paths in per.items():
            for kind, picks in paths.items():
                pts = []
                for set_name, series, lo in picks:
                    st = d["sets"].get(set_name)
                    if st is None:
                        raise ValueError(f"{path}: fit.{node}.{g}.{kind} names unknown set {set_name!r}")
                    rows = (st["rows"].get(int(g)) or st["rows"].get(str(g)) or {}).get(series)
                    if rows is None:
                        raise ValueError(f"{path}: sets.{set_name}.rows.{g} has no series {series!r}")
                    pts += [(float(b), float(us) * 1e-6, set_name) for b, us in rows if b >= lo]
                sz = np.array([p[0] for p in pts])
                y = np.array([p[1] for p in pts])
                lat, bw, rel = fit_line(sz, y)
                nd.setdefault(str(g), {})[kind] = {
                    "latency_s": lat, "bw_bytes_per_s": bw, "n": int(sz.size),
                    "sizes": [int(sz.min()), int(sz.max())], "sets": sorted({p[2] for p in pts}),
                    "median_abs_rel_error": float(np.median(np.abs(rel))),
                    "max_abs_rel_error": float(np.max(np.abs(rel))),
                    "points": [{"bytes": int(b), "seconds": float(t), "predicted": float(lat + b / bw)}
                               for b, t in zip(sz, y)]}
    eager = {int(b): us for b, us in d["sets"]["sglang_2904"]["rows"][4]["vllm_custom_ar"]
             if b >= d["sets"]["sglang_2904"].get("kernel_bound_from_bytes", 0)}
    graph = {int(b): us for b, us in d["sets"]["vllm_24111"]["rows"][4]["ca_2stage"]}
    out["eager_vs_graph"] = {str(b): eager[b] / graph[b] for b in sorted(set(eager) & set(graph))}
    return out


def custom_block(res: dict, node: str) -> dict:
    """The ``custom_allreduce`` block of a node preset: vLLM's size rules (:data:`CUSTOM_AR_RULES`) and the
    fitted lines (4 significant figures), measured inside CUDA graphs."""
    measured = fabric_twin(node)
    rules = CUSTOM_AR_RULES[measured]
    lines = {g: {k: {"latency_s": float(f"{v['latency_s']:.4g}"), "bw_bytes_per_s": float(f"{v['bw_bytes_per_s']:.4g}")}
                 for k, v in per.items()} for g, per in sorted(res["nodes"][measured].items(), key=lambda kv: int(kv[0]))}
    on = "" if measured == node else f" on {measured} (the same collectives.profile: one fabric, one set of lines)"
    return {"source": (f"{VLLM_SOURCE} custom_all_reduce.py, all_reduce_utils.py, csrc/custom_all_reduce.cuh "
                       f"(rules); lines fitted by calibrate.collectives.fit_custom_ar{on}"),
            "data": "calibrate/data/collectives/vllm_custom_ar.yaml",
            "timing": ("per all-reduce inside CUDA graphs (2 GPUs: with eager points from 1 MiB, where the GPU "
                       "bounds the loop; see the data file)"),
            "max_size_bytes": {str(g): v for g, v in rules["max_size_bytes"].items()},
            "one_shot_max_bytes": {str(g): v for g, v in rules["one_shot_max_bytes"].items()},
            "lines": lines}


BEGIN = "# --- collectives fitted on Vidur's network profiles (python -m calibrate.collectives --write) ---"


def write_node(path: Path, block: dict, custom: dict | None = None) -> None:
    """Replace the fitted ``collectives`` block (and ``custom_allreduce``, when given) at the end of a node
    preset, in place (atomic)."""
    import yaml

    from traces.store import atomic_write_text

    t = Path(path).read_text()
    if BEGIN in t:
        t = t[:t.index(BEGIN)].rstrip("\n") + "\n"
    t = re.sub(r"^collectives:.*(\n[ ]+.*)*\n?", "", t, flags=re.M)
    body = {"collectives": block, **({"custom_allreduce": custom} if custom else {})}
    t = t.rstrip("\n") + "\n" + BEGIN + "\n" + yaml.safe_dump(body, sort_keys=False, width=110)
    atomic_write_text(path, t)


def main(argv=None) -> int:
    from sim.cost.profiles import PRESET_DIR, read_preset_file
    from traces.store import atomic_write_text

    ap = argparse.ArgumentParser(prog="python -m calibrate.collectives", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write network-fit.json and the node presets' collectives")
    a = ap.parse_args(argv)
    res = fit()
    for prof, colls in res["profiles"].items():
        for coll, rows in colls.items():
            for r in rows:
                segs = "  ".join(f"<{s['max_size'] or 'inf'}: {s['latency_s'] * 1e6:.1f} us + N/{s['bw_bytes_per_s'] / 1e9:.1f} GB/s"
                                 for s in r["segments"])
                print(f"{prof:22s} {coll:10s} gpus={r['num_workers']:2d} per_node={r['devices_per_node']} "
                      f"median|rel|={r['median_abs_rel_error']:.3f} (one line {r['single_line']['median_abs_rel_error']:.3f})  "
                      f"rms={r['rel_rms']:.3f}  {segs}")
    car = fit_custom_ar()
    for node, per in car["nodes"].items():
        for g, kinds in per.items():
            for kind, r in kinds.items():
                print(f"{node:10s} custom_all_reduce gpus={g} {kind:8s} {r['latency_s'] * 1e6:.2f} us + "
                      f"N/{r['bw_bytes_per_s'] / 1e9:.1f} GB/s  n={r['n']}  median|rel|={r['median_abs_rel_error']:.3f}"
                      f"  max|rel|={r['max_abs_rel_error']:.3f}")
    print("eager loop / CUDA graph, 4 GPUs two-shot:",
          "  ".join(f"{int(b) >> 10} KiB {v:.2f}" for b, v in car["eager_vs_graph"].items()))
    res["custom_allreduce"] = car
    if a.write:
        atomic_write_text(FIT_PATH, json.dumps(res, indent=1) + "\n")
        for p in sorted((PRESET_DIR / "nodes").glob("*.yaml")):
            prof = (read_preset_file(p).get("collectives") or {}).get("profile")
            if prof in res["profiles"]:
                name = read_preset_file(p).get("name", p.stem)
                has = fabric_twin(name) in car["nodes"]
                write_node(p, node_block(res, prof), custom_block(car, name) if has else None)
                print(f"wrote {p}")
        print(f"wrote {FIT_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
