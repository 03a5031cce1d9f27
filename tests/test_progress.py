"""Progress bars (``app.progress``): ``plain.run(progress=...)`` hears every answer once and
``validate.run_figures(progress=...)`` every figure; ``bench serve``, ``bench throughput`` and ``validate`` draw
a bar where stderr is a terminal, none with ``--no-progress`` or into a pipe or file."""
from __future__ import annotations

import json

import pytest

from sim.bench import plain
from sim.cost.profiles import load_hardware, load_model


def _run(**kw):
    m, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    wl = plain.random_workload(60, 256, 48, 0.5, 0, 3)
    return plain.run(m, hw, wl, request_rate=30.0, seed=3, **kw)


@pytest.mark.parametrize("kw", [dict(), dict(step_by_step=True), dict(data_parallel_size=2),
                                dict(data_parallel_size=2, max_concurrency=4)])
def test_progress_hears_every_answer_once(kw):
    """``plain.run(progress=...)`` is called once per answered request, whichever path answered it (windows, steps,
    a fleet of replicas, replicas behind client slots); the run's results do not depend on it."""
    calls = []
    r = _run(progress=lambda: calls.append(1), **kw)
    assert len(calls) == r.workload.n == 60
    assert json.dumps(plain.serve_result(r)) == json.dumps(plain.serve_result(_run(**kw)))


class _Terminal:
    """A stderr that says it is a terminal (tqdm shows a bar only there)."""

    def __init__(self):
        self.text = []

    def write(self, s):
        self.text.append(s)

    def flush(self):
        pass

    def isatty(self):
        return True


@pytest.mark.parametrize("verb", [["serve", "--request-rate", "20"], ["throughput"]])
def test_bench_shows_a_bar_of_answered_requests_on_a_terminal_only(monkeypatch, capsys, verb):
    """``bench serve`` / ``bench throughput`` draw a bar of answered requests where stderr is a terminal, none with
    ``--no-progress`` or where stderr is a file or pipe; stdout is the same either way."""
    import sys
    from app.cli import main
    args = ["bench", *verb, "--model-preset", "qwen3-4b", "--hardware", "h100-sxm", "--num-prompts", "30",
            "--input-len", "64", "--output-len", "16"]
    assert main(args) == 0
    plain_out = capsys.readouterr()
    assert "requests answered" not in plain_out.err          # not a terminal: no bar
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(args) == 0
    assert "requests answered" in "".join(tty.text) and "/30 " in "".join(tty.text)   # its total: the requests
    assert capsys.readouterr().out == plain_out.out
    tty.text.clear()
    assert main(args + ["--no-progress"]) == 0
    assert "requests answered" not in "".join(tty.text)


def test_validate_shows_a_bar_of_priced_figures_on_a_terminal_only(monkeypatch, capsys, tmp_path):
    """``rksim validate`` draws a bar of the figures priced so far (refused ones count) where stderr is a terminal;
    ``run_figures`` calls ``progress`` once per figure; stdout is the same with or without the bar."""
    import sys

    import yaml

    from app.cli import main
    from sim.bench.validate import load_figures, run_figures
    fig = {"id": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "dtype": "bfloat16", "parallelism": {"tp": 1},
           "workload": {"input_lens": [200] * 4, "output_lens": [20] * 4}, "metric": "mean_ttft_ms", "value": 1.0,
           "source": {"url": "x", "where": "y"}}
    refused = {**fig, "id": "r", "parallelism": {"tp": 1, "dp": 2}}
    f = tmp_path / "f.yaml"
    f.write_text(yaml.safe_dump({"figures": [fig, refused]}))
    calls = []
    run_figures(load_figures(f), progress=lambda: calls.append(1))
    assert len(calls) == 2
    assert main(["validate", str(f)]) == 0
    plain_out = capsys.readouterr()
    assert "figures priced" not in plain_out.err
    tty = _Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["validate", str(f)]) == 0
    assert "figures priced" in "".join(tty.text) and "/2 " in "".join(tty.text)
    assert capsys.readouterr().out == plain_out.out
    tty.text.clear()
    assert main(["validate", str(f), "--no-progress"]) == 0
    assert "figures priced" not in "".join(tty.text)
