"""Confidence-gated early exit (CGEE) for the verification passes (DESIGN §4)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from .base import PolicyBase, register


@dataclass
class CGEEDecision:
    """Outcome of CGEE on one problem (B branches, L layers)."""

    skipped: bool             # level 1: the whole verification was skipped
    winner: int               # argmax confidence (-1 with no branch)
    exit_layer: np.ndarray    # (B,) int, 1..L; all 0 when skipped
    scores: np.ndarray        # (B,) p_yes / (p_yes + p_no) at the exit layer; NaN when skipped
    selected: int             # chosen branch (winner when skipped, else argmax scores)
    full_selected: int        # argmax of the full-depth scores (layer L)
    differs: bool             # CGEE-induced error: the selected answer != full verification's answer
    branch_differs: bool      # selected != full_selected (branch-level disagreement)

    @property
    def layers_run(self) -> int:
        """Decoder layers run over all verification passes of the problem."""
        return int(self.exit_layer.sum())


def yes_score(p_yes: np.ndarray, p_no: np.ndarray) -> np.ndarray:
    """Verification score ``p_yes / (p_yes + p_no)``; 0.5 where both are 0 (no evidence)."""
    den = p_yes + p_no
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, p_yes / np.where(den > 0, den, 1.0), 0.5)


def answer_differs(selected: int, full_selected: int, answers: Sequence | None) -> bool:
    """A CGEE-induced error (DESIGN §4): the selected branch's answer differs from the answer of
    the branch full-depth verification selects. Two branches with the same answer are the same
    outcome for the user. Without ``answers`` only branches can be compared: ``selected != full_selected``.
    """
    if selected == full_selected:
        return False
    if answers is None or selected < 0 or full_selected < 0:
        return True
    return bool(answers[selected] != answers[full_selected])


def _argmax_first(x: np.ndarray) -> int:
    """argmax with ties to the lowest index (np.argmax already does this)."""
    return int(np.argmax(x)) if x.size else -1


@register
@dataclass
class CGEE(PolicyBase):
    """Confidence-gated early exit, two levels (DESIGN §4).

    Level 1 (skip): winner ``w = argmax conf``; skip the whole verification iff::

        p(w) >= tau_conf  and  (p(w) - p(second)) / p(w) >= delta_rel

    and select the winner directly. ``p(second)`` is the best confidence among branches
    whose answer differs from the winner's (when ``answers`` are given); for
    ``confidence="vote"`` without answers it is inferred from the vote shares (a share held
    by more branches than its own vote count means another answer ties it); for
    ``"mean_prob"`` without answers it is the second-largest entry.
    ``level1_rule="notebook"`` adds the RKSC notebook's second branch: skip also when
    ``p(w) >= nb_conf and p(w) - p(second) >= nb_margin`` (absolute margin; 0.63 / 0.08).

    Level 2 (layer exit), per verification pass: exit at the first layer
    ``l >= l_min`` with::

        H_l < theta  and  |H_l - H_(l-1)| < eps

    and score with that layer's logit lens, ``p_yes / (p_yes + p_no)``; else run all L
    layers. Layer 1 never exits (H_0 is undefined). ``theta = 0`` disables level 2.

    Parameters
    ----------
    tau_conf : float, default 0.6
        Level-1 confidence threshold. With vote shares: at least 60% of branches agree.
    delta_rel : float, default 0.5
        Level-1 relative margin: the runner-up has at most half the winner's confidence.
    confidence : {"vote", "mean_prob"}, default "vote"
        Which confidence the caller passes: ``branches.vote_share`` or
        ``branches.mean_prob`` (mean token probability of the generation).
    theta : float, default 1.0
        Entropy threshold: nats (full vocabulary; ln 49152 = 10.8 is uniform), or with
        ``theta_unit="ln_v"`` a fraction of the vocabulary's maximum entropy ``ln V``.
    theta_unit : {"nats", "ln_v"}, default "nats"
        ``"ln_v"``: the threshold is ``theta * ln(vocab_size)`` nats, so one value means the
        same on another tokenizer (ln V = 10.8 for SmolLM2, 11.9 for Qwen2.5, 12.5 for Gemma 3).
    vocab_size : int or None, default None
        V of the model whose entropies are tested; needed with ``theta_unit="ln_v"`` (the
        simulator fills it from the trace's manifest, a real runner from its model).
    eps : float, default 0.05
        Entropy stability between consecutive layers, nats.
    l_min : int, default 26
        First layer allowed to exit. On the bundled trace (12 GSM8K problems x 8 branches,
        ``rksim sweep --policy cgee``, theta 1.0, eps 0.05), l_min 24 changes the selected
        branch in 69% of problems and l_min 25 in 65%, because a branch that exits early is
        scored by a lens that leans Yes and outranks branches scored at layer 30;
        l_min 26 changes none. Earlier, on a 16-question sample: Measured on SmolLM2-135M (30 layers; 16 GSM8K
        questions, a right and a wrong answer each, normed lens): layers 21-25 already
        put ~all their mass on Yes/No with entropy 0.1-0.5 nats but lean Yes while the
        last layer leans No, so exits there flip selections (6 of 16 problems with
        l_min <= 22, eps 0.1); with l_min 24, theta 1.0, eps 0.05, 19% of the passes
        exit early and no selection changes. Early layers echo the input token with
        near-zero entropy (layer 1: 0.08 nats). Re-measure per model.
    lens : {"norm", "nonorm"}, default "norm"
        Which trace columns the caller passes: ``entropy, p_yes, p_no`` (logit lens with
        the final norm, the paper) or ``entropy_nonorm, p_yes_nonorm, p_no_nonorm`` (the
        RKSC notebook's lens without the final norm). With "nonorm" pass the true
        full-depth ``verify_score`` as ``full_scores`` to :meth:`decide`.
    level1_rule : {"paper", "notebook"}, default "paper"
    nb_conf : float, default 0.63
    nb_margin : float, default 0.08
        The notebook rule's second branch (used only with ``level1_rule="notebook"``).
    """

    kind: ClassVar[str] = "exit"
    name: ClassVar[str] = "cgee"
    choices: ClassVar[dict[str, tuple[str, ...]]] = {'confidence': ('vote', 'mean_prob'), 'lens': ('norm', 'nonorm'), 'level1_rule': ('paper', 'notebook'), 'theta_unit': ('nats', 'ln_v')}
    tau_conf: float = 0.6
    delta_rel: float = 0.5
    confidence: str = "vote"
    theta: float = 1.0
    eps: float = 0.05
    l_min: int = 26
    lens: str = "norm"
    level1_rule: str = "paper"
    nb_conf: float = 0.63
    nb_margin: float = 0.08
    theta_unit: str = "nats"
    vocab_size: int | None = None
    domains: ClassVar[dict[str, tuple]] = {
        "tau_conf": (0.0, 1.0, "probability", "winner's confidence (vote share or mean token probability) needed "
                     "to skip verification; > 1 never skips"),
        "delta_rel": (0.0, 1.0, "fraction", "relative margin (p(w) - p(second)) / p(w) needed to skip; > 1 never skips"),
        "theta": (0.0, None, "nats", "entropy below which a layer may exit; 0 disables layer exit "
                  "(theta_unit=ln_v: a fraction of ln V, in [0, 1])"),
        "eps": (0.0, None, "nats", "entropy change between consecutive layers below which a layer may exit"),
        "l_min": (1, None, "layer", "first layer allowed to exit"),
        "nb_conf": (0.0, 1.0, "probability", "level1_rule=notebook only: second rule's confidence"),
        "nb_margin": (0.0, 1.0, "probability", "level1_rule=notebook only: second rule's absolute margin"),
        "vocab_size": (2, None, "tokens", "theta_unit=ln_v only: V of the tested model (the simulator fills it in)"),
    }

    def __post_init__(self) -> None:
        self._check_number("tau_conf")
        self._check_number("delta_rel")
        self._check_choice("confidence", ("vote", "mean_prob"))
        self._check_number("theta", lo=0)
        self._check_number("eps", lo=0)
        self._check_number("l_min", lo=1, integer=True)
        self._check_choice("lens", ("norm", "nonorm"))
        self._check_choice("level1_rule", ("paper", "notebook"))
        self._check_number("nb_conf")
        self._check_number("nb_margin")
        self._check_choice("theta_unit", ("nats", "ln_v"))
        if self.theta_unit == "ln_v":
            self._check_number("theta", lo=0, hi=1)
        if self.vocab_size is not None:
            self._check_number("vocab_size", lo=2, integer=True)

    @property
    def theta_nats(self) -> float:
        """The entropy threshold in nats: ``theta``, or ``theta * ln(vocab_size)`` with ``theta_unit="ln_v"``."""
        if self.theta_unit == "nats":
            return float(self.theta)
        if self.vocab_size is None:
            raise self._fail("vocab_size", "is needed with theta_unit='ln_v' (theta is a fraction of ln V)")
        return float(self.theta) * math.log(int(self.vocab_size))

    @property
    def trace_columns(self) -> dict[str, str]:
        """verify.parquet / branches.parquet columns this configuration reads."""
        sfx = "" if self.lens == "norm" else "_nonorm"
        return {"confidence": "vote_share" if self.confidence == "vote" else "mean_prob",
                "entropy": "entropy" + sfx, "p_yes": "p_yes" + sfx, "p_no": "p_no" + sfx}

    # ---- level 1 -------------------------------------------------------------------
    def _second(self, c: np.ndarray, w: int, answers: Sequence | None) -> float:
        n = c.shape[0]
        if answers is not None:
            if len(answers) != n:
                raise self._fail("answers", f"must have one entry per branch ({n}), got {len(answers)}")
            others = [c[i] for i in range(n) if answers[i] != answers[w]]
            return float(max(others)) if others else 0.0
        if self.confidence == "vote":
            # Equal shares belong to one answer only if no more branches hold that share
            # than the share's own vote count.
            pw = c[w]
            holders = int(np.isclose(c, pw, rtol=0, atol=1e-9).sum())
            votes = int(round(pw * n))
            if votes >= 1 and holders > votes:
                return float(pw)
            lower = c[c < pw - 1e-9]
            return float(lower.max()) if lower.size else 0.0
        if n < 2:
            return 0.0
        return float(np.sort(c)[-2])

    def skip(self, conf: np.ndarray, answers: Sequence | None = None) -> tuple[bool, int]:
        """Level 1: ``(skip?, winner)``. ``answers`` (B strings) sharpen ``p(second)``."""
        c = self._array("conf", conf, ndim=1)
        if c.size == 0:
            return False, -1
        w = _argmax_first(c)
        pw = float(c[w])
        if pw <= 0:
            return False, w
        p2 = self._second(c, w, answers)
        ok = pw >= self.tau_conf and (pw - p2) / pw >= self.delta_rel
        if not ok and self.level1_rule == "notebook":
            ok = pw >= self.nb_conf and (pw - p2) >= self.nb_margin
        return bool(ok), w

    # ---- level 2 -------------------------------------------------------------------
    def should_exit(self, l: int, H_l: float, H_prev: float | None) -> bool:
        """Layer-by-layer test for the real runner: may the pass stop after layer ``l``?

        ``H_prev`` is the entropy at layer ``l - 1`` (None at layer 1).
        """
        if not np.isfinite(H_l) or (H_prev is not None and not np.isfinite(H_prev)):
            raise self._fail("entropy", f"NaN or inf at layer {l}")
        if H_prev is None or l < max(self.l_min, 2):
            return False
        return bool(H_l < self.theta_nats and abs(H_l - H_prev) < self.eps)

    def exit_layer(self, entropy_row: np.ndarray) -> int:
        """Level 2 over one pass's per-layer entropies (L,): the 1-based exit layer (L if none)."""
        H = self._array("entropy", entropy_row, ndim=1)
        return int(self._exit_layers(H[None, :])[0])

    def _exit_layers(self, H: np.ndarray) -> np.ndarray:
        B, L = H.shape
        if L == 0:
            raise self._fail("entropy", "needs at least one layer")
        ok = np.zeros((B, L), bool)
        if L >= 2:
            ok[:, 1:] = (H[:, 1:] < self.theta_nats) & (np.abs(np.diff(H, axis=1)) < self.eps)
        ok[:, : max(self.l_min, 2) - 1] = False  # column j is layer j + 1
        first = np.where(ok.any(axis=1), ok.argmax(axis=1) + 1, L)
        return first.astype(np.int64)

    def decide(self, conf: np.ndarray, entropy: np.ndarray, p_yes: np.ndarray, p_no: np.ndarray,
               answers: Sequence | None = None, full_scores: np.ndarray | None = None) -> CGEEDecision:
        """Both levels on one problem, as the simulator replays it.

        Parameters
        ----------
        conf : (B,) confidence per branch (see ``confidence``).
        entropy, p_yes, p_no : (B, L) per-branch, per-layer logit-lens values.
        answers : optional (B,) extracted answers, to find the runner-up answer and to tell
            whether the selection changes the answer (``differs``; without them ``differs`` is
            the branch-level ``branch_differs``).
        full_scores : optional (B,) full-depth verification scores; default: the score at
            layer L from ``p_yes, p_no`` (correct for ``lens="norm"``).
        """
        c = self._array("conf", conf, ndim=1)
        B = c.shape[0]
        H = self._array("entropy", entropy, ndim=2, shape=(B, None))
        L = H.shape[1]
        py = self._array("p_yes", p_yes, ndim=2, shape=(B, L))
        pn = self._array("p_no", p_no, ndim=2, shape=(B, L))
        if B == 0:
            return CGEEDecision(False, -1, np.zeros(0, np.int64), np.zeros(0), -1, -1, False, False)
        if answers is not None and len(answers) != B:
            raise self._fail("answers", f"must have one entry per branch ({B}), got {len(answers)}")
        if L == 0:
            raise self._fail("entropy", "needs at least one layer")
        if full_scores is None:
            full = yes_score(py[:, -1], pn[:, -1])
        else:
            full = self._array("full_scores", full_scores, ndim=1, shape=(B,))
        full_sel = _argmax_first(full)
        skipped, w = self.skip(c, answers)
        if skipped:
            return CGEEDecision(True, w, np.zeros(B, np.int64), np.full(B, np.nan), w, full_sel,
                                answer_differs(w, full_sel, answers), w != full_sel)
        layers = self._exit_layers(H)
        rows = np.arange(B)
        scores = yes_score(py[rows, layers - 1], pn[rows, layers - 1])
        if full_scores is not None:
            # The full-depth pass's score is the given one, whatever lens the early exits use.
            scores = np.where(layers == L, full, scores)
        sel = _argmax_first(scores)
        return CGEEDecision(False, w, layers, scores, sel, full_sel, answer_differs(sel, full_sel, answers),
                            sel != full_sel)
