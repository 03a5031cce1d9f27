"""CLI conventions (issue 11, item 9), checked over every parser ``rksim`` builds: a description per
sub-command, a help text per flag with its default shown, one metavar style, one ``--trace`` default,
``--sim-seed`` as the simulator seed, ``--version`` and ``rksim policies``."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from app.cli import build_parser, main, walk

# upper-case words, joined by = , or / where a value has parts (KEY=VALUE, NAME,NAME, I/N)
METAVAR = re.compile(r"^[A-Z][A-Z0-9_]*([=,/][A-Z][A-Z0-9_]*)*$")
SKIP = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


def _commands():
    return [(" ".join(path) or "rksim", p) for path, p, _ in walk(build_parser())]


def _flags():
    for name, p in _commands():
        for a in p._actions:
            if not isinstance(a, SKIP):
                yield name, p, a


def test_every_command_has_a_description():
    missing = [name for name, p in _commands() if not (p.description or "").strip()]
    assert not missing, missing


def test_every_flag_and_argument_has_help():
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, _, a in _flags()
               if not (a.help or "").strip()]
    assert not missing, missing


def test_every_flag_shows_its_default():
    """The formatted help of each option names its default: explicitly, or added by the formatter."""
    bad = []
    for name, p, a in _flags():
        if not a.option_strings or a.required or isinstance(a, (argparse._StoreTrueAction,
                                                                argparse._StoreConstAction)):
            continue
        text = p._get_formatter()._get_help_string(a) if a.help else ""
        if "default" not in text.lower():
            bad.append(f"{name} {a.option_strings[0]}: {text!r}")
    assert not bad, "\n".join(bad)


def test_one_metavar_style():
    bad = []
    for name, _, a in _flags():
        if not a.option_strings or a.nargs == 0 or a.choices:
            continue
        mv = a.metavar or a.dest.upper()
        if not METAVAR.match(str(mv)):
            bad.append(f"{name} {a.option_strings[0]} {mv}")
    assert not bad, bad


def test_trace_has_the_same_default_in_every_command():
    seen = {}
    for name, _, a in _flags():
        if "--trace" in a.option_strings:
            seen[name] = (a.default, a.required, a.metavar)
    assert len(seen) >= 6, seen
    assert len(set(seen.values())) == 1, seen
    assert next(iter(seen.values()))[1] is False  # never required: the bundled trace is the default


def test_seed_is_the_simulator_seed_and_the_split_seed_is_its_own_flag():
    for name in ("simulate", "serve", "compare", "sweep", "tune", "demo"):
        p = dict(_commands())[name]
        act = next(a for a in p._actions if "--sim-seed" in a.option_strings)
        assert "simulator" in act.help.lower(), (name, act.help)
        assert act.option_strings == ["--sim-seed", "--seed"] and "deprecated" in act.help, (name, act.option_strings)
    tune = dict(_commands())["tune"]
    assert any("--split-seed" in a.option_strings for a in tune._actions)


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.match(r"rksim \d+\.\d+", capsys.readouterr().out)


def test_policies_lists_every_policy_with_kind_defaults_and_ranges(capsys):
    from policies import list_policies, policy_defaults

    assert main(["policies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["policy"] for r in rows} == set(list_policies())
    by = {(r["policy"], r["parameter"]): r for r in rows}
    assert by[("cgee", "l_min")]["default"] == policy_defaults("cgee")["l_min"]
    assert by[("cgee", "l_min")]["allowed"] == "[1, inf) integer"      # from CGEE.__post_init__'s own check
    assert by[("rkv", "threshold")]["allowed"] == "[-1, 1]"
    assert by[("asks", "pooling")]["allowed"] == "mean | last"
    assert by[("snapkv", "budget")]["kind"] == "token"
    assert main(["policies", "--kind", "exit"]) == 0
    out = capsys.readouterr().out
    assert "cgee" in out and "asks" not in out


def test_policies_state_domains_units_and_only_parameters_that_act(capsys):
    assert main(["policies", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {(r["policy"], r["parameter"]): r for r in rows}
    # a similarity and a probability have real domains, whatever the checks accept
    assert by[("asks", "tau")]["domain"] == "[-1, 1]" and by[("asks", "tau")]["unit"] == "cosine similarity"
    assert by[("cgee", "tau_conf")]["domain"] == "[0, 1]" and by[("cgee", "tau_conf")]["unit"] == "probability"
    assert not any("-inf, inf" in r["domain"] for r in rows)
    assert by[("snapkv", "budget")]["unit"] == "tokens" and by[("cgee", "theta")]["unit"] == "nats"
    assert by[("cgee", "l_min")]["unit"] == "layer index (1 = first)"
    # a full cache evicts nothing: none of the eviction parameters is listed for it
    full = [r for r in rows if r["policy"] == "full"]
    assert len(full) == 1 and full[0]["parameter"] == "" and "evicts nothing" in full[0]["note"]
    # with a trace, a layer is one of its model's
    from trace_files import BUNDLED, HAS_BUNDLED
    if HAS_BUNDLED:
        from traces.store import load_trace
        L = load_trace(BUNDLED, verify=False).n_layers
        assert main(["policies", "--json", "--kind", "exit", "--trace", str(BUNDLED)]) == 0
        r = {x["parameter"]: x for x in json.loads(capsys.readouterr().out)}["l_min"]
        assert r["unit"] == f"layer of the trace's {L}-layer model" and r["domain"] == f"[1, {L}]"
    assert main(["policies", "--trace", "/no/such/trace"]) == 2
    assert "--trace" in capsys.readouterr().err


def test_dashboard_flags_and_bad_port(capsys):
    args = build_parser().parse_args(["dashboard"])
    assert args.host == "127.0.0.1" and args.port == 8501 and args.trace_root is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dashboard", "--port", "abc"])
    assert "--port: 'abc' is not a number" in capsys.readouterr().err.replace("argument ", "")
    assert main(["dashboard", "--trace-root", "/no/such/folder"]) == 2
    assert "--trace-root '/no/such/folder': no such folder" in capsys.readouterr().err


def test_dashboard_starts_streamlit_on_loopback_with_the_roots():
    from app.cli_app import APP, streamlit_argv

    argv = streamlit_argv(["/data/a", "/data/b"], 9000, "127.0.0.1")
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4] == str(APP)
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "9000"
    # the roots travel as the script's own arguments, read by app.ui_paths.roots_from
    from app.ui_paths import roots_from

    script_args = argv[argv.index("--") + 1:]
    assert roots_from(script_args, {}) == [Path("/data/a"), Path("/data/b")]
    assert "--" not in streamlit_argv(None, 8501, "127.0.0.1")


def test_an_output_that_cannot_be_written_fails_before_the_run(tmp_path, capsys):
    # issue 31: `bench serve --save-result --result-dir /proc/x` used to fail after the whole run
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [(["bench", "serve", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "400",
               "--save-result", "--result-dir", "/proc/rksim-x"], "--result-dir '/proc/rksim-x': cannot write under"),
             (["bench", "throughput", "--model-preset", "llama-3-8b", "--hardware", "h100-sxm", "--input-len", "8",
               "--output-len", "8", "--num-prompts", "4", "--output-json", str(a_file / "r.json")],
              f"--output-json '{a_file / 'r.json'}': '{a_file}' is a file, not a folder"),
             (["validate", "docs/validation/published-figures.yaml", "--markdown", str(a_file / "deep" / "v.md")], "is a file, not a folder")]
    for argv, words in cases:
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert words in err and out == "", (argv, err, out)   # nothing ran: no result was printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_the_write_check_leaves_nothing_behind(tmp_path):
    from app.outputs import check_writable
    check_writable(tmp_path / "new" / "deeper" / "r.json", "--out")
    check_writable(tmp_path, "--out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("keep")
    check_writable(tmp_path / "f", "--out")          # an existing file is replaced atomically later: its folder counts
    assert (tmp_path / "f").read_text() == "keep" and [p.name for p in tmp_path.iterdir()] == ["f"]
