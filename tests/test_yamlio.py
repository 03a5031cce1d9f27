"""The libyaml loader builds the same objects as PyYAML's pure-Python safe loader, for every shipped YAML file."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import yaml

from sim.base.errors import PresetError
from sim.base.yamlio import safe_load
from sim.cost.profiles import read_preset_file

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted(p for p in subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=ROOT, capture_output=True,
                                           text=True, check=True).stdout.split())


def same(a, b) -> bool:
    """Equal values of equal types, floats bit for bit (NaN equals NaN), recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_libyaml_is_used_where_installed_and_the_python_parser_otherwise(monkeypatch):
    used = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, Loader: used.append(Loader) or real(text, Loader=Loader))
    assert safe_load("a: 1.5") == {"a": 1.5}
    assert used[-1] is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)   # a PyYAML built without libyaml
    assert safe_load("a: 1.5") == {"a": 1.5} and used[-1] is yaml.SafeLoader


@pytest.mark.parametrize("rel", SHIPPED)
def test_every_shipped_yaml_file_loads_the_same_objects(rel):
    text = (ROOT / rel).read_text()
    assert same(safe_load(text), yaml.safe_load(text)), rel


def test_the_comparison_sees_a_changed_float():
    assert not same({"a": [1.0, 2.0]}, {"a": [1.0, 2.0000000000000004]})
    assert not same({"a": 1}, {"a": 1.0})


def test_a_broken_preset_file_is_named(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\n  peak: [1, 2\n")
    with pytest.raises(PresetError, match=r"bad\.yaml: not valid YAML"):
        read_preset_file(p)
