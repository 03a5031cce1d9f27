"""Benchmark loaders: GSM8K (JSONL), MMLU (CSV, no header), ARC-style (JSONL).

Each returns a list of :class:`Problem` with a normalised ground truth
(a number string for GSM8K, a choice letter ``A``.. for multiple choice).
Bad input raises :class:`~traces.errors.TraceError` ``"FILE:LINE: field: what"``.
No torch.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from traces.answers import normalize_number
from traces.errors import TraceError

DATA_DIR = Path(__file__).resolve().parent / "data"
GSM8K_TEST = DATA_DIR / "gsm8k" / "test.jsonl"
MMLU_DIR = DATA_DIR / "mmlu"
LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Problem:
    """One benchmark item.

    ``choices`` are the option texts (empty for free-form answers); ``labels``
    are the option labels as written in the source (``A``.. or ``1``..);
    ``truth`` is normalised: a number string (``answer_kind == "number"``) or
    the letter of the correct option by position (``"choice"``).
    """

    index: int
    question: str
    truth: str
    answer_kind: str
    choices: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False)

    def prompt_text(self) -> str:
        """The problem as shown to the model (question, then lettered options)."""
        if self.answer_kind == "number":
            return self.question.strip()
        opts = "\n".join(f"{LETTERS[i]}. {c.strip()}" for i, c in enumerate(self.choices))
        return f"{self.question.strip()}\n{opts}"


def _jsonl(path: Path):
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceError(str(path), "file", f"cannot open ({exc.strerror})") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise TraceError(f"{path}:{n}", "json", f"not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}:{n}", "json", "line is not an object")
            yield n, obj


def load_gsm8k(path: str | Path = GSM8K_TEST, limit: int | None = None) -> list[Problem]:
    """GSM8K JSONL: ``{"question", "answer"}``; the final answer follows ``####``."""
    path = Path(path)
    out = []
    for n, obj in _jsonl(path):
        for k in ("question", "answer"):
            if not isinstance(obj.get(k), str):
                raise TraceError(f"{path}:{n}", k, "missing or not a string")
        ans = obj["answer"]
        if "####" not in ans:
            raise TraceError(f"{path}:{n}", "answer", "no '####' final-answer marker")
        final = ans.rsplit("####", 1)[1].strip()
        truth = normalize_number(final)
        if truth is None:
            raise TraceError(f"{path}:{n}", "answer", f"final answer {final!r} is not a number")
        out.append(Problem(len(out), obj["question"], truth, "number", source=str(path),
                           meta={"line": n, "solution": ans}))
        if limit is not None and len(out) >= limit:
            break
    return out


def load_mmlu(path: str | Path = MMLU_DIR, limit: int | None = None) -> list[Problem]:
    """MMLU CSV without header, 6 fields ``question, A, B, C, D, answer``.

    ``path`` is one CSV or a directory of them (read in sorted order).
    """
    path = Path(path)
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    if not files:
        raise TraceError(str(path), "file", "no .csv files")
    out = []
    for fp in files:
        try:
            f = open(fp, encoding="utf-8", newline="")
        except OSError as exc:
            raise TraceError(str(fp), "file", f"cannot open ({exc.strerror})") from None
        with f:
            reader = csv.reader(f)
            for row in reader:
                n = reader.line_num
                if not row:
                    continue
                if len(row) != 6:
                    raise TraceError(f"{fp}:{n}", "fields", f"{len(row)} fields, expected 6 "
                                     "(question, A, B, C, D, answer)")
                ans = row[5].strip().upper()
                if ans not in ("A", "B", "C", "D"):
                    raise TraceError(f"{fp}:{n}", "answer", f"{row[5]!r} is not one of A B C D")
                out.append(Problem(len(out), row[0], ans, "choice", tuple(row[1:5]), ("A", "B", "C", "D"),
                                   source=str(fp), meta={"line": n, "subject": fp.stem.removesuffix("_test")}))
                if limit is not None and len(out) >= limit:
                    return out
    return out


def load_arc(path: str | Path, limit: int | None = None) -> list[Problem]:
    """ARC-style JSONL: ``question.stem``, ``question.choices[{text, label}]``, ``answerKey``.

    Labels may be letters (``A``–``E``) or digits (``1``–``4``); the truth is
    normalised to the letter of the correct option's position.
    """
    path = Path(path)
    out = []
    for n, obj in _jsonl(path):
        q = obj.get("question")
        where = f"{path}:{n}"
        if not isinstance(q, dict) or not isinstance(q.get("stem"), str):
            raise TraceError(where, "question.stem", "missing or not a string")
        ch = q.get("choices")
        if not isinstance(ch, list) or not 2 <= len(ch) <= len(LETTERS):
            raise TraceError(where, "question.choices", "missing or not a list of 2-10 options")
        texts, labels = [], []
        for i, c in enumerate(ch):
            if not isinstance(c, dict) or not isinstance(c.get("text"), str) or c.get("label") is None:
                raise TraceError(where, f"question.choices[{i}]", "needs text and label")
            texts.append(c["text"])
            labels.append(str(c["label"]).strip())
        if len(set(labels)) != len(labels):
            raise TraceError(where, "question.choices", f"duplicate labels {labels}")
        key = obj.get("answerKey")
        key = str(key).strip() if key is not None else ""
        if key not in labels:
            raise TraceError(where, "answerKey", f"{obj.get('answerKey')!r} is not one of the labels {labels}")
        out.append(Problem(len(out), q["stem"], LETTERS[labels.index(key)], "choice", tuple(texts),
                           tuple(labels), source=str(path), meta={"line": n, "id": obj.get("id")}))
        if limit is not None and len(out) >= limit:
            break
    return out


def load_dataset(spec: str, limit: int | None = None) -> list[Problem]:
    """``gsm8k`` | ``mmlu`` | ``gsm8k:PATH`` | ``mmlu:PATH`` | ``arc:PATH``."""
    kind, _, arg = spec.partition(":")
    if kind == "gsm8k":
        return load_gsm8k(arg or GSM8K_TEST, limit)
    if kind == "mmlu":
        return load_mmlu(arg or MMLU_DIR, limit)
    if kind == "arc":
        if not arg:
            raise ValueError("--dataset: arc needs a path, e.g. arc:ARC-Challenge-Test.jsonl")
        return load_arc(arg, limit)
    raise ValueError(f"--dataset: {spec!r} is not gsm8k, mmlu or arc:PATH")
