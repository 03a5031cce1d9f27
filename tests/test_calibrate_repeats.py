"""Repeats on a shared host: whole passes, fastest kept (calibrate.repeats)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from calibrate.repeats import fastest_of_passes, fastest_per_row


class Host:
    """A fake clock: each job takes `work[j]` seconds, times `slow` while the clock is in [t0, t1)."""

    def __init__(self, work, t0, t1, slow):
        self.work, self.t0, self.t1, self.slow, self.t = work, t0, t1, slow, 0.0
        self.order = []

    def run(self, j):
        start = self.t
        sec = self.work[j] * (self.slow if self.t0 <= start < self.t1 else 1.0)
        self.t += sec
        self.order.append(j)
        return f"job{j}@{start:.1f}", sec


def test_a_slow_stretch_is_removed_by_interleaved_passes():
    # 4 jobs of 10 s; the host is 10% slow while jobs 1 and 2 of the first pass run
    h = Host([10.0] * 4, t0=10.0, t1=30.0, slow=1.1)
    best = fastest_of_passes(4, 2, h.run)
    assert h.order == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [s for _, s in best] == [10.0] * 4
    # jobs 1 and 2 keep their second-pass result
    assert [r for r, _ in best][1:3] == ["job1@52.0", "job2@62.0"]


def test_back_to_back_repeats_would_keep_that_slowdown():
    # the same slow stretch over back-to-back repeats of job 1 (what the runner did before)
    h = Host([10.0] * 4, t0=20.0, t1=43.0, slow=1.1)
    kept = []
    for j in range(4):
        kept.append(min(h.run(j)[1] for _ in range(2)))
    assert kept[1] == pytest.approx(11.0)        # both repeats of job 1 fell in the stretch
    h2 = Host([10.0] * 4, t0=20.0, t1=43.0, slow=1.1)
    assert [s for _, s in fastest_of_passes(4, 2, h2.run)] == [10.0] * 4


def test_between_passes_and_progress_are_called_per_pass():
    calls = []
    fastest_of_passes(3, 2, lambda j: (j, 1.0), between_passes=lambda r: calls.append(("pass", r)),
                      on_done=lambda r, j: calls.append((r, j)))
    assert calls == [(0, 0), (0, 1), (0, 2), ("pass", 0), (1, 0), (1, 1), (1, 2), ("pass", 1)]


def test_repeats_below_one_is_refused():
    with pytest.raises(ValueError, match="repeats"):
        fastest_of_passes(2, 0, lambda j: (j, 1.0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.001, 10.0), min_size=3, max_size=3), min_size=1, max_size=4))
def test_fastest_per_row_is_the_elementwise_minimum(passes):
    out = fastest_per_row(passes, seconds=lambda x: x)
    assert out == [min(col) for col in zip(*passes)]


def test_fastest_per_row_refuses_passes_of_other_rows():
    with pytest.raises(ValueError, match="not the same rows"):
        fastest_per_row([[1.0, 2.0], [1.0]], seconds=lambda x: x)
