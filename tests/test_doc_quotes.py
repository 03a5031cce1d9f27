"""Docs that cannot drift: every figure a user doc quotes is checked against its source or dated.

The rules (docs/design.md, "Figures in the docs"):

1. **Quoted figures.** A figure copied from a file the project generates carries a marker right
   after it, ``1.95×<!-- quote docs/reproduction/claims.json rows[id=vase-4].data.table[model=qwen3-4b].throughput_vs_full -->``:
   the path is relative to the repository root (JSON or YAML), the key a path into it
   (``a.b``, ``[3]`` a list index, ``[field=value]`` the one list item whose field equals value,
   ``[f=a&g=b]`` several fields, ``[some.key]`` a dict key holding dots; spaces are allowed), and an optional ``scale=100`` multiplies the source
   (fractions quoted as percent). The figure is the number just before the marker (units such as
   ``%``, ``×``, ``x``, ``s``, ``ms``, ``µs`` and ``**`` may follow it); it passes when the
   source, rounded to the figure's decimals, equals it. A string source (a claim's ``paper``
   field, say) passes when one of its numbers does.
2. **Dated figures.** A result figure (a decimal number followed by ``×``/``x``, or a decimal
   percentage) that carries no marker, and is not inside a block another test regenerates and
   compares (``<!-- generated: tests/test_x.py -->`` ... ``<!-- /generated -->``, the test
   named reading this doc), must sit under a date label, ``measured 2026-12-01`` or
   ``measured 1 Dec 2026`` (also ``dated``, ``as of``): in its own line, its paragraph or table
   (the paragraph just before a table or a list, its caption, counts), or a heading above it. Fenced code blocks are skipped.
3. **Benchmark logs** (``docs/benchmarks/*.md``) are dated by construction: every ``##`` entry
   names its date.
4. **Words.** No doc refers to issue numbers, people or the circumstances of its writing.

Generated documents (``docs/reproduction/report.md``, ``docs/validation/ratios.md``) are their own
sources and are not scanned by rules 1-2; rule 4 covers them too.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GENERATED = {"docs/reproduction/report.md", "docs/validation/ratios.md"}


def user_docs() -> list[Path]:
    """README.md and the hand-written docs (docs/*.md), not the generated reports or the logs."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def all_docs() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


# ---------------------------------------------------------------------------- markers and keys

MARKER = re.compile(r"<!--\s*quote\s+(?P<path>\S+)\s+(?P<key>.+?)(?:\s+scale=(?P<scale>[-0-9.e]+))?\s*-->")
NUMBER = r"[-+−]?\d[\d,]*(?:\.\d+)?"
# the figure just before a marker: a number, then at most a unit and closing emphasis
FIGURE_BEFORE = re.compile(
    rf"(?P<num>{NUMBER})\s*(?:%|×|x|s|ms|µs|us|pts|points|tokens|MiB|GiB|MB|GB|tok/s)?\s*(?:\*\*|\*)?\s*$")


def parse_number(text: str) -> tuple[float, int]:
    """The value of a quoted figure and its number of decimals ("4,102" -> (4102.0, 0))."""
    t = text.replace(",", "").replace("−", "-")
    decimals = len(t.split(".")[1]) if "." in t else 0
    return float(t), decimals


def split_key(key: str) -> list[str]:
    """``rows[id=x].data[0].a`` -> ``['rows', '[id=x]', 'data', '[0]', 'a']``."""
    parts = re.findall(r"\[[^\]]*\]|[^.\[\]]+", key)
    if "".join(p if p.startswith("[") else "." + p for p in parts).lstrip(".") != key.replace(".[", "["):
        raise ValueError(f"cannot parse key {key!r}")
    return parts


def resolve(data, key: str):
    """Follow ``key`` (see the module docstring) into loaded JSON/YAML; KeyError names the step."""
    cur = data
    for part in split_key(key):
        if part.startswith("["):
            inner = part[1:-1]
            if re.fullmatch(r"-?\d+", inner):
                if not isinstance(cur, list) or not -len(cur) <= int(inner) < len(cur):
                    raise KeyError(f"{part} out of range in {key!r}")
                cur = cur[int(inner)]
            elif "=" in inner and isinstance(cur, list):
                conds = [c.split("=", 1) for c in inner.split("&")]
                hits = [x for x in cur if isinstance(x, dict) and all(str(x.get(f)) == v for f, v in conds)]
                if len(hits) != 1:
                    raise KeyError(f"{part} matches {len(hits)} items in {key!r}")
                cur = hits[0]
            else:
                if not isinstance(cur, dict) or inner not in cur:
                    raise KeyError(f"{part} not found in {key!r}")
                cur = cur[inner]
        else:
            if not isinstance(cur, dict) or part not in cur:
                raise KeyError(f"{part!r} not found in {key!r}")
            cur = cur[part]
    return cur


def load_source(path: str, cache: dict):
    if path not in cache:
        p = ROOT / path
        if not p.is_file():
            raise FileNotFoundError(f"quote source {path} does not exist")
        text = p.read_text()
        cache[path] = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    return cache[path]


def matches(quoted: str, source, scale: float) -> bool:
    """Whether ``quoted`` is ``source`` (times ``scale``) rounded to the quoted decimals."""
    q, decimals = parse_number(quoted)
    tol = 0.5 * 10.0 ** -decimals + 1e-9 * max(1.0, abs(q))
    if isinstance(source, bool) or source is None:
        return False
    if isinstance(source, (int, float)):
        return abs(source * scale - q) <= tol
    if isinstance(source, str):
        return any(abs(parse_number(n)[0] * scale - q) <= tol
                   for n in re.findall(r"\d[\d,]*(?:\.\d+)?", source))
    return False


GENERATED_BEGIN = re.compile(r"<!--\s*generated:\s*(?P<test>tests/\S+\.py)\b[^>]*-->")
GENERATED_END = re.compile(r"<!--\s*/generated\s*-->")
INLINE_CODE = re.compile(r"`[^`]*`")


def strip_code(text: str, generated: bool = True) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks (and, unless ``generated``,
    outside ``<!-- generated: tests/X.py -->`` ... ``<!-- /generated -->`` blocks)."""
    out, fenced, gen = [], False, False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        prose = INLINE_CODE.sub("", line)  # a marker quoted in `code` is an example, not a marker
        if not fenced and GENERATED_BEGIN.search(prose):
            gen = True
        if not fenced and (generated or not gen):
            out.append((i, line))
        if not fenced and GENERATED_END.search(prose):
            gen = False
    return out


def generated_blocks(path: Path) -> list[str]:
    """Problems with a doc's generated blocks: each names a test that exists and reads this doc."""
    text = "\n".join(INLINE_CODE.sub("", ln) for _, ln in strip_code(path.read_text()))
    out, rel = [], path.relative_to(ROOT)
    begins, ends = list(GENERATED_BEGIN.finditer(text)), list(GENERATED_END.finditer(text))
    if len(begins) != len(ends):
        out.append(f"{rel}: {len(begins)} '<!-- generated: ... -->' markers but {len(ends)} '<!-- /generated -->'")
    for m in begins:
        test = ROOT / m.group("test")
        if not test.is_file():
            out.append(f"{rel}: the generated block names {m.group('test')}, which does not exist")
        elif path.name not in test.read_text():
            out.append(f"{rel}: {m.group('test')} does not read {path.name}, so nothing checks the block")
    return out


def quotes(path: Path):
    """Every marker of a doc: (line number, quoted figure or None, source path, key, scale)."""
    for n, line in strip_code(path.read_text()):
        line = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)  # examples in `code` are not quotes
        for m in MARKER.finditer(line):
            before = MARKER.sub("", line[: m.start()])
            fig = FIGURE_BEFORE.search(before)
            yield n, (fig.group("num") if fig else None), m.group("path"), m.group("key"), float(m.group("scale") or 1)


