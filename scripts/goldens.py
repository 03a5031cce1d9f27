"""Regenerate (``--write``) or check the simulator's invariant goldens in ``tests/golden/``.

Each golden is the ``--json`` output of one ``rksim`` command on the bundled trace
(:data:`CASES`), with the repository root written as ``<repo>`` so the files do not depend
on where the checkout lives, and run as on the host ``local-cpu`` was fitted on (:func:`on_fitted_host`),
so that they do not depend on which machine runs them either. ``tests/test_goldens.py`` runs the same commands and compares
the JSON (:func:`moved`): every key, string, integer and boolean exactly, floats to ``REL`` relative, because
the attention-error figures go through BLAS matrix products whose kernels (and so last bits) differ between
CPUs. Regenerate only when a change moves a figure on purpose, and say why in
``tests/golden/NOTES.md``::

    python scripts/goldens.py --write
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(ROOT / "tests"))
from json_close import moved  # noqa: E402,F401  (the comparison; tests/json_close.py)

TARGETS = (("local-cpu", None), ("h100-sxm", "qwen2.5-7b"), ("h200", "qwen3-4b"))
SERVE_POLICIES = ("rksc", "rsbcm", "vase-dkv")
SERVE_REQUESTS = 6


def _cases() -> dict[str, list[str]]:
    out = {}
    for hw, model in TARGETS:
        name = f"compare-{model or 'trace'}-{hw}"
        out[name] = ["compare", "--json", "--hardware", hw] + (["--model-preset", model] if model else [])
    for pol in SERVE_POLICIES:
        out[f"serve-{pol}"] = ["serve", "--json", "--policy", pol, "--num-problems", str(SERVE_REQUESTS)]
    return out


CASES = _cases()


@contextlib.contextmanager
def on_fitted_host():
    """Within this block this process reads the host as the one the shipped ``local-cpu`` was fitted on.

    A golden priced with ``local-cpu`` says whether the profile belongs to the host it runs on
    (``hardware_calibrated``, ``host_note``: :mod:`sim.cost.fingerprint`); on any other CPU those fields, and only
    those, would differ. What a foreign host prints is tested on its own (``tests/test_host_profiles.py``).
    """
    import sim.cost.fingerprint
    from sim.cost.profiles import load_hardware

    recorded = load_hardware("local-cpu").fingerprint or {}
    here = sim.cost.fingerprint.current_cpu_fingerprint()
    pinned = {**here, **{k: recorded[k] for k in ("cpu_model", "isa", "torch") if k in recorded}}
    real = sim.cost.fingerprint.current_cpu_fingerprint
    sim.cost.fingerprint.current_cpu_fingerprint = lambda *a, **k: dict(pinned)
    try:
        yield
    finally:
        sim.cost.fingerprint.current_cpu_fingerprint = real


def run_case(argv: list[str]) -> dict:
    """The parsed JSON that ``rksim ARGV`` prints (run in this process, as on ``local-cpu``'s host), repository
    root as ``<repo>``."""
    from app.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), on_fitted_host():
        rc = main(list(argv))
    if rc != 0:
        raise RuntimeError(f"rksim {' '.join(argv)} exited {rc}")
    return json.loads(buf.getvalue().replace(str(ROOT), "<repo>"))


def dump(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


REL = 1e-12   # floats: relative agreement (a BLAS kernel's summation order moves the last bits, about 1e-16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite tests/golden/*.json (default: check only)")
    args = ap.parse_args(argv)
    bad = []
    for name, case in CASES.items():
        path = GOLDEN / f"{name}.json"
        text = dump(run_case(case))
        if args.write:
            GOLDEN.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            print(f"wrote {path.relative_to(ROOT)}")
        elif not path.is_file() or moved(json.loads(text), json.loads(path.read_text()), rel=REL):
            bad.append(name)
            print(f"differs: {name}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
