"""The real runner: every policy end to end on a real model, each phase timed.

For one problem with B branches (prompts from ``traces.workload``) and one
policy object from ``policies`` (the very objects the simulator calls):

1. **Sharing** (``no-kv``, ``exact-prefix``, ``asks``; ``rksc`` uses its ASKS part;
   ``cgee`` alone shares nothing). ASKS first runs its gate: a full-depth pass
   over each branch's variant span only, mean-pooled per layer, cosine to the
   root's (``policies.pooled_cosine``), then ``policy.plan``. The root's prompt
   is prefilled; a branch with ``share_root`` decodes on the root's KV (the
   same tensors, no copy, no recompute); a branch that reuses ``reused[b]``
   tokens gets a view of the first ``reused[b]`` tokens of its source's KV
   (``keys[:, :, :n]``, no copy) and prefills only the rest; with No-KV every
   branch prefills its whole prompt.
2. **Decode**: the branch caches are stacked into one left-padded batch and
   decoded together with seeded sampling (``traces.capture_ops.sample_decode``,
   one generator per branch), each step timed.
3. **Verification** of every branch over ``prompt + generation + verify
   prompt``, recomputed from scratch (``verify_reuses_kv = False``: No-KV's
   behaviour, the case where CGEE matters most). With CGEE (``cgee``,
   ``rksc``): level 1 skips the verification entirely when the vote is
   confident (``policy.skip``); level 2 runs the decoder layers one by one,
   probes the logit lens from layer ``l_min - 1`` on and stops at the first
   layer where ``policy.should_exit`` says so — the layers above are not run.

Outputs (``run_calibration``): ``phases.parquet`` (one row per timed phase
with the cost-model items), ``decisions.parquet`` (one row per problem and
policy: the plan, the gate's sigma, skip/exit/selection, answers and the
measured end-to-end seconds), ``sweep`` phases (prefill lengths, decode batch
sizes and contexts) and ``run.json``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

# `--model random:<preset>`: random weights in a model preset's shape (calibrate.random_model)
RANDOM_PREFIX = "random:"
# policies that the runner executes end to end (token eviction: calibrate.quality)
E2E_POLICIES = ("no-kv", "exact-prefix", "asks", "cgee", "rksc")


@dataclass
class RealRunConfig:
    model: str = "smollm2-135m"
    device: str = "cpu"
    seed: int = 0
    threads: int | None = 1     # intra-op threads; 1 on a shared CPU (2 oversubscribe, see traces/capture.py)
    problems: int = 4
    branches: int = 4
    max_new_tokens: int = 24
    temperature: float = 0.7
    top_p: float = 0.95
    dataset: str = "gsm8k"
    layout: str = "persona-prefix"
    target_prefix_tokens: int = 0
    policies: tuple = E2E_POLICIES
    params: dict = field(default_factory=dict)   # policy name -> parameter dict
    sweep: bool = True
    verify_reuses_kv: bool = False  # True: verification reads the branch's KV (No-KV and CGEE-on-No-KV still recompute)
    capture: bool = True       # also capture a trace of the same problems/seeds (DIR/trace) for parity and report
    repeats: int = 2          # passes over every (problem, policy) and the sweep; the fastest run's phases are kept
    sweep_prefill: tuple = (16, 64, 256, 1024, 2048)
    sweep_decode_batch: tuple = (1, 2, 4, 8, 16, 32)   # 32 = 8 branches x 4 problems in flight (serving mode)
    sweep_decode_ctx: tuple = (64, 512)
    dtype: str | None = None      # None: float32 on CPU, bfloat16 on CUDA (traces.models.torch_dtype)
    tokenizer: str | None = None  # random:<preset> models: tokenizer folder (default: SmolLM2's)

    @classmethod
    def from_args(cls, a) -> "RealRunConfig":
        pols = tuple(p.strip() for p in a.policies.split(",")) if a.policies else E2E_POLICIES
        for p in pols:
            if p not in E2E_POLICIES:
                raise ValueError(f"--policies: {p!r} is not one of {', '.join(E2E_POLICIES)}")
        if a.repeats < 1:
            raise ValueError("--repeats: must be >= 1")
        if a.problems < 1:
            raise ValueError("--problems: must be >= 1")
        if a.branches < 2:
            raise ValueError("--branches: must be >= 2")
        sweep = {}
        for flag in ("sweep_prefill", "sweep_decode_batch", "sweep_decode_ctx"):
            v = getattr(a, flag, None)
            if v:
                try:
                    sweep[flag] = tuple(int(x) for x in str(v).split(","))
                except ValueError:
                    raise ValueError(f"--{flag.replace('_', '-')}: a comma list of integers, got {v!r}") from None
                if any(x < 1 for x in sweep[flag]):
                    raise ValueError(f"--{flag.replace('_', '-')}: sizes must be >= 1, got {v!r}")
        return cls(model=a.model, device=a.device, seed=a.seed, threads=a.threads, problems=a.problems,
                   branches=a.branches, max_new_tokens=a.max_new_tokens, dataset=a.dataset, layout=a.layout,
                   policies=pols, sweep=not a.no_sweep, repeats=a.repeats,
                   capture=not a.no_capture, dtype=getattr(a, "dtype", None),
                   tokenizer=getattr(a, "tokenizer", None), **sweep)


DEFAULT_PARAMS = {
    # The CGEE defaults of policies/ (theta = 0.5 nats, l_min = 15 of 30) rarely fire on a
    # 135M model; these are the values the calibration runs use, recorded in run.json.
    "cgee": {"tau_conf": 0.6, "delta_rel": 0.5, "theta": 2.0, "eps": 0.5, "l_min": 15},
    "asks": {"tau": 0.9},
}


def make_policy(name: str, params: dict | None = None):
    from policies import get_policy

    p = dict(DEFAULT_PARAMS.get(name, {}))
    if name == "rksc":
        p = {**DEFAULT_PARAMS["asks"], **DEFAULT_PARAMS["cgee"]}
    p.update(params or {})
    return get_policy(name, **p)


class StepClock:
    """Times each decode step from the hook ``sample_decode`` calls before every forward."""

    def __init__(self, timer, B: int, lens: list[int]):
        self.timer, self.B, self.lens = timer, B, lens
        self.marks: list[tuple[float, float]] = []   # (wall, thread CPU) at each step's start

    def hook(self, t, feed):
        self.timer.sync()
        self.marks.append((time.perf_counter(), time.thread_time()))

    def close(self):
        from calibrate.timing import PhaseRow
        if not self.timer.enabled:
            return
        self.timer.sync()
        end = (time.perf_counter(), time.thread_time())
        for i, t0 in enumerate(self.marks):
            t1 = self.marks[i + 1] if i + 1 < len(self.marks) else end
            # A step runs the forward, then samples every row from its logits (the next loop turn).
            row = PhaseRow("decode", **self.timer.context).items([1] * self.B, [n + i for n in self.lens])
            row.seconds, row.cpu_seconds, row.sampled = t1[0] - t0[0], t1[1] - t0[1], self.B
            self.timer.rows.append(row)


def run_problem(lm, prompts, problem, pol, cfg: RealRunConfig, timer, yes, no, suffix, stop, pad_id) -> dict:
    """One problem under one policy, end to end. Returns the decision record.

    The steps of the module docstring, in order: the sharing plan (:func:`_sharing_plan`, ASKS's gate
    included), the prompts' KV (:func:`_prefill_prompts`), one batched decode, the answers and their
    vote, the verification (:func:`_verify`); ``seconds`` and ``cpu_seconds`` span all of them.
    """
    import torch
    from traces import capture_ops as CO
    from traces.answers import extract_answer
    from traces.capture import STREAM_BRANCH

    ids = [np.asarray(b.prompt_ids, dtype=np.int64) for b in prompts.branches]
    spans = np.array([[b.variant_start, b.variant_end] for b in prompts.branches], dtype=np.int64)
    B = len(ids)
    t_start, c_start = time.perf_counter(), time.thread_time()
    sharing, cos, plan = _sharing_plan(lm, pol, ids, spans, pad_id, timer)
    with torch.inference_mode():
        kv = _prefill_prompts(lm, ids, plan, pad_id, timer)
        # --- decode all branches as one batch (the capture's sampling streams)
        gens = [CO.make_generator(lm, CO.seed_for(cfg.seed, problem.index, b, STREAM_BRANCH)) for b in range(B)]
        clock = StepClock(timer, B, kv.lens)
        res = CO.sample_decode(lm, kv.first, kv.batch, kv.mask, kv.next_pos, cfg.max_new_tokens, gens,
                               cfg.temperature, cfg.top_p, stop_ids=sorted(stop), step_hook=clock.hook)
        clock.close()
    tok = lm.tokenizer
    answers = [extract_answer(tok.decode(g, skip_special_tokens=True), problem.answer_kind,
                              len(problem.choices), problem.choices, problem.labels) for g in res.gen_ids]
    vote = np.array([(sum(a == x for x in answers) / B) if a else 0.0 for a in answers])
    mean_prob = np.array([float(np.mean(np.exp(lp))) if lp else 0.0 for lp in res.logprobs])
    ver = _verify(lm, pol, sharing, cfg, ids, res, kv, answers, vote, mean_prob, yes, no, suffix, stop, pad_id,
                  timer)
    seconds = time.perf_counter() - t_start
    cpu_seconds = time.thread_time() - c_start
    return _decision_record(problem, pol, plan, ids, spans, cos, res, answers, vote, mean_prob, ver,
                            seconds, cpu_seconds)


def _sharing_plan(lm, pol, ids, spans, pad_id, timer):
    """The sharing policy (No-KV for ``cgee`` alone), ASKS's gate cosines (None without a gate) and the plan."""
    from policies import NoKV
    from traces import capture_ops as CO

    from calibrate import real_phases as E

    B = len(ids)
    sharing = pol if hasattr(pol, "plan") else NoKV()
    asks = getattr(pol, "asks", pol if getattr(pol, "name", "") == "asks" else None)
    cos = None
    if asks is not None and asks.tau <= 1.0:
        if asks.similarity == "centered":
            raise ValueError("calibrate run: asks similarity='centered' needs the reference means; use 'cosine'")
        mean, last = E.gate_batch(lm, [ids[b][spans[b, 0]:spans[b, 1]].tolist() for b in range(B)], pad_id, timer)
        pooled = mean if asks.pooling == "mean" else last
        cos = CO.cosine(pooled, pooled[:1])
        cos[0] = 1.0  # the root against itself, exactly (as capture stores it)
    return sharing, cos, sharing.plan(ids, cos=cos, variant_spans=spans)