def check_quotes(path: Path) -> list[str]:
    """The problems with a doc's markers, one line each (empty when every quote holds)."""
    problems, cache = [], {}
    rel = path.relative_to(ROOT)
    for n, fig, src, key, scale in quotes(path):
        where = f"{rel}:{n}"
        if fig is None:
            problems.append(f"{where}: a quote marker with no figure before it ({src} {key})")
            continue
        try:
            value = resolve(load_source(src, cache), key)
        except (KeyError, FileNotFoundError, ValueError) as e:
            problems.append(f"{where}: {e}")
            continue
        if not matches(fig, value, scale):
            problems.append(f"{where}: the doc says {fig}, {src} {key} is {value!r}"
                            + (f" (x {scale:g})" if scale != 1 else ""))
    return problems


# ---------------------------------------------------------------------------- dated figures

RESULT_FIGURE = re.compile(r"(?<![\w.])\d+\.\d+\s?(?:×|x(?![\w])|%)")
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*"
DATE_LABEL = re.compile(
    rf"\b(?:measured|dated|as of)\b[\s\S]{{0,160}}?(?:\b20\d\d-\d\d-\d\d\b|\b\d{{1,2}} {MONTH} 20\d\d\b)", re.I)
HEADING = re.compile(r"^(#+)\s")


