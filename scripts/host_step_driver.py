"""Times vLLM's own host work per engine step on this CPU (runs in ``.venv-vllm`` with ``vllm==0.33.0``;
never imports rksim). Driven by :mod:`calibrate.host_step`, which writes and fits the result.

What is timed, each with the thread's CPU clock (``time.thread_time``) and the wall clock
(``time.perf_counter``), per step:

* ``schedule``: ``Scheduler.schedule()`` of vLLM's V1 scheduler on CPU, built by
  :func:`reference_check_vllm_driver.build_scheduler` (``DeviceConfig(device="cpu")``, one
  full-attention KV group, prefix caching with its sha256 block hash);
* ``update``: ``Scheduler.update_from_output()`` with a synthetic ``ModelRunnerOutput`` (one
  sampled token per request whose known tokens are all computed, as the GPU runner returns);
* ``output``: vLLM's ``OutputProcessor.process_outputs`` on the ``EngineCoreOutputs`` that
  ``update_from_output`` returned (the API server's per-step work: incremental detokenisation
  with a real tokenizer when ``--tokenizer`` names one, one ``RequestOutput`` per request put on
  its ``RequestOutputCollector`` as ``AsyncLLM`` does, streaming ``DELTA`` outputs);
* ``admit``: building the ``Request`` (block hashes of the prompt) and ``Scheduler.add_request``
  (the engine core's per-request work) and ``OutputProcessor.add_request``;
* ``ipc``: the msgpack encode (engine core's output thread) and decode (API server) of the step's
  ``EngineCoreOutputs``;
* ``sse``: what ``OpenAIServingCompletion.completion_stream_generator`` does per streamed output:
  a ``CompletionStreamResponse`` dumped to JSON and framed as an SSE event;
* ``requests``: the API server's per-request work: parsing the JSON body into
  ``CompletionRequest``, tokenising the prompt, the ``EngineCoreRequest``'s msgpack round trip.

Not timed (they need a GPU or a socket): the model runner's input preparation and sampling, the
HTTP server's own work (uvicorn, the socket writes) and the ZMQ transport.

Sweeps: ``running`` decode requests (every request decodes one token a step) at each count of
``--running``, and one prefill chunk of each ``--prefill-tokens`` count alone and beside
``--prefill-beside`` running decodes. Output token ids are a real text's tokens (``--text``),
cycled, so the detokeniser sees ordinary words; prompt ids are seeded random ids.

Usage: ``.venv-vllm/bin/python scripts/host_step_driver.py OUT.json [--tokenizer DIR] [--text FILE]
[--running 1,2,4,...] [--steps N] [--prefill-tokens 256,...] [--seed S]``
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_check_vllm_common import write_json  # noqa: E402
from reference_check_vllm_driver import _model_dir, build_scheduler  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

BLOCK = 16
PROMPT = 128            # prompt tokens of each decoding request
PHASES = ("schedule", "update", "output", "ipc", "sse")


class Clock:
    """CPU (thread) and wall seconds of a block."""

    __slots__ = ("cpu", "wall", "_c", "_w")

    def __enter__(self):
        self._c, self._w = time.thread_time(), time.perf_counter()
        return self

    def __exit__(self, *a):
        self.cpu, self.wall = time.thread_time() - self._c, time.perf_counter() - self._w


class Bench:
    """One scheduler + output processor; requests are added, steps run and timed."""

    def __init__(self, n_blocks: int, max_seqs: int, max_tokens: int, tokenizer, out_ids: list[int], vocab: int,
                 model_dir: str, rng: random.Random):
        from vllm.v1.engine.output_processor import OutputProcessor

        cfg = {"block_size": BLOCK, "num_blocks": n_blocks, "max_num_seqs": max_seqs,
               "max_num_batched_tokens": max_tokens, "long_prefill_token_threshold": 0, "prefix_caching": True}
        self.s, self.vcfg, self.hasher = build_scheduler(cfg, model_dir)
        from vllm.v1.engine import EngineCoreOutputs
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

        self.op = OutputProcessor(tokenizer, log_stats=False)
        self.enc, self.dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
        self.queues: dict[str, object] = {}
        self.created = int(time.time())
        self.out_ids, self.vocab, self.rng = out_ids, vocab, rng
        self.n_out: dict[str, int] = {}
        self.next_id = 0

    def add(self, prompt_len: int, max_tokens: int) -> dict:
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.output_processor import RequestOutputCollector
        from vllm.v1.request import Request

        rid = f"r{self.next_id}"
        self.next_id += 1
        ids = [self.rng.randrange(100, self.vocab - 100) for _ in range(prompt_len)]
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
        ecr = EngineCoreRequest(request_id=rid, prompt_token_ids=ids, mm_features=None, sampling_params=sp,
                                pooling_params=None, arrival_time=time.time(), lora_request=None,
                                cache_salt=None, data_parallel_rank=None, external_req_id=rid)
        with Clock() as c_core:
            r = Request.from_engine_core_request(ecr, self.hasher)
            self.s.add_request(r)
        q = RequestOutputCollector(RequestOutputKind.DELTA, rid)
        with Clock() as c_front:
            self.op.add_request(ecr, None, None, 0, q)
        self.queues[rid] = q
        self.n_out[rid] = 0
        return {"prompt_tokens": prompt_len, "core_cpu": c_core.cpu, "core_wall": c_core.wall,
                "front_cpu": c_front.cpu, "front_wall": c_front.wall}

    def step(self) -> dict:
        from vllm.v1.outputs import ModelRunnerOutput

        with Clock() as c_s:
            so = self.s.schedule()
        ids = list(so.num_scheduled_tokens)
        sampled, n_sampled = [], 0
        for rid in ids:
            r = self.s.requests[rid]
            if r.num_computed_tokens + so.num_scheduled_tokens[rid] >= r.num_tokens:
                k = self.n_out[rid]
                sampled.append([self.out_ids[k % len(self.out_ids)]])
                self.n_out[rid] = k + 1
                n_sampled += 1
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        running = len(ids)
        with Clock() as c_u:
            eco = self.s.update_from_output(so, mro)
        with Clock() as c_e:           # the engine core's output thread: msgpack of the step's outputs
            frames = {k: self.enc.encode(e) for k, e in eco.items()}
        with Clock() as c_d:           # the API server's output handler: decode them
            got = {k: self.dec.decode(f) for k, f in frames.items()}
        outs = [o for e in got.values() for o in e.outputs]
        with Clock() as c_o:
            self.op.process_outputs(outs)
        with Clock() as c_c:           # each request's generate() task: its SSE chunk (serving completions)
            n_chunks = self._chunks(outs)
        return {"running": running, "tokens": int(so.total_num_scheduled_tokens), "sampled": n_sampled,
                "outputs": len(outs), "chunks": n_chunks,
                "schedule_cpu": c_s.cpu, "schedule_wall": c_s.wall, "update_cpu": c_u.cpu, "update_wall": c_u.wall,
                "output_cpu": c_o.cpu, "output_wall": c_o.wall, "ipc_cpu": c_e.cpu + c_d.cpu,
                "ipc_wall": c_e.wall + c_d.wall, "sse_cpu": c_c.cpu, "sse_wall": c_c.wall}

    def _chunks(self, outs) -> int:
        """What ``OpenAIServingCompletion.completion_stream_generator`` does per output: one
        ``CompletionStreamResponse`` dumped to JSON and framed as an SSE event."""
        from vllm.entrypoints.openai.completion.protocol import (CompletionResponseStreamChoice,
                                                                 CompletionStreamResponse)

        n = 0
        for o in outs:
            q = self.queues.get(o.request_id)
            res = q.get_nowait() if q is not None else None
            if res is None:
                continue
            for i, c in enumerate(res.outputs):
                chunk = CompletionStreamResponse(
                    id=o.request_id, object="text_completion", created=self.created, model="smollm2-135m",
                    choices=[CompletionResponseStreamChoice(index=i, text=c.text, logprobs=None,
                                                            finish_reason=c.finish_reason,
                                                            stop_reason=c.stop_reason, prompt_token_ids=None,
                                                            token_ids=None, weight_versions=None)],
                    kv_transfer_params=None)
                data = f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n".encode()
                n += len(data) > 0
        return n


def _median_row(steps: list[dict], **extra) -> dict:
    row = dict(extra)
    for k in ("running", "tokens", "sampled", "outputs", "chunks"):
        row[k] = int(statistics.median(s[k] for s in steps))
    for ph in PHASES:
        for clk in ("cpu", "wall"):
            row[f"{ph}_{clk}_ms"] = round(1e3 * statistics.median(s[f"{ph}_{clk}"] for s in steps), 5)
    for clk in ("cpu", "wall"):
        tot = [s[f"schedule_{clk}"] + s[f"update_{clk}"] for s in steps]
        row[f"core_{clk}_ms"] = round(1e3 * statistics.median(tot), 5)
    row["steps_timed"] = len(steps)
    return row


def decode_sweep(n: int, steps: int, warm: int, tok, out_ids, vocab, model_dir, rng) -> tuple[dict, list[dict]]:
    """``n`` requests decoding together: prefill them all, then time ``steps`` decode steps."""
    need = n * ((PROMPT + warm + steps + 8) // BLOCK + 2) + 16
    b = Bench(need, max(n, 1), 8192, tok, out_ids, vocab, model_dir, rng)
    admits = [b.add(PROMPT, 100_000) for _ in range(n)]
    for _ in range(200):               # prefill every request (8192 tokens a step)
        st = b.step()
        if st["tokens"] == n and st["sampled"] == n:
            break
    else:
        raise RuntimeError(f"running={n}: requests did not all reach decode")
    for _ in range(warm):
        b.step()
    gc.collect()
    timed = [b.step() for _ in range(steps)]
    bad = [t for t in timed if t["running"] != n or t["tokens"] != n]
    if bad:
        raise RuntimeError(f"running={n}: a timed step was not a pure decode of {n} requests: {bad[0]}")
    return _median_row(timed, kind="decode"), admits


def prefill_sweep(tokens: int, beside: int, reps: int, tok, out_ids, vocab, model_dir, rng) -> dict:
    """One ``tokens``-token prompt scheduled whole in one step beside ``beside`` decodes (``reps`` times)."""
    need = (beside * (PROMPT + 3 * reps + 40) + reps * (tokens + BLOCK)) // BLOCK + 64
    b = Bench(need, beside + 2, tokens + beside + 16, tok, out_ids, vocab, model_dir, rng)
    for _ in range(beside):
        b.add(PROMPT, 100_000)
    for _ in range(200):
        st = b.step()
        if st["running"] == beside and st["tokens"] == beside:
            break
    timed, admits = [], []
    for _ in range(reps + 1):
        admits.append(b.add(tokens, 1))   # one token: the request finishes in the step that prefills it
        st = b.step()
        if st["tokens"] != tokens + beside:
            raise RuntimeError(f"prefill {tokens} beside {beside}: the step scheduled {st['tokens']} tokens")
        timed.append(st)
        b.step()                        # a decode-only step between (not timed)
    row = _median_row(timed[1:], kind="prefill", prefill_tokens=tokens, beside=beside)
    for k in ("core", "front"):
        row[f"admit_{k}_cpu_ms"] = round(1e3 * statistics.median(x[f"{k}_cpu"] for x in admits[1:]), 5)
    return row


def request_sweep(tok, text: str, lengths: list[int], reps: int) -> list[dict]:
    """The API server's per-request work for prompts of about ``lengths`` tokens (a real text):
    parsing the JSON body into vLLM's ``CompletionRequest``, tokenising the prompt (``encode``),
    and the ``EngineCoreRequest``'s msgpack round trip to the engine core; median CPU ms each."""
    import json

    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreRequest)
    ids = tok.encode(text, add_special_tokens=False)
    rows = []
    for n in lengths:
        piece = tok.decode(ids[:n] if n <= len(ids) else (ids * (n // len(ids) + 1))[:n])
        body = json.dumps({"model": "smollm2-135m", "prompt": piece, "max_tokens": 128, "stream": True,
                           "ignore_eos": True, "temperature": 0.0})
        t = {"parse": [], "tokenize": [], "ipc": []}
        for r in range(reps):
            with Clock() as c:
                CompletionRequest.model_validate_json(body)
            t["parse"].append(c.cpu)
            with Clock() as c:
                got = tok.encode(piece)
            t["tokenize"].append(c.cpu)
            ecr = EngineCoreRequest(request_id=f"q{r}", prompt_token_ids=got, mm_features=None,
                                    sampling_params=SamplingParams(max_tokens=128, ignore_eos=True),
                                    pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                                    data_parallel_rank=None)
            with Clock() as c:
                dec.decode(enc.encode(ecr))
            t["ipc"].append(c.cpu)
        rows.append({"prompt_tokens": len(got), **{f"{k}_cpu_ms": round(1e3 * statistics.median(v), 5)
                                                   for k, v in t.items()}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (tokenizer.json); none: no detokenisation")
    ap.add_argument("--text", default=None, help="a text file whose tokens are the outputs")
    ap.add_argument("--running", default="1,2,4,8,16,32,64,128,256,512")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--prefill-tokens", default="256,1024,2048,4096,8192")
    ap.add_argument("--prefill-beside", default="0,32")
    ap.add_argument("--prefill-reps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import vllm

    rng = random.Random(a.seed)
    tok, vocab = None, 50000
    if a.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        vocab = len(tok)
    text = open(a.text).read() if a.text else "the quick brown fox jumps over the lazy dog. " * 200
    if tok is not None:
        out_ids = tok.encode(text, add_special_tokens=False)
    else:
        out_ids = [rng.randrange(100, vocab - 100) for _ in range(4096)]
    model_dir = _model_dir(vocab)
    t0 = time.process_time()
    decode, admits = [], []
    for n in [int(x) for x in a.running.split(",") if x]:
        row, adm = decode_sweep(n, a.steps, a.warm, tok, out_ids, vocab, model_dir, rng)
        decode.append(row)
        admits += adm
        print(f"decode running={n}: core {row['core_cpu_ms']:.3f} ms CPU, output {row['output_cpu_ms']:.3f} ms",
              flush=True)
    prefill = []
    for beside in [int(x) for x in a.prefill_beside.split(",") if x != ""]:
        for t in [int(x) for x in a.prefill_tokens.split(",") if x]:
            row = prefill_sweep(t, beside, a.prefill_reps, tok, out_ids, vocab, model_dir, rng)
            prefill.append(row)
            print(f"prefill {t} beside {beside}: core {row['core_cpu_ms']:.3f} ms CPU", flush=True)
    admit_ms = {k: round(1e3 * statistics.median(x[k] for x in admits), 5)
                for k in ("core_cpu", "core_wall", "front_cpu", "front_wall")}
    requests = request_sweep(tok, text, [16, 128, 512, 2048, 8192], 15) if tok is not None else []
    write_json(a.out, {
        "vllm_version": vllm.__version__, "python": sys.version.split()[0], "scheduler": "Scheduler",
        "tokenizer": (getattr(tok, "name_or_path", None) or a.tokenizer) if tok is not None else None,
        "detokenizer": None if tok is None else
        ("FastIncrementalDetokenizer" if getattr(tok, "is_fast", False) else "SlowIncrementalDetokenizer"),
        "settings": {"block_size": BLOCK, "prompt_tokens": PROMPT, "steps": a.steps, "warm": a.warm,
                     "prefill_reps": a.prefill_reps, "seed": a.seed, "prefix_caching": True,
                     "async_scheduling": False, "output_kind": "DELTA"},
        "decode": decode, "prefill": prefill,
        "admit_per_request_ms": {**admit_ms, "prompt_tokens": PROMPT},
        "requests": requests, "driver_cpu_s": round(time.process_time() - t0, 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
