"""A progress bar on stderr for long commands, drawn only where stderr is a terminal (pipes, files and CI logs
get none) and never with ``--no-progress``."""
from __future__ import annotations

import contextlib
import sys

PROGRESS_HELP = "no progress bar on stderr (drawn only where stderr is a terminal)"


@contextlib.contextmanager
def bar(enabled: bool, total: int, desc: str, unit: str):
    """A tqdm bar of ``total`` ``unit`` s: its ``update`` (call it once per unit done), or None where ``enabled`` is
    False or stderr is no terminal. stderr is asked before tqdm is imported: the import is most of a short run's
    cost of a bar."""
    if not (enabled and getattr(sys.stderr, "isatty", lambda: False)()):
        yield None
        return
    from tqdm.auto import tqdm
    with tqdm(total=total, unit=unit, desc=desc, leave=False, file=sys.stderr) as b:
        yield b.update
