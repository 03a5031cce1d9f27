"""Re-create the bundled example trace with the capture command (``make capture``).

The exact command lands in the trace's manifest. Re-running resumes (complete
shards are kept); delete the folder first to capture from scratch.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "examples" / "trace-gsm8k-persona"

ARGS = [
    "capture", "--model", "smollm2-135m", "--dataset", "gsm8k", "--problems", "12", "--branches", "8",
    "--layout", "persona-prefix", "--max-new-tokens", "128", "--sampling-seed", "0", "--device", "cpu",
    "--long-decode", "512", "--long-decode-seqs", "2", "--long-decode-layers", "8,16,24,30",
    "--tree-depth", "2", "--tree-expand", "2", "--tree-branching", "3", "--tree-step", "32",
    "--out", "examples/trace-gsm8k-persona",
]


def main() -> int:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONHASHSEED="0")
    rc = subprocess.call([sys.executable, "-m", "app.cli", *ARGS], cwd=ROOT, env=env)
    if rc == 0:
        rc = subprocess.call([sys.executable, "-m", "app.cli", "trace", "validate", str(OUT.relative_to(ROOT))],
                             cwd=ROOT, env=env)
    return rc


if __name__ == "__main__":
    sys.exit(main())
