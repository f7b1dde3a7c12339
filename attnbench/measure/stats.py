"""Uncertainty of a timing: the median with a distribution-free confidence interval, and rounds.

For ``n`` values the interval between the ``j``-th and ``k``-th smallest holds the median with
probability ``P(j <= Bin(n, 1/2) < k)``, whatever the distribution (the sign test's interval): asv's
own ``asv_runner.statistics.quantile_ci``, which this module only bounds by the values' range.

One window's samples are not independent: its process and moment move them together, and windows
in different processes differ far more than one window's interval (results/LOG.md). So with several
rounds the unit is the round (``basis="rounds"``); one window's interval (``basis="samples"``) only
says how steady that window was.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from asv_runner.statistics import binom_pmf, quantile_ci


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The order-statistics interval around the median with coverage at least ``confidence``
    (asv's ``quantile_ci``); with too few samples for that, where asv's ends are infinite, the
    full range."""
    if not samples:
        raise ValueError("median_ci needs at least one sample")
    if not 0.5 <= confidence < 1:  # asv reads a lower one as its complement
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")
    xs = sorted(samples)
    _, (low, high) = quantile_ci(xs, 0.5, alpha_min=1.0 - confidence)
    return (xs[0] if low == -math.inf else low), (xs[-1] if high == math.inf else high)


def interval_coverage(n: int, confidence: float = 0.95) -> float:
    """The coverage ``median_ci`` reaches with ``n`` values: at least ``confidence``, except with too
    few values (fewer than 6 at 95%), where its full range covers ``1 - 2 ** (1 - n)``."""
    if n < 1:
        raise ValueError("interval_coverage needs at least one value")
    low, _ = median_ci(range(n), confidence)  # the interval of the ranks: it starts at rank ``low``
    return 1.0 - 2.0 * sum(binom_pmf(n, i, 0.5) for i in range(low + 1))


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
    """One estimate from the samples (per-step seconds) of each round: over the rounds' medians when
    there are several, else over the one window's samples."""
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
