"""Flag names: vLLM's where rksim means the same, the unit in the name where it does not, one meaning per flag,
one set of serving flags, and the old spellings as deprecated aliases that warn in one line."""
from __future__ import annotations

import json

import pytest

from app.cli import build_parser, main, walk

SERVING_COMMANDS = ("serve", "simulate", "compare", "sweep", "tune")
# old spelling -> new one, per command (argv given with the new flag, then the old)
RENAMED = [
    (["serve", "--policy", "asks"], "--requests", "--num-problems", "3"),
    (["serve", "--policy", "asks"], "--concurrency", "--max-concurrent-problems", "2"),
    (["serve", "--policy", "asks"], "--arrival-rate", "--problem-rate", "1.5"),
    (["serve", "--policy", "asks"], "--seed", "--sim-seed", "7"),
    (["serve", "--policy", "asks"], "--batch-scheduler", "--scheduler", "prefill-first"),
    (["simulate", "--policy", "asks"], "--seed", "--sim-seed", "7"),
    (["compare"], "--requests", "--num-problems", "3"),
    (["sweep", "--policy", "asks", "--out", "x.parquet"], "--batch-scheduler", "--scheduler", "prefill-first"),
    (["sweep", "--policy", "asks", "--out", "x.parquet"], "--concurrency", "--max-concurrent-problems", "2"),
    (["tune", "--policy", "asks"], "--seed", "--sim-seed", "7"),
    (["demo"], "--seed", "--sim-seed", "7"),
    (["plan", "--model-preset", "m", "--hardware", "h", "--gpus", "8"], "--arrival-rate", "--problem-rate", "2"),
    (["plan", "--model-preset", "m", "--hardware", "h", "--gpus", "8"], "--concurrency", "--max-concurrent-problems",
     "4"),
    (["plan", "--model-preset", "m", "--hardware", "h", "--gpus", "8"], "--requests", "--num-problems", "12"),
    (["plan", "--model-preset", "m", "--hardware", "h", "--gpus", "8"], "--seed", "--sim-seed", "3"),
    (["capture", "--out", "t"], "--seed", "--sampling-seed", "3"),
    (["calibrate", "run", "--out", "o"], "--seed", "--sampling-seed", "3"),
    (["reproduce", "--out", "r"], "--seed", "--reshape-seed", "3"),
]


def _parsers() -> dict:
    return {" ".join(path): p for path, p, _ in walk(build_parser())}


def _serving_group(p):
    return next((g for g in p._action_groups if g.title and g.title.startswith("serving")), None)


@pytest.mark.parametrize("argv,old,new,value", RENAMED, ids=[f"{r[0][0]}{r[1]}" for r in RENAMED])
def test_old_spelling_is_a_deprecated_alias_with_one_warning(capsys, argv, old, new, value):
    parser = build_parser()
    want = vars(parser.parse_args(argv + [new, value]))
    assert capsys.readouterr().err == ""  # the new name warns of nothing
    got = vars(build_parser().parse_args(argv + [old, value]))
    err = capsys.readouterr().err.splitlines()
    assert err == [f"rksim: warning: {old} is deprecated; use {new}"]
    assert got == want


def test_one_set_of_serving_flags_in_every_command_that_serves():
    parsers = _parsers()
    sets = {}
    for name in SERVING_COMMANDS:
        g = _serving_group(parsers[name])
        assert g is not None, name
        sets[name] = sorted(s for a in g._group_actions for s in a.option_strings)
    assert len({tuple(v) for v in sets.values()}) == 1, sets
    flags = set(sets["serve"])
    for want in ("--problem-rate", "--max-concurrent-problems", "--num-problems", "--scheduler", "--max-num-seqs",
                 "--max-num-batched-tokens", "--gpu-memory-utilization", "--kv-capacity-bytes"):
        assert want in flags, want
    # a command without --mode has no "(with --mode serving)" title; the others say so
    assert _serving_group(parsers["serve"]).title == "serving"
    assert "mode serving" not in parsers["serve"].format_help()
    for name in SERVING_COMMANDS[1:]:
        assert "--mode serving" in _serving_group(parsers[name]).title, name


