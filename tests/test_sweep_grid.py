"""--grid parsing: ranges, lists, the product's order, config ids, and clear errors."""
from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.search.grid import (DEFAULT_MAX_CONFIGS, Grid, GridError, config_id, parse_grid_arg,
                      parse_grids)


def test_range_is_decimal_exact_and_stop_inclusive():
    key, vals = parse_grid_arg("tau=0:1:0.1")
    assert key == "tau"
    assert vals == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    # the values are the floats one would type, not accumulated sums (0.1+0.2 != 0.3)
    assert vals[3] == 0.3 and vals[7] == 0.7
    assert parse_grid_arg("x=0.5:1.0:0.05")[1][-1] == 1.0
    assert len(parse_grid_arg("x=0.5:1.0:0.05")[1]) == 11


def test_range_types_and_direction():
    assert parse_grid_arg("l_min=4:28:8") == ("l_min", [4, 12, 20, 28])
    assert all(type(v) is int for v in parse_grid_arg("k=1:5:1")[1])
    assert parse_grid_arg("x=1:0:-0.25")[1] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert parse_grid_arg("x=0:1:0.3")[1] == [0.0, 0.3, 0.6, 0.9]  # stop not on the lattice
    assert parse_grid_arg("x=2:2:1")[1] == [2]
    assert parse_grid_arg("x=1e-3:3e-3:1e-3")[1] == [0.001, 0.002, 0.003]


@settings(max_examples=200, deadline=None)
@given(start=st.integers(-1000, 1000), n=st.integers(1, 60), step=st.integers(1, 500),
       scale=st.sampled_from([1, 10, 100, 1000]))
def test_range_matches_exact_decimal_lattice(start, n, step, scale):
    s, d = Decimal(start) / scale, Decimal(step) / scale
    stop = s + (n - 1) * d
    _, vals = parse_grid_arg(f"x={s}:{stop}:{d}")
    assert len(vals) == n
    assert vals == [float(s + i * d) for i in range(n)]
    assert vals[-1] == float(stop)


def test_lists():
    assert parse_grid_arg("a=1,2,3") == ("a", [1, 2, 3])
    assert parse_grid_arg("a=1,2.5") == ("a", [1.0, 2.5])
    assert parse_grid_arg("s=cosine,centered") == ("s", ["cosine", "centered"])
    assert parse_grid_arg("b=true,FALSE") == ("b", [True, False])
    assert parse_grid_arg("a=7") == ("a", [7])
    assert parse_grid_arg("a= 0.5 , 1 ") == ("a", [0.5, 1.0])


@pytest.mark.parametrize("text, part", [
    ("tau", "no '='"),
    ("=1,2", "key before '=' is empty"),
    ("tau=", "no values"),
    ("tau=0:1:0", "step is 0"),
    ("tau=0:1:-0.1", "wrong sign"),
    ("tau=1:0:0.1", "wrong sign"),
    ("tau=a:1:0.1", "start 'a' is not a number"),
    ("tau=0:b:0.1", "stop 'b' is not a number"),
    ("tau=0:1:", "step of the range is empty"),
    ("tau=0:1", "start:stop:step"),
    ("tau=0:inf:1", "finite"),
    ("tau=1,,2", "item 2 of the list is empty"),
    ("tau=1,x", "mixes numbers and words"),
    ("tau=true,1", "mixes booleans and numbers"),
    ("tau=0.5,0.5", "appears twice"),
    ("tau=nan", "NaN"),
    ("tau=0:1:0.5,2", "not both"),
    ("bad key=1", "not a parameter name"),
])
def test_bad_grid_names_flag_and_part(text, part):
    with pytest.raises(GridError) as ei:
        parse_grid_arg(text)
    msg = str(ei.value)
    assert msg.startswith(f"--grid {text!r}")
    assert part in msg
    assert "\n" not in msg


def test_duplicate_key_and_limit():
    with pytest.raises(GridError, match=r"--grid 'tau=3'.*two --grid flags"):
        parse_grids(["tau=1,2", "tau=3"])
    with pytest.raises(GridError, match=r"1010101 configurations .* --max-configs 1010101"):
        parse_grids(["a=0:1:0.0001", "b=0:1:0.01"])
    g = parse_grids(["a=0:1:0.0001", "b=0:1:0.01"], max_configs=None)
    assert g.size == 10001 * 101
    assert DEFAULT_MAX_CONFIGS >= 10_000


def test_product_order_and_ids():
    g = parse_grids(["tau=0.5,0.9", "alpha=0,1,2"])
    cfgs = list(g.configs())
    assert g.size == len(cfgs) == 6
    assert cfgs[:3] == [{"tau": 0.5, "alpha": 0}, {"tau": 0.5, "alpha": 1}, {"tau": 0.5, "alpha": 2}]
    ids = [config_id(c) for c in cfgs]
    assert len(set(ids)) == 6
    # stable: independent of key order, equal to a sha256 of canonical JSON
    assert config_id({"alpha": 0, "tau": 0.5}) == ids[0]
    import hashlib
    canon = json.dumps({"alpha": 0, "tau": 0.5}, sort_keys=True, separators=(",", ":"))
    assert ids[0] == hashlib.sha256(canon.encode()).hexdigest()[:16]
    assert list(Grid().configs()) == [{}]


def test_policy_params_validated_before_any_work():
    from sim.search.sweep import validate_params
    from sim.search.tune import DEFAULT_GRIDS, default_grid

    for policy in DEFAULT_GRIDS:  # the default grids name real parameters with valid values
        validate_params(policy, list(default_grid(policy, 30).configs()))
    with pytest.raises(ValueError, match=r"--grid 'foo': policy 'asks' has no parameter 'foo' \(valid: .*tau"):
        validate_params("asks", [{"tau": 0.5, "foo": 1}])
    with pytest.raises(ValueError, match=r"--policy 'nope'"):
        validate_params("nope", [{}])
    with pytest.raises(ValueError, match=r"--grid: policy 'cgee' refuses \{'l_min': 0\}.*l_min"):
        validate_params("cgee", [{"l_min": 0}])
