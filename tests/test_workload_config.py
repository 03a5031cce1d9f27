"""The workload options as a dataclass: declared fields, validated once, errors naming ``workload.<field>``."""
from __future__ import annotations

import dataclasses

import pytest

from sim.base.errors import ConfigError
from sim.replay.runconfig import RunConfig
from sim.workload.config import WORKLOAD_DEFAULTS, Workload

BAD = [("verify_reuses_kv", 1), ("base_sharing", "lru"), ("block_sharing", "nope"), ("block_size", 0),
       ("block_size", 2.5), ("kv_budget_frac", 0), ("kv_budget_frac", float("nan")), ("kv_budget_blocks", -1),
       ("score", "votes"), ("concurrency", 0), ("concurrency", True), ("n_requests", 0), ("n_requests", 10**8),
       ("token_compressions", [0]), ("token_compressions", "4"), ("max_long_layers", 0), ("batching", "dynamic")]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_a_bad_option_is_refused_once_naming_its_field(name, value):
    with pytest.raises(ConfigError) as e:
        Workload.from_any({name: value})
    assert e.value.field == f"workload.{name}"
    assert str(e.value).startswith(f"workload option '{name}'")
    with pytest.raises(ConfigError) as e2:  # the same check through the run's config
        RunConfig(policy="rsbcm", workload={name: value})
    assert e2.value.field == e.value.field


def test_unknown_options_are_named_and_the_fields_are_declared():
    with pytest.raises(ConfigError, match="workload option 'concurency' is unknown") as e:
        Workload.from_any({"concurency": 2})
    assert e.value.field == "workload"
    names = [f.name for f in dataclasses.fields(Workload)]
    assert all("option" in f.metadata for f in dataclasses.fields(Workload))
    assert list(WORKLOAD_DEFAULTS) == names
    assert WORKLOAD_DEFAULTS["kv_budget_frac"] == 0.5 and WORKLOAD_DEFAULTS["token_compressions"] == [2, 4, 8]


def test_a_dict_becomes_a_frozen_hashable_workload():
    rc = RunConfig(policy="asks", workload={"concurrency": 8, "token_compressions": [2, 4]})
    wl = rc.workload
    assert isinstance(wl, Workload) and wl.concurrency == 8 and wl.token_compressions == (2, 4)
    assert rc.sim.workload is wl
    with pytest.raises(dataclasses.FrozenInstanceError):
        wl.concurrency = 2
    assert hash(wl) == hash(Workload(concurrency=8, token_compressions=(2, 4)))
    assert Workload.from_any(None) == Workload() and Workload.from_any(wl) is wl
    import numpy as np
    assert Workload(block_size=np.int64(32), verify_reuses_kv=np.bool_(False)).to_dict()["block_size"] == 32


def test_an_unstated_budget_fraction_is_not_a_stated_one(syn):
    """Serving: no kv_budget_frac = the device's capacity; a stated 0.5 = half of it (the isolated default)."""
    from sim.api import simulate
    kw = dict(policy="rsbcm", mode="serving", hardware="h100-sxm", baselines=False)
    full = simulate(syn, workload={"n_requests": 2}, **kw).summary["kv_budget_blocks"]
    half = simulate(syn, workload={"n_requests": 2, "kv_budget_frac": 0.5}, **kw).summary["kv_budget_blocks"]
    assert half == pytest.approx(full / 2, abs=1)
    assert Workload().key() != Workload(kv_budget_frac=0.5).key()
    assert Workload().to_dict() == Workload(kv_budget_frac=0.5).to_dict()  # both report the 0.5 they run in isolation


def test_the_cli_names_the_flag_of_a_workload_field():
    from app.cli_sim import flagged
    assert flagged(ConfigError("x", field="workload.concurrency")) == "--max-concurrent-problems: x"
    assert flagged(ConfigError("x", field="workload.n_requests")) == "--num-problems: x"
    assert flagged(ConfigError("x", field="workload.block_size")) == "--workload: x"
    assert flagged(ConfigError("x", field="arrival_rate")) == "--problem-rate: x"
