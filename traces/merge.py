"""``rksim trace merge``: parts captured with ``--shard I/N`` joined into one trace.

A part (``rksim capture ... --shard I/N``) holds every N-th problem (and long
decode and tree) from position I, each captured with the seeds of its position,
so its shards are the very shards an unsharded capture writes; only the
directory numbers (0.. within the part) and the manifest differ. Merging:

1. loads and fully verifies every part (checksums, tables, arrays);
2. checks that they are parts of one capture: the same ``model`` block, the same
   ``capture`` block and ``config.json`` except ``shard`` (dataset, layout,
   sampling, seeds, device type and dtype...), the same N, the same reference
   arrays; the first field that differs is named (``B: capture.seed: 1 here, 0
   in A``);
3. checks coverage: each part holds exactly the positions of its ``I/N``, no
   index twice (overlap), none of 0..N-1 missing;
4. copies the shards in position order to ``problems/p00000..``, ``long/..``,
   ``trees/..`` of a temporary directory beside ``--out``, writes the
   ``config.json`` the unsharded capture writes, recomputes every checksum in a
   fresh manifest, verifies the result with :func:`~traces.store.load_trace`,
   and renames it into place (atomic: ``--out`` is the complete trace or absent).

The merged trace equals an unsharded capture of the same command file for file,
except ``timings.parquet`` (measured) and ``manifest.json`` (``created``,
``command``, ``device`` and ``versions``, and ``merged_from`` listing the parts).
No torch here.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from traces.errors import TraceError
from traces.store import (
    CONFIG, SHARD, Trace, TraceWriter, load_trace, long_dir, problem_dir, tree_dir,
)

# Manifest keys that describe one sitting, not the capture: they may differ between parts.
_PER_SITTING = ("created", "command", "device", "versions", "rksim_version", "n_problems", "shards", "files",
                "manifest_sha256", "has_tree", "schema_version", "capture", "merged_from")


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 0 <= I < N; a bad spec raises a one-line ``--shard`` error."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if m is None:
        raise ValueError(f"--shard: {spec!r} is not I/N (part I of N, counting from 0, e.g. 0/4)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise ValueError(f"--shard: {spec}: N must be >= 1")
    if i >= n:
        raise ValueError(f"--shard: {spec}: I must be in 0..{n - 1} (parts count from 0)")
    return i, n


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Dotted path of the first field where two JSON values differ (sorted keys), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}{k}"
            d = first_difference(a[k], b[k], f"{path}{k}.")
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}{i}.")
            if d is not None:
                return d
        return None
    if type(a) is not type(b) or a != b:
        return path.rstrip(".") or "(value)"
    return None


def _get(obj: Any, dotted: str) -> Any:
    for k in dotted.split("."):
        if isinstance(obj, dict):
            obj = obj.get(k, "<absent>")
        elif isinstance(obj, list) and k.isdigit() and int(k) < len(obj):
            obj = obj[int(k)]
        else:
            return "<absent>"
    return obj


def _short(v: Any) -> str:
    s = json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _shard_of(tr: Trace, label: str) -> tuple[int, int]:
    cap = tr.manifest["capture"]
    if not isinstance(cap, dict):
        raise TraceError(f"{label}/manifest.json", "capture", "expected an object")
    spec = cap.get("shard")
    if spec is None:
        raise TraceError(label, "capture.shard",
                         "not a part (captured without --shard I/N); merge joins the parts of one sharded capture")
    try:
        shard = parse_shard(spec)
    except ValueError as exc:
        raise TraceError(label, "capture.shard", str(exc)) from None
    for k in ("problem_start", "problems", "long_decode", "long_decode_seqs", "tree_depth", "trees"):
        if isinstance(cap.get(k), bool) or not isinstance(cap.get(k), int):
            raise TraceError(f"{label}/manifest.json", f"capture.{k}", f"expected an integer, got {cap.get(k)!r}")
    return shard


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def _unsharded(d: dict) -> dict:
    return _without(d, "shard")


def _compare(ref: dict, other: dict, ref_label: str, label: str, prefix: str) -> None:
    diff = first_difference(ref, other)
    if diff is not None:
        field = f"{prefix}{diff}" if diff != "(value)" else prefix.rstrip(".")
        raise TraceError(label, field, f"{_short(_get(other, diff))} here, {_short(_get(ref, diff))} in {ref_label}: "
                         "the parts are not of one capture")


def check_parts(parts: Sequence[Trace], labels: Sequence[str]) -> list[tuple[int, int]]:
    """Raise :class:`TraceError` unless ``parts`` are the complete, disjoint parts of one capture."""
    if not parts:
        raise TraceError("rksim trace merge", "PART", "no part given")
    shards = [_shard_of(tr, lab) for tr, lab in zip(parts, labels)]
    ref, ref_label = parts[0], labels[0]
    ref_cfg = json.loads((ref.path / CONFIG).read_text())
    for tr, lab, (i, n) in zip(parts, labels, shards):
        m = tr.manifest
        # model.source (a local folder's path) may differ between machines; the model itself is
        # pinned by its whole block and by the reference arrays it computed (compared below)
        _compare(_without(ref.manifest["model"], "source"), _without(m["model"], "source"), ref_label, lab, "model.")
        _compare(_unsharded(ref.manifest["capture"]), _unsharded(m["capture"]), ref_label, lab, "capture.")
        cfg = json.loads((tr.path / CONFIG).read_text())
        _compare(_unsharded(ref_cfg), _unsharded(cfg), ref_label, lab, f"{CONFIG}.")
        rest = {k: v for k, v in ref.manifest.items() if k not in _PER_SITTING and k != "model"}
        _compare(rest, {k: m.get(k, "<absent>") for k in rest}, ref_label, lab, "")
        if n != shards[0][1]:
            raise TraceError(lab, "capture.shard", f"{i}/{n} here, {shards[0][0]}/{shards[0][1]} in {ref_label}: "
                             "parts of one capture share N")
        for name in ("reference_mean.npy", "reference_last.npy"):
            if (tr.path / name).read_bytes() != (ref.path / name).read_bytes():
                raise TraceError(f"{lab}/{name}", "values",
                                 f"differ from {ref_label}'s (computed on other hardware or software?): "
                                 "the centered similarities of the parts would not be comparable")
    n = shards[0][1]
    seen: dict[int, str] = {}
    for lab, (i, _) in zip(labels, shards):
        if i in seen:
            raise TraceError(lab, "capture.shard", f"{i}/{n} overlaps {seen[i]} (also part {i}/{n})")
        seen[i] = lab
    missing = [i for i in range(n) if i not in seen]
    if missing:
        raise TraceError("rksim trace merge", "PART", f"part {missing[0]}/{n} missing "
                         f"({len(missing)} of {n} parts not given; have {', '.join(f'{i}/{n}' for i in sorted(seen))})")
    return shards


def _positions(tr: Trace, lab: str, i: int, n: int) -> dict[str, list[tuple[int, str]]]:
    """(position, rel) of the part's problems, long decodes and trees; checks they are those of ``i/n``."""
    cap = tr.manifest["capture"]
    start, P = int(cap["problem_start"]), int(cap["problems"])
    n_long = int(cap["long_decode_seqs"]) if cap["long_decode"] else 0
    n_tree = int(cap["trees"]) if cap["tree_depth"] else 0
    got = {
        "problems": [(int(p.meta["problem_index"]) - start, p.rel) for p in tr.problems],
        "long": [(int(s.meta["seq_index"]), s.rel) for s in tr.long_decodes],
        "trees": [(int(t.meta["problem_index"]) - start, t.rel) for t in tr.trees],
    }
    for kind, total in (("problems", P), ("long", n_long), ("trees", n_tree)):
        want = list(range(i, total, n))
        have = [pos for pos, _ in got[kind]]
        if have != want:
            raise TraceError(lab, f"shards.{kind}", f"positions {have[:6]}{'...' if len(have) > 6 else ''}, "
                             f"part {i}/{n} of {total} must hold {want[:6]}{'...' if len(want) > 6 else ''}")
    return got


