"""Intervals, once for the whole project: the median of a figure's rounds with its interval, and two
kernels (or two revisions) compared round by round.

For ``n`` values the interval between the ``j``-th and ``k``-th smallest holds the median with
probability ``P(j <= Bin(n, 1/2) < k)``, whatever the distribution (the sign test's interval): asv's
own ``asv_runner.statistics.quantile_ci``, which this module only bounds by the values' range. A
confidence needs enough values: the full range of ``n`` values covers the median with probability
``1 - 2 ** (1 - n)``, so 99% needs 8 (``min_values``). With fewer, the interval is the range and its
``coverage`` says how much less it claims.

One window's samples are not independent: its process and moment move them together, and windows
in different processes differ far more than one window's interval (results/LOG.md). So with several
rounds the unit is the round (``basis="rounds"``); one window's interval (``basis="samples"``) only
says how steady that window was.

Two kernels timed in the same rounds are compared by the ratio of their medians within each round
(``paired_ratio``): what moved the whole machine in a round moves both, and cancels. ``compare_to_one``
reads such a ratio's interval against 1 and a margin: equal within the margin (both ends inside
it, an equivalence test at the interval's confidence), else below, above, or unclear.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from asv_runner.statistics import binom_pmf, quantile_ci

CONFIDENCE = 0.99  # every interval this project prints or decides on (asv's too)
BELOW, ABOVE, EQUAL, UNCLEAR = "below", "above", "equal", "unclear"  # a ratio's interval against 1


def _check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1:  # asv reads a lower one as its complement
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence!r}")


def median_ci(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The order-statistics interval around the median with coverage at least ``confidence``
    (asv's ``quantile_ci``); with too few samples for that (fewer than ``min_values``), where asv's
    ends are infinite, the full range."""
    if not samples:
        raise ValueError("median_ci needs at least one sample")
    _check_confidence(confidence)
    xs = sorted(samples)
    _, (low, high) = quantile_ci(xs, 0.5, alpha_min=1.0 - confidence)
    return (xs[0] if low == -math.inf else low), (xs[-1] if high == math.inf else high)


def interval_coverage(n: int, confidence: float = CONFIDENCE) -> float:
    """The coverage ``median_ci`` reaches with ``n`` values: at least ``confidence``, except with too
    few values (fewer than ``min_values(confidence)``), where its full range covers ``1 - 2 ** (1 - n)``."""
    if n < 1:
        raise ValueError("interval_coverage needs at least one value")
    low, _ = median_ci(range(n), confidence)  # the interval of the ranks: it starts at rank ``low``
    return 1.0 - 2.0 * sum(binom_pmf(n, i, 0.5) for i in range(low + 1))


def min_values(confidence: float = CONFIDENCE) -> int:
    """The fewest values whose interval carries ``confidence``: their range covers ``1 - 2 ** (1 - n)``
    (8 for 99%, 6 for 95%)."""
    _check_confidence(confidence)
    return max(1, math.ceil(1.0 - math.log2(1.0 - confidence) - 1e-12))


def method(basis: str, n: int, coverage: float, confidence: float = CONFIDENCE) -> str:
    """How an interval was made, in words a record keeps (``ci_method``)."""
    values = {"rounds": f"{n} round medians", "samples": f"{n} samples of one window",
              "paired rounds": f"{n} per-round ratios"}.get(basis, f"{n} {basis}")
    if n >= min_values(confidence):
        return f"sign-test order statistics of {values}, {coverage:.1%} coverage"
    if n == 1:
        return (f"one value ({basis}), its own interval: 0.0% coverage, too few values for {confidence:.0%} "
                f"(it needs {min_values(confidence)})")
    return (f"range of {values}: {coverage:.1%} coverage, too few values for {confidence:.0%} "
            f"(it needs {min_values(confidence)})")


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
    confidence: float = CONFIDENCE

    @property
    def relative_half_width(self) -> float:
        """Half the interval over the median: the smallest change this figure can resolve."""
        return (self.ci_high - self.ci_low) / 2.0 / self.median if self.median else math.inf

    @property
    def method(self) -> str:
        n = self.rounds if self.basis == "rounds" else len(self.samples)
        return method(self.basis, n, self.coverage, self.confidence)


