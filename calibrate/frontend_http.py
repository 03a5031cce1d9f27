"""Front-end time with the HTTP layer: run vLLM's own API server and client on this CPU, fit, write.

``python -m calibrate.frontend_http [--vllm-python .venv-vllm/bin/python] [--out FILE] [--quick]`` runs
``scripts/frontend_http_driver.py`` in vLLM's venv (``make reference-check-vllm`` builds it; ``pip install
vllm==0.33.0``): ``vllm serve``'s own server (uvicorn, FastAPI, tokenisation, ``AsyncLLM``'s processors) in front of an
engine core that computes nothing, and ``vllm bench serve``'s own client (module docstring of the driver). It fits
and writes ``calibrate/data/frontend_http/vllm-<v>-cpu.json`` atomically with this host's fingerprint and speed.
``--refit FILE`` refits a written file without vLLM.

The fit (every figure a per-request measurement on this host, none end to end of a GPU run)::

    TTFT(P)        = a + per_prompt_token_s * P        one request at a time, no engine time, median over 200
                                                       (scenarios ttft-32, ttft-512, ttft-2048; least squares)
    per_output_s   = (cpu(stream-128) - cpu(stream-16)) / (n * (128 - 16))
                                                       the server's CPU per streamed token, one chunk a token
    request_s      = a - per_output_s                  FrontendCost.ttft_s adds per_output_s (the first chunk)

``step_base_s`` (a step's fixed front-end cost) is not separable here: it is the one :mod:`calibrate.host_step`
measured, carried to this host by the ratio of the two hosts' :func:`calibrate.host_step.microbench` times.
Checks, not fits (written beside the fit): the request throughput of 500 requests sent at once against
``1 / (request_s + per_prompt_token_s * P + per_output_s * O)``, the API server's time per request if nothing
overlapped; the TTFT of a request that finds the server idle against back to back; and the chat endpoint's TTFT
(its template rendered per request) against the completions endpoint's.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "scripts" / "frontend_http_driver.py"
DATA_DIR = ROOT / "calibrate" / "data" / "frontend_http"
HOST_STEP = ROOT / "calibrate" / "data" / "host_step" / "vllm-0.33.0-cpu.json"
QUICK = ("ttft-32,32,2,40,1,inf,0;ttft-512,512,2,40,1,inf,0;ttft-2048,2048,2,40,1,inf,0;idle-512,512,2,10,1,4,0;"
         "stream-16,512,16,48,16,inf,3;stream-128,512,128,48,16,inf,3;sent-at-once,512,128,100,0,inf,0;"
         "stream1-128,512,128,10,1,inf,3;chat-512,512,2,40,1,inf,0,chat;paced-c1,232,200,6,1,inf,7,chat")


class FrontendHttpError(ValueError):
    """A driver run that failed or a measurement file that is malformed (message names it)."""


def _rows(meas: dict) -> dict:
    rows = meas.get("rows")
    if not isinstance(rows, list) or not rows:
        raise FrontendHttpError("measurement: 'rows' must be a non-empty list")
    by = {}
    for r in rows:
        if not isinstance(r, dict) or "name" not in r:
            raise FrontendHttpError(f"measurement: a row without a name: {r!r}")
        by[r["name"]] = r
    return by


def fit(meas: dict) -> dict:
    """The front-end coefficients from a driver's rows (module docstring), with the checks beside them."""
    by = _rows(meas)
    ttft = sorted((r for n, r in by.items() if n.startswith("ttft-")), key=lambda r: r["input_len"])
    if len({r["input_len"] for r in ttft}) < 2:
        raise FrontendHttpError("measurement: the TTFT line needs ttft-* rows at two prompt lengths at least")
    for need in ("stream-16", "stream-128"):
        if need not in by:
            raise FrontendHttpError(f"measurement: row {need!r} missing (the CPU per streamed token)")
    P = np.array([r["input_len"] for r in ttft], float)
    T = np.array([r["ttft_median_ms"] for r in ttft], float) * 1e-3
    slope, icpt = np.polyfit(P, T, 1)
    s16, s128 = by["stream-16"], by["stream-128"]
    if s16["num_prompts"] != s128["num_prompts"] or s16["input_len"] != s128["input_len"]:
        raise FrontendHttpError("measurement: stream-16 and stream-128 must differ in their output length only")
    per_out = (s128["server_cpu_s"] - s16["server_cpu_s"]) / (s128["num_prompts"] * (s128["output_len"]
                                                                                     - s16["output_len"]))
    coef = {"request_s": float(icpt - per_out), "per_prompt_token_s": float(slope), "per_output_s": float(per_out)}
    if min(coef.values()) <= 0:
        raise FrontendHttpError(f"measurement: a coefficient came out <= 0 ({coef}); rerun on a quieter host")
    fitted = icpt + slope * P
    checks = {"ttft_line": [{"input_len": int(p), "measured_ms": round(1e3 * t, 4), "fitted_ms": round(1e3 * f, 4)}
                            for p, t, f in zip(P, T, fitted)],
              "stream_chunks_per_request": {n: by[n]["chunks_per_request"] for n in ("stream-16", "stream-128")}}
    if "sent-at-once" in by:
        r = by["sent-at-once"]
        per_req = (coef["request_s"] + coef["per_prompt_token_s"] * r["input_len"]
                   + coef["per_output_s"] * r["output_len"])
        checks["sent_at_once"] = {"measured_request_throughput": r["request_throughput"],
                                  "one_api_server_bound": round(1.0 / per_req, 3),
                                  "ratio": round(r["request_throughput"] * per_req, 4)}
    if "idle-512" in by and "ttft-512" in by:
        checks["idle_vs_back_to_back_ttft_ms"] = [by["idle-512"]["ttft_median_ms"], by["ttft-512"]["ttft_median_ms"]]
    if "paced-c1" in by:
        checks["paced_one_in_flight_ttft_ms"] = by["paced-c1"]["ttft_median_ms"]
    if "stream1-128" in by and by["stream1-128"].get("engine_steps"):
        r = by["stream1-128"]
        checks["one_in_flight_cpu_per_step_ms"] = round(1e3 * r["server_cpu_s"] / r["engine_steps"], 4)
    if "chat-512" in by and "ttft-512" in by:
        checks["chat_vs_completions_ttft_ms"] = [by["chat-512"]["ttft_median_ms"], by["ttft-512"]["ttft_median_ms"]]
    return {"coef": {k: float(f"{v:.4g}") for k, v in coef.items()}, "checks": checks}


