"""Uncertainty of a timing: the median with a distribution-free confidence interval, and rounds.

A step time is never one number here. Every figure is a median over samples (blocks of calls) with
a confidence interval from order statistics: for ``n`` samples, the interval between the ``j``-th
and ``k``-th smallest holds the true median with probability ``P(j <= Bin(n, 1/2) < k)``, whatever
the noise's distribution (the sign test's interval; asv's ``quantile_ci`` is the same idea).
Samples of several rounds (separate processes, spread over a run) are pooled, so a burst of
outside load that hits one round moves the median little and widens the interval instead.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The order-statistics interval ``(x_(j), x_(k))`` (1-based ranks, sorted samples) around the
    median with coverage at least ``confidence``; with too few samples for that, the full range."""
    if not samples:
        raise ValueError("median_ci needs at least one sample")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    xs = sorted(samples)
    n = len(xs)
    # Largest j such that P(Bin(n, 1/2) <= j - 1) <= (1 - confidence) / 2: the interval is then
    # [x_(j), x_(n + 1 - j)], symmetric in rank.
    tail, j, cumulative = (1.0 - confidence) / 2.0, 0, 0.0
    for i in range(n + 1):
        cumulative += math.comb(n, i) / 2.0**n
        if cumulative > tail:
            break
        j = i + 1
    if j < 1:
        return xs[0], xs[-1]
    return xs[j - 1], xs[n - j]


@dataclass(frozen=True)
class Estimate:
    """A robust estimate of a step time from pooled samples."""

    median: float
    ci_low: float  # 95% interval of the median (order statistics)
    ci_high: float
    q25: float
    q75: float
    samples: tuple[float, ...]
    rounds: int

    @property
    def relative_half_width(self) -> float:
        """Half the interval over the median: the smallest change this figure can resolve."""
        return (self.ci_high - self.ci_low) / 2.0 / self.median if self.median else math.inf


def estimate(rounds: Sequence[Sequence[float]]) -> Estimate:
    """Pool the samples of every round (each a sequence of per-step seconds) into one estimate."""
    pooled = [float(x) for round_samples in rounds for x in round_samples]
    if not pooled:
        raise ValueError("estimate needs at least one sample")
    low, high = median_ci(pooled)
    quartiles = statistics.quantiles(pooled, n=4) if len(pooled) > 1 else [pooled[0]] * 3
    return Estimate(median=statistics.median(pooled), ci_low=low, ci_high=high, q25=quartiles[0],
                    q75=quartiles[2], samples=tuple(pooled), rounds=sum(1 for r in rounds if len(r)))
