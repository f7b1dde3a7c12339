"""Uncertainty and contention: order-statistics intervals and the machine-busy monitor."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from attnbench.contention import Contention, ContentionMonitor
from attnbench.stats import estimate, median_ci


@pytest.mark.parametrize("n,ranks", [(10, (2, 9)), (20, (6, 15)), (30, (10, 21)), (5, (1, 5))])
def test_median_interval_ranks_match_the_sign_test_table(n, ranks):
    # Samples 1..n: the interval's ends are the ranks themselves (binomial table, 95%).
    assert median_ci(list(range(1, n + 1))) == ranks


def test_estimate_pools_rounds_so_one_disturbed_round_moves_the_median_little():
    quiet = [[10.0 + 0.01 * i for i in range(10)] for _ in range(2)]
    disturbed = [18.0 + 0.01 * i for i in range(10)]  # a burst of outside load hit this round only
    pooled = estimate(quiet + [disturbed])
    assert pooled.rounds == 3 and len(pooled.samples) == 30
    assert 10.0 <= pooled.median <= 10.1  # the median of 30 samples, 20 of them quiet
    # ...and the interval widens to say so: ranks 10..21 of 30 reach into the disturbed round.
    assert (pooled.ci_low, pooled.ci_high) == (10.04, 18.0)
    alone = estimate(quiet)
    assert alone.ci_high <= 10.09 and alone.relative_half_width < 0.005


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
