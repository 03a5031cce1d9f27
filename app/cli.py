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
_AREAS = ["app.cli_trace", "app.cli_sim", "app.cli_sweep", "app.cli_calibrate"]


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rksim",
        description="What would KV sharing, early exit and KV eviction buy on my model and hardware?",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _AREAS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an area not built yet
            if exc.name == name:
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
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
