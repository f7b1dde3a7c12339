"""Uncertainty and contention: order-statistics intervals and the machine-busy monitor."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from attnbench.core.stats import (
    ABOVE,
    BELOW,
    EQUAL,
    UNCLEAR,
    compare_to_one,
    estimate,
    interval_coverage,
    median_ci,
    min_values,
    pair_rounds,
    paired_ratio,
)
from attnbench.measure.contention import Contention, ContentionMonitor


@pytest.mark.parametrize("n,ranks", [(10, (2, 9)), (20, (6, 15)), (30, (10, 21)), (5, (1, 5))])
def test_median_interval_ranks_match_the_sign_test_table(n, ranks):
    # Samples 1..n: the interval's ends are the ranks themselves (binomial table, 95%).
    assert median_ci(list(range(1, n + 1)), 0.95) == ranks


@pytest.mark.parametrize("n,ranks", [(8, (1, 8)), (10, (1, 10)), (20, (4, 17)), (30, (8, 23))])
def test_the_99_percent_interval_ranks_by_the_binomial_table(n, ranks):
    # 99%, the project's default: n = 8 is the fewest whose range covers it (1 - 2/2^8 = 99.2%);
    # n = 20: P(Bin(20, 1/2) <= 3) = 0.0013 per side.
    assert median_ci(list(range(1, n + 1))) == ranks


def test_a_confidence_needs_enough_values():
    assert min_values(0.99) == 8 and min_values(0.95) == 6 and min_values(0.999) == 11
    assert interval_coverage(7) == pytest.approx(1 - 2 / 2**7)  # 98.4%: seven values cannot carry 99%
    assert interval_coverage(8) >= 0.99


def test_a_paired_ratio_cancels_what_moved_both_and_says_how_it_was_made():
    # Two kernels in the same 12 rounds: the machine moved every round by up to +-30%, both alike;
    # b is 1.25x a in every round, give or take 1%.
    drift = [1.0, 1.3, 0.7, 1.1, 0.9, 1.25, 0.75, 1.05, 0.95, 1.2, 0.8, 1.0]
    a = [d * 1.0 for d in drift]
    b = [d * 1.25 * (1 + 0.01 * (-1) ** i) for i, d in enumerate(drift)]
    ratio = paired_ratio(b, a)
    assert ratio.ratio == pytest.approx(1.25, rel=0.011) and ratio.carried
    assert 1.23 < ratio.low <= ratio.high < 1.27  # unpaired, each side alone spans 0.7..1.3
    assert ratio.rounds == 12 and "12 per-round ratios" in ratio.method
    assert ratio.against_one(0.10) == ABOVE
    few = paired_ratio(b[:5], a[:5])
    assert not few.carried and few.against_one(0.10) == UNCLEAR  # five rounds cannot carry 99%
    assert pair_rounds({1: 1.0, 2: 2.0, 4: 4.0}, {2: 20.0, 3: 30.0, 4: 40.0}) == ([2.0, 4.0], [20.0, 40.0])
    with pytest.raises(ValueError, match="as many values of b as of a"):
        paired_ratio([1.0], [1.0, 2.0])


@pytest.mark.parametrize("low,high,state", [(0.8, 0.9, BELOW), (1.12, 1.3, ABOVE), (0.95, 1.04, EQUAL),
                                            (0.93, 0.97, EQUAL), (0.85, 1.2, UNCLEAR), (1.05, 1.12, ABOVE)])
def test_an_interval_against_one_and_a_margin(low, high, state):
    # equal comes first: within 1 +- 10%, a difference is none that matters (0.93..0.97 included)
    assert compare_to_one(low, high, 0.10) == state


@pytest.mark.parametrize("margin", [0, 1, -0.1, 1.5])
def test_a_margin_outside_zero_one_is_refused(margin):
    with pytest.raises(ValueError, match="margin must be a fraction between 0 and 1"):
        compare_to_one(0.9, 1.1, margin)


def test_estimate_is_the_median_of_round_medians_with_an_interval_over_rounds():
    quiet = [[10.0 + 0.01 * i for i in range(10)] for _ in range(2)]
    disturbed = [18.0 + 0.01 * i for i in range(10)]  # a burst of outside load hit this round only
    est = estimate(quiet + [disturbed])
    assert est.rounds == 3 and len(est.samples) == 30 and est.basis == "rounds"
    # Each round's median is 10.045 or 18.045; their median is the quiet rounds' value exactly.
    assert est.round_medians == pytest.approx((10.045, 10.045, 18.045))
    assert est.median == pytest.approx(10.045)
    # Three values: the interval is their full range, which covers the median 1 - 2 * 0.5**3 = 75%.
    assert (est.ci_low, est.ci_high) == pytest.approx((10.045, 18.045)) and est.coverage == 0.75


def test_rounds_not_samples_are_the_unit_of_the_interval():
    # Seven rounds, each internally steady (+-0.1%) but 1..7% apart: the noise between processes.
    # Pooling their 77 samples as if independent would give an interval a few tenths of a percent
    # wide; over the rounds it is the 1st..7th round medians (98.4% coverage for n = 7).
    rounds = [[1.0 + 0.01 * r + 0.0001 * (i - 5) for i in range(11)] for r in range(1, 8)]
    est = estimate(rounds)
    assert est.median == pytest.approx(1.04)
    assert (est.ci_low, est.ci_high) == pytest.approx((1.01, 1.07))
    assert est.coverage == pytest.approx(1 - 2 / 2**7)
    one = estimate(rounds[:1])  # a single window: its own samples, and it says so
    assert one.basis == "samples" and one.ci_high - one.ci_low < 0.001


@pytest.mark.parametrize("n,coverage", [(1, 0.0), (3, 0.75), (5, 0.9375), (6, 1 - 2 / 64),
                                        (10, 1 - 2 * 11 / 1024)])
def test_interval_coverage_by_hand(n, coverage):
    # 95%: n <= 5: the full range, 1 - 2 * 0.5**n; n = 10: ranks 2..9, 1 - 2 * (1 + 10) / 2**10.
    assert interval_coverage(n, 0.95) == pytest.approx(coverage)


def test_contention_verdict_from_other_cores_and_steal():
    quiet = Contention(wall_s=1.0, other_cpu_share=0.05, steal_share=0.0, cpu_pressure_share=0.1,
                       load_1min=1.0)
    busy = Contention(wall_s=1.0, other_cpu_share=0.9, steal_share=0.0, cpu_pressure_share=0.5,
                      load_1min=3.0)
    stolen = Contention(wall_s=1.0, other_cpu_share=0.0, steal_share=0.2, cpu_pressure_share=None,
                        load_1min=1.0)
    assert not quiet.contended and quiet.columns()["contention_reason"] is None
    assert busy.contended and "other processes used 0.90 cores" in busy.columns()["contention_reason"]
    assert stolen.contended and "hypervisor steal 0.20 cores" in stolen.reasons[0]


def test_monitor_sees_another_process_burning_a_core():
    burner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3\n"
                               "while time.time() < end: pass"])
    try:
        time.sleep(0.3)  # let it start
        with ContentionMonitor() as monitor:
            time.sleep(1.0)
    finally:
        burner.kill()
        burner.wait()
    assert monitor.result.other_cpu_share > 0.5 and monitor.result.contended


def test_a_confidence_below_one_half_is_refused_not_read_as_its_complement():
    # asv's quantile_ci reads 0.3 as 0.7; this project says what is wrong instead
    with pytest.raises(ValueError, match=r"confidence must be in \[0.5, 1\), got 0.3"):
        median_ci([1.0, 2.0, 3.0], 0.3)
    assert median_ci(list(range(20)), 0.7) == (7, 12)
