"""Answer extraction from model outputs, and answer comparison. No torch.

Free text (GSM8K): the last number, normalised (commas, ``$``, trailing
period, ``1,000`` -> ``1000``, ``5.50`` -> ``5.5``, ``-3``); if the text has a
``####`` marker, the last number after it. Multiple choice: the option letter,
found by explicit phrases first ("answer is (B)", "Answer: b", "option C"),
then a line starting with a label ("B) ...", "(C)", "D."), then a lone
capital label, then a unique match of an option's text.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_MINUS = "\u2212\u2013"  # unicode minus, en dash
# A number: digits with optional thousands groups and decimals. The sign and
# "$" are looked at by hand in _numbers (a "-" is a sign only when not glued
# to a preceding word or digit, so "16-3" is 3, not -3).
_NUM = re.compile(r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?!\d)")


def normalize_number(s: str) -> str | None:
    """Canonical string of a number: ``"$1,000.50"`` -> ``"1000.5"``, ``"18.0"`` -> ``"18"``.

    Returns None if ``s`` holds no number.
    """
    t = s.strip().replace(",", "").replace("$", "").replace(" ", "")
    for m in _MINUS:
        t = t.replace(m, "-")
    t = t.rstrip(".")
    try:
        d = Decimal(t)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def _numbers(text: str) -> list[str]:
    out = []
    for m in _NUM.finditer(text):
        s = m.start()
        prev = text[s - 1] if s else " "
        if prev.isalnum() or prev in "_.":  # "x2", "H2O", "v1.2.3" tails
            continue
        j = s - 1 if prev == "$" else s
        neg = False
        if j > 0 and text[j - 1] in "-" + _MINUS:
            before = text[j - 2] if j >= 2 else " "
            if before == "$":  # "$-5"
                before = text[j - 3] if j >= 3 else " "
            neg = not (before.isalnum() or before in ")]")
        v = normalize_number(m.group("num"))
        if v is not None:
            out.append(("-" + v) if neg and v != "0" else v)
    return out


def extract_number(text: str) -> str:
    """The last number in ``text`` (after ``####`` if present), normalised; ``""`` if none."""
    if "####" in text:
        nums = _numbers(text.rsplit("####", 1)[1])
        if nums:
            return nums[0]
    nums = _numbers(text)
    return nums[-1] if nums else ""


def extract_choice(text: str, n_choices: int = 4, choices: tuple[str, ...] = (),
                   labels: tuple[str, ...] = ()) -> str:
    """The chosen option letter (``A``..), or ``""``.

    Parameters
    ----------
    text : the model's output.
    n_choices : number of options (letters ``A`` .. the n-th letter are valid).
    choices : option texts, for the last-resort unique text match.
    labels : the source labels when they are not letters (ARC ``1``-``4``):
        "answer is 2" maps to the option labelled ``2``.
    """
    letters = "ABCDEFGHIJ"[:n_choices]
    cls = f"[{letters}{letters.lower()}]"
    digit_map = {lab: letters[i] for i, lab in enumerate(labels) if lab.isdigit() and i < n_choices}
    # 1. explicit phrase; the last one wins ("... B? No, the answer is C")
    explicit = re.compile(
        r"(?:answer|option|choice)\s*(?:is|would be|should be|=|:)?\s*(?:option\s*|choice\s*)?"
        r"[\(\[\*\s]*(" + cls + (r"|[" + "".join(digit_map) + "]" if digit_map else "") + r")(?![A-Za-z])",
        re.IGNORECASE)
    # "Answer: b" counts in any case, but "answer is a tricky one" (article) does not
    hits = []
    for m in explicit.finditer(text):
        g = m.group(1)
        article = g in ("a", "A", "I") and re.match(r"\s[a-z]", text[m.end():m.end() + 2])
        if article and not re.search(r"[:=(]\s*" + g + "$", text[m.start():m.end()]):
            continue
        hits.append(g)
    if hits:
        return digit_map.get(hits[-1], hits[-1].upper())
    # 2. a line that starts with a label: "B) ...", "(C)", "D.", "**A**"
    m = re.search(r"(?m)^\s*[\*\(\[]*([" + letters + r"])[\)\]\.:\*](?:\s|$)", text)
    if m:
        return m.group(1)
    # 3. a lone capital label: "(B)", "B" — not the article "A cat"
    for m in re.finditer(r"(?<![A-Za-z])\(?([" + letters + r"])\)?(?![A-Za-z])", text):
        g = m.group(1)
        tail = text[m.end():m.end() + 2]
        if g in ("A", "I") and "(" not in m.group(0) and re.match(r"\s[a-z]", tail):
            continue
        return g
    # 4. exactly one option's text appears
    if choices:
        low = text.lower()
        found = [i for i, c in enumerate(choices[:n_choices])
                 if c.strip() and re.search(r"(?<!\w)" + re.escape(c.strip().lower()) + r"(?!\w)", low)]
        if len(found) == 1:
            return letters[found[0]]
    return ""


def extract_answer(text: str, kind: str, n_choices: int = 4, choices: tuple[str, ...] = (),
                   labels: tuple[str, ...] = ()) -> str:
    """Dispatch on ``kind`` (``number`` | ``choice``)."""
    if kind == "number":
        return extract_number(text)
    if kind == "choice":
        return extract_choice(text, n_choices, choices, labels)
    raise ValueError(f"answer_kind: {kind!r} is not number or choice")


def is_correct(answer: str, truth: str, kind: str) -> bool:
    """Exact match after normalisation (numbers compared as decimals)."""
    if not answer:
        return False
    if kind == "number":
        a, t = normalize_number(answer), normalize_number(truth)
        return a is not None and a == t
    return answer.strip().upper() == truth.strip().upper()