@dataclass
class _PromptKV:
    """Every branch's prompt KV as one left-padded decode batch, with the first logits of each branch."""
    batch: object        # the batch's cache
    mask: object         # (B, T) attention mask
    first: object        # (B, V) logits after each branch's prompt
    lens: list           # per branch: the context length a decode step's row is charged for
    next_pos: object     # (B,) position of each branch's first generated token


def _prefill_prompts(lm, ids, plan, pad_id, timer) -> _PromptKV:
    """The prompts' KV under ``plan``, each prefill timed; runs under the caller's ``torch.inference_mode``."""
    import torch
    from traces import capture_ops as CO

    from calibrate import kv as KV

    B = len(ids)
    # One left-padded batch for the branches that compute their whole prompt (the root always
    # does), a view of the source's first `reused` tokens for the others, the root's KV itself
    # for the branches ASKS let share it.
    full = [b for b in range(B) if plan.reused[b] == 0 and not plan.share_root[b]]
    x, mask, pos = CO.left_pad([ids[b].tolist() for b in full], pad_id, lm.device)
    T0 = x.shape[1]
    # Views are cut out of this KV when some branch reuses it: a sliding-window layer must
    # then keep every token (calibrate.kv); otherwise the model's own cache, as capture's.
    keep_all = KV.full_kv_cache(lm.model) if len(full) < B else None
    with timer.phase("prefill") as row:
        logits, cache, _ = CO.prefill(lm, x, mask, pos, cache=keep_all)
        row.items([T0] * len(full), [0] * len(full))
    if len(full) == B:
        return _PromptKV(cache, mask, logits, [T0] * B, mask.sum(1))
    row_of = {b: i for i, b in enumerate(full)}
    per, firsts = [None] * B, [None] * B
    for b in full:  # each row without its left padding: views
        i, pad = row_of[b], T0 - len(ids[b])
        per[b] = KV.cache_from([(k[i:i + 1, :, pad:], v[i:i + 1, :, pad:]) for k, v in KV.kv_list(cache)])
        firsts[b] = logits[i:i + 1]
    for b in range(B):
        if b in row_of:
            continue
        if plan.share_root[b]:
            per[b], firsts[b] = per[0], firsts[0]
            continue
        r = int(plan.reused[b])
        past = KV.prefix_view(per[int(plan.source[b])], r)
        with timer.phase("prefill", branch=b) as row:
            xb = torch.tensor([ids[b][r:].tolist()], dtype=torch.long, device=lm.device)
            pb = torch.arange(r, len(ids[b]), device=lm.device).unsqueeze(0)
            firsts[b], per[b], _ = CO.prefill(lm, xb, position_ids=pb, cache=past)
            row.items([len(ids[b]) - r], [r])
    with timer.phase("assemble", kind="copy") as row:
        batch, bmask, lens0 = KV.left_padded_batch(per)
        row.cand = int(sum(lens0))
    next_pos = torch.tensor([KV.seq_len(c) for c in per], device=lm.device)
    return _PromptKV(batch, bmask, torch.cat(firsts, 0), [bmask.shape[1]] * B, next_pos)


