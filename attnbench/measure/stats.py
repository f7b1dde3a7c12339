"""Uncertainty of a timing: the median with a distribution-free confidence interval, and rounds.

A step time is never one number here. Every figure is a median with a confidence interval from
order statistics: for ``n`` values, the interval between the ``j``-th and ``k``-th smallest holds
the true median with probability ``P(j <= Bin(n, 1/2) < k)``, whatever the noise's distribution
(the sign test's interval; asv's ``quantile_ci`` is the same idea).

Which values? The samples of one timing window are not independent of each other: on a shared or
virtual machine the window's process and its moment (the host's other tenants, frequency, where the
allocator put the buffers) move all of them together. Measured here (results/LOG.md), two windows of
the same case in different processes differ by 5-20% while each window's own interval is 1-2% wide.
So with several rounds (separate processes, spread over a run) the unit is the round: the figure is
the median of the rounds' medians and its interval the order-statistics interval of those
(``basis="rounds"``); a burst of outside load that hits one round moves the figure little and
widens the interval instead. A single window's interval (``basis="samples"``) only says how steady
that one window was.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def _rank(n: int, confidence: float) -> int:
    """The largest ``j`` with ``P(Bin(n, 1/2) <= j - 1) <= (1 - confidence) / 2``: the interval
    ``[x_(j), x_(n + 1 - j)]`` (symmetric in rank) then covers the median with at least
    ``confidence``; 0 when even the full range cannot."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    tail, j, cumulative = (1.0 - confidence) / 2.0, 0, 0.0
    for i in range(n + 1):
        cumulative += math.comb(n, i) / 2.0**n
        if cumulative > tail:
            break
        j = i + 1
    return j


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The order-statistics interval ``(x_(j), x_(k))`` (1-based ranks, sorted samples) around the
    median with coverage at least ``confidence``; with too few samples for that, the full range."""
    if not samples:
        raise ValueError("median_ci needs at least one sample")
    xs = sorted(samples)
    j = max(_rank(len(xs), confidence), 1)
    return xs[j - 1], xs[len(xs) - j]


def interval_coverage(n: int, confidence: float = 0.95) -> float:
    """The coverage ``median_ci`` reaches with ``n`` values: at least ``confidence``, except with too
    few values (fewer than 6 at 95%), where its full range covers ``1 - 2 ** (1 - n)``."""
    if n < 1:
        raise ValueError("interval_coverage needs at least one value")
    j = max(_rank(n, confidence), 1)
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(j)) / 2.0**n


@dataclass(frozen=True)
class Estimate:
    """A robust estimate of a step time from one or more rounds of samples."""

    median: float
    ci_low: float  # interval of the median (order statistics) with coverage ``coverage``
    ci_high: float
    q25: float  # quartiles of the pooled samples
    q75: float
    samples: tuple[float, ...]  # every round's samples, pooled
    rounds: int
    round_medians: tuple[float, ...]
    basis: str  # "rounds": the interval is over the rounds' medians; "samples": over one window's
    coverage: float

    @property
    def relative_half_width(self) -> float:
        """Half the interval over the median: the smallest change this figure can resolve."""
        return (self.ci_high - self.ci_low) / 2.0 / self.median if self.median else math.inf


def estimate(rounds: Sequence[Sequence[float]]) -> Estimate:
    """One estimate from the samples (per-step seconds) of each round.

    Several rounds: the median of the rounds' medians, with the order-statistics interval of those
    medians. One round: the median of its samples and their interval, which only describes that
    window (see the module's docstring).
    """
    kept = [[float(x) for x in r] for r in rounds if len(r)]
    pooled = [x for r in kept for x in r]
    if not pooled:
        raise ValueError("estimate needs at least one sample")
    medians = [statistics.median(r) for r in kept]
    values, basis = (medians, "rounds") if len(kept) > 1 else (pooled, "samples")
    low, high = median_ci(values)
    quartiles = statistics.quantiles(pooled, n=4) if len(pooled) > 1 else [pooled[0]] * 3
    return Estimate(median=statistics.median(values), ci_low=low, ci_high=high, q25=quartiles[0],
                    q75=quartiles[2], samples=tuple(pooled), rounds=len(kept), round_medians=tuple(medians),
                    basis=basis, coverage=interval_coverage(len(values)))
