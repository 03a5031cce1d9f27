"""YAML read the one way every preset and figure file is read: PyYAML's safe loader, on libyaml where installed.

``CSafeLoader`` is libyaml's parser under PyYAML's own safe constructor and resolver, so it builds the same
objects as ``SafeLoader`` (``tests/test_yamlio.py`` compares every shipped file); it reads the presets of one
command about ten times faster (of the order of 20 ms a command here).
"""
from __future__ import annotations


def safe_load(text: str):
    """``yaml.safe_load(text)``, on libyaml's parser where PyYAML was built with it."""
    import yaml
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
