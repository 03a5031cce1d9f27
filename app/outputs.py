"""Output flags checked before a command runs: a run that cannot write its result fails in a second, not
after the whole simulation (``--out``, ``--output-json``, ``--result-dir`` of every command)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

# argparse destinations that name something a command writes
OUTPUT_DESTS = {"out": "--out", "output_json": "--output-json", "result_dir": "--result-dir", "markdown": "--markdown",
                "keep": "--keep"}


def nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing ancestor."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable(path, flag: str) -> None:
    """Raise ``ValueError`` naming ``flag`` unless files can be created where ``path`` will be written.

    The nearest existing folder at or above ``path`` must be a folder, and a file must be creatable in it
    (tried with a temporary file, removed at once: nothing is left behind).
    """
    p = Path(os.path.abspath(os.fspath(path)))
    base = nearest_existing(p)
    if base.exists() and not base.is_dir():
        base = base.parent if base == p else base
        if not base.is_dir():
            raise ValueError(f"{flag} {str(path)!r}: {str(base)!r} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=base, prefix=".rksim-write-check-")
    except OSError as exc:
        raise ValueError(f"{flag} {str(path)!r}: cannot write under {str(base)!r} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def check_outputs(args) -> None:
    """:func:`check_writable` for every output flag the parsed ``args`` carries."""
    for dest, flag in OUTPUT_DESTS.items():
        v = getattr(args, dest, None)
        if isinstance(v, (str, os.PathLike)) and str(v):
            check_writable(v, flag)