@dataclass
class _Verdict:
    """The verification's outcome: CGEE's level-1 skip and winner, the selected branch, per-branch exits."""
    skipped: bool
    winner: int
    selected: int
    exit_layers: np.ndarray   # (B,) 0 where not verified
    scores: np.ndarray        # (B,) NaN where not verified
    entropy: np.ndarray       # (B, L) NaN where the lens was not evaluated


def _verify(lm, pol, sharing, cfg, ids, res, kv: _PromptKV, answers, vote, mean_prob, yes, no, suffix, stop,
            pad_id, timer) -> _Verdict:
    """CGEE's level-1 skip on the vote (or mean token probability), else every branch verified, its best selected."""
    from traces.workload import verification_ids

    from calibrate import real_phases as E

    B = len(ids)
    exit_pol = getattr(pol, "cgee", pol if getattr(pol, "name", "") == "cgee" else None)
    skipped, winner = False, int(np.argmax(vote))
    if exit_pol is not None:
        conf = vote if exit_pol.confidence == "vote" else mean_prob
        skipped, winner = exit_pol.skip(conf, answers)
    L = lm.n_layers
    exit_layers = np.zeros(B, np.int64)
    scores = np.full(B, np.nan)
    entropy = np.full((B, L), np.nan)
    if skipped:
        return _Verdict(skipped, winner, winner, exit_layers, scores, entropy)
    # recomputed from scratch: the branch's own prompt + its generation (also for a branch that
    # decoded on the root's KV, as capture scores the counterfactual generation)
    if cfg.verify_reuses_kv and getattr(sharing, "name", "") != "no-kv":
        vr = E.verify_batch_reuse(lm, res.cache, kv.mask, kv.next_pos, res.gen_ids, suffix, yes, no, exit_pol, timer)
    else:
        vseqs = [verification_ids(ids[b].tolist(), res.gen_ids[b], suffix, sorted(stop))[0] for b in range(B)]
        vr = E.verify_batch(lm, vseqs, yes, no, pad_id, exit_pol, timer)
    return _Verdict(skipped, winner, int(np.argmax(vr.scores)), vr.exit_layer, vr.scores, vr.entropy)


