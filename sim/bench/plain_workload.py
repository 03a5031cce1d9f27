"""Plain benchmark workloads and send schedules, as vLLM's benchmark code draws them (read, not copied).

* **random dataset** (``vllm/benchmarks/datasets/random.py`` @ 237145ea, ``RandomDataset``): :func:`random_workload`.
* **arrivals** (``vllm/benchmarks/serve.py`` @ 009e6d4a, ``get_request``): :func:`arrival_times`.

The formulas, and what rksim takes where vLLM uses its tokenizer, are in :mod:`sim.bench.plain`'s docstring.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.serving.kvcache import check_size

MAX_PROMPTS = 10_000_000
MAX_LEN = 1 << 22


class PlainError(ValueError):
    """A bad plain-workload input (the message names the flag, file or field)."""


@dataclass(frozen=True)
class PlainWorkload:
    """Per request: ``input_lens`` (prompt tokens, shared prefix included) and ``output_lens``.

    ``prefix_len``: the first tokens of every prompt are the same (exact-prefix caching can hit them).
    """

    input_lens: np.ndarray
    output_lens: np.ndarray
    prefix_len: int = 0
    source: str = "random"

    def __post_init__(self) -> None:
        if len(self.input_lens) != len(self.output_lens) or not len(self.input_lens):
            raise PlainError("workload: input and output lengths must be non-empty and of equal count")

    @property
    def n(self) -> int:
        return int(len(self.input_lens))


def int_arg(name: str, v, lo: int, hi: int) -> int:
    try:
        return check_size(name, v, lo, hi)
    except ValueError as exc:
        raise PlainError(str(exc)) from None


def random_workload(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    prefix_len: int = 0, seed: int = 0) -> PlainWorkload:
    """vLLM's ``RandomDataset`` lengths (module docstring), ``num_special = 0``."""
    K = int_arg("--num-prompts", num_prompts, 1, MAX_PROMPTS)
    Li = int_arg("--random-input-len", input_len, 0, MAX_LEN)
    Lo = int_arg("--random-output-len", output_len, 1, MAX_LEN)
    P = int_arg("--random-prefix-len", prefix_len, 0, MAX_LEN)
    r = range_ratio
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0.0 <= r < 1.0:
        raise PlainError(f"--random-range-ratio: must be in [0, 1), got {r!r}")
    lo_in, hi_in = math.floor(Li * (1 - r)), math.ceil(Li * (1 + r))
    lo_out, hi_out = max(math.floor(Lo * (1 - r)), 1), max(math.ceil(Lo * (1 + r)), 1)
    if P + lo_in < 1:
        raise PlainError(f"--random-input-len: {Li} with --random-range-ratio {r} and --random-prefix-len {P} "
                         "can give an empty prompt; the shortest prompt must have at least 1 token")
    rng = np.random.default_rng(int_arg("--seed", seed, 0, 2 ** 63 - 1))
    inp = rng.integers(lo_in, hi_in + 1, size=K)
    out = rng.integers(lo_out, hi_out + 1, size=K)
    return PlainWorkload(inp.astype(np.int64) + P, out.astype(np.int64), P, "random")


def file_workload(path, num_prompts: int | None = None) -> PlainWorkload:
    """(input, output) lengths from a file, first ``num_prompts`` rows in order (default all).

    Accepted: CSV with columns ``input_len,output_len`` (or ``prompt_len,output_len``); JSON: a
    list of ``[input, output]`` pairs or of objects with those keys, or a ``vllm bench serve
    --save-result --save-detailed`` file (its ``input_lens`` / ``output_lens``); JSON lines of
    such objects or pairs.
    """
    p = Path(path)
    if not p.is_file():
        raise PlainError(f"--dataset-path: {p}: no such file")
    text = p.read_text()
    rows = []
    try:
        if p.suffix.lower() == ".csv":
            rd = csv.DictReader(text.splitlines())
            cols = rd.fieldnames or []
            ik = next((c for c in ("input_len", "prompt_len", "input_tokens") if c in cols), None)
            ok = next((c for c in ("output_len", "output_tokens") if c in cols), None)
            if ik is None or ok is None:
                raise PlainError(f"--dataset-path: {p}: CSV needs columns input_len and output_len, has {cols}")
            rows = [(r[ik], r[ok]) for r in rd]
        else:
            if p.suffix.lower() == ".jsonl":
                data = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
            else:
                data = json.loads(text)
            if isinstance(data, dict) and "input_lens" in data and "output_lens" in data:
                rows = list(zip(data["input_lens"], data["output_lens"]))
            elif isinstance(data, list):
                for i, r in enumerate(data):
                    if isinstance(r, dict):
                        ik = next((c for c in ("input_len", "prompt_len", "input_tokens") if c in r), None)
                        ok = next((c for c in ("output_len", "output_tokens") if c in r), None)
                        if ik is None or ok is None:
                            raise PlainError(f"--dataset-path: {p}: row {i} has no input_len/output_len")
                        rows.append((r[ik], r[ok]))
                    elif isinstance(r, (list, tuple)) and len(r) == 2:
                        rows.append(tuple(r))
                    else:
                        raise PlainError(f"--dataset-path: {p}: row {i} is not an (input, output) pair")
            else:
                raise PlainError(f"--dataset-path: {p}: expected a list of (input, output) lengths or a "
                                 "vllm bench result with input_lens/output_lens")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlainError(f"--dataset-path: {p}: not valid JSON: {exc}") from None
    if not rows:
        raise PlainError(f"--dataset-path: {p}: no rows")
    K = len(rows) if num_prompts is None else int_arg("--num-prompts", num_prompts, 1, MAX_PROMPTS)
    if K > len(rows):
        raise PlainError(f"--num-prompts: {K} requested but {p} has {len(rows)} rows")
    inp, out = np.zeros(K, np.int64), np.zeros(K, np.int64)
    for i, (a, b) in enumerate(rows[:K]):
        try:
            inp[i], out[i] = int(a), int(b)
        except (TypeError, ValueError):
            raise PlainError(f"--dataset-path: {p}: row {i}: lengths must be integers, got {a!r}, {b!r}") from None
        if not 1 <= inp[i] <= MAX_LEN or not 1 <= out[i] <= MAX_LEN:
            raise PlainError(f"--dataset-path: {p}: row {i}: lengths must be in 1..{MAX_LEN}, got {a}, {b}")
    return PlainWorkload(inp, out, 0, str(p))


def arrival_times(n: int, request_rate: float = math.inf, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times of ``n`` requests as ``vllm bench serve`` schedules them (module docstring)."""
    R, B = request_rate, burstiness
    if isinstance(R, bool) or not isinstance(R, (int, float)) or math.isnan(R) or R <= 0:
        raise PlainError(f"--request-rate: must be > 0 (inf: all at t = 0), got {R!r}")
    if isinstance(B, bool) or not isinstance(B, (int, float)) or math.isnan(B) or B <= 0:
        raise PlainError(f"--burstiness: must be > 0, got {B!r}")
    if math.isinf(R):
        return np.zeros(n)
    if math.isinf(B):
        d = np.full(n, 1.0 / R)
    else:
        d = np.random.RandomState(int(seed) % (2 ** 32)).gamma(shape=B, scale=1.0 / (R * B), size=n)
    t = np.cumsum(d)
    if t[-1] != 0:
        t = t * ((n / R) / t[-1])
    return t
