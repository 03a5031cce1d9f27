"""Reader of LLMCompass's real-A100 operator measurements (``calibrate/data/llmcompass/``, BSD-3, see SOURCE.md).

Headerless CSVs written by the repository's ``ae/figure5`` scripts on a real A100 80GB in
fp16: ``matmul_A100.csv`` rows ``M, N, K, <ms>ms, <T>Tflops`` (an ``M x K`` by ``K x N``
product); ``softmax_A100.csv`` / ``layernorm_A100.csv`` rows ``M, N, G elements/s`` over an
``M x N`` tensor; ``gelu_A100.csv`` rows ``elements, G elements/s``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

DATA = Path(__file__).resolve().parent / "data" / "llmcompass"
REPO = "github:PrincetonUniversity/LLMCompass"
SNAPSHOT = "2e015fd2ee750e6cad8d7152df52551e5b41ef20"
COMMIT = "b95c6c95a80071414d31da8ba8d2e62334753f3d"
FILES = {"matmul": "ae/figure5/ab/real_hardware/matmul_A100.csv",
         "softmax": "ae/figure5/cf/real_hardware/softmax_A100.csv",
         "layernorm": "ae/figure5/de/real_hardware/layernorm_A100.csv",
         "gelu": "ae/figure5/g/real_hardware/gelu_A100.csv"}


def _read(name: str) -> list[list[str]]:
    p = DATA / f"{name}_A100.csv"
    rows = [[x.strip() for x in line.split(",")] for line in p.read_text().splitlines() if line.strip()]
    return rows


def load_operators() -> pd.DataFrame:
    """``op, M, N, K, elements, seconds``: one row per measurement (``K`` 0 and ``N`` 1 where absent)."""
    out = []
    for r in _read("matmul"):
        if len(r) != 5 or not r[3].endswith("ms"):
            raise ValueError(f"{DATA / 'matmul_A100.csv'}: row {r!r} is not 'M, N, K, <ms>ms, <T>Tflops'")
        M, N, K = (int(x) for x in r[:3])
        out.append(("matmul", M, N, K, M * N, float(r[3][:-2]) * 1e-3))
    for op in ("softmax", "layernorm"):
        for r in _read(op):
            M, N, g = int(r[0]), int(r[1]), float(r[2])
            out.append((op, M, N, 0, M * N, M * N / (g * 1e9)))
    for r in _read("gelu"):
        M, g = int(r[0]), float(r[1])
        out.append(("gelu", M, 1, 0, M, M / (g * 1e9)))
    return pd.DataFrame(out, columns=["op", "M", "N", "K", "elements", "seconds"]).astype(
        {"M": np.int64, "N": np.int64, "K": np.int64, "elements": np.int64, "seconds": np.float64})
