"""Fixtures shared by the test modules: synthetic traces (``syn``, ``syn_factory``).

The bundled example trace is ``trace_files.BUNDLED`` (a constant: ``skipif`` marks read it at import).
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def syn_factory(tmp_path_factory):
    """``make(n_problems=5, seed=3, **kw)`` -> the path of a synthetic trace (``sim.synthetic``), written once per shape."""
    from sim.synthetic import write_synthetic_trace
    made: dict = {}

    def make(n_problems: int = 5, seed: int = 3, **kw) -> str:
        key = (n_problems, seed, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = str(write_synthetic_trace(tmp_path_factory.mktemp("syn") / "t", n_problems=n_problems,
                                                  seed=seed, **kw))
        return made[key]
    return make


@pytest.fixture(scope="session")
def syn(syn_factory) -> str:
    """The default synthetic trace: 5 problems, seed 3."""
    return syn_factory()