def _decision_record(problem, pol, plan, ids, spans, cos, res, answers, vote, mean_prob, ver: _Verdict,
                     seconds, cpu_seconds) -> dict:
    """One row of ``decisions.parquet``: the plan, the signals, the decisions, the answers and the clocks."""
    from traces.answers import is_correct

    sel_ans = answers[ver.selected]
    return {
        "problem": int(problem.index), "policy": pol.name,
        "share_root": plan.share_root.tolist(), "reused": plan.reused.tolist(), "computed": plan.computed.tolist(),
        "source": plan.source.tolist(), "gate_tokens": plan.gate_tokens.tolist(),
        "sigma": [float(s) for s in plan.sigma],
        "skipped": bool(ver.skipped), "winner": int(ver.winner), "exit_layer": [int(x) for x in ver.exit_layers],
        "scores": [float(s) for s in ver.scores], "selected": int(ver.selected),
        "answers": answers, "gen_len": [len(g) for g in res.gen_ids], "prompt_len": [len(i) for i in ids],
        "gen_ids": [list(map(int, g)) for g in res.gen_ids],
        "prompt_ids": [i.tolist() for i in ids], "spans": spans.tolist(),
        "cos": None if cos is None else cos.tolist(), "entropy": ver.entropy.tolist(),
        "vote_share": vote.tolist(), "mean_prob": mean_prob.tolist(),
        "answer": sel_ans, "correct": bool(is_correct(sel_ans, problem.truth, problem.answer_kind)),
        "truth": problem.truth, "seconds": float(seconds), "cpu_seconds": float(cpu_seconds),
    }


