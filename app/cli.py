"""The ``rksim`` command line.

Each area registers its own sub-commands from a module ``app/cli_<area>.py``
exposing ``register(subparsers)``; heavy imports (torch, simpy, plotly) happen
inside the command functions so that ``rksim --help`` stays fast and the
simulator never loads torch.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# Order sets the order in --help.
_AREAS = ["app.cli_trace", "app.cli_sim", "app.cli_sweep", "app.cli_bench", "app.cli_validate", "app.cli_plan", "app.cli_calibrate",
          "app.cli_app"]


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def version() -> str:
    """The installed rksim's version (pyproject's, when run from a checkout that is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v("rksim")
    except PackageNotFoundError:  # pragma: no cover - a bare checkout
        import re
        from pathlib import Path

        m = re.search(r'^version\s*=\s*"([^"]+)"', (Path(__file__).parents[1] / "pyproject.toml").read_text(), re.M)
        return m.group(1) if m else "0"


class _Version(argparse._VersionAction):
    """``--version``, its version looked up when asked: ``importlib.metadata`` would cost every other command
    about 30 ms of start-up."""

    def __call__(self, parser, namespace, values, option_string=None):
        self.version = f"rksim {version()}"
        super().__call__(parser, namespace, values, option_string)


class HelpFormatter(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the text already says it ("default ...")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.help is argparse.SUPPRESS or "default" in text.lower() or "%(default)" in text:
            return text
        if not action.option_strings or action.default is None or action.default is argparse.SUPPRESS or \
                action.default is False or \
                isinstance(action, (argparse._StoreTrueAction, argparse._HelpAction, argparse._VersionAction)):
            return text
        d = action.default
        shown = ",".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)
        if isinstance(d, list) and not d:
            return text
        return f"{text} (default {shown})".strip()


class Parser(argparse.ArgumentParser):
    """The parser of rksim and of every sub-command: one help format everywhere."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def walk(parser: argparse.ArgumentParser, path: tuple = ()):
    """``(command path, parser, help line)`` of the parser and every sub-command under it."""
    yield path, parser, None
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in act._choices_actions}
            for name, sub in act.choices.items():
                for p, s, h in walk(sub, path + (name,)):
                    yield p, s, (helps.get(name) if p == path + (name,) else h)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="rksim",
        description="What would KV sharing, early exit and KV eviction buy on my model and hardware?",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in _AREAS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an area not built yet
            if exc.name == name:
                continue
            raise
        mod.register(sub)
    # A sub-command registered with a help line only gets it as its description too.
    for _path, p, help_line in walk(parser):
        if not p.description and help_line:
            p.description = help_line[0].upper() + help_line[1:] + "."
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from app.outputs import check_outputs
        check_outputs(args)   # before the run: a result that cannot be written fails now, not at the end
        rc = args.func(args)
    except BrokenPipeError:  # `rksim policies | head`
        return 0
    except CLIError as exc:
        print(f"rksim: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, KeyError) as exc:
        # Library errors carry the file/field/flag at fault; one line, no traceback.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"rksim: error: {msg}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
