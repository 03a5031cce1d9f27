"""The on-disk trace schema (docs/trace-schema.md), as data.

Pure pyarrow/numpy: the simulator loads traces without torch. Every table is
described by its columns (name -> Arrow type) and which float columns must be
finite; every array by its dtype. Columns beyond these are allowed (a newer
minor capture may add some) but never fewer.
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

I32 = pa.int32()
F32 = pa.float32()
F64 = pa.float64()
STR = pa.string()
BOOL = pa.bool_()
LI32 = pa.list_(pa.int32())
LF32 = pa.list_(pa.float32())
LSTR = pa.list_(pa.string())

BRANCHES = {
    "branch": I32,
    "variant_id": I32,
    "variant_text": STR,
    "prompt_ids": LI32,
    "prompt_len": I32,
    "seg_kinds": LSTR,
    "seg_lens": LI32,
    "variant_start": I32,
    "variant_end": I32,
    "gen_ids": LI32,
    "gen_len": I32,
    "gen_logprobs": LF32,
    "mean_logprob": F64,
    "mean_prob": F64,
    "answer": STR,
    "correct": BOOL,
    "vote_share": F64,
    "cf_gen_ids": LI32,
    "cf_gen_len": I32,
    "cf_gen_logprobs": LF32,
    "cf_mean_logprob": F64,
    "cf_mean_prob": F64,
    "cf_answer": STR,
    "cf_correct": BOOL,
    "cf_vote_share": F64,
    "verify_prompt_len": I32,
    "verify_score": F64,
    "cf_verify_score": F64,
}

ASKS = {
    "branch": I32,
    "layer": I32,
    "cos_mean_raw": F64,
    "cos_mean_centered": F64,
    "cos_last_raw": F64,
    "cos_last_centered": F64,
}

VERIFY = {
    "gen": STR,
    "branch": I32,
    "layer": I32,
    "entropy": F64,
    "p_yes": F64,
    "p_no": F64,
    "top1": I32,
    "entropy_nonorm": F64,
    "p_yes_nonorm": F64,
    "p_no_nonorm": F64,
    "top1_nonorm": I32,
}

TIMINGS = {
    "phase": STR,
    "branch": I32,
    "n_new": I32,
    "n_cached": I32,
    "batch": I32,
    "seconds": F64,
}

NODES = {
    "node": I32,
    "parent": I32,
    "depth": I32,
    "score": F64,
    "n_tokens": I32,
    "context_len": I32,
    "token_ids": LI32,
    "expanded": BOOL,
    "answer": STR,
    "correct": BOOL,
}

TABLES = {
    "branches.parquet": BRANCHES,
    "asks.parquet": ASKS,
    "verify.parquet": VERIFY,
    "timings.parquet": TIMINGS,
    "nodes.parquet": NODES,
}

# Float columns that must be finite. Timings may be anything >= 0 but finite too.
FINITE = {
    name: [c for c, t in cols.items() if t in (F32, F64, LF32)] for name, cols in TABLES.items()
}

# Files of a shard that vary from run to run of the same command (measured wall
# times). Everything else is bit-identical for the same command and seeds.
NONDETERMINISTIC_FILES = ("timings.parquet",)

MANIFEST_REQUIRED = (
    "schema_version", "rksim_version", "created", "command", "model", "device", "dataset",
    "layout", "n_problems", "n_branches", "capture", "versions", "shards",
    "long_decode_layers", "has_hidden_vectors", "has_counterfactual",
    "has_verification_lens", "has_tree", "files", "manifest_sha256",
)
MODEL_REQUIRED = (
    "name", "source", "n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim",
    "intermediate_size", "vocab_size", "dtype",
)
PROBLEM_REQUIRED = (
    "problem_index", "question", "truth", "answer_kind", "n_branches",
    "shared_prefix_tokens", "files",
)
LONG_REQUIRED = (
    "seq_index", "problem_index", "prompt_len", "gen_len", "layers", "n_heads",
    "n_kv_heads", "head_dim", "token_ids", "answer", "truth", "correct", "files",
)
TREE_REQUIRED = ("problem_index", "depth", "step_tokens", "expand_k", "branching", "files")

# Parquet write options: fixed so that the same rows give the same bytes.
PARQUET_OPTIONS = dict(
    compression="zstd",
    compression_level=3,
    use_dictionary=True,
    write_statistics=False,
    version="2.6",
    data_page_version="1.0",
    store_schema=False,
)
