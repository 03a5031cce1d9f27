"""Workload layouts and prompts (the real SmolLM2 tokenizer), torch-free modules."""
from __future__ import annotations


import pytest

from traces.workload import (
    BANKS, LAYOUTS, TreeConfig, WorkloadConfig, build_prompts, neutral_texts, pad_ids, verification_ids,
    verify_suffix_ids, yes_no_ids,
)

QUESTION = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from traces.models import model_folder

    return AutoTokenizer.from_pretrained(model_folder("smollm2-135m")[0])


def test_banks_and_reference():
    for layout in LAYOUTS:
        assert len(BANKS[layout]) >= 8 and len(set(BANKS[layout])) == len(BANKS[layout])
    assert 16 <= len(neutral_texts()) <= 32


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_segments(tok, layout):
    pp = build_prompts(tok, QUESTION, "number", WorkloadConfig(layout=layout, n_branches=6, seed=3), 5)
    assert len(pp.branches) == 6
    root = pp.branches[0]
    assert root.variant_id == 0
    assert len({b.variant_id for b in pp.branches}) == 6  # distinct while the bank lasts
    for b in pp.branches:
        assert sum(b.seg_lens) == b.prompt_len
        assert b.seg_kinds.count("variant") == 1
        assert tok.decode(b.prompt_ids[b.variant_start:b.variant_end]) == b.variant_text
        # shared segments hold the same tokens in every branch
        shared = [b.prompt_ids[:b.variant_start], b.prompt_ids[b.variant_end:]]
        assert shared == [root.prompt_ids[:root.variant_start], root.prompt_ids[root.variant_end:]]
    text = tok.decode(root.prompt_ids)
    assert "bolts" in text and text.startswith("<|im_start|>system")
    assert text.endswith("<|im_start|>assistant\n")
    if layout == "persona-prefix":
        assert pp.shared_prefix_tokens <= 5  # variation at the start: exact prefix shares ~nothing
        assert root.variant_start < 5
    if layout == "hint-suffix":
        assert pp.shared_prefix_tokens >= root.prompt_len - 20
    if layout == "paraphrase":
        assert "Think step by step." in text


def test_seeded_assignment(tok):
    a = build_prompts(tok, QUESTION, "number", WorkloadConfig(n_branches=8, seed=1), 3)
    b = build_prompts(tok, QUESTION, "number", WorkloadConfig(n_branches=8, seed=1), 3)
    c = build_prompts(tok, QUESTION, "number", WorkloadConfig(n_branches=8, seed=2), 3)
    ids = lambda pp: [x.variant_id for x in pp.branches]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    many = build_prompts(tok, QUESTION, "number", WorkloadConfig(n_branches=30), 0)
    assert len(many.branches) == 30 and many.branches[0].variant_id == 0


def test_padding_to_target(tok):
    cfg = WorkloadConfig(layout="persona-prefix", n_branches=4, target_prefix_tokens=1024)
    pp = build_prompts(tok, QUESTION, "number", cfg, 0)
    assert pp.branches[0].prompt_len == 1024
    assert pp.pad_tokens > 900
    again = build_prompts(tok, QUESTION, "number", cfg, 0)
    assert again.branches[2].prompt_ids == pp.branches[2].prompt_ids
    # the pad is shared text: the shared tail after the variant is > 1000 tokens in every branch
    for b in pp.branches:
        assert b.prompt_len - b.variant_end > 950
    assert pad_ids(tok, 50) == pad_ids(tok, 50) and len(pad_ids(tok, 50)) == 50
    # a target below the natural length pads nothing
    short = build_prompts(tok, QUESTION, "number", WorkloadConfig(target_prefix_tokens=10), 0)
    assert short.pad_tokens == 0


def test_choice_task_text(tok):
    pp = build_prompts(tok, "Which?\nA. x\nB. y", "choice", WorkloadConfig(layout="hint-suffix", n_branches=2), 0)
    assert "letter of the correct option" in tok.decode(pp.branches[0].prompt_ids)


def test_verification_suffix(tok):
    suf = verify_suffix_ids(tok)
    text = tok.decode(suf)
    assert text.startswith("<|im_end|>") and "Is this answer correct? Answer Yes or No." in text
    assert text.endswith("<|im_start|>assistant\n")
    end = suf[0]
    full, n = verification_ids([1, 2], [5, end], suf)
    assert full == [1, 2, 5, end] + suf[1:] and n == len(suf) - 1  # the end-of-turn is not repeated
    full, n = verification_ids([1, 2], [5, 6], suf)
    assert full == [1, 2, 5, 6] + suf and n == len(suf)
    yes, no = yes_no_ids(tok)
    assert tok.encode("Yes", add_special_tokens=False)[0] in yes and tok.encode(" No", add_special_tokens=False)[0] in no


def test_config_errors():
    with pytest.raises(ValueError, match="--layout"):
        WorkloadConfig(layout="middle")
    with pytest.raises(ValueError, match="--branches"):
        WorkloadConfig(n_branches=0)
    with pytest.raises(ValueError, match="--tree-step"):
        TreeConfig(depth=1, step_tokens=0)