def undated_figures(path: Path) -> list[str]:
    """Result figures with neither a quote marker nor a date label in scope."""
    lines = dict(strip_code(path.read_text(), generated=False))
    numbers = sorted(lines)
    # blocks: runs of consecutive non-blank lines outside code
    block_of, blocks, cur = {}, [], []
    prev = None
    for n in numbers:
        line = lines[n]
        if not line.strip() or HEADING.match(line) or (prev is not None and n != prev + 1):
            if cur:
                blocks.append(cur)
            cur = []
        if line.strip() and not HEADING.match(line):
            cur.append(n)
        prev = n
    if cur:
        blocks.append(cur)
    for i, b in enumerate(blocks):
        for n in b:
            block_of[n] = i

    def block_text(i: int) -> str:
        return "\n".join(lines[n] for n in blocks[i])

    def is_table(i: int) -> bool:  # a table or a list: the paragraph before it is its caption
        return bool(re.match(r"\s*(?:\||[-*] |\d+\. )", lines[blocks[i][0]]))

    # headings in scope for each line (a stack by level)
    scope, stack = {}, []
    for n in numbers:
        m = HEADING.match(lines[n])
        if m:
            level = len(m.group(1))
            stack = [(lv, t) for lv, t in stack if lv < level] + [(level, lines[n])]
        scope[n] = " ".join(t for _, t in stack)

    out = []
    rel = path.relative_to(ROOT)
    for n in numbers:
        line = lines[n]
        if HEADING.match(line):
            continue
        bare = MARKER.sub("", line)
        code_spans = [s.span() for s in re.finditer(r"`[^`]*`", line)]  # formulas and commands, not figures
        for m in RESULT_FIGURE.finditer(line):
            if any(a <= m.start() < b for a, b in code_spans):
                continue
            # quoted: a marker follows this figure directly
            if MARKER.match(line, m.end()) or re.match(r"\s*(?:\*\*)?\s*<!--\s*quote", line[m.end():]):
                continue
            i = block_of.get(n)
            context = [line, scope[n]]
            if i is not None:
                context.append(block_text(i))
                if is_table(i) and i > 0:
                    context.append(block_text(i - 1))  # the table's caption
            if any(DATE_LABEL.search(c) for c in context):
                continue
            out.append(f"{rel}:{n}: {m.group(0).strip()!r} is neither quoted from a source nor dated: {bare.strip()[:120]}")
    return out


# ---------------------------------------------------------------------------- words

FORBIDDEN = [
    (re.compile(r"\bissues? #?\d+", re.I), "an issue number"),
    (re.compile(r"\b(?:the|this|that) issue\b|\bthe issue's\b", re.I), "the issue"),
    (re.compile(r"\bthe lead\b|\blead's\b", re.I), "a person"),
    (re.compile(r"\bhelpers?\b(?! function)", re.I), "a person"),
    (re.compile(r"\b(?:this|other|another|one other|\d+ other) sessions?\b|\bsession's\b"), "the circumstances of writing"),
    (re.compile(r"\b(?:this|the) task\b|\bwas lent\b", re.I), "the circumstances of writing"),
    (re.compile(r"\bat hand\b", re.I), "the circumstances of writing"),
    (re.compile(r"\blandings?\b", re.I), "the circumstances of writing"),
    (re.compile(r"\bDESIGN(?:\.md)? §|\bDESIGN §", re.I), "a file outside the repository"),
]


