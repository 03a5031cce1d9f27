"""The requests of a ``rksim calibrate serve`` run and its closed-loop arrivals (in iteration space)."""
from __future__ import annotations

from dataclasses import dataclass, field

from calibrate.serve_config import ServeConfig

@dataclass
class Request:
    """One branch of one problem: a sequence the scheduler serves."""

    rid: int
    problem: int          # position in the run (0..problems-1)
    problem_index: int    # row in the dataset
    branch: int
    user: int
    prompt: list[int]
    max_new: int
    out: list[int] = field(default_factory=list)
    arrival_iter: int = -1   # submitted before this iteration was scheduled
    first_iter: int = -1     # iteration that sampled its first token
    finish_iter: int = -1    # iteration that sampled its last token
    preempted: int = 0
    gen: object = None       # torch.Generator (real run)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out


def closed_loop_users(n_problems: int, concurrency: int) -> list[list[int]]:
    """User ``u`` submits problems ``u, u + K, u + 2K, ...`` one after the other (K = concurrency)."""
    return [list(range(u, n_problems, concurrency)) for u in range(min(concurrency, n_problems))]


class ClosedLoop:
    """Arrivals of a closed loop, in iteration space (the real run's; the replay's are ``sim.serving.engine``'s).

    At the start every user submits its first problem, in user order; when a
    problem's last branch finishes in iteration ``i``, its user's next problem
    is submitted before iteration ``i + 1`` is scheduled, users in the order
    their problems finished, branches in branch order — what ``sim.serving.engine``'s
    closed-loop users do. It decides *when requests exist*, not how they are
    scheduled.
    """

    def __init__(self, requests: list[Request], concurrency: int):
        self.by_problem: dict[int, list[Request]] = {}
        for r in requests:
            self.by_problem.setdefault(r.problem, []).append(r)
        n = len(self.by_problem)
        self.queue = {u: list(ps) for u, ps in enumerate(closed_loop_users(n, concurrency))}
        self.left = {p: len(rs) for p, rs in self.by_problem.items()}

    def first(self) -> list[Request]:
        out = []
        for u in sorted(self.queue):
            if self.queue[u]:
                out.extend(self.by_problem[self.queue[u].pop(0)])
        return out

    def finished(self, reqs: list[Request]) -> list[Request]:
        """Requests submitted after these finished (their problems' users' next problems).

        ``reqs`` in the order the scheduler finished them; users whose problems were
        answered in the same iteration submit in that order (as ``sim.serving.engine``'s users do).
        """
        out = []
        for r in reqs:
            self.left[r.problem] -= 1
            if self.left[r.problem] == 0:
                u = self.by_problem[r.problem][0].user
                if self.queue[u]:
                    out.extend(self.by_problem[self.queue[u].pop(0)])
        return out


def build_requests(lm, cfg: ServeConfig) -> list[Request]:
    """The branch prompts of the first ``cfg.problems`` problems, as requests (rid = problem * B + branch)."""
    from traces import capture_ops as CO
    from traces.capture import STREAM_BRANCH
    from traces.datasets import load_dataset
    from traces.workload import WorkloadConfig, build_prompts

    problems = load_dataset(cfg.dataset, limit=cfg.problems)
    wcfg = WorkloadConfig(layout=cfg.layout, n_branches=cfg.branches, seed=cfg.seed)
    users = closed_loop_users(len(problems), cfg.concurrency)
    user_of = {p: u for u, ps in enumerate(users) for p in ps}
    reqs = []
    for j, p in enumerate(problems):
        pp = build_prompts(lm.tokenizer, p.prompt_text(), p.answer_kind, wcfg, p.index)
        for b, br in enumerate(pp.branches):
            reqs.append(Request(rid=j * cfg.branches + b, problem=j, problem_index=int(p.index), branch=b,
                                user=user_of[j], prompt=[int(t) for t in br.prompt_ids], max_new=cfg.max_new_tokens,
                                gen=CO.make_generator(lm, CO.seed_for(cfg.seed, p.index, b, STREAM_BRANCH))))
    return reqs


def check_capacity(cfg: ServeConfig, reqs: list[Request]) -> None:
    """Every request must fit alone (vLLM refuses a request longer than its KV cache, too)."""
    cap = cfg.num_blocks * cfg.block_size
    need = max(len(r.prompt) + r.max_new for r in reqs)
    if need > cap:
        raise ValueError(f"--capacity-tokens: {cfg.capacity_tokens} ({cfg.num_blocks} blocks of {cfg.block_size}) "
                         f"cannot hold one request of {need} tokens (prompt + --max-new-tokens); use at least "
                         f"{-(-need // cfg.block_size) * cfg.block_size}")
