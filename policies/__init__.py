"""rksim policies: the decision logic of every policy and baseline, on numpy arrays (no torch).

See docs/policy-api.md (the contract) and docs/policies.md (formulas, parameters, defaults).
"""
from .base import POLICY_KINDS, PolicyError
from .blocks import FIFO, LRU, RSBCM
from .composite import RKSC
from .exit import CGEE, CGEEDecision, yes_score
from .registry import (POLICY_NAMES, get_policy, list_policies, param_applies, param_choices, param_domains, policy_class,
                       policy_defaults)
from .sharing import ASKS, ExactPrefix, NoKV, SharingPlan, layer_weights, pooled_cosine
from .similarity import cosine, identical_spans
from .token_loop import EvictionResult, run_token_eviction
from .token_metrics import FullAttention, attention_metrics
from .tokens import (H2O, RKV, CurDKV, FullCache, RandomEviction, SnapKV, StreamingLLM, TokenPolicy,
                     VASEAttnV, VASEDKV)

__all__ = [
    "POLICY_KINDS", "POLICY_NAMES", "PolicyError", "get_policy", "list_policies", "param_choices", "policy_class",
    "policy_defaults", "param_domains", "param_applies",
    "NoKV", "ExactPrefix", "ASKS", "SharingPlan", "layer_weights", "pooled_cosine",
    "cosine", "identical_spans",
    "CGEE", "CGEEDecision", "yes_score",
    "RSBCM", "LRU", "FIFO",
    "RKSC",
    "TokenPolicy", "FullCache", "StreamingLLM", "H2O", "SnapKV", "RKV", "CurDKV", "RandomEviction",
    "VASEAttnV", "VASEDKV", "run_token_eviction", "EvictionResult", "FullAttention", "attention_metrics",
]
