"""Test session setup: fitted profiles go to a private user profile directory, never the user's own."""
from __future__ import annotations

import os
import tempfile


def pytest_configure(config):
    # a user's ~/.config/rksim profiles must not shadow the shipped presets the tests read
    if not os.environ.get("RKSIM_PROFILE_DIR"):
        os.environ["RKSIM_PROFILE_DIR"] = tempfile.mkdtemp(prefix="rksim-test-profiles-")
