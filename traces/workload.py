"""Multi-branch workloads (DESIGN §2): layouts, variant banks, prompts as token segments.

No torch: a tokenizer is passed in. A branch prompt is a list of segments,
each ``shared`` (same tokens in every branch) or ``variant``. Segments are
tokenized one by one and concatenated, so a shared segment has exactly the
same token ids in every branch (tokenizing the whole string could merge
tokens across a segment boundary differently per branch) and the segment
token spans are exact.

Layouts
-------
- ``hint-suffix``: [problem][variant hint] (default system prompt);
- ``persona-prefix``: [variant persona, as the system message][problem];
- ``paraphrase``: [variant paraphrase of the instruction][problem][hint].

The chat template is the tokenizer's own (rendered with sentinel strings in
place of the variant and the problem, then split at the sentinels).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
LAYOUTS = ("hint-suffix", "persona-prefix", "paraphrase")
VERIFY_PROMPT = "Is this answer correct? Answer Yes or No."

# Variant banks. Index 0 is the root's (canonical) variant.
PERSONAS = (
    "You are a helpful AI assistant.",
    "You are a helpful assistant who solves problems carefully.",
    "You are a careful math tutor who explains each step.",
    "You are an expert problem solver. Think step by step.",
    "You are a patient teacher helping a student with homework.",
    "You are a meticulous accountant who double-checks every number.",
    "You are a concise assistant. Keep your answers short.",
    "You are a logical reasoner who verifies every claim before answering.",
    "You are a friendly assistant who likes puzzles.",
    "You are a pirate. Answer in the voice of a pirate.",
    "You are a poet who answers every question in rhyme.",
    "Translate the following text into French.",
)
HINTS = (
    "Think step by step.",
    "Show your work, then give the final answer.",
    "Double-check your arithmetic before answering.",
    "Be concise.",
    "Start by listing the quantities you know.",
    "Work backwards from what the question asks.",
    "Explain your reasoning briefly.",
    "Break the problem into smaller parts.",
    "Write the calculation as one equation first.",
    "Answer quickly without explanation.",
)
PARAPHRASES = (
    "Solve the following problem.",
    "Please work out the answer to this question.",
    "Find the solution to the problem below.",
    "Here is a problem for you to solve.",
    "Compute the answer to the following question.",
    "Read the question carefully and answer it.",
    "Your task is to solve this problem.",
    "Work through this problem and give the answer.",
    "Answer the question that follows.",
    "Figure out the correct answer to this problem.",
)
BANKS = {"persona-prefix": PERSONAS, "hint-suffix": HINTS, "paraphrase": PARAPHRASES}
PARAPHRASE_HINT = "Think step by step."

# What the shared part asks for, by answer kind (no example value: a small model copies it).
TASK = {
    "number": "Explain briefly, then end with \"The answer is\" followed by the final number.",
    "choice": "End with \"The answer is\" followed by the letter of the correct option.",
}

_VAR, _PROB, _GEN = "\u2063RKSIMVAR\u2063", "\u2063RKSIMPROB\u2063", "\u2063RKSIMGEN\u2063"


@lru_cache(maxsize=1)
def neutral_texts() -> tuple[str, ...]:
    """The shipped neutral reference texts (``traces/reference/neutral.json``)."""
    data = json.loads((REFERENCE_DIR / "neutral.json").read_text(encoding="utf-8"))
    return tuple(data["texts"])


@dataclass
class TreeConfig:
    """Tree search (RSBCM): ``depth`` levels; each expanded node generates a step of
    ``step_tokens`` tokens; the best ``expand_k`` nodes of a level (by
    verification score) expand into ``branching`` children each."""

    depth: int = 0
    step_tokens: int = 32
    expand_k: int = 2
    branching: int = 3

    def __post_init__(self):
        for k in ("depth", "step_tokens", "expand_k", "branching"):
            if int(getattr(self, k)) < (0 if k == "depth" else 1):
                raise ValueError(f"--tree-{k.replace('_', '-')}: must be >= {0 if k == 'depth' else 1}")


@dataclass
class WorkloadConfig:
    """How branch prompts are built.

    ``target_prefix_tokens``: pad the shared problem text with neutral text so
    that the root prompt is exactly this many tokens (0 = no padding; the RKSC
    paper used ~1,024). ``shuffle_variants``: draw the branch -> variant
    assignment of branches 1.. per problem from ``seed`` (the root, branch 0,
    always takes variant 0, the canonical prompt).
    """

    layout: str = "persona-prefix"
    n_branches: int = 8
    seed: int = 0
    target_prefix_tokens: int = 0
    shuffle_variants: bool = True
    verify_prompt: str = VERIFY_PROMPT

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout: {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if int(self.n_branches) < 1:
            raise ValueError("--branches: must be >= 1")
        if int(self.target_prefix_tokens) < 0:
            raise ValueError("--target-prefix-tokens: must be >= 0")


@dataclass
class BranchPrompt:
    branch: int
    variant_id: int
    variant_text: str
    prompt_ids: list[int]
    seg_kinds: list[str]
    seg_lens: list[int]
    variant_start: int
    variant_end: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


@dataclass
class ProblemPrompts:
    problem_index: int
    branches: list[BranchPrompt]
    pad_tokens: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def shared_prefix_tokens(self) -> int:
        """Length of the token prefix common to all branch prompts."""
        ids = [b.prompt_ids for b in self.branches]
        n = min(len(x) for x in ids)
        for i in range(n):
            t = ids[0][i]
            if any(x[i] != t for x in ids[1:]):
                return i
        return n


def encode_text(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False)) if text else []


def _render(tok, messages: list[dict], add_generation_prompt: bool) -> str:
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    # No template (a base model such as Gemma-3-270M): a plain, readable fallback, opened
    # with the BOS token where the tokenizer itself would start a sequence with it (a chat
    # template writes it; without it Gemma 3 degenerates into repeating the prompt's last line).
    parts = [f"{m['role'].capitalize()}: {m['content']}\n" for m in messages]
    return _bos_text(tok) + "".join(parts) + ("Assistant: " if add_generation_prompt else "")


def _bos_text(tok) -> str:
    bos, bid = getattr(tok, "bos_token", None), getattr(tok, "bos_token_id", None)
    if not bos or bid is None:
        return ""
    ids = list(tok.encode("x", add_special_tokens=True))
    return bos if ids and ids[0] == bid else ""


def _messages(layout: str) -> list[dict]:
    """Chat messages with sentinels: _VAR = the variant text, _PROB = the shared problem block."""
    if layout == "persona-prefix":
        return [{"role": "system", "content": _VAR}, {"role": "user", "content": _PROB}]
    if layout == "hint-suffix":
        return [{"role": "user", "content": f"{_PROB}\n{_VAR}"}]
    return [{"role": "user", "content": f"{_VAR}\n\n{_PROB}\n{PARAPHRASE_HINT}"}]


def template_pieces(tok, layout: str) -> list[tuple[str, str]]:
    """The rendered chat template split into ('text', s) / ('var', '') / ('prob', '') pieces."""
    text = _render(tok, _messages(layout), add_generation_prompt=True)
    pieces: list[tuple[str, str]] = []
    rest = text
    while rest:
        i, j = rest.find(_VAR), rest.find(_PROB)
        cands = [(k, w) for k, w in ((i, "var"), (j, "prob")) if k >= 0]
        if not cands:
            pieces.append(("text", rest))
            break
        k, w = min(cands)
        if k:
            pieces.append(("text", rest[:k]))
        pieces.append((w, ""))
        rest = rest[k + len(_VAR if w == "var" else _PROB):]
    if [p for p in pieces if p[0] == "var"] != [("var", "")] or [p for p in pieces if p[0] == "prob"] != [("prob", "")]:
        raise ValueError("tokenizer chat template: cannot locate the variant and problem in the rendered prompt")
    return pieces


def pad_ids(tok, n: int, offset: int = 0) -> list[int]:
    """``n`` tokens of neutral text (the shipped texts in order, from ``offset``), deterministic."""
    texts = neutral_texts()
    out: list[int] = []
    i = offset
    while len(out) < n:
        out += encode_text(tok, texts[i % len(texts)] + " ")
        i += 1
    return out[:n]


def build_prompts(tok, problem_text: str, answer_kind: str, cfg: WorkloadConfig,
                  problem_index: int = 0) -> ProblemPrompts:
    """The N branch prompts of one problem, as token segments."""
    bank = BANKS[cfg.layout]
    B = int(cfg.n_branches)
    # The root keeps the canonical variant 0; the other branches draw the rest
    # of the bank in a seeded order (repeating if B > bank size).
    rest = np.arange(1, len(bank))
    if cfg.shuffle_variants:
        rest = np.random.default_rng([int(cfg.seed), int(problem_index), 7]).permutation(rest)
    vids = [0] + [int(rest[(b - 1) % len(rest)]) for b in range(1, B)]
    pieces = template_pieces(tok, cfg.layout)
    prob_body = f"{problem_text.strip()}\n\n{TASK[answer_kind]}"

    def assemble(vid: int, pad: list[int]) -> BranchPrompt:
        segs: list[tuple[str, list[int]]] = []
        for kind, s in pieces:
            if kind == "text":
                segs.append(("shared", encode_text(tok, s)))
            elif kind == "var":
                segs.append(("variant", encode_text(tok, bank[vid])))
            else:
                if pad:
                    segs.append(("shared", encode_text(tok, "Notes:\n") + pad + encode_text(tok, "\n\nQuestion: ")))
                segs.append(("shared", encode_text(tok, prob_body)))
        # merge adjacent shared segments; drop empty ones
        kinds, lens, ids = [], [], []
        for kind, s in segs:
            if not s:
                continue
            if kinds and kind == "shared" and kinds[-1] == "shared":
                lens[-1] += len(s)
            else:
                kinds.append(kind)
                lens.append(len(s))
            ids += s
        vi = kinds.index("variant")
        vs = int(sum(lens[:vi]))
        return BranchPrompt(0, vid, bank[vid], ids, kinds, lens, vs, vs + lens[vi])

    pad: list[int] = []
    if cfg.target_prefix_tokens:
        root0 = assemble(vids[0], [])
        wrap = len(encode_text(tok, "Notes:\n")) + len(encode_text(tok, "\n\nQuestion: "))
        need = int(cfg.target_prefix_tokens) - root0.prompt_len - wrap
        if need > 0:
            pad = pad_ids(tok, need, offset=problem_index)
    branches = []
    for b in range(B):
        bp = assemble(vids[b], pad)
        bp.branch = b
        branches.append(bp)
    return ProblemPrompts(problem_index, branches, len(pad), {"layout": cfg.layout})


def verify_suffix_ids(tok, verify_prompt: str = VERIFY_PROMPT) -> list[int]:
    """Tokens that follow a generation in the verification pass.

    The assistant turn is closed and the verification question asked as a new
    user turn, then the assistant turn opened, all with the tokenizer's chat
    template: e.g. ``<|im_end|>\\n<|im_start|>user\\nIs this answer correct?
    Answer Yes or No.<|im_end|>\\n<|im_start|>assistant\\n``.
    """
    msgs = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": _GEN},
            {"role": "user", "content": verify_prompt}]
    text = _render(tok, msgs, add_generation_prompt=True)
    return encode_text(tok, text.split(_GEN, 1)[1])


def verification_ids(prompt_ids: Sequence[int], gen_ids: Sequence[int], suffix: Sequence[int],
                     eos_ids: Sequence[int] = ()) -> tuple[list[int], int]:
    """(full verification input, number of verification-prompt tokens).

    If the generation already ends with the token that opens the suffix (the
    end-of-turn token), it is not repeated.
    """
    suffix = list(suffix)
    gen = list(gen_ids)
    if gen and suffix and gen[-1] == suffix[0]:
        suffix = suffix[1:]
    elif gen and gen[-1] in set(eos_ids) and suffix:
        # ended with a different stop token: replace it by the template's close
        gen = gen[:-1]
    return list(prompt_ids) + gen + suffix, len(suffix)


def yes_no_ids(tok) -> tuple[list[int], list[int]]:
    """Single-token ids of Yes/No variants (case and leading space)."""
    yes, no = set(), set()
    for words, dest in ((("Yes", "yes", "YES"), yes), (("No", "no", "NO"), no)):
        for w in words:
            for s in (w, " " + w):
                ids = encode_text(tok, s)
                if len(ids) == 1:
                    dest.add(ids[0])
    if not yes or not no:
        raise ValueError("tokenizer: no single-token Yes/No variants for the verification score")
    return sorted(yes), sorted(no)


def config_dict(cfg: Any) -> dict:
    return asdict(cfg)
