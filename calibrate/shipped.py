"""The ``--write`` / ``--check`` step every fit or reading module ends with: the files it derives from the shipped data
(presets, JSON tables), compared byte for byte with what is shipped, or written atomically."""
from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(files: dict, *, write: bool, check: bool, how: str) -> int:
    """``files``: path -> the text (or bytes) the shipped data gives. ``check``: exit code 1, naming every path that differs
    (or is missing) and ``how`` to rewrite them; ``write``: each written atomically. 0 otherwise."""
    from traces.store import atomic_write_bytes, atomic_write_text

    def same(p, t) -> bool:   # text or bytes (a compressed extract)
        return Path(p).is_file() and (Path(p).read_bytes() if isinstance(t, bytes) else Path(p).read_text()) == t

    if check:
        bad = [str(p) for p, t in files.items() if not same(p, t)]
        if bad:
            print(f"differs from what the shipped data gives ({how}): {', '.join(bad)}", file=sys.stderr)
            return 1
    if write:
        for p, t in files.items():
            (atomic_write_bytes if isinstance(t, bytes) else atomic_write_text)(p, t)
            print(f"wrote {p}")
    return 0
