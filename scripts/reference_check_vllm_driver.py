"""vLLM's side of ``make reference-check-vllm`` (runs in ``.venv-vllm`` with ``vllm==0.33.0``; never
imports rksim).

vLLM's V1 ``Scheduler`` (``vllm.v1.core.sched.scheduler``), built as vLLM's own
``tests/v1/core/utils.py`` builds it, on CPU (``DeviceConfig(device="cpu")``), a one-layer
model folder holding only a ``config.json`` (no weights, no tokenizer), one full-attention KV
group of ``num_blocks + 1`` blocks (vLLM keeps block 0 as its null block), prefix caching with
its default hash (sha256). Each stream of ``streams.json`` runs through the loop of
:func:`reference_check_vllm_common.drive`; the fake model samples the stream's next output
token for every request whose known tokens are all computed after the step, nothing for a
partial prefill chunk. The step log is written as JSON.

Usage: ``.venv-vllm/bin/python scripts/reference_check_vllm_driver.py STREAMS.json OUT.json
[--reserve-full-isl true|false|default]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_check_vllm_common import VOCAB, drive, output_tokens, prompt_tokens, write_json  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

MAX_MODEL_LEN = 32768


def _model_dir(vocab: int = VOCAB) -> str:
    d = tempfile.mkdtemp(prefix="rksim-vllm-model-")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
           "num_hidden_layers": 1, "vocab_size": int(vocab), "max_position_embeddings": MAX_MODEL_LEN,
           "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
           "tie_word_embeddings": False}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def build_scheduler(config: dict, model_dir: str, reserve_full_isl: bool | None = None, scheduler_cls=None):
    """vLLM's V1 ``Scheduler`` (or the subclass ``scheduler_cls``) on CPU for a stream ``config``.

    Returns ``(scheduler, vllm_config, block_hasher)``; built as vLLM's ``tests/v1/core/utils.py``
    builds one (module docstring). Shared by :mod:`host_step_driver`.
    """
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    bs = int(config["block_size"])
    kw = dict(max_num_seqs=int(config["max_num_seqs"]),
              max_num_batched_tokens=int(config["max_num_batched_tokens"]),
              max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
              long_prefill_token_threshold=int(config["long_prefill_token_threshold"]),
              async_scheduling=False, is_encoder_decoder=False)
    if reserve_full_isl is not None:
        kw["scheduler_reserve_full_isl"] = bool(reserve_full_isl)
    sched_cfg = SchedulerConfig(**kw)
    model_cfg = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32",
                            max_model_len=MAX_MODEL_LEN, seed=0)
    cache_cfg = CacheConfig(block_size=bs, enable_prefix_caching=bool(config["prefix_caching"]))
    vcfg = VllmConfig(device_config=DeviceConfig(device="cpu"), model_config=model_cfg,
                      scheduler_config=sched_cfg, cache_config=cache_cfg)
    n_blocks = int(config["num_blocks"]) + 1     # + vLLM's null block
    kv_cfg = KVCacheConfig(num_blocks=n_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                               block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    vcfg.cache_config.num_gpu_blocks = n_blocks
    cls = scheduler_cls or Scheduler
    s = cls(vllm_config=vcfg, kv_cache_config=kv_cfg,
            structured_output_manager=StructuredOutputManager(vcfg), block_size=bs, log_stats=False)
    hash_fn = get_hash_fn_by_name(vcfg.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return s, vcfg, get_request_block_hasher(bs, hash_fn)


class VllmSide:
    def __init__(self, config: dict, model_dir: str, reserve_full_isl: bool | None):
        from vllm.v1.core.sched.scheduler import Scheduler

        class Observed(Scheduler):
            """vLLM's scheduler, unchanged, noting the order of its preemptions (its output has a set)."""

            preempt_log: list = []

            def _preempt_request(self, request, *args, **kwargs):
                self.preempt_log.append(request.request_id)
                return super()._preempt_request(request, *args, **kwargs)

        self.s, vcfg, self.hasher = build_scheduler(config, model_dir, reserve_full_isl, Observed)
        self.reserve_full_isl = vcfg.scheduler_config.scheduler_reserve_full_isl
        self.pool = self.s.kv_cache_manager.block_pool
        self.out_tokens: dict[str, list[int]] = {}
        self.n_out: dict[str, int] = {}
        self.live: list[str] = []

    def add(self, req: dict) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        rid = str(req["id"])
        sp = SamplingParams(max_tokens=int(req["max_tokens"]), ignore_eos=True, temperature=0.0)
        r = Request(request_id=rid, prompt_token_ids=prompt_tokens(req), sampling_params=sp,
                    pooling_params=None, block_hasher=self.hasher, arrival_time=0.0)
        self.out_tokens[rid] = output_tokens(req)
        self.n_out[rid] = 0
        self.live.append(rid)
        self.s.add_request(r)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def _run(self, so):
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = self.s.requests[rid]
            # the step completes the known tokens: the fake model samples the stream's next token
            if r.num_computed_tokens >= r.num_tokens:
                k = self.n_out[rid]
                sampled.append([self.out_tokens[rid][k]])
                self.n_out[rid] = k + 1
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        self.s.update_from_output(so, mro)

    def step(self) -> dict:
        preempted: list[int] = []
        while True:
            self.s.preempt_log = []
            so = self.s.schedule()
            fs = self.pool.get_num_free_blocks()
            pre = [int(x) for x in self.s.preempt_log]
            if sorted(self.s.preempt_log) != sorted(so.preempted_req_ids or ()):
                raise RuntimeError("preemptions observed differ from SchedulerOutput.preempted_req_ids")
            preempted += pre
            if so.total_num_scheduled_tokens > 0 or not pre:
                break
            # a step that only preempted: vLLM runs an empty step; rksim's schedule() forms the next
            # one at once, so the two are merged here
            self._run(so)
        items = []
        for rid, n in so.num_scheduled_tokens.items():
            r = self.s.requests[rid]
            items.append([int(rid), int(r.num_computed_tokens - n), int(n)])
        self._run(so)
        fu = self.pool.get_num_free_blocks()
        finished = [rid for rid in self.live if rid not in self.s.requests]
        done = set(finished)
        self.live = [rid for rid in self.live if rid not in done]
        order = [rid for rid in so.num_scheduled_tokens if rid in done]
        return {"s": items, "p": preempted, "f": [int(x) for x in order], "fs": int(fs), "fu": int(fu)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("streams")
    ap.add_argument("out")
    ap.add_argument("--reserve-full-isl", choices=("true", "false", "default"), default="default")
    a = ap.parse_args(argv)
    import vllm

    with open(a.streams) as f:
        streams = json.load(f)
    rfi = None if a.reserve_full_isl == "default" else a.reserve_full_isl == "true"
    model_dir = _model_dir()
    logs = {}
    for st in streams:
        t0 = time.process_time()
        side = VllmSide(st["config"], model_dir, rfi)
        log = drive(st, side)
        logs[st["name"]] = log
        print(f"vllm {vllm.__version__} reserve_full_isl={side.reserve_full_isl}: {st['name']}: "
              f"{len(log)} steps, {time.process_time() - t0:.1f} s CPU", flush=True)
    write_json(a.out, {"vllm_version": vllm.__version__, "scheduler": "Scheduler",
                       "scheduler_reserve_full_isl": side.reserve_full_isl, "logs": logs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
