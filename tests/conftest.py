"""Test session setup and shared fixtures: synthetic traces (``syn``, ``syn_factory``).

Fitted profiles go to a private user profile directory, never the user's own.

The bundled example trace is ``trace_files.BUNDLED`` (a constant: ``skipif`` marks read it at import).
"""
from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config):
    # a user's ~/.config/rksim profiles must not shadow the shipped presets the tests read; each
    # pytest-xdist worker gets its own directory (workers inherit the controller's environment, and
    # two workers fitting profiles of the same name must not see each other's)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker or not os.environ.get("RKSIM_PROFILE_DIR"):
        os.environ["RKSIM_PROFILE_DIR"] = tempfile.mkdtemp(prefix=f"rksim-test-profiles-{worker or 'main'}-")


@pytest.fixture(scope="session")
def syn_factory(tmp_path_factory):
    """``make(n_problems=5, seed=3, **kw)`` -> the path of a synthetic trace (``tests.synthetic``), written once per shape."""
    from tests.synthetic import write_synthetic_trace
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
