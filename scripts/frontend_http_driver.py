"""Times vLLM's API server with its HTTP layer on this CPU: ``vllm serve``'s own server, ``vllm bench serve``'s own
client, and an engine core that computes nothing (runs in ``.venv-vllm`` with ``vllm==0.33.0``; never imports
rksim). Driven by :mod:`calibrate.frontend_http`, which fits and writes the result.

The server is vLLM's ``vllm serve`` entry point (``vllm.entrypoints.launchers.api_server.entry.main``: uvicorn on
uvloop, FastAPI, the OpenAI completions route, the renderer's tokenisation, ``AsyncLLM``'s input and output
processors, stat logging and the access log, all at their defaults), with one change:
``EngineCoreClient.make_async_mp_client`` returns :class:`StandIn`, an in-process engine core that, every
``--step-ms`` (0: as fast as the event loop turns), samples one token for each running request and finishes a
request at its ``max_tokens`` (``finish_reason`` length). It msgpack-encodes each request and each step's outputs
and decodes the outputs with vLLM's own ``MsgpackEncoder`` / ``MsgpackDecoder``, as ``AsyncMPClient`` and the engine
core's output thread do, so the API server's share of the IPC is in; the ZMQ sockets and the engine-core process
are not. The server runs in a child process whose CPU time (``/proc/PID/stat``, every thread) is read around each
scenario.

The client is ``vllm bench serve --backend vllm`` (``/v1/completions``, streamed; the random dataset, ``--ignore-eos``,
seed 0) in another process on the same host, whose result file gives each request's TTFT and ITLs as the
published figures' client measured them.

Scenarios (``--scenarios``: ``name,input,output,prompts,concurrency,rate,step_ms[,chat]`` separated by ``;``; ``chat``:
``--backend openai-chat`` on ``/v1/chat/completions``, the chat template rendered per request); the defaults:

* ``ttft-P``: one request at a time, back to back (``--max-concurrency 1``), two output tokens, no engine time, at
  prompts of 32, 512 and 2,048 tokens: TTFT = the front end's latency alone (HTTP, tokenisation, processing, the
  first chunk and the client's own handling);
* ``idle-512``: the same at 2 requests/s (the server idle between requests): the TTFT of a request that finds the
  server idle (``vllm-project/vllm#31602`` reports the effect on GPU servers);
* ``stream-O``: 16 in flight, a 3 ms engine step (the front end keeps up: one chunk per token), 512-token prompts,
  16 and 128 output tokens, and ``stream1-128`` one in flight: the server's CPU against requests, engine steps (from
  ``/metrics``) and streamed tokens, which separates a step's fixed cost from a token's;
* ``sent-at-once``: 500 requests of 512 / 128 sent at once, no engine time: the request throughput the API server
  alone allows on this CPU (kvcached's H100 check sent these shapes at once: ``docs/calibration.md``);
* ``chat-512``: ``ttft-512`` on the chat endpoint (GPUStack's latency runs used it);
* ``paced-c1``: GPUStack's Qwen3-8B latency run at one in flight as the front end sees it (chat, 232-token prompts,
  200 tokens, an engine step every 7 ms): the TTFT of a request on a server that is paced, so mostly idle.

Usage: ``.venv-vllm/bin/python scripts/frontend_http_driver.py OUT.json --model DIR [--scenarios ...]
[--port N]``; ``... serve --model DIR --port N --step-ms S`` runs the server alone and ``... client ARGS`` runs
``vllm bench serve ARGS`` (the driver starts both so, on vLLM's CPU platform).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_check_vllm_common import write_json  # noqa: E402

ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SCENARIOS = ("ttft-32,32,2,200,1,inf,0;ttft-512,512,2,200,1,inf,0;ttft-2048,2048,2,200,1,inf,0;"
             "idle-512,512,2,60,1,2,0;stream-16,512,16,200,16,inf,3;stream-128,512,128,200,16,inf,3;"
             "stream1-128,512,128,40,1,inf,3;sent-at-once,512,128,500,0,inf,0;chat-512,512,2,200,1,inf,0,chat;"
             "paced-c1,232,200,20,1,inf,7,chat")


# ------------------------------------------------------------------ the server
def install_stand_in(step_s: float) -> None:
    """Make ``AsyncLLM`` talk to :class:`StandIn` instead of an engine-core process."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason, core_client
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    class Resources:
        engine_dead = False

    class StandIn:
        """An engine core that computes nothing: each step samples one token for every running request."""

        def __init__(self):
            self.running = {}                  # request id -> [max_tokens, sampled]
            self.engine_ranks_managed = [0]
            self.resources = Resources()
            self.enc, self.dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)
            self.wake = None
            self.tok = 0

        async def add_request_async(self, request):
            self.enc.encode(request)           # AsyncMPClient._send_input's msgpack of the request
            self.running[request.request_id] = [request.sampling_params.max_tokens, 0]
            if self.wake is None:
                self.wake = asyncio.Event()
            self.wake.set()

        async def abort_requests_async(self, request_ids):
            for r in request_ids:
                self.running.pop(r, None)

        async def get_output_async(self):
            if self.wake is None:
                self.wake = asyncio.Event()
            while not self.running:
                self.wake.clear()
                await self.wake.wait()
            await asyncio.sleep(step_s)
            outs = []
            for rid, st in list(self.running.items()):
                st[1] += 1
                self.tok = (self.tok + 7) % 20000
                done = st[1] >= st[0]
                outs.append(EngineCoreOutput(request_id=rid, new_token_ids=[1000 + self.tok],
                                             finish_reason=FinishReason.LENGTH if done else None))
                if done:
                    del self.running[rid]
            # the engine core's msgpack of its outputs, the API server's decode of them
            return self.dec.decode(self.enc.encode(EngineCoreOutputs(outputs=outs, timestamp=time.monotonic())))

        async def get_supported_tasks_async(self):
            return ("generate",)

        async def is_sleeping_async(self):
            return False

        def dp_engines_running(self):
            return False

        def shutdown(self, timeout=None):
            return None

        def __getattr__(self, name):   # the other utility calls (reset caches, ...) do nothing here
            if name.endswith("_async"):
                async def nothing(*a, **k):
                    return None
                return nothing
            raise AttributeError(name)

    core_client.EngineCoreClient.make_async_mp_client = staticmethod(lambda *a, **k: StandIn())