def estimate(rounds: Sequence[Sequence[float]], confidence: float = CONFIDENCE) -> Estimate:
    """One estimate from the samples (per-step seconds) of each round: over the rounds' medians when
    there are several, else over the one window's samples."""
    kept = [[float(x) for x in r] for r in rounds if len(r)]
    pooled = [x for r in kept for x in r]
    if not pooled:
        raise ValueError("estimate needs at least one sample")
    medians = [statistics.median(r) for r in kept]
    values, basis = (medians, "rounds") if len(kept) > 1 else (pooled, "samples")
    low, high = median_ci(values, confidence)
    quartiles = statistics.quantiles(pooled, n=4) if len(pooled) > 1 else [pooled[0]] * 3
    return Estimate(median=statistics.median(values), ci_low=low, ci_high=high, q25=quartiles[0],
                    q75=quartiles[2], samples=tuple(pooled), rounds=len(kept), round_medians=tuple(medians),
                    basis=basis, coverage=interval_coverage(len(values), confidence), confidence=confidence)


@dataclass(frozen=True)
class Ratio:
    """``a / b`` of two figures measured in the same rounds: the median of the per-round ratios and its
    interval (order statistics of the ratios' logarithms)."""

    ratio: float
    low: float
    high: float
    rounds: int  # rounds both were measured in
    coverage: float
    confidence: float = CONFIDENCE

    @property
    def carried(self) -> bool:
        """Whether the interval holds its confidence (enough rounds for it)."""
        return self.coverage >= self.confidence - 1e-12

    @property
    def method(self) -> str:
        return method("paired rounds", self.rounds, self.coverage, self.confidence)

    def against_one(self, margin: float) -> str:
        """``compare_to_one`` of this ratio's interval; ``UNCLEAR`` while it does not carry its
        confidence."""
        return compare_to_one(self.low, self.high, margin) if self.carried else UNCLEAR


def pair_rounds(a: dict[int, float], b: dict[int, float]) -> tuple[list[float], list[float]]:
    """The values of the rounds both ``{round id: value}`` hold, in round order."""
    common = sorted(set(a) & set(b))
    return [a[r] for r in common], [b[r] for r in common]


def paired_ratio(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Ratio:
    """``a / b`` from values measured in the same rounds (``a[i]`` with ``b[i]``)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_ratio needs as many values of b as of a, at least one")
    if min(min(a), min(b)) <= 0:
        raise ValueError("paired_ratio needs positive values")
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True)]
    low, high = median_ci(logs, confidence)
    return Ratio(ratio=math.exp(statistics.median(logs)), low=math.exp(low), high=math.exp(high),
                 rounds=len(logs), coverage=interval_coverage(len(logs), confidence), confidence=confidence)


def check_margin(margin: float) -> float:
    """``margin`` if it is a fraction in (0, 1), else ``ValueError`` naming it."""
    if not isinstance(margin, (int, float)) or not 0.0 < margin < 1.0:
        raise ValueError(f"the margin must be a fraction between 0 and 1 (0.1 for +-10%), got {margin!r}")
    return float(margin)


def check_precision(precision: float) -> float:
    """``precision`` (a 99% relative half-width to time a figure down to) if it is a fraction in (0, 1),
    else ``ValueError`` naming it."""
    if not isinstance(precision, (int, float)) or not 0.0 < precision < 1.0:
        raise ValueError(f"the precision must be a fraction between 0 and 1 (0.05 for +-5%), "
                         f"got {precision!r}")
    return float(precision)


def compare_to_one(low: float, high: float, margin: float) -> str:
    """A ratio's interval read against 1: ``EQUAL`` when both ends lie within ``1 +- margin`` (any
    difference is smaller than the margin: an equivalence test at the interval's confidence), else
    ``BELOW`` (wholly under 1) or ``ABOVE`` (wholly over), else ``UNCLEAR`` (too wide to say).
    Equal comes first: a difference the interval can only place within the margin is none that
    matters, and an A/A pair with a small order effect must never read as two different kernels."""
    check_margin(margin)
    if 1.0 - margin <= low and high <= 1.0 + margin:
        return EQUAL
    if high < 1.0:
        return BELOW
    if low > 1.0:
        return ABOVE
    return UNCLEAR
