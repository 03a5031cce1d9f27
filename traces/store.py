"""The versioned on-disk trace store: atomic writer, verifying loader.

Layout and fields: docs/trace-schema.md. No torch here: the simulator and the
dashboard load traces with numpy, pandas and pyarrow only.

Writing: every file goes to a temporary name in its own directory, is fsynced
and renamed into place (:func:`atomic_write_bytes`). A shard's ``shard.json``
(holding the sha256 of the shard's other files) is written last, so a shard
directory with a ``shard.json`` is complete; ``manifest.json`` (sha256 of
every file) is written last of all.

Loading: :func:`load_trace` checks the schema version, every checksum and
byte count, the columns and types of every table, the shape and dtype of every
array, and finiteness; any fault raises :class:`~traces.errors.TraceError`
with a one-line message ``"FILE: field: what"``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces import schema as S
from traces.errors import TraceError

__all__ = [
    "TraceError", "Trace", "ProblemTrace", "LongDecodeTrace", "TreeTrace", "load_trace",
    "TraceWriter", "atomic_write_bytes", "atomic_write_with", "atomic_write_json", "sha256_file", "table_bytes",
    "npy_bytes", "problem_dir", "long_dir", "tree_dir",
]

MANIFEST = "manifest.json"
CONFIG = "config.json"
SHARD = "shard.json"


# --------------------------------------------------------------------------- writing

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_with(path: str | os.PathLike, write) -> Path:
    """Write ``path`` atomically through ``write(file)``: temp file in the same directory, fsync,
    the user's usual file mode, ``os.replace``, fsync of the directory. A reader sees the old
    file or the new one, never a part; if ``write`` raises, the temp file is removed and the old
    file stays.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the user's usual mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename is still atomic
        pass
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> str:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write_with`); return its sha256 (hex)."""
    atomic_write_with(path, lambda f: f.write(data))
    return hashlib.sha256(data).hexdigest()


def json_bytes(obj: Any) -> bytes:
    """Canonical JSON (sorted keys, 1-space indent, trailing newline)."""
    return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> str:
    return atomic_write_bytes(path, json_bytes(obj))


def atomic_write_text(path: str | os.PathLike, text: str) -> str:
    """UTF-8 text through :func:`atomic_write_bytes` (reports, presets, HTML)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _column(values: Any, typ: pa.DataType, name: str, table: str) -> pa.Array:
    if isinstance(values, pd.Series):
        values = values.tolist()
    if pa.types.is_list(typ):
        values = [None if v is None else np.asarray(v).tolist() for v in values]
    elif isinstance(values, np.ndarray):
        values = values.tolist()
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise TraceError(table, f"column {name}", f"cannot convert to {typ}: {exc}") from None


def table_bytes(name: str, columns: Mapping[str, Any] | pd.DataFrame) -> bytes:
    """Serialise one of the schema's tables to Parquet bytes.

    ``name`` is the file name (``branches.parquet`` ...); ``columns`` maps
    every schema column (and optionally extra ones, appended in sorted order)
    to a sequence. Fixed writer options and no pandas metadata, so the same
    rows always give the same bytes.
    """
    spec = S.TABLES[name]
    if isinstance(columns, pd.DataFrame):
        columns = {c: columns[c] for c in columns.columns}
    missing = [c for c in spec if c not in columns]
    if missing:
        raise TraceError(name, f"column {missing[0]}", "missing when writing")
    arrays, fields = [], []
    for c, typ in spec.items():
        arrays.append(_column(columns[c], typ, c, name))
        fields.append(pa.field(c, typ))
    for c in sorted(set(columns) - set(spec)):
        arr = pa.array(list(columns[c]) if not isinstance(columns[c], list) else columns[c])
        arrays.append(arr)
        fields.append(pa.field(c, arr.type))
    n = {len(a) for a in arrays}
    if len(n) > 1:
        raise TraceError(name, "rows", f"columns have different lengths {sorted(n)}")
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    buf = io.BytesIO()
    pq.write_table(table, buf, **S.PARQUET_OPTIONS)
    return buf.getvalue()


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def problem_dir(i: int) -> str:
    return f"problems/p{i:05d}"


def long_dir(i: int) -> str:
    return f"long/s{i:05d}"


def tree_dir(i: int) -> str:
    return f"trees/t{i:05d}"


class TraceWriter:
    """Writes a trace directory shard by shard; resumable.

    Parameters
    ----------
    root : path of the trace directory (created if absent).
    config : the capture configuration (JSON-able dict). Stored as
        ``config.json`` on first use; re-opening a directory with a different
        config raises :class:`TraceError` naming the first differing key, so a
        resumed capture can never mix two configurations.
    """

    def __init__(self, root: str | os.PathLike, config: Mapping[str, Any]):
        self.root = Path(root)
        self.config = json.loads(json_bytes(dict(config)))
        cfg_path = self.root / CONFIG
        if self.root.exists() and not self.root.is_dir():
            raise TraceError(str(self.root), "--out", "exists and is not a directory")
        if cfg_path.exists():
            try:
                old = json.loads(cfg_path.read_text())
            except (OSError, ValueError) as exc:
                raise TraceError(str(cfg_path), "json", f"unreadable ({exc})") from None
            if old != self.config:
                keys = sorted(set(old) | set(self.config))
                diff = next(k for k in keys if old.get(k) != self.config.get(k))
                raise TraceError(
                    str(cfg_path), diff,
                    f"this directory holds a capture with {diff}={old.get(diff)!r}, not "
                    f"{self.config.get(diff)!r}; use a new --out directory",
                )
        else:
            if self.root.exists() and any(p.name != ".DS_Store" for p in self.root.iterdir()):
                raise TraceError(str(self.root), "--out",
                                 "directory is not empty and holds no rksim capture (config.json)")
            self.root.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cfg_path, self.config)

    # -- shards
    def shard_complete(self, rel: str) -> bool:
        """True when ``rel/shard.json`` exists and every file it lists matches its sha256."""
        d = self.root / rel
        try:
            meta = json.loads((d / SHARD).read_text())
            files = meta["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        for name, info in files.items():
            p = d / name
            if not p.is_file() or p.stat().st_size != info.get("bytes") or sha256_file(p) != info.get("sha256"):
                return False
        return True

    def write_shard(self, rel: str, meta: Mapping[str, Any], tables: Mapping[str, Any] | None = None,
                    arrays: Mapping[str, np.ndarray] | None = None) -> dict:
        """Write a shard's tables and arrays, then its ``shard.json`` (last)."""
        d = self.root / rel
        d.mkdir(parents=True, exist_ok=True)
        old = d / SHARD
        if old.exists():  # a stale shard is incomplete until its new shard.json lands
            old.unlink()
        files: dict[str, dict] = {}
        for name, cols in (tables or {}).items():
            data = table_bytes(name, cols)
            files[name] = {"sha256": atomic_write_bytes(d / name, data), "bytes": len(data)}
        for name, arr in (arrays or {}).items():
            if arr is None:
                continue
            data = npy_bytes(arr)
            files[name] = {"sha256": atomic_write_bytes(d / name, data), "bytes": len(data)}
        meta = dict(meta)
        meta["files"] = files
        atomic_write_json(d / SHARD, meta)
        return meta

    def write_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, arr in arrays.items():
            atomic_write_bytes(self.root / name, npy_bytes(arr))

    def finalize(self, manifest: Mapping[str, Any]) -> dict:
        """Write ``manifest.json`` last, with sha256 and size of every other file."""
        files = {}
        for p in sorted(self.root.rglob("*")):
            if not p.is_file() or p.name == MANIFEST or p.name.endswith(".tmp"):
                continue
            rel = p.relative_to(self.root).as_posix()
            files[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        m = dict(manifest)
        m["schema_version"] = S.SCHEMA_VERSION
        m["files"] = files
        m.pop("manifest_sha256", None)
        m["manifest_sha256"] = manifest_self_hash(m)
        atomic_write_json(self.root / MANIFEST, m)
        return m


def manifest_self_hash(m: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest without its ``manifest_sha256`` key.

    The manifest cannot list its own checksum in ``files``; this field lets a
    corrupted manifest be named as such rather than blamed on the file whose
    entry it garbled.
    """
    return hashlib.sha256(json_bytes({k: v for k, v in m.items() if k != "manifest_sha256"})).hexdigest()


# --------------------------------------------------------------------------- loading

def _read_json(root: Path, rel: str) -> dict:
    p = root / rel
    if not p.is_file():
        raise TraceError(rel, "file", "missing")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise TraceError(rel, "json", f"not UTF-8 ({exc.reason})") from None
    except ValueError as exc:
        raise TraceError(rel, "json", f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceError(rel, "json", "top level is not an object")
    return obj


def _require(obj: Mapping, keys: Iterable[str], rel: str, prefix: str = "") -> None:
    for k in keys:
        if k not in obj:
            raise TraceError(rel, prefix + k, "missing")


def _int(obj: Mapping, key: str, rel: str, lo: int = 0, prefix: str = "") -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise TraceError(rel, prefix + key, f"expected an integer >= {lo}, got {v!r}")
    return v


def _read_table(root: Path, rel: str) -> pd.DataFrame:
    name = rel.rsplit("/", 1)[-1]
    spec = S.TABLES[name]
    p = root / rel
    if not p.is_file():
        raise TraceError(rel, "file", "missing")
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TraceError(rel, "parquet", f"unreadable ({str(exc).splitlines()[0] if str(exc) else exc})") from None
    have = {f.name: f.type for f in table.schema}
    for c, typ in spec.items():
        if c not in have:
            raise TraceError(rel, f"column {c}", "missing")
        if have[c] != typ:
            raise TraceError(rel, f"column {c}", f"type {have[c]}, expected {typ}")
        if table.column(c).null_count:
            raise TraceError(rel, f"column {c}", f"{table.column(c).null_count} null value(s)")
    for c in S.FINITE[name]:
        col = table.column(c)
        vals = pc.list_flatten(col) if pa.types.is_list(col.type) else col
        arr = np.asarray(vals.to_numpy(zero_copy_only=False) if hasattr(vals, "to_numpy") else vals,
                         dtype=np.float64)
        if arr.size and not np.isfinite(arr).all():
            bad = int((~np.isfinite(arr)).sum())
            raise TraceError(rel, f"column {c}", f"{bad} non-finite value(s) (NaN or inf)")
    return table.to_pandas()


def _load_npy(root: Path, rel: str, dtype: str, shape: tuple, check_finite: bool) -> np.ndarray:
    p = root / rel
    if not p.is_file():
        raise TraceError(rel, "file", "missing")
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise TraceError(rel, "npy", f"unreadable ({exc})") from None
    if arr.dtype != np.dtype(dtype):
        raise TraceError(rel, "dtype", f"{arr.dtype}, expected {dtype}")
    if arr.shape != tuple(shape):
        raise TraceError(rel, "shape", f"{arr.shape}, expected {tuple(shape)}")
    if check_finite and arr.size:
        # Chunked so a large memmap is never copied whole.
        flat = arr.reshape(-1)
        step = 1 << 22
        for s in range(0, flat.size, step):
            if not np.isfinite(flat[s:s + step]).all():
                raise TraceError(rel, "values", "non-finite value(s) (NaN or inf)")
    return arr


def _check_ids(df: pd.DataFrame, col: str, expect: np.ndarray, rel: str) -> None:
    got = df[col].to_numpy()
    if got.shape != expect.shape or not np.array_equal(got, expect):
        raise TraceError(rel, f"column {col}", f"rows are not the expected {col} sequence "
                         f"({len(got)} rows, expected {len(expect)})")


@dataclass
class ProblemTrace:
    """One problem's shard (``problems/pNNNNN``)."""

    root: Path
    rel: str
    meta: dict
    n_layers: int
    hidden_size: int
    has_counterfactual: bool = True

    @property
    def index(self) -> int:
        return int(self.meta["problem_index"])

    @property
    def truth(self) -> str:
        return str(self.meta["truth"])

    @property
    def n_branches(self) -> int:
        return int(self.meta["n_branches"])

    @cached_property
    def branches(self) -> pd.DataFrame:
        rel = f"{self.rel}/branches.parquet"
        df = _read_table(self.root, rel)
        _check_ids(df, "branch", np.arange(self.n_branches), rel)
        for ids, n, what in (("prompt_ids", "prompt_len", "prompt"), ("gen_ids", "gen_len", "gen"),
                             ("cf_gen_ids", "cf_gen_len", "cf gen")):
            lens = df[ids].map(len).to_numpy()
            if not np.array_equal(lens, df[n].to_numpy()):
                raise TraceError(rel, f"column {n}", f"does not match len({ids})")
        for lp, n in (("gen_logprobs", "gen_len"), ("cf_gen_logprobs", "cf_gen_len")):
            if not np.array_equal(df[lp].map(len).to_numpy(), df[n].to_numpy()):
                raise TraceError(rel, f"column {lp}", f"length does not match {n}")
        if not np.array_equal(df["seg_lens"].map(lambda x: int(np.sum(x))).to_numpy(), df["prompt_len"].to_numpy()):
            raise TraceError(rel, "column seg_lens", "does not sum to prompt_len")
        if ((df["variant_start"] < 0) | (df["variant_end"] > df["prompt_len"])
                | (df["variant_end"] <= df["variant_start"])).any():
            raise TraceError(rel, "column variant_start", "variant span outside the prompt or empty")
        return df

    @cached_property
    def asks(self) -> pd.DataFrame:
        rel = f"{self.rel}/asks.parquet"
        df = _read_table(self.root, rel)
        B, L = self.n_branches, self.n_layers
        _check_ids(df, "branch", np.repeat(np.arange(B), L), rel)
        _check_ids(df, "layer", np.tile(np.arange(1, L + 1), B), rel)
        for c in ("cos_mean_raw", "cos_mean_centered", "cos_last_raw", "cos_last_centered"):
            v = df[c].to_numpy()
            if (np.abs(v) > 1 + 1e-6).any():
                raise TraceError(rel, f"column {c}", "cosine outside [-1, 1]")
        return df

    @cached_property
    def verify(self) -> pd.DataFrame:
        rel = f"{self.rel}/verify.parquet"
        df = _read_table(self.root, rel)
        B, L = self.n_branches, self.n_layers
        gens = ["own", "cf"] if self.has_counterfactual else ["own"]
        _check_ids(df, "gen", np.repeat(np.array(gens, dtype=object), B * L), rel)
        _check_ids(df, "branch", np.tile(np.repeat(np.arange(B), L), len(gens)), rel)
        _check_ids(df, "layer", np.tile(np.arange(1, L + 1), B * len(gens)), rel)
        for c in ("p_yes", "p_no", "p_yes_nonorm", "p_no_nonorm"):
            v = df[c].to_numpy()
            if ((v < 0) | (v > 1 + 1e-6)).any():
                raise TraceError(rel, f"column {c}", "probability outside [0, 1]")
        return df

    @cached_property
    def timings(self) -> pd.DataFrame:
        rel = f"{self.rel}/timings.parquet"
        df = _read_table(self.root, rel)
        if (df["seconds"] < 0).any():
            raise TraceError(rel, "column seconds", "negative time")
        return df

    def _hidden(self, name: str, check_finite: bool = False) -> np.ndarray | None:
        if name not in self.meta["files"]:
            return None
        return _load_npy(self.root, f"{self.rel}/{name}", "float16",
                         (self.n_branches, self.n_layers, self.hidden_size), check_finite)

    @cached_property
    def hidden_mean(self) -> np.ndarray | None:
        return self._hidden("hidden_mean.npy")

    @cached_property
    def hidden_last(self) -> np.ndarray | None:
        return self._hidden("hidden_last.npy")

    def cos(self, pooling: str = "mean", similarity: str = "cosine") -> np.ndarray:
        """(B, L) float64 similarity of each branch's variant span to the root's.

        ``pooling`` is ``mean`` or ``last``; ``similarity`` is ``cosine`` (raw)
        or ``centered`` (each pooled vector minus the layer's reference mean).
        """
        if pooling not in ("mean", "last"):
            raise ValueError(f"pooling: {pooling!r} is not 'mean' or 'last'")
        kind = {"cosine": "raw", "raw": "raw", "centered": "centered"}.get(similarity)
        if kind is None:
            raise ValueError(f"similarity: {similarity!r} is not 'cosine' or 'centered'")
        col = self.asks[f"cos_{pooling}_{kind}"].to_numpy(dtype=np.float64)
        return col.reshape(self.n_branches, self.n_layers)

    def lens(self, gen: str = "own", norm: bool = True) -> dict[str, np.ndarray]:
        """Verification logit lens: dict of (B, L) arrays ``entropy``, ``p_yes``, ``p_no``, ``top1``."""
        if gen not in ("own", "cf"):
            raise ValueError(f"gen: {gen!r} is not 'own' or 'cf'")
        df = self.verify[self.verify["gen"] == gen]
        if df.empty:
            raise ValueError(f"gen: this trace has no {gen!r} verification rows")
        suf = "" if norm else "_nonorm"
        shape = (self.n_branches, self.n_layers)
        return {k: df[k + suf].to_numpy().reshape(shape) for k in ("entropy", "p_yes", "p_no", "top1")}

    def _validate(self, check_finite: bool) -> None:
        _ = self.branches, self.asks, self.verify, self.timings
        for name in ("hidden_mean.npy", "hidden_last.npy"):
            self._hidden(name, check_finite)


@dataclass
class LongDecodeTrace:
    """One long-decode sequence (``long/sNNNNN``): raw K/V/Q of the selected layers."""

    root: Path
    rel: str
    meta: dict

    @property
    def layers(self) -> list[int]:
        return list(self.meta["layers"])

    @property
    def T(self) -> int:
        return int(self.meta["prompt_len"]) + int(self.meta["gen_len"])

    def _shape(self, name: str) -> tuple:
        m = self.meta
        n = len(m["layers"])
        if name == "Q.npy":
            return (n, self.T, m["n_heads"], m["head_dim"])
        if name in ("K.npy", "V.npy"):
            return (n, self.T, m["n_kv_heads"], m["head_dim"])
        return (n, self.T, m["n_kv_heads"])

    def _arr(self, name: str, check_finite: bool = False) -> np.ndarray:
        dtype = "float16" if name in ("K.npy", "V.npy", "Q.npy") else "float32"
        return _load_npy(self.root, f"{self.rel}/{name}", dtype, self._shape(name), check_finite)

    K = cached_property(lambda self: self._arr("K.npy"))
    V = cached_property(lambda self: self._arr("V.npy"))
    Q = cached_property(lambda self: self._arr("Q.npy"))
    value_range = cached_property(lambda self: self._arr("value_range.npy"))
    key_norm = cached_property(lambda self: self._arr("key_norm.npy"))

    def _validate(self, check_finite: bool) -> None:
        if len(self.meta["token_ids"]) != self.T:
            raise TraceError(f"{self.rel}/{SHARD}", "token_ids", f"{len(self.meta['token_ids'])} ids, expected {self.T}")
        for name in ("K.npy", "V.npy", "Q.npy", "value_range.npy", "key_norm.npy"):
            self._arr(name, check_finite)


@dataclass
class TreeTrace:
    """One tree-search trace (``trees/tNNNNN``)."""

    root: Path
    rel: str
    meta: dict

    @cached_property
    def nodes(self) -> pd.DataFrame:
        rel = f"{self.rel}/nodes.parquet"
        df = _read_table(self.root, rel)
        n = len(df)
        _check_ids(df, "node", np.arange(n), rel)
        par = df["parent"].to_numpy()
        if n and (par[0] != -1 or (par[1:] < 0).any() or (par[1:] >= np.arange(1, n)).any()):
            raise TraceError(rel, "column parent", "node 0 must be the root (-1); parents must precede children")
        if not np.array_equal(df["token_ids"].map(len).to_numpy(), df["n_tokens"].to_numpy()):
            raise TraceError(rel, "column n_tokens", "does not match len(token_ids)")
        return df

    def _validate(self, check_finite: bool) -> None:
        _ = self.nodes


@dataclass
class Trace:
    """A loaded trace. See docs/trace-schema.md for the fields."""

    path: Path
    manifest: dict
    problems: list[ProblemTrace] = field(default_factory=list)
    long_decodes: list[LongDecodeTrace] = field(default_factory=list)
    trees: list[TreeTrace] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return int(self.manifest["model"]["n_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["model"]["hidden_size"])

    @property
    def model_name(self) -> str:
        return str(self.manifest["model"]["name"])

    @property
    def n_branches(self) -> int:
        return int(self.manifest["n_branches"])

    @cached_property
    def reference_mean(self) -> np.ndarray:
        return _load_npy(self.path, "reference_mean.npy", "float32", (self.n_layers, self.hidden_size), False)

    @cached_property
    def reference_last(self) -> np.ndarray:
        return _load_npy(self.path, "reference_last.npy", "float32", (self.n_layers, self.hidden_size), False)

    def info(self) -> dict:
        """The summary printed by ``rksim trace info``."""
        m = self.manifest
        return {
            "path": str(self.path),
            "schema_version": m["schema_version"],
            "model": self.model_name,
            "device": m["device"],
            "dtype": m["model"]["dtype"],
            "dataset": m["dataset"],
            "layout": m["layout"],
            "n_problems": len(self.problems),
            "n_branches": self.n_branches,
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "has_hidden_vectors": bool(m["has_hidden_vectors"]),
            "has_counterfactual": bool(m["has_counterfactual"]),
            "has_verification_lens": bool(m["has_verification_lens"]),
            "long_decode_layers": list(m["long_decode_layers"]),
            "n_long_decodes": len(self.long_decodes),
            "has_tree": bool(m["has_tree"]),
            "n_trees": len(self.trees),
            "max_new_tokens": m["capture"].get("max_new_tokens"),
            "seed": m["capture"].get("seed"),
            "n_files": len(m["files"]),
            "bytes": int(sum(f["bytes"] for f in m["files"].values())),
            "command": m["command"],
            "created": m["created"],
        }


def _check_manifest(m: dict) -> None:
    rel = MANIFEST
    v = m.get("schema_version")
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(rel, "schema_version", f"expected an integer, got {v!r}")
    if v > S.SCHEMA_VERSION:
        raise TraceError(rel, "schema_version",
                         f"trace has schema version {v}, newer than this rksim reads ({S.SCHEMA_VERSION}); upgrade rksim")
    if v < 1:
        raise TraceError(rel, "schema_version", f"{v} is not a valid version")
    _require(m, S.MANIFEST_REQUIRED, rel)
    if m["manifest_sha256"] != manifest_self_hash(m):
        raise TraceError(rel, "manifest_sha256", "checksum of manifest.json itself mismatch (file corrupt or edited)")
    if not isinstance(m["model"], dict):
        raise TraceError(rel, "model", "expected an object")
    _require(m["model"], S.MODEL_REQUIRED, rel, "model.")
    for k in ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "vocab_size"):
        _int(m["model"], k, rel, 1, "model.")
    _int(m, "n_problems", rel, 0)
    _int(m, "n_branches", rel, 1)
    if not isinstance(m["files"], dict):
        raise TraceError(rel, "files", "expected an object")
    if not isinstance(m["shards"], dict):
        raise TraceError(rel, "shards", "expected an object")
    L = m["model"]["n_layers"]
    for l in m["long_decode_layers"]:
        if isinstance(l, bool) or not isinstance(l, int) or not 1 <= l <= L:
            raise TraceError(rel, "long_decode_layers", f"layer {l!r} outside 1..{L}")


def _verify_files(root: Path, files: dict, check_sums: bool) -> None:
    for rel in sorted(files):
        info = files[rel]
        p = root / rel
        if not p.is_file():
            raise TraceError(rel, "file", "missing (listed in manifest.json)")
        if not isinstance(info, dict) or "sha256" not in info or "bytes" not in info:
            raise TraceError(MANIFEST, f"files.{rel}", "needs sha256 and bytes")
        size = p.stat().st_size
        if size != info["bytes"]:
            raise TraceError(rel, "bytes", f"{size} bytes, manifest says {info['bytes']} (truncated or modified)")
        if check_sums and sha256_file(p) != info["sha256"]:
            raise TraceError(rel, "sha256", "checksum mismatch (file corrupt or modified)")


def load_trace(path: str | os.PathLike, verify: bool = True) -> Trace:
    """Load (and by default fully verify) a trace directory.

    Parameters
    ----------
    path : the trace directory (or its ``manifest.json``).
    verify : check every sha256, every table's columns, types and row keys,
        every array's shape, dtype and finiteness up front. With ``False`` only
        the manifest, shard metadata and file sizes are checked; tables and
        arrays are checked lazily when first used.

    Raises
    ------
    TraceError
        ``"FILE: field: what"`` for the first fault found.
    """
    root = Path(path)
    if root.name == MANIFEST:
        root = root.parent
    if not root.is_dir():
        raise TraceError(str(root), "path", "not a trace directory")
    if not (root / MANIFEST).is_file():
        what = "missing (capture incomplete? re-run the same capture command to finish it)" \
            if (root / CONFIG).is_file() else "missing"
        raise TraceError(MANIFEST, "file", what)
    m = _read_json(root, MANIFEST)
    _check_manifest(m)
    _verify_files(root, m["files"], check_sums=verify)
    listed = set(m["files"])
    L, d = int(m["model"]["n_layers"]), int(m["model"]["hidden_size"])
    tr = Trace(path=root, manifest=m)

    def shard(rel: str, required) -> dict:
        sj = f"{rel}/{SHARD}"
        if sj not in listed:
            raise TraceError(sj, "file", "shard listed in manifest.json shards but its shard.json is not in files")
        meta = _read_json(root, sj)
        _require(meta, required, sj)
        if not isinstance(meta["files"], dict):
            raise TraceError(sj, "files", "expected an object")
        for name, info in meta["files"].items():
            f = f"{rel}/{name}"
            if f not in listed:
                raise TraceError(f, "file", f"listed in {sj} but not in manifest.json")
            if info != m["files"][f]:
                raise TraceError(f, "sha256", f"{sj} and manifest.json disagree")
        return meta

    shards = m["shards"]
    for rel in shards.get("problems", []):
        meta = shard(rel, S.PROBLEM_REQUIRED)
        sj = f"{rel}/{SHARD}"
        _int(meta, "n_branches", sj, 1)
        if meta["n_branches"] != m["n_branches"]:
            raise TraceError(sj, "n_branches", f"{meta['n_branches']}, manifest says {m['n_branches']}")
        if meta["answer_kind"] not in ("number", "choice"):
            raise TraceError(sj, "answer_kind", f"{meta['answer_kind']!r} is not number or choice")
        for name in ("branches.parquet", "asks.parquet", "verify.parquet", "timings.parquet"):
            if name not in meta["files"]:
                raise TraceError(f"{rel}/{name}", "file", f"missing (not listed in {sj})")
        if m["has_hidden_vectors"]:
            for name in ("hidden_mean.npy", "hidden_last.npy"):
                if name not in meta["files"]:
                    raise TraceError(f"{rel}/{name}", "file", f"missing (not listed in {sj})")
        tr.problems.append(ProblemTrace(root, rel, meta, L, d, bool(m["has_counterfactual"])))
    if len(tr.problems) != m["n_problems"]:
        raise TraceError(MANIFEST, "n_problems", f"{m['n_problems']}, but {len(tr.problems)} problem shards")
    for rel in shards.get("long", []):
        meta = shard(rel, S.LONG_REQUIRED)
        if list(meta["layers"]) != list(m["long_decode_layers"]):
            raise TraceError(f"{rel}/{SHARD}", "layers", "differ from manifest.json long_decode_layers")
        for name in ("K.npy", "V.npy", "Q.npy", "value_range.npy", "key_norm.npy"):
            if name not in meta["files"]:
                raise TraceError(f"{rel}/{name}", "file", f"missing (not listed in {rel}/{SHARD})")
        tr.long_decodes.append(LongDecodeTrace(root, rel, meta))
    for rel in shards.get("trees", []):
        meta = shard(rel, S.TREE_REQUIRED)
        if "nodes.parquet" not in meta["files"]:
            raise TraceError(f"{rel}/nodes.parquet", "file", f"missing (not listed in {rel}/{SHARD})")
        tr.trees.append(TreeTrace(root, rel, meta))
    if bool(m["has_tree"]) != bool(tr.trees):
        raise TraceError(MANIFEST, "has_tree", f"{m['has_tree']} but {len(tr.trees)} tree shards")
    if verify:
        _ = tr.reference_mean, tr.reference_last
        for a in (tr.reference_mean, tr.reference_last):
            if not np.isfinite(a).all():
                raise TraceError("reference_mean.npy" if a is tr.reference_mean else "reference_last.npy",
                                 "values", "non-finite value(s)")
        for item in (*tr.problems, *tr.long_decodes, *tr.trees):
            item._validate(check_finite=True)
    return tr