def op_sweep(lm, cfg: RealRunConfig, timer) -> None:
    """Isolated ops over the range the fit must cover: prefill lengths, decode batch x context."""
    import torch
    from traces import capture_ops as CO
    from traces.workload import pad_ids

    from calibrate import kv as KV

    tok = lm.tokenizer
    dev = lm.device
    timer.context = {"problem": -1, "policy": "sweep"}
    with torch.inference_mode():
        for n in cfg.sweep_prefill:
            x = torch.tensor([pad_ids(tok, n)], dtype=torch.long, device=dev)
            with timer.phase("sweep-prefill") as row:
                CO.prefill(lm, x)
                row.items([n], [0])
        for ctx in cfg.sweep_decode_ctx:
            x = torch.tensor([pad_ids(tok, ctx, offset=3)], dtype=torch.long, device=dev)
            _, base, _ = CO.prefill(lm, x)
            for bsz in cfg.sweep_decode_batch:
                cache = KV.expand_view(base, bsz)
                mask = torch.ones(bsz, ctx, dtype=torch.long, device=dev)
                step = torch.full((bsz, 1), 13, dtype=torch.long, device=dev)
                for s in range(3):
                    mask = torch.cat([mask, torch.ones(bsz, 1, dtype=torch.long, device=dev)], 1)
                    pos = torch.full((bsz, 1), ctx + s, dtype=torch.long, device=dev)
                    with timer.phase("sweep-decode") as row:
                        out = lm.model(input_ids=step, attention_mask=mask, position_ids=pos, cache=cache,
                                       use_cache=True, logits_to_keep=1)
                        row.items([1] * bsz, [ctx + s] * bsz)
                    cache = out.cache