@pytest.mark.parametrize("name", SERVING_COMMANDS)
def test_problem_rate_and_max_concurrent_problems_are_exclusive(capsys, name):
    argv = {"serve": ["serve", "--policy", "asks"], "simulate": ["simulate", "--policy", "asks"],
            "compare": ["compare"], "sweep": ["sweep", "--policy", "asks", "--out", "x.parquet"],
            "tune": ["tune", "--policy", "asks"]}[name]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv + ["--problem-rate", "2", "--max-concurrent-problems", "4"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_one_meaning_per_flag():
    """--scheduler is the batch scheduler wherever it appears; the Dask address is --dask-scheduler."""
    for name, p in _parsers().items():
        for a in p._actions:
            if "--scheduler" in a.option_strings:
                assert "vllm-v1" in (a.choices or a.help) and "dask" not in a.help.lower(), (name, a.help)
            if "--dask-scheduler" in a.option_strings:
                assert "dask" in a.help.lower(), name
    for name in ("sweep", "tune"):
        opts = {s for a in _parsers()[name]._actions for s in a.option_strings}
        assert "--dask-scheduler" in opts and "--batch-scheduler" in opts  # the latter: an alias of --scheduler


def test_workload_concurrency_is_deprecated_pointing_to_its_flag(syn, capsys):
    assert main(["serve", "--trace", syn, "--policy", "exact-prefix", "--hardware", "h100-sxm", "--num-problems", "4",
                 "--workload", "concurrency=1", "--json"]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert err == ["rksim: warning: --workload concurrency=... is deprecated; use --max-concurrent-problems"]
    capsys.readouterr()
    # the flag wins over the deprecated spelling, and both give the figures of the flag alone
    assert main(["serve", "--trace", syn, "--policy", "exact-prefix", "--hardware", "h100-sxm", "--num-problems", "4",
                 "--workload", "concurrency=1", "--max-concurrent-problems", "2", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert main(["serve", "--trace", syn, "--policy", "exact-prefix", "--hardware", "h100-sxm", "--num-problems", "4",
                 "--max-concurrent-problems", "2", "--json"]) == 0
    flag = json.loads(capsys.readouterr().out)
    assert both["throughput_tokens_per_s"] == flag["throughput_tokens_per_s"]
    assert both["info"]["workload"]["concurrency"] == 2


def test_compare_takes_the_serving_flags(syn, capsys):
    base = ["compare", "--trace", syn, "--hardware", "h100-sxm", "--mode", "serving", "--policies", "exact-prefix",
            "--json"]
    assert main(base + ["--num-problems", "4", "--max-concurrent-problems", "1"]) == 0
    one = json.loads(capsys.readouterr().out)["policies"]["exact-prefix"]
    assert main(base + ["--num-problems", "4", "--max-concurrent-problems", "4"]) == 0
    four = json.loads(capsys.readouterr().out)["policies"]["exact-prefix"]
    assert one["throughput_tokens_per_s"] < four["throughput_tokens_per_s"]
    assert main(base + ["--num-problems", "4", "--problem-rate", "0.5"]) == 0
    rate = json.loads(capsys.readouterr().out)["policies"]["exact-prefix"]
    assert rate["throughput_tokens_per_s"] != four["throughput_tokens_per_s"]
    assert main(base + ["--kv-capacity-bytes", "1"]) == 2
    assert "KV" in capsys.readouterr().err


def test_serving_flags_outside_serving_mode_are_refused_by_their_new_name(syn, capsys):
    assert main(["simulate", "--trace", syn, "--policy", "asks", "--num-problems", "4"]) == 2
    assert capsys.readouterr().err.strip() == "rksim: error: --num-problems: only with --mode serving"
    assert main(["simulate", "--trace", syn, "--policy", "asks", "--problem-rate", "2"]) == 2
    assert "--problem-rate" in capsys.readouterr().err


def test_help_names_the_unit():
    serve = _parsers()["serve"]
    helps = {a.option_strings[0]: a.help for a in serve._actions if a.option_strings}
    assert "problems per second" in helps["--problem-rate"]
    assert "problems in flight" in helps["--max-concurrent-problems"]
    assert "branch requests" in helps["--num-problems"]
