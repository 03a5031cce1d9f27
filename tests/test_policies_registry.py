"""Registry, parameter validation and the no-torch rule of policies/."""
import dataclasses

import pytest

import policies
from policies import POLICY_KINDS, PolicyError, get_policy, list_policies

NAMES = ["no-kv", "exact-prefix", "asks", "cgee", "rsbcm", "lru", "fifo", "rksc", "full", "streamingllm",
         "h2o", "snapkv", "rkv", "curdkv", "random", "vase-attnv", "vase-dkv"]


def test_every_name_resolves_with_its_kind():
    assert list_policies() == NAMES
    for name in NAMES:
        pol = get_policy(name)
        assert pol.name == name
        assert pol.kind in POLICY_KINDS
        assert dataclasses.asdict(pol) == pol.params()
    assert list_policies("token") == NAMES[8:]
    assert list_policies("sharing") == ["no-kv", "exact-prefix", "asks"]
    assert list_policies("block") == ["rsbcm", "lru", "fifo"]
    assert list_policies("composite") == ["rksc"]


def test_unknown_name_lists_valid_names():
    with pytest.raises(PolicyError, match="unknown policy 'vase'.*vase-attnv"):
        get_policy("vase")


def test_unknown_parameter_names_key_and_lists_valid_ones():
    with pytest.raises(PolicyError) as ei:
        get_policy("asks", tau=0.8, beta=2)
    msg = str(ei.value)
    assert "'beta'" in msg and "tau" in msg and "alpha" in msg and "'asks'" in msg


def test_no_parameter_policy_rejects_any_key():
    with pytest.raises(PolicyError, match=r"valid: \(none\)"):
        get_policy("lru", budget=3)


@pytest.mark.parametrize("name,params,field", [
    ("asks", {"pooling": "max"}, "pooling"),
    ("asks", {"similarity": "dot"}, "similarity"),
    ("asks", {"tau": float("nan")}, "tau"),
    ("asks", {"block_size": 0}, "block_size"),
    ("asks", {"layer_weights": "other"}, "layer_weights"),
    ("exact-prefix", {"block_size": 2.5}, "block_size"),
    ("cgee", {"l_min": 0}, "l_min"),
    ("cgee", {"theta": -1}, "theta"),
    ("cgee", {"confidence": "logprob"}, "confidence"),
    ("cgee", {"lens": "raw"}, "lens"),
    ("rsbcm", {"score_source": "x"}, "score_source"),
    ("snapkv", {"window": 0}, "window"),
    ("vase-attnv", {"temperature": 0}, "temperature"),
    ("vase-attnv", {"n_value": 200, "budget": 128}, "n_value"),
    ("vase-dkv", {"deterministic": "yes"}, "deterministic"),
    ("h2o", {"budget": 0}, "budget"),
    ("streamingllm", {"sinks": 10, "budget": 8}, "sinks"),
    ("rkv", {"mix_lambda": 1.5}, "mix_lambda"),
    ("rksc", {"tau_conf": "high"}, "tau_conf"),
])
def test_bad_parameter_value_names_policy_and_field(name, params, field):
    with pytest.raises(PolicyError) as ei:
        get_policy(name, **params)
    assert field in str(ei.value)
    assert repr(name) in str(ei.value) or name == "rksc"


def test_rksc_routes_flat_parameters_to_its_components():
    pol = get_policy("rksc", tau=0.7, theta=1.5, score_source="unscored")
    assert pol.asks.tau == 0.7 and pol.cgee.theta == 1.5 and pol.rsbcm.score_source == "unscored"
    assert pol.asks.name == "asks" and pol.cgee.name == "cgee"
    assert "asks" not in dataclasses.asdict(pol)  # components are not parameters
    assert set(dataclasses.asdict(pol)) == (set(policies.policy_defaults("asks")) | set(policies.policy_defaults("cgee"))
                                             | set(policies.policy_defaults("rsbcm")))


def test_policy_defaults():
    assert policies.policy_defaults("snapkv")["window"] == 32
    assert policies.policy_defaults("rkv")["window"] == 8
    assert policies.policy_defaults("asks")["alpha"] == 1.0


def test_param_choices_cover_every_string_parameter_and_are_enforced():
    import pytest
    from policies import PolicyError, get_policy, list_policies, param_choices, policy_defaults
    for name in list_policies():
        choices = param_choices(name)
        for field, default in policy_defaults(name).items():
            if isinstance(default, str):
                assert field in choices and default in choices[field], (name, field)
        for field, allowed in choices.items():
            for v in allowed:
                get_policy(name, **{field: v})
            with pytest.raises(PolicyError, match=field):
                get_policy(name, **{field: "no-such-choice"})


def test_policy_specs_name_an_ablation_and_refuse_bad_text():
    import pytest
    from policies import PolicyError
    from policies.registry import parse_spec, policy_from_spec
    assert parse_spec("vase-attnv") == ("vase-attnv", {})
    assert parse_spec(" vase-dkv : value_frac=0 : deterministic=true ") == (
        "vase-dkv", {"value_frac": 0, "deterministic": True})
    p = policy_from_spec("vase-attnv:value_frac=0.25:temperature=0.5", budget=40)
    assert (p.value_frac, p.temperature, p.budget) == (0.25, 0.5, 40)
    assert policy_from_spec("h2o:budget=7", budget=9).budget == 9          # overrides win
    with pytest.raises(PolicyError, match=r"'h2o:budget' 'budget': expected KEY=VALUE"):
        parse_spec("h2o:budget")
    with pytest.raises(PolicyError, match=r"'h2o:=3' '=3': empty key"):
        parse_spec("h2o:=3")
    with pytest.raises(PolicyError, match=r"'h2o:bogus=1'.*unknown parameter"):
        policy_from_spec("h2o:bogus=1")
    with pytest.raises(PolicyError, match=r"value_frac"):
        policy_from_spec("vase-attnv:value_frac=2")


def test_calibrate_quality_takes_ablation_specs():
    import argparse
    import pytest
    from calibrate.quality import QualityConfig
    a = argparse.Namespace(model="m", device="cpu", seed=0, threads=1, problems=1, long_decode=64,
                           policies="vase-attnv,vase-attnv:value_frac=0", compression="4")
    assert QualityConfig.from_args(a).policies == ("vase-attnv", "vase-attnv:value_frac=0")
    for bad, msg in (("vase-attnv:bogus=1", "unknown parameter"), ("asks", "not a token-eviction"),
                     ("vase-attnv:x", "expected KEY=VALUE")):
        a.policies = bad
        with pytest.raises(ValueError, match=rf"--policies: .*{msg}"):
            QualityConfig.from_args(a)