def merge_traces(parts: Sequence[str | os.PathLike], out: str | os.PathLike, command: str = "") -> dict:
    """Merge the parts of a sharded capture into ``out``; returns the new manifest.

    Raises :class:`TraceError` (one line naming the part and field) for a part
    that does not load or verify, parts of different captures, overlapping or
    missing parts, or an ``out`` that already holds something; nothing is
    written then.
    """
    out = Path(out)
    labels = [str(p) for p in parts]
    if len(set(os.path.realpath(p) for p in parts)) != len(parts):
        dup = next(lab for k, lab in enumerate(labels) if os.path.realpath(lab) in
                   {os.path.realpath(x) for x in labels[:k]})
        raise TraceError(dup, "PART", "given twice")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TraceError(str(out), "--out", "exists and is not an empty directory; nothing was written")
    if any(os.path.realpath(out) == os.path.realpath(p) for p in parts):
        raise TraceError(str(out), "--out", "is one of the parts")
    traces = []
    for p, lab in zip(parts, labels):
        try:
            traces.append(load_trace(p, verify=True))
        except TraceError as exc:
            raise TraceError(f"{lab}/{exc.file}", exc.field, exc.what) from None
    shards = check_parts(traces, labels)
    where: dict[str, list[tuple[int, Trace, str]]] = {"problems": [], "long": [], "trees": []}
    for tr, lab, (i, n) in zip(traces, labels, shards):
        for kind, items in _positions(tr, lab, i, n).items():
            where[kind] += [(pos, tr, rel) for pos, rel in items]
    ref = traces[0]
    cfg = {k: v for k, v in json.loads((ref.path / CONFIG).read_text()).items() if k != "shard"}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.merge-", dir=out.parent))
    try:
        writer = TraceWriter(tmp / "t", cfg)  # config.json exactly as the unsharded capture writes it
        for name in ("reference_mean.npy", "reference_last.npy"):
            shutil.copyfile(ref.path / name, writer.root / name)
        new_shards: dict[str, list[str]] = {"problems": [], "long": [], "trees": []}
        dirs = {"problems": problem_dir, "long": long_dir, "trees": tree_dir}
        for kind in ("problems", "long", "trees"):
            for k, (pos, tr, rel) in enumerate(sorted(where[kind], key=lambda x: x[0])):
                assert pos == k, (kind, pos, k)  # coverage was checked: positions are 0..n-1
                dest = dirs[kind](k)
                meta = json.loads((tr.path / rel / SHARD).read_text())
                (writer.root / dest).mkdir(parents=True)
                for name in [*meta["files"], SHARD]:  # shard.json (listing the others' checksums) last
                    shutil.copyfile(tr.path / rel / name, writer.root / dest / name)
                new_shards[kind].append(dest)
        m = ref.manifest
        capture = {k: v for k, v in m["capture"].items() if k != "shard"}
        devices = list(dict.fromkeys(t.manifest["device"] for t in traces))
        manifest = {k: v for k, v in m.items() if k not in ("files", "manifest_sha256", "schema_version")}
        manifest.update({
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command or "rksim trace merge " + " ".join(labels) + f" --out {out}",
            "device": devices[0] if len(devices) == 1 else "mixed: " + "; ".join(devices),
            "n_problems": len(new_shards["problems"]), "capture": capture, "shards": new_shards,
            "has_tree": bool(new_shards["trees"]),
            "merged_from": [{"path": lab, "shard": t.manifest["capture"]["shard"], "command": t.manifest["command"],
                             "created": t.manifest["created"], "device": t.manifest["device"],
                             "model_source": t.manifest["model"]["source"],
                             "versions": t.manifest["versions"], "manifest_sha256": t.manifest["manifest_sha256"]}
                            for t, lab in sorted(zip(traces, labels), key=lambda x: _shard_of(x[0], x[1]))],
        })
        result = writer.finalize(manifest)
        try:
            load_trace(writer.root, verify=True)
        except TraceError as exc:  # a copy went wrong: say so, keep nothing
            raise TraceError(f"{out}/{exc.file}", exc.field, f"merged copy does not verify: {exc.what}") from None
        if out.exists():
            out.rmdir()  # empty (checked above); rename cannot replace a directory portably
        os.replace(writer.root, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result