def cpu_platform() -> None:
    """vLLM's CPU platform on a CUDA build without a GPU: ``VLLM_TARGET_DEVICE=cpu``, and where that variable does not
    pick it (0.11: only a CPU build or macOS did), the platform plugin told so."""
    os.environ.update(ENV)
    import vllm.platforms as platforms
    if "cpu" in getattr(platforms, "builtin_platform_plugins", {}):
        platforms.builtin_platform_plugins["cpu"] = lambda: "vllm.platforms.cpu.CpuPlatform"


def client(argv: list[str]) -> None:
    """``vllm bench serve ARGV`` (vLLM's own CLI) on the CPU platform."""
    cpu_platform()
    from vllm.entrypoints.cli.main import main as vllm_main
    sys.argv = ["vllm", "bench", "serve", *argv]
    vllm_main()


def serve(model: str, port: int, step_ms: float) -> None:
    """``vllm serve MODEL --port PORT`` with the stand-in engine core (in this process)."""
    cpu_platform()
    install_stand_in(step_ms / 1e3)
    sys.argv = ["vllm", "--model", model, "--port", str(port)]
    try:
        from vllm.entrypoints.launchers.api_server import entry
    except ImportError:   # vLLM before the launchers package (0.11): the same steps in api_server's __main__
        import uvloop
        from vllm.entrypoints.openai.api_server import run_server
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.utils import cli_env_setup
        from vllm.utils import FlexibleArgumentParser
        cli_env_setup()
        args = make_arg_parser(FlexibleArgumentParser()).parse_args()
        validate_parsed_serve_args(args)
        uvloop.run(run_server(args))
        return
    entry.main()


