"""One check of a preset's fields (sim.cost.fields): every numeric and choice field of a hardware preset and of its
host_step / frontend blocks refuses a bad value with the field's name and the rule's words, and takes a good one."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.cost.fields import RULES, check_choice, check_field
from sim.cost.overheads import FrontendCost, HostStepCost
from sim.base.errors import PresetError
from sim.cost.profiles import load_hardware

H100 = load_hardware("h100-sxm")
# field -> (a value its rule refuses, the words of the refusal)
BAD = {
    "peak_flops": (0.0, "a positive number"), "mem_bw": (-1.0, "a positive number"),
    "eff_c": (float("nan"), "a positive number"), "eff_m": (True, "a positive number"),
    "eff_kv": (0.0, "a positive number or null"), "eff_c_fp8": (-0.5, "a positive number or null"),
    "gemm_row_block": (0, "a positive integer or null"), "sm_count": (2.5, "a positive integer or null"),
    "per_kernel_s": (-1e-6, "a number >= 0"), "eager_launch_s": ("1", "a number >= 0"),
    "per_kernel_graph_s": (-1.0, "a number >= 0"), "cuda_graphs": (1, "true or false"),
    "fp8_weights": ("w4a16", "one of None, w8a8, w8a16"), "roofline": ("kernel", "one of iteration, operator"),
    "decode_attention": ("flash", "one of paged, padded"),
}


@pytest.mark.parametrize("field", sorted(BAD))
def test_a_bad_hardware_field_is_refused_by_name(field):
    v, words = BAD[field]
    with pytest.raises(PresetError, match=f"field '{field}' must be {words}, got"):
        dataclasses.replace(H100, **{field: v})


def test_good_values_and_nulls_pass():
    dataclasses.replace(H100, eff_kv=None, sm_count=None, per_kernel_graph_s=None, peak_flops=1e15, cuda_graphs=False)


@pytest.mark.parametrize("cls, field, v, words", [
    (HostStepCost, "per_running_s", -1.0, "a number >= 0"), (HostStepCost, "host_speed", 0.0, "a positive number"),
    (HostStepCost, "serial_fraction", 1.5, "a number in \\[0, 1\\]"),
    (HostStepCost, "max_running", 0, "a positive integer or null"),
    (FrontendCost, "api_servers", 0, "a positive integer"), (FrontendCost, "request_s", -1.0, "a number >= 0"),
    (FrontendCost, "host_speed", float("inf"), "a positive number")])
def test_overhead_blocks_refuse_by_name(cls, field, v, words):
    base = {"base_s": 1e-4} if cls is HostStepCost else {"request_s": 1e-3}
    base[field] = v
    prefix = "host_step" if cls is HostStepCost else "frontend"
    with pytest.raises(PresetError, match=f"{prefix}.{field} must be {words}, got"):
        cls(**base)


@given(st.one_of(st.integers(-3, 3), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                 st.text(max_size=2)))
def test_rules_agree_with_their_words(v):
    import math
    num = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    expect = {"positive": num and v > 0, "nonneg": num and v >= 0, "fraction": num and 0 <= v <= 1,
              "positive or null": v is None or (num and v > 0), "count": isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              "bool": isinstance(v, bool)}
    expect["count or null"] = v is None or expect["count"]
    for rule in RULES:
        if expect[rule]:
            check_field("x", v, rule)
        else:
            with pytest.raises(PresetError, match=f"^x must be {RULES[rule][0].replace('[', '.').replace(']', '.')}, got"):
                check_field("x", v, rule)
    check_choice("y", None, (None, "a"))
    with pytest.raises(PresetError, match="^y must be one of None, a, got 'b'"):
        check_choice("y", "b", (None, "a"))
