"""One series of the tidy results in commit order, and a step found in it: the values
``results/steps.py`` finds steps in and ``results/judge.py`` judges. Reads, never writes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _text(value):
    return value if isinstance(value, str) and value else None


@dataclass
class Series:
    """One series' figures in commit order, as arrays. ``value`` is divided by each figure's
    ``scale`` (its run correction); ``up`` and ``down`` are the intervals' relative half-widths."""

    keys: dict  # the series' parameters (``noise.SERIES`` columns)
    table: object  # the analysed tidy rows, and this series' positions in them (commit order)
    index: np.ndarray
    metric: str
    direction: str
    unit: str
    machine: str
    commit: np.ndarray
    position: np.ndarray
    value: np.ndarray
    up: np.ndarray
    down: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    source: np.ndarray
    scale: np.ndarray
    shift: np.ndarray  # the run factor of the correction, as is (1 where none)
    variance: np.ndarray  # the correction chain's accumulated variance at each figure
    definitions: np.ndarray
    platform: np.ndarray
    regime: np.ndarray
    dtype: np.ndarray
    category: np.ndarray  # "interpreted", or the kernel's label

    @property
    def kind(self) -> tuple:
        """The kind of figure its noise floor is the machine's for: metric, regime, interpreted or not."""
        return (self.machine, self.metric, _text(self.regime[-1]) or "static",
                self.category[-1] == "interpreted")


@dataclass
class Candidate:
    """A step asv's detection found in one series, with what judging it needs."""

    series: Series
    before: int  # index of the last figure of the old level, and of the first of the new one
    after: int
    left: tuple[int, int]  # the two levels' segments [start, end)
    right: tuple[int, int]
    levels: tuple[float, float]  # the two levels as the metric shows them, corrected for the run
    excursion: bool  # out of a one-figure level back to (or beyond) the level before it
    u: list = field(default_factory=lambda: [None, None])  # each level's uncertainty (metric units)
    sources: set = field(default_factory=set)
    end: int | None = None  # where the new level's host period ends (None: the series' end)

    @property
    def step(self) -> float:
        return abs(self.levels[1] - self.levels[0])

    @property
    def runs_at_new_level(self) -> int:
        """Consecutive figures from the step on, on its host, that are nearer the new level than the
        old one: a later host's figure, scaled by its run factor, cannot say a level held (kernels
        scale apart across CPU generations: an interpreted one unlike a compiled one)."""
        values = self.series.value[self.after:self.end]
        before, after = self.levels
        near = np.abs(values - after) < np.abs(values - before)
        return int(np.argmin(near)) if not near.all() else len(values)

    @property
    def ends_series(self) -> bool:
        """Whether the new level lasts to the series' end, or to its host period's end."""
        end = len(self.series.value) if self.end is None else self.end
        return self.after + self.runs_at_new_level >= end

    @property
    def ends_host(self) -> bool:
        """Whether the new level's last figure is its host's last, a later host's runs after it."""
        return self.end is not None and self.end < len(self.series.value) and self.ends_series

    @property
    def relative(self) -> float:
        before, after = self.levels
        return (after - before) / abs(before) if before else float("inf")


