"""Benchmark loaders and answer extraction (no torch)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from traces.answers import extract_answer, extract_choice, extract_number, is_correct, normalize_number
from traces.datasets import load_arc, load_dataset, load_gsm8k, load_mmlu
from traces.errors import TraceError


def test_gsm8k_shipped():
    probs = load_gsm8k()
    assert len(probs) == 1319
    assert probs[0].truth == "18" and probs[0].answer_kind == "number"
    assert "Janet" in probs[0].question
    assert all(normalize_number(p.truth) == p.truth for p in probs)
    assert len(load_dataset("gsm8k", limit=5)) == 5


def test_mmlu_shipped():
    probs = load_mmlu()
    assert len(probs) == 1543
    assert {p.truth for p in probs} == {"A", "B", "C", "D"}
    assert all(len(p.choices) == 4 for p in probs)
    # quoted fields with commas survive the CSV parser
    assert any("," in c for p in probs for c in p.choices)
    assert "A. " in probs[0].prompt_text() and "D. " in probs[0].prompt_text()


def test_gsm8k_errors(tmp_path):
    f = tmp_path / "g.jsonl"
    f.write_text('{"question": "q", "answer": "4"}\n')
    with pytest.raises(TraceError, match=r"g.jsonl:1: answer: no '####'"):
        load_gsm8k(f)
    f.write_text('{"question": "q", "answer": "x\\n#### 1,234"}\n{oops\n')
    with pytest.raises(TraceError, match=r"g.jsonl:2: json:"):
        load_gsm8k(f)
    assert load_gsm8k(f, limit=1)[0].truth == "1234"


def test_mmlu_errors(tmp_path):
    f = tmp_path / "m.csv"
    f.write_text('"What, exactly?",1,2,3,4,C\nq,1,2,3,B\n')
    with pytest.raises(TraceError, match=r"m.csv:2: fields: 5 fields"):
        load_mmlu(f)
    f.write_text('"What, exactly?",1,2,3,4,E\n')
    with pytest.raises(TraceError, match="answer"):
        load_mmlu(f)


def test_arc(tmp_path):
    rows = [
        {"id": "x1", "question": {"stem": "Which?", "choices": [
            {"text": "a", "label": "A"}, {"text": "b", "label": "B"}, {"text": "c", "label": "C"},
            {"text": "d", "label": "D"}, {"text": "e", "label": "E"}]}, "answerKey": "E"},
        {"id": "x2", "question": {"stem": "Num?", "choices": [
            {"text": "one", "label": "1"}, {"text": "two", "label": "2"}, {"text": "three", "label": "3"},
            {"text": "four", "label": "4"}]}, "answerKey": "3"},
    ]
    f = tmp_path / "arc.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    probs = load_dataset(f"arc:{f}")
    assert [p.truth for p in probs] == ["E", "C"]
    assert probs[1].labels == ("1", "2", "3", "4") and len(probs[0].choices) == 5
    assert "E. e" in probs[0].prompt_text()
    rows[0]["answerKey"] = "F"
    f.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(TraceError, match=r"arc.jsonl:1: answerKey:"):
        load_arc(f)
    with pytest.raises(ValueError, match="--dataset"):
        load_dataset("squad")


@pytest.mark.parametrize("text,want", [
    ("The answer is 18.", "18"),
    ("She makes $1,234.50 in total.", "1234.5"),
    ("Total: 1,000", "1000"),
    ("He loses -5 dollars", "-5"),
    ("16-3-4=9", "9"),
    ("so 5 - 3 = 2.", "2"),
    ("It costs $-3.", "-3"),
    ("x = -$2.5", "-2.5"),
    ("It is 0.50.", "0.5"),
    ("18.0", "18"),
    ("Answer: 3,000,000 eggs", "3000000"),
    ("Steps ... #### 72\nThen 5 more", "72"),
    ("Water is H2O", ""),
    ("no numbers at all", ""),
    ("In 2 hours she walks 12 miles.", "12"),
    ("\u22127 degrees", "-7"),
])
def test_extract_number(text, want):
    assert extract_number(text) == want


@pytest.mark.parametrize("text,want", [
    ("The answer is (B).", "B"),
    ("B) Because the force is zero", "B"),
    ("Answer: b", "B"),
    ("answer: a", "A"),
    ("**C**", "C"),
    ("(D)", "D"),
    ("A cat is an animal. The correct option is D.", "D"),
    ("I think the answer is a tricky one, but C.", "C"),
    ("The answer is A.", "A"),
    ("A. 5 apples", "A"),
    ("Option B? No wait, the answer is C", "C"),
    ("It is clearly B", "B"),
    ("A ball rolls down.", ""),
    ("The answer is E", ""),  # only 4 options
])
def test_extract_choice(text, want):
    assert extract_choice(text, 4) == want


def test_extract_choice_digit_labels_and_text():
    assert extract_choice("The answer is 2", 4, labels=("1", "2", "3", "4")) == "B"
    assert extract_choice("It must be photosynthesis.", 4, choices=("respiration", "photosynthesis", "x", "y")) == "B"
    assert extract_answer("The answer is (E)", "choice", n_choices=5) == "E"


def test_is_correct():
    assert is_correct("18", "18.00", "number") and not is_correct("", "18", "number")
    assert is_correct("b", "B", "choice") and not is_correct("C", "B", "choice")


@given(st.integers(min_value=-10**9, max_value=10**9))
def test_number_roundtrip_with_commas(n):
    s = f"The total is ${n:,}."
    assert extract_number(s) == str(n)


@given(st.text(max_size=200))
def test_extractors_never_crash(text):
    assert isinstance(extract_number(text), str)
    assert extract_choice(text, 4) in ("", "A", "B", "C", "D")
