"""What two captures of the same problems must share byte for byte (test helper, not a test module)."""
from __future__ import annotations

import json
from pathlib import Path

from traces.schema import NONDETERMINISTIC_FILES


def deterministic_files(root: Path) -> dict[str, bytes]:
    """Every file's bytes, except measured timings (and their checksum entries in shard.json) and the manifest."""
    out = {}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == "manifest.json" or p.name in NONDETERMINISTIC_FILES:
            continue
        rel = p.relative_to(root).as_posix()
        if p.name == "shard.json":
            meta = json.loads(p.read_text())
            for f in NONDETERMINISTIC_FILES:
                meta["files"].pop(f, None)
            out[rel] = json.dumps(meta, sort_keys=True).encode()
        else:
            out[rel] = p.read_bytes()
    return out


def _bundled() -> Path:
    from sim.replay.session import default_trace_path
    return default_trace_path()


BUNDLED = _bundled()                                     # the bundled example trace
HAS_BUNDLED = (BUNDLED / "manifest.json").is_file()
