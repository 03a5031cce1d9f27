"""The serving-fidelity matrix compares the simulator with the mean of several real runs of a shape."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("bench_calibrate", ROOT / "bench" / "bench_calibrate.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _cmp(real, sim, e_real, e_sim, gen=100.0):
    return {"makespan_real_s": real, "makespan_sim_s": sim, "throughput_real_tokens_per_s": gen / real,
            "e2e_real_s": e_real, "e2e_sim_s": e_sim}


def test_errors_are_against_the_mean_of_the_real_runs_and_spreads_are_theirs():
    # two real runs 10 s and 12 s (mean 11), the replay 11.55 s both times: +5%, not -3.75% / +15.5%
    c = bench.combine_repeats([_cmp(10.0, 11.55, [4.0, 6.0, 2.0], [4.4, 6.3, 2.2]),
                               _cmp(12.0, 11.55, [6.0, 6.0, 2.0], [4.4, 6.3, 2.2])])
    assert c["repeats"] == 2
    assert c["makespan_error"] == pytest.approx(0.05)
    assert c["throughput_error"] == pytest.approx(1 / 1.05 - 1)
    # e2e per problem against the mean real e2e: 4.4/5, 6.3/6, 2.2/2 -> 12%, 5%, 10%: median 10%
    assert c["e2e_median_abs_pct_error"] == pytest.approx(10.0)
    assert c["real_makespan_spread"] == pytest.approx(2 / 11)
    # per problem (max - min) / mean: 2/5, 0, 0 -> median 0
    assert c["real_e2e_spread_pct"] == pytest.approx(0.0)
    one = bench.combine_repeats([_cmp(10.0, 11.0, [5.0], [5.5])])
    assert one["makespan_error"] == pytest.approx(0.1) and one["real_makespan_spread"] == 0.0


def test_matrix_repeats_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--matrix", "--matrix-repeats", "0", "--out", "/nonexistent/never-written"])
    assert "--matrix-repeats: must be at least 1" in capsys.readouterr().err