def forbidden_words(path: Path) -> list[str]:
    out = []
    rel = path.relative_to(ROOT)
    if path.suffix != ".md":
        return out
    for n, line in enumerate(path.read_text().splitlines(), 1):
        for rx, what in FORBIDDEN:
            m = rx.search(line)
            if m:
                out.append(f"{rel}:{n}: refers to {what} ({m.group(0)!r}): {line.strip()[:120]}")
    return out


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("doc", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_figures_match_their_sources(doc):
    problems = check_quotes(doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_unquoted_result_figures_are_dated(doc):
    problems = generated_blocks(doc) + undated_figures(doc)
    assert not problems, "\n".join(problems)


def test_benchmark_log_entries_are_dated():
    logs = sorted((ROOT / "docs" / "benchmarks").glob("*.md"))
    assert logs, "docs/benchmarks/ holds the dated benchmark logs"
    for log in logs:
        entries = [ln for ln in log.read_text().splitlines() if ln.startswith("## ")]
        assert entries, f"{log.name}: no '## ' entries"
        undated = [e for e in entries if not re.search(rf"\b20\d\d-\d\d-\d\d\b|\b\d{{1,2}} {MONTH} 20\d\d\b", e)]
        assert not undated, f"{log.name}: entries without a date: {undated}"


@pytest.mark.parametrize("doc", all_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_speak_of_the_project(doc):
    problems = forbidden_words(doc)
    assert not problems, "\n".join(problems)



@pytest.mark.parametrize("doc", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_unrendered_template_placeholders(doc):
    # a figure written as a template call ("0.18{q('eff_m')}") was never checked against its source
    bad = [f"{doc.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for i, line in enumerate(doc.read_text().splitlines(), 1)
           if re.search(r"\{q\(|\{\{\s*\w+\s*\}\}", line)]
    assert not bad, "\n".join(bad)

def test_readme_links_stay_in_the_repository():
    """The README links only files of the repository (no web addresses), and each one exists."""
    text = (ROOT / "README.md").read_text()
    assert not re.findall(r"https?://", text), "README.md: links outside the repository"
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        assert (ROOT / target.split("#")[0]).exists(), f"README.md links {target}, which does not exist"
    assert text.startswith("# rksim\n\n```\nmake run ") and "\nmake test " in text.split("```")[1], \
        "README.md must lead with make run and make test"


def test_the_readme_quotes_some_figures():
    """The README's headline findings are quoted, so rule 1 has something to check there."""
    assert len(list(quotes(ROOT / "README.md"))) >= 3


# the checker itself, on made-up docs: a wrong figure, a missing key, an undated figure, a word


def test_checker_catches_a_wrong_figure(tmp_path, monkeypatch):
    src = tmp_path / "src.json"
    src.write_text(json.dumps({"rows": [{"id": "a", "v": 2.2069}, {"id": "b", "v": 0.2023}],
                               "d": {"x.y": 4105}}))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("ok 2.21×<!-- quote src.json rows[id=a].v -->, ok **20.2%**<!-- quote src.json rows[1].v scale=100 -->,\n"
                   "ok 4,105 tokens<!-- quote src.json d[x.y] -->\n"
                   "wrong 2.15×<!-- quote src.json rows[id=a].v -->\n"
                   "missing 1.0<!-- quote src.json rows[id=c].v -->\n")
    problems = check_quotes(doc)
    assert len(problems) == 2, problems
    assert "doc.md:3: the doc says 2.15" in problems[0]
    assert "matches 0 items" in problems[1]


def test_checker_catches_an_undated_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("# T\n\n## Measured 1 Dec 2026 on a shared core\n\nIt ran 2.13x faster.\n\n"
                   "## Other\n\nMeasured 2026-12-01: 9.5%.\n\nCaption.\n\n| a |\n| 3.3% |\n\n"
                   "Measured 2026-12-01 below.\n\n| b |\n| 1.5x |\n\n```\n7.7x in code\n```\n")
    problems = undated_figures(doc)
    assert len(problems) == 1 and "doc.md:14: '3.3%'" in problems[0], problems


def test_checker_catches_words(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("As issue 9 asked,\nthe lead's summary\nthe machine at hand\nthe Session object is fine\n")
    problems = forbidden_words(doc)
    assert [p.split(":")[1] for p in problems] == ["1", "2", "3"], problems