def write_parquet(path: Path, df: pd.DataFrame) -> None:
    import io
    from traces.store import atomic_write_bytes
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def run_calibration(cfg: RealRunConfig, out: Path, progress: bool = True) -> dict:
    """``rksim calibrate run``: every policy on every problem, plus the op sweep.

    The model and its token ids (:func:`load_run_model`, :func:`_token_ids`), one unmeasured
    warm-up, the measured passes (:func:`_measured_passes`), then the outputs: ``phases.parquet``,
    ``decisions.parquet``, ``parity.parquet`` (with ``cfg.capture``, :func:`_parity_vs_capture`)
    and ``run.json`` (:func:`_run_summary`).
    """
    import torch
    from traces.datasets import load_dataset
    from traces.store import atomic_write_json
    from traces.workload import WorkloadConfig, build_prompts

    from calibrate.repeats import fastest_per_row
    from calibrate.timing import PhaseTimer

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / "run.json").exists():
        raise ValueError(f"--out: {out} is not empty and holds no calibration run")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    lm = load_run_model(cfg)
    timer = PhaseTimer(sync=lm.sync)
    problems = load_dataset(cfg.dataset, limit=cfg.problems)
    wcfg = WorkloadConfig(layout=cfg.layout, n_branches=cfg.branches, seed=cfg.seed,
                          target_prefix_tokens=cfg.target_prefix_tokens)
    tokens = _token_ids(lm, wcfg)
    pols = {name: make_policy(name, cfg.params.get(name)) for name in cfg.policies}
    # warm-up: first calls allocate and pick kernels; not part of any measurement
    timer.enabled = False
    pp0 = build_prompts(lm.tokenizer, problems[0].prompt_text(), problems[0].answer_kind, wcfg, problems[0].index)
    run_problem(lm, pp0, problems[0], make_policy("no-kv"), dataclasses.replace(cfg, max_new_tokens=2), timer, *tokens)
    timer.enabled = True
    timer.rows.clear()
    jobs = [(p, name) for p in problems for name in cfg.policies]
    prompts = {int(p.index): build_prompts(lm.tokenizer, p.prompt_text(), p.answer_kind, wcfg, p.index)
               for p in problems}
    # fastest repeat by the clock the fit will use (thread CPU time on CPU, wall on CUDA)
    best_key = "seconds" if lm.device.type == "cuda" else "cpu_seconds"
    best, sweeps = _measured_passes(lm, cfg, timer, jobs, prompts, pols, tokens, best_key, progress)
    records = []
    for (p, _), ((rec, rows), _) in zip(jobs, best):
        timer.rows.extend(rows)
        rec["shared_prefix_tokens"] = int(prompts[int(p.index)].shared_prefix_tokens)
        records.append(rec)
    # each sweep row is its own measurement of one shape: the fastest per row across passes
    timer.rows.extend(fastest_per_row(sweeps, lambda row: getattr(row, best_key)))
    phases = timer.frame()
    write_parquet(out / "phases.parquet", phases)
    dec = pd.DataFrame(records)
    write_parquet(out / "decisions.parquet", dec)
    summary = _run_summary(cfg, lm, pols, problems, phases)
    summary["replay_parity"] = float(decision_parity(out, dec, pols)) if len(dec) else float("nan")
    summary["decision_parity"] = None
    if cfg.capture:
        summary.update(_parity_vs_capture(cfg, lm, out, dec, pols, summary["policy_params"], progress))
    atomic_write_json(out / "run.json", summary)
    return summary


def load_run_model(cfg: RealRunConfig):
    """The model ``cfg.model`` names: random weights in a preset's shape for ``random:<preset>``, else loaded."""
    from traces.models import load_model

    if cfg.model.startswith(RANDOM_PREFIX):
        from calibrate.random_model import build_random_model
        return build_random_model(cfg.model[len(RANDOM_PREFIX):], device=cfg.device, dtype=cfg.dtype,
                                  tokenizer=cfg.tokenizer, seed=cfg.seed)
    return load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)


def _token_ids(lm, wcfg) -> tuple:
    """``run_problem``'s last five arguments: the verifier's yes and no ids, its suffix, the stop ids, the pad id."""
    from traces.capture import stop_ids
    from traces.workload import verify_suffix_ids, yes_no_ids

    yes, no = yes_no_ids(lm.tokenizer)
    suffix = verify_suffix_ids(lm.tokenizer, wcfg.verify_prompt)
    eos = set(stop_ids(lm.tokenizer))   # the capture's stop tokens and pad id: same computation paths
    tk = lm.tokenizer
    pad_id = tk.pad_token_id if tk.pad_token_id is not None else (tk.eos_token_id or 0)
    return yes, no, suffix, eos, pad_id


def _measured_passes(lm, cfg: RealRunConfig, timer, jobs, prompts, pols, tokens, best_key, progress):
    """``cfg.repeats`` passes over ``jobs`` (and the op sweep between them); the fastest run of each job.

    Returns ``calibrate.repeats.fastest_of_passes``'s list, one ``((record, phase rows), clock)``
    per job, and the sweep's phase rows of every pass.
    """
    from tqdm import tqdm

    from calibrate.repeats import fastest_of_passes

    # The machine may be shared: keep the fastest of `repeats` identical runs (same seeds, same
    # decisions), as whole passes over the job list (calibrate.repeats says why the order matters).
    bar = tqdm(total=cfg.repeats * len(jobs), desc="calibrate run", disable=not progress)
    first: list = [None] * len(jobs)
    sweeps: list = []

    def measure(j):
        p, name = jobs[j]
        timer.context = {"problem": int(p.index), "policy": name}
        mark = len(timer.rows)
        r = run_problem(lm, prompts[int(p.index)], p, pols[name], cfg, timer, *tokens)
        rows = timer.rows[mark:]
        del timer.rows[mark:]
        if first[j] is None:
            first[j] = r["gen_ids"]
        elif r["gen_ids"] != first[j]:
            raise RuntimeError(f"problem {p.index} {name}: a repeat decoded different tokens (non-deterministic run)")
        return (r, rows), r[best_key]

    def sweep(rep):
        if cfg.sweep:
            mark = len(timer.rows)
            op_sweep(lm, cfg, timer)
            sweeps.append(timer.rows[mark:])
            del timer.rows[mark:]

    def done(rep, j):
        bar.set_postfix_str(f"pass {rep + 1}/{cfg.repeats}")
        bar.update(1)

    best = fastest_of_passes(len(jobs), cfg.repeats, measure, between_passes=sweep, on_done=done, seed=cfg.seed)
    bar.close()
    return best, sweeps


