"""A bar of answered requests: ``plain.run(progress=...)`` hears every answer once, and ``bench serve`` /
``bench throughput`` draw it where stderr is a terminal."""
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