def assemble(meas: dict, fingerprint: dict, bench_s: float, date: str) -> dict:
    """The file: the measurement, its fit and the ``frontend`` block it proposes for the GPU presets."""
    f = fit(meas)
    hs = json.loads(HOST_STEP.read_text())
    # host_step's per-step constant, carried to this host by the two hosts' microbenchmark times
    step_base = float(f"{hs['preset']['frontend']['step_base_s'] * bench_s / hs['microbench_s']:.4g}")
    block = {**f["coef"], "step_base_s": step_base, "api_servers": 1, "host_speed": 1.0,
             "source": (f"measured {date} on this host with vLLM {meas.get('vllm')} "
                        f"(calibrate/data/frontend_http/{_file_name(meas)}): vllm serve's own API server with its "
                        f"HTTP layer (uvicorn, FastAPI, tokenisation, AsyncLLM's processors, stat and access "
                        f"logging) in front of an engine core that computes nothing, and vllm bench serve's own "
                        f"client: TTFT of one request at a time against prompt length; the server's CPU per "
                        f"streamed token at 16 in flight; step_base_s from "
                        f"calibrate/data/host_step/vllm-0.33.0-cpu.json, scaled by the two hosts' microbenchmark "
                        f"times; host_speed 1.0: this host's speed, not a GPU server's (`python -m "
                        f"calibrate.host_step --speed calibrate/data/frontend_http/{_file_name(meas)}` on that "
                        f"server gives the ratio)")}
    return {"about": __doc__.split("\n\n")[0], "measured": date, "fingerprint": fingerprint,
            "microbench_s": round(bench_s, 6), "microbench_python": meas.get("python"), "measurement": meas,
            "fit": f, "preset": {"frontend": block}}


def _file_name(meas: dict) -> str:
    return f"vllm-{meas.get('vllm', 'unknown')}-cpu.json"


def run_driver(vllm_python: str, out: Path, model: Path, scenarios: str | None, timeout: float = 3600.0) -> dict:
    """Run the driver in vLLM's venv; its JSON, parsed."""
    from calibrate.host_step import run_vllm_script
    args = [out, "--model", model] + (["--scenarios", scenarios] if scenarios else [])
    return run_vllm_script(vllm_python, DRIVER, args, out, FrontendHttpError, timeout=timeout)


def build_model_dir(dest: Path) -> Path:
    """A model folder vLLM's server accepts: SmolLM2-135M's tokenizer (from its GGUF) and its ``config.json``
    shape (no weights: the engine core computes nothing)."""
    from calibrate.host_step import build_tokenizer
    build_tokenizer(dest)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
           "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
           "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
           "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True}
    (dest / "config.json").write_text(json.dumps(cfg))
    # the tokenizer class every transformers generation reads (transformers 5 saves its own "TokenizersBackend",
    # which the 4.x that vLLM 0.11 runs on does not know)
    tc = json.loads((dest / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.pop("backend", None)
    (dest / "tokenizer_config.json").write_text(json.dumps(tc, indent=1))
    return dest


def main(argv=None) -> int:
    from calibrate.host_step import microbench, write_json
    from sim.cost.fingerprint import current_cpu_fingerprint
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--out", default=None,
                    help="the file to write (default calibrate/data/frontend_http/vllm-<v>-cpu.json)")
    ap.add_argument("--quick", action="store_true", help="fewer requests per scenario (a smoke run)")
    ap.add_argument("--refit", default=None, help="refit this written file (no vLLM needed)")
    ap.add_argument("--date", default=_dt.date.today().isoformat())
    a = ap.parse_args(argv)
    if a.refit:
        rec = json.loads(Path(a.refit).read_text())
        out = assemble(rec["measurement"], rec["fingerprint"], rec["microbench_s"], rec["measured"])
        write_json(Path(a.out or a.refit), out)
        print(json.dumps(out["fit"], indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="rksim-frontend-http-") as td:
        model = build_model_dir(Path(td) / "model")
        meas = run_driver(a.vllm_python, Path(td) / "out.json", model, QUICK if a.quick else None)
    out = assemble(meas, current_cpu_fingerprint(), microbench(), a.date)
    path = Path(a.out) if a.out else DATA_DIR / _file_name(meas)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, out)
    print(f"wrote {path}")
    print(json.dumps(out["fit"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