def _run_summary(cfg: RealRunConfig, lm, pols: dict, problems, phases: pd.DataFrame) -> dict:
    """``run.json`` but its parity figures: the config, the policies' parameters, the model, host and versions."""
    import torch

    return {
        "config": {**dataclasses.asdict(cfg), "policies": list(cfg.policies)},
        "policy_params": {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else {} for k, v in pols.items()},
        "model": lm.info(), "device": str(lm.device), "threads": torch.get_num_threads(),
        "device_name": (torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda"
                        else (platform.processor() or platform.machine())),
        "clocks": ["wall", "cpu"],   # phases.parquet seconds (wall) and cpu_seconds (timing thread)
        "fingerprint": model_fingerprint(lm),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "platform": platform.platform()},
        "command": " ".join(sys.argv), "n_problems": len(problems), "policies": list(cfg.policies),
        "n_phases": int(len(phases)), "problems": [int(p.index) for p in problems],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _parity_vs_capture(cfg: RealRunConfig, lm, out: Path, dec: pd.DataFrame, pols: dict, policy_params: dict,
                       progress: bool) -> dict:
    """Capture a trace of the same problems and seeds (``out/trace``) and compare the run's decisions with it.

    Writes ``parity.parquet``; returns ``run.json``'s parity figures, in their order there.
    """
    import torch
    from traces.capture import CaptureConfig, run_capture

    from calibrate.parity import parity_vs_trace

    ccfg = CaptureConfig(model=cfg.model, dataset=cfg.dataset, problems=cfg.problems, branches=cfg.branches,
                         layout=cfg.layout, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                         top_p=cfg.top_p, seed=cfg.seed, device=cfg.device, threads=torch.get_num_threads(),
                         target_prefix_tokens=cfg.target_prefix_tokens, hidden_vectors=False, dtype=cfg.dtype)
    run_capture(ccfg, out / "trace", command="rksim calibrate run (parity capture)", progress=progress, lm=lm)
    par = parity_vs_trace(dec, out / "trace", pols, policy_params)
    write_parquet(out / "parity.parquet", par)
    dpar = par[par["decision"] != "sigma_info"]
    sig = par[par["decision"] == "sigma_info"]["detail"]
    return {
        "decision_parity": float(dpar["match"].mean()) if len(dpar) else None,
        "parity_by_decision": {k: float(v) for k, v in dpar.groupby("decision")["match"].mean().items()},
        "parity_by_policy": {k: float(v) for k, v in dpar.groupby("policy")["match"].mean().items()},
        "asks_sigma_max_abs_diff_vs_trace": float(sig.max()) if len(sig) else None,
    }


def model_fingerprint(lm) -> dict:
    """The host (or GPU) this run measures, with its threads and dtype (:mod:`calibrate.hostinfo`)."""
    import torch

    from calibrate.hostinfo import fingerprint
    return fingerprint(str(lm.device), torch.get_num_threads(), str(lm.dtype))


def decision_parity(out: Path, dec: pd.DataFrame, pols: dict) -> float:
    """Share of (problem, policy) decisions that the policies reproduce when replayed on the run's signals.

    See ``calibrate.parity`` for the replay (the same policy objects, fed the recorded
    per-branch signals instead of live tensors).
    """
    from calibrate.parity import replay_agreement
    return replay_agreement(dec, pols)