# ------------------------------------------------------------------ the driver
def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` (every thread)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_steps(port: int) -> int:
    """Steps the server's stat logger has recorded (``vllm:iteration_tokens_total``'s count, one per step with
    outputs), read from ``/metrics``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    n = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
         if line.startswith("vllm:iteration_tokens_total_count")]
    if not n:
        raise SystemExit("/metrics has no vllm:iteration_tokens_total_count (stat logging off?)")
    return int(sum(n))


def start_server(model: str, port: int, step_ms: float, log: str):
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", "--model", model, "--port", str(port),
                          "--step-ms", str(step_ms)], env={**os.environ, **ENV},
                         stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        if p.poll() is not None:
            raise SystemExit(f"the server exited ({p.returncode}); its log: {log}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except OSError:
            time.sleep(0.5)
    p.kill()
    raise SystemExit(f"the server did not answer /health in 300 s; its log: {log}")


def bench(model: str, port: int, work: str, name: str, inp: int, out: int, n: int, conc: int, rate: str,
          chat: bool = False) -> dict:
    """One ``vllm bench serve`` run (``chat``: ``--backend openai-chat`` on ``/v1/chat/completions``); its result
    file."""
    backend = ["openai-chat", "--endpoint", "/v1/chat/completions"] if chat else ["vllm"]
    cmd = [sys.executable, os.path.abspath(__file__), "client", "--backend", *backend,
           "--base-url", f"http://127.0.0.1:{port}", "--model", model,
           "--dataset-name", "random", "--random-input-len", str(inp), "--random-output-len", str(out),
           "--num-prompts", str(n), "--ignore-eos", "--seed", "0", "--request-rate", rate, "--disable-tqdm",
           "--save-result", "--save-detailed", "--result-dir", work, "--result-filename", f"{name}.json"]
    if conc:
        cmd += ["--max-concurrency", str(conc)]
    with open(os.path.join(work, f"{name}.log"), "w") as log:
        subprocess.run(cmd, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT, check=True)
    with open(os.path.join(work, f"{name}.json")) as f:
        return json.load(f)


def run(out_path: str, model: str, scenarios: str, port: int) -> None:
    import vllm
    work = os.path.dirname(os.path.abspath(out_path))
    rows, server, step = [], None, None
    try:
        for spec in scenarios.split(";"):
            name, inp, outl, n, conc, rate, step_ms, *endpoint = spec.split(",")
            chat = endpoint == ["chat"]
            if server is None or float(step_ms) != step:
                if server is not None:
                    server.terminate()
                    server.wait(30)
                step = float(step_ms)
                server = start_server(model, port, step, os.path.join(work, "server.log"))
                bench(model, port, work, "warm-up", 128, 16, 20, 1, "inf")
            c0, k0 = cpu_seconds(server.pid), engine_steps(port)
            res = bench(model, port, work, name, int(inp), int(outl), int(n), int(conc), rate, chat)
            cpu, steps = cpu_seconds(server.pid) - c0, engine_steps(port) - k0
            if res["completed"] != int(n):
                raise SystemExit(f"scenario {name}: {res['completed']} of {n} requests completed")
            ttft = [1e3 * t for t in res["ttfts"]]
            rows.append({"name": name, "endpoint": "/v1/chat/completions" if chat else "/v1/completions",
                         "input_len": int(inp), "output_len": int(outl), "num_prompts": int(n),
                         "max_concurrency": int(conc) or None, "request_rate": rate, "step_ms": step,
                         "server_cpu_s": round(cpu, 3), "engine_steps": steps,
                         "duration_s": round(res["duration"], 4),
                         "request_throughput": round(res["request_throughput"], 3),
                         "ttft_median_ms": round(statistics.median(ttft), 4),
                         "ttft_mean_ms": round(statistics.fmean(ttft), 4),
                         "tpot_mean_ms": round(res["mean_tpot_ms"], 4), "itl_median_ms": round(res["median_itl_ms"], 4),
                         "chunks_per_request": round(statistics.fmean(len(x) + 1 for x in res["itls"]), 2)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
    write_json(out_path, {"vllm": vllm.__version__, "python": platform.python_version(),
                          "client": "vllm bench serve --backend vllm (/v1/completions, streamed)",
                          "server": "vllm serve (api_server entry.main) with an in-process engine core that computes "
                                    "nothing (scripts/frontend_http_driver.py)", "rows": rows})


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["client"]:
        client(argv[1:])
        return 0
    if argv[:1] == ["serve"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--model", required=True)
        ap.add_argument("--port", type=int, required=True)
        ap.add_argument("--step-ms", type=float, default=0.0)
        a = ap.parse_args(argv[1:])
        serve(a.model, a.port, a.step_ms)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", required=True, help="a folder with config.json and the tokenizer")
    ap.add_argument("--scenarios", default=SCENARIOS)
    ap.add_argument("--port", type=int, default=18123)
    a = ap.parse_args(argv)
    run(a.out, a.model, a.scenarios, a.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
