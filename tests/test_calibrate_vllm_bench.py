"""calibrate vllm-bench on files the real CPU serving loop writes (calibrate serve --save-result's schema).

A tiny random Llama is served by ``calibrate serve``'s loop (rksim's scheduler driving real forwards, the KV
capacity binding, prefix caching off so that the vLLM-schema file, which has no token ids, holds all that
decided the schedule); its run is written as a ``vllm bench serve --save-detailed`` result and fitted.
"""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from tiny_hf import tiny_llama  # noqa: E402

from calibrate import serve as S  # noqa: E402
from calibrate import serve_workload as W  # noqa: E402
from calibrate import vllm_bench as vb  # noqa: E402
from sim.cost.model_shape import ModelShape  # noqa: E402
from sim.cost.profiles import load_hardware


def test_a_real_cpu_serving_run_is_read_placed_and_fitted(tmp_path):
    torch.set_num_threads(1)
    tiny = types.SimpleNamespace(model=tiny_llama(0), dtype=torch.float32, device=torch.device("cpu"))
    cfg = S.ServeConfig(problems=4, capacity_tokens=96, concurrency=2, branches=2, max_new_tokens=12, block_size=8,
                        temperature=0.0, model_preset="smollm2-135m", hardware="local-cpu", warmup=False,
                        prefix_caching=False, max_num_batched_tokens=32)
    rng = np.random.default_rng(0)
    users = W.closed_loop_users(cfg.problems, cfg.concurrency)
    user_of = {p: u for u, ps in enumerate(users) for p in ps}
    reqs = [W.Request(rid=j * 2 + b, problem=j, problem_index=j, branch=b, user=user_of[j],
                      prompt=rng.integers(3, 300, 10 + 7 * j + b).tolist(), max_new=cfg.max_new_tokens)
            for j in range(cfg.problems) for b in range(2)]
    rows, rq, *_ = S.serve_requests(tiny, cfg, reqs, stop=[])
    assert sum(len(p) for p in rows["preempted"]) > 0        # the capacity binds
    res = vb.serve_frames_result(rows, rq, "cpu", concurrency=cfg.concurrency)
    f = tmp_path / "run.json"
    f.write_text(json.dumps(res))
    bf = vb.load_bench_file(f)
    assert bf.output_lens.tolist() == [cfg.max_new_tokens] * len(reqs)
    c = tiny.model.config    # the shape the CPU ran, in float32
    m = ModelShape(name="tiny-llama", n_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
                   n_heads=c.num_attention_heads, n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                   intermediate_size=c.intermediate_size, vocab_size=c.vocab_size, dtype_bytes=4,
                   tied_embeddings=True, dtype="float32")
    out = vb.fit_files([f], m, load_hardware("local-cpu"), max_num_seqs=cfg.max_num_seqs,
                       max_num_batched_tokens=cfg.max_num_batched_tokens, block_size=cfg.block_size,
                       prefix_caching=False, kv_capacity_bytes=cfg.capacity_tokens * m.kv_bytes_per_token,
                       holdout=None, async_scheduling=False)   # the real loop schedules each step after the last
    pf = out["per_file"][0]
    # rksim's scheduler, given only the file, places every measured iteration the real loop ran
    assert pf["mismatched"] == 0 and pf["matched"] + pf["unmeasured"] >= len(rows) - pf["unmeasured"]
    assert pf["matched"] >= 0.9 * len(rows)
    assert out["fit"]["n_iterations"] == pf["matched"]
    assert all(v is None or np.isfinite(v) for v in out["errors"].values())
    # in sample (nothing held out), the replay of its own sends reproduces the run's duration roughly
    # (loose: a shared CPU's timings; the exact recovery is tests/test_plain.py's synthetic files)
    assert abs(out["errors"]["request_throughput"]) < 0.5, out["errors"]
