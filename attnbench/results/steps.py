"""Steps in the tidy results, and which of them are regressions. Reads, never writes.

``find_steps`` runs asv's step detection per series in commit order (directions honoured) and judges
each step by what its metric is (``Metric.judged``; docs/reports.md):

* ``noise``: the step must exceed the two levels' combined uncertainty, each level's never below the
  machine's noise floor for the metric (``noise.noise_floors``), plus the run correction's own
  standard error where the figure is divided by its run's shift;
* ``exact``: deterministic figures (compiler bytes, counts): any step beyond the threshold is real;
* ``allocator``: alerts only for a step that holds on both sides (two runs or more each, no overlap)
  and exceeds ``ALLOCATOR_MIN_STEP``;
* ``tolerance``: an error alerts when it crosses its dtype's tolerance or rises by more than
  ``TOLERANCE_FRACTION`` of it.

A step that passes is then explained, in order, as a one-run excursion, a host change, a definition
change (``DEFINITION_CHANGES``, per metric, regime, platform, kernel and class), a change of a setting
the metric depends on (``SETTINGS_THAT_MATTER``), or no change in the code the series measures
(``results/code.py``); what is left is a regression, naming the commits that changed that code, the
step against the noise it beat, and how many runs it has held.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from attnbench.core import metrics
from attnbench.core.numerics import TOLERANCE
from attnbench.results import code, hosts, noise
from attnbench.results.noise import SCATTER_Z, column

# Imported where used: pandas (the torch_xla venv has no report libraries); asv (the main venv only).

DEFAULT_THRESHOLD = 0.05
# A noise step alerts beyond ALERT_Z standard deviations of each level (combined in quadrature): a
# 99.9% band, not 99%, as one history judges hundreds of candidate steps, and a 99% band let several
# noise-only steps through per synthetic history (tests/test_regression_rule.py; docs/reports.md).
ALERT_Z = 3.291
# Steps smaller than this in absolute terms are noise whatever their relative size: the process's
# resident high-water mark moves in 4 KiB pages, so 0 -> 8 KiB would read as an infinite regression.
MIN_ABSOLUTE_STEP = {"bytes": 2**20}
REGRESSION, WITHIN_NOISE = "regression", "within noise"
ONE_RUN, UNCONFIRMED, SEEN_BEFORE = "one-run excursion", "unconfirmed", "level seen before"
WITHIN_TOLERANCE, COMPANION = "within tolerance", "companion only"
HOST_CHANGED, DEFINITION_CHANGED, SETTING_CHANGED = "host changed", "definition changed", "setting changed"
NO_CODE_CHANGE = "no measured code changed"
VERDICTS = (REGRESSION, UNCONFIRMED, HOST_CHANGED, DEFINITION_CHANGED, SETTING_CHANGED, NO_CODE_CHANGE,
            ONE_RUN, SEEN_BEFORE, WITHIN_NOISE, WITHIN_TOLERANCE, COMPANION)


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
    def rows(self):
        """The series' tidy rows in commit order (a step's versions and settings come from them); taken
        only for a candidate step: taking them for every series costs more than the analysis."""
        return self.table.iloc[self.index]

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

    @property
    def step(self) -> float:
        return abs(self.levels[1] - self.levels[0])

    @property
    def runs_at_new_level(self) -> int:
        """Consecutive figures from the step on that are nearer the new level than the old one."""
        values = self.series.value[self.after:]
        before, after = self.levels
        near = np.abs(values - after) < np.abs(values - before)
        return int(np.argmin(near)) if not near.all() else len(values)

    @property
    def ends_series(self) -> bool:
        return self.after + self.runs_at_new_level >= len(self.series.value)

    @property
    def relative(self) -> float:
        before, after = self.levels
        return (after - before) / abs(before) if before else float("inf")


# -- series ----------------------------------------------------------------------------------------
def _factor_chains(factors: dict):
    """``(machine, env_name, class, metric) -> class``: whose ``run_factors`` chain a class's figures
    use: its own, or for a class too small to say (torch_xla's Training), its environment's busiest."""
    runs = Counter(key[:4] for key in factors)
    best = {}
    for (m, e, c, metric), n in runs.items():
        if n > runs.get((m, e, best.get((m, e, metric)), metric), 0):
            best[(m, e, metric)] = c
    return lambda key: key[2] if key in runs else best.get((key[0], key[1], key[3]))


def series_of(ok, factors: dict):
    """Every series of ``ok`` (usable rows), one ``Series`` each. Plain arrays sliced per series, not
    one DataFrame per series: this runs over 100k rows."""
    keys = [c for c in noise.SERIES if c in ok]
    grouped = ok.groupby(keys, dropna=False)
    group_keys = grouped.size().index
    codes = grouped.ngroup().to_numpy()
    positions = ok[noise.order_column(ok)].to_numpy()
    order = np.lexsort((positions.astype(float), codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    starts, ends = np.concatenate(([0], bounds)), np.concatenate((bounds, [len(order)]))
    value = ok["value"].to_numpy(dtype=float)[order]
    commit = ok["commit_hash"].to_numpy()[order]
    metric, machine = ok["metric"].to_numpy()[order], ok["machine"].to_numpy()[order]
    low, high, source = (a[order] for a in noise.intervals(ok))
    trusted = noise.spans_rounds(ok)[order]  # asv's 99% interval weighs a figure where it spans rounds
    ci_low = np.where(trusted, column(ok, "ci_low")[order], np.nan)
    ci_high = np.where(trusted, column(ok, "ci_high")[order], np.nan)
    platform = np.array([_text(p) or _text(m) for p, m in zip(column(ok, "platform", object)[order],
                                                             column(ok, "machine_platform", object)[order],
                                                             strict=True)], dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        up, down = (high - value) / np.abs(value), (value - low) / np.abs(value)
    scale, shift, variance = _corrections(ok, order, factors, metric, machine, commit, platform)
    dtype = column(ok, "dtype", object)[order]
    run_dtypes = column(ok, "setting_dtypes", object)[order]
    # Training has no dtype parameter: the run's first dtype is its
    dtype = np.array([_text(d) or (_text(r) or "").split(",")[0] or None
                      for d, r in zip(dtype, run_dtypes, strict=True)], dtype=object)
    arrays = {"commit": commit, "position": positions[order], "value": value / scale, "up": up, "down": down,
              "ci_low": ci_low / scale, "ci_high": ci_high / scale, "source": source, "scale": scale,
              "shift": shift, "variance": variance, "platform": platform, "dtype": dtype,
              "definitions": column(ok, "setting_definitions", object)[order],
              "regime": column(ok, "regime", object)[order],
              "category": column(ok, "category", object)[order]}
    direction, unit = column(ok, "direction", object)[order], column(ok, "unit", object)[order]
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        key = group_keys[codes[order[start]]]
        key = key if isinstance(key, tuple) else (key,)
        yield Series(keys=dict(zip(keys, key, strict=True)), table=ok, index=order[start:end],
                     metric=metric[start], direction=direction[start], unit=unit[start],
                     machine=machine[start], **{k: v[start:end] for k, v in arrays.items()})


def _corrections(ok, order, factors: dict, metric, machine, commit, platform):
    """Each figure's run correction (``scale``: its run factor to the correction's power), the factor
    as is, and its chain's variance; 1, 1, 0 where the figure is not corrected."""
    n = len(order)
    scale, shift, variance = np.ones(n), np.ones(n), np.zeros(n)
    if not factors:
        return scale, shift, variance
    benchmark, env = ok["benchmark"].to_numpy()[order], ok["env_name"].to_numpy()[order]
    chain_of, rules = _factor_chains(factors), {}
    for i in range(n):
        where = (metric[i], platform[i])
        if where not in rules:
            rules[where] = (noise.correction_metric(*where), noise.correction_exponent(*where))
        source, exponent = rules[where]
        if not exponent:
            continue
        group = (machine[i], env[i], str(benchmark[i]).rsplit(".", 1)[0], source)
        found = factors.get((machine[i], env[i], chain_of(group), source, commit[i]))
        if found:
            scale[i], shift[i], variance[i] = found.factor ** exponent, found.factor, found.variance
    return scale, shift, variance


def _text(value):
    return value if isinstance(value, str) and value else None


# -- the machine's noise floor ---------------------------------------------------------------------
def _scatter(values) -> float | None:
    """The robust relative SD of one figure from successive figures (``noise.series_scatter``'s
    estimator); None under three figures."""
    values = np.asarray([v for v in values if v == v], dtype=float)
    if len(values) < 3:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        moves = values[1:] / values[:-1] - 1.0
    moves = moves[np.isfinite(moves)]
    return noise.robust_sd(moves) / math.sqrt(2.0) if len(moves) >= 2 else None


def floors_of(series: list[Series]) -> dict[tuple, float]:
    """How far one figure moves from run to run on a machine, as judged (after its run correction): a
    relative SD, the median over that kind of figure's series of their scatter. A kind is ``(machine,
    metric, regime, interpreted)`` (a regime's stream of a few steps is noisier than a static case
    timed in rounds, ``static`` for classes without regimes; an interpreter noisier than compiled
    code), with ``(machine, metric)`` over every kind as the fallback. Only for metrics judged against
    noise; a kind with no series of three figures has none."""
    noisy = {m.name for m in metrics.METRICS if m.judged == "noise"}
    found: dict[tuple, list[float]] = {}
    for s in series:
        if s.metric not in noisy:
            continue
        spread = _scatter(s.value)
        if spread is None:
            continue
        found.setdefault(s.kind, []).append(spread)
        found.setdefault((s.machine, s.metric), []).append(spread)
    return {key: float(np.median(values)) for key, values in found.items()}


def floor_of(floors: dict, series: Series) -> float | None:
    """The noise floor of a series' figures: its kind's, else its metric's on its machine."""
    found = floors.get(series.kind)
    return found if found is not None else floors.get((series.machine, series.metric))


def noise_floors(frame, factors: dict | None = None) -> dict[tuple, float]:
    """``floors_of`` the usable series of ``frame``, corrected by ``factors`` (default: its own)."""
    factors = noise.run_factors(noise.correction_shifts(frame)) if factors is None else factors
    ok = noise.usable(frame)
    return floors_of(list(series_of(ok, factors))) if not ok.empty else {}


def noise_floor(frame, thresholds: dict | None = None, metric: str = "seconds_per_step",
                floors: dict | None = None):
    """Per machine, the noise floor ``find_steps`` holds ``metric``'s static, compiled figures to (a
    relative SD, ``floors_of``; ``floors``: already computed), the median interval half-width over
    rounds beside it, and so the smallest step it can call a regression:
    max(threshold, ALERT_Z x sqrt(2) x floor)."""
    import pandas as pd

    threshold = (thresholds or {}).get(metric, DEFAULT_THRESHOLD)
    floors = noise_floors(frame) if floors is None else floors
    part = frame[(frame["metric"] == metric) & (frame["status"] == "ok")]
    rows = []
    for machine, mine in part.groupby("machine", sort=True):
        contended = noise.is_contended(mine)
        clean = mine[~contended]
        low, high, _ = noise.intervals(clean)
        value = clean["value"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            half = (high - low) / 2.0 / np.abs(value)
        half = half[np.isfinite(half)]
        floor = floors.get((machine, metric, "static", False), floors.get((machine, metric)))
        rows.append({"machine": machine, "figures": len(clean), "contended": int(contended.sum()),
                     "with_intervals": len(half),
                     "interval_half_width": float(np.median(half)) if len(half) else float("nan"),
                     "noise_floor": floor if floor is not None else float("nan"),
                     "measured_by": ("median over the static compiled series of their run-to-run scatter, "
                                     "after the run correction") if floor is not None
                     else "no series of three figures",
                     "alert_band": ALERT_Z * floor if floor is not None else float("nan"),
                     "threshold": threshold,
                     "smallest_detectable_step": max(threshold, ALERT_Z * math.sqrt(2.0) * floor)
                     if floor is not None else float("nan")})
    return pd.DataFrame(rows)


# -- finding steps ---------------------------------------------------------------------------------
def _cannot_regress(values, threshold) -> bool:
    """True when no step of at least ``threshold`` can exist in ``values`` (exact, so it only saves time):
    asv's levels are segment medians within [min, max], and ``v + max(0, threshold * v)`` grows with v."""
    if threshold is None or not threshold >= 0:
        return False
    finite = [v for v in values if v is not None and v == v]
    if not finite:
        return True
    low, high = min(finite), max(finite)
    return high <= low + max(0.0, threshold * low)


# The Potts penalty of a breakpoint, in noise floors (relative SDs) of the series' kind: a 30% step in
# the middle of 12 figures of 5% noise is found 97-99% of the time, a noise-only series split 1.5%
# (simulated, docs/reports.md); asv's own choice of the penalty (detect_steps) found such a step in
# about half of the series, as it reads a step in a short series as correlated noise.
POTTS_GAMMA = 4.0


def fit_levels(values: list, weights: list | None, floor_sd: float | None) -> list[tuple]:
    """asv's piecewise-constant fit of a series, as ``asv.step_detect.detect_steps`` returns it: the
    penalty of a breakpoint ``POTTS_GAMMA`` noise floors (on values over the series' median) where
    the series' kind has a floor, else asv's own choice (``detect_steps``)."""
    from asv.step_detect import detect_steps, solve_potts

    kept = [j for j, v in enumerate(values) if v is not None and v == v
            and (weights is None or weights[j] is None or weights[j] > 0)]
    if not floor_sd or len(kept) < 2:
        return detect_steps(values, weights)
    y = np.asarray([values[j] for j in kept], dtype=float)
    middle = float(np.median(y)) or 1.0
    known = [weights[j] for j in kept if weights is not None and weights[j] is not None]
    scale = float(np.median(known)) if known else 1.0
    w = [(weights[j] / scale) if weights is not None and weights[j] is not None else 1.0 for j in kept]
    right, levels, dists = solve_potts(list(y / middle), w, gamma=POTTS_GAMMA * floor_sd)
    out, left = [], 0
    for r, level, dist in zip(right, levels, dists, strict=True):
        out.append((kept[left], kept[r - 1] + 1, level * middle, float(y[left:r].min()),
                    abs(dist / (r - left)) * middle))
        left = r
    return out


def candidates(series: Series, threshold: float, floor: float, min_size: int = 1,
               floor_sd: float | None = None) -> list[Candidate]:
    """The steps of one series beyond ``threshold`` and the absolute ``floor`` (``fit_levels``, then
    asv's ``detect_regressions``); ``floor_sd``: the noise floor of the series' kind, if it has one."""
    from asv.step_detect import detect_regressions

    if len(set(series.commit.tolist())) < 2 or series.direction not in ("lower", "higher"):
        return []  # one commit, or neither way is better: nothing can regress
    higher = series.direction == "higher"
    shown = series.value
    values = [1.0 / v if v else None for v in shown.tolist()] if higher else shown.tolist()
    if _cannot_regress(values, threshold):
        return []
    weights = None  # asv's own weighting of a figure: 2 / width of its 99% interval
    lo, hi = series.ci_low, series.ci_high
    with np.errstate(divide="ignore", invalid="ignore"):
        width = np.abs(1.0 / lo - 1.0 / hi) if higher else np.abs(hi - lo)
    if np.isfinite(width).any() and (width > 0).any():
        weights = [2.0 / w if np.isfinite(w) and w > 0 else None for w in width]
    steps = fit_levels(values, weights, floor_sd)
    _, _, found = detect_regressions(steps, threshold=threshold, min_size=min_size)
    segments = {(left, right) for left, right, *_ in steps}
    levels = {(left, right): level for left, right, level, *_ in steps}
    out = []
    for before, after, value_before, value_after in found or ():
        shown_levels = (1.0 / value_before, 1.0 / value_after) if higher else (value_before, value_after)
        if abs(shown_levels[1] - shown_levels[0]) < floor:
            continue
        left = next(((a, b) for a, b in segments if b - 1 == before), (before, before + 1))
        right = next(((a, b) for a, b in segments if a == after), (after, after + 1))
        prior = next((levels[(a, b)] for a, b in segments if b == left[0]), None)
        excursion = (left[1] - left[0] == 1 and prior is not None
                     and value_after <= prior + threshold * abs(prior))
        out.append(Candidate(series, before, after, left, right, shown_levels, excursion))
    return out


def _interval_uncertainty(candidate: Candidate) -> None:
    """Each level's uncertainty from its figures' intervals (the half facing the other level), else
    for a figure read once per run from the series' successive differences, else from the scatter of
    the points on both sides."""
    s, (before, after) = candidate.series, candidate.levels
    rising = after > before
    for side, (segment, level, half) in enumerate(((candidate.left, before, s.up if rising else s.down),
                                                   (candidate.right, after, s.down if rising else s.up))):
        known = half[slice(*segment)]
        known = known[np.isfinite(known)]
        if len(known):  # asv's 99% interval, widened to the alert's band
            candidate.u[side] = float(np.median(known)) * abs(level) * ALERT_Z / SCATTER_Z
    candidate.sources |= {str(x) for x in s.source[candidate.left[0]:candidate.right[1]].tolist() if x}
    if None not in candidate.u:
        return
    metric = metrics.get(s.metric) if s.metric in metrics.names() else None
    spread = None
    if metric is not None and metric.one_reading:
        spread = reading_scatter(s.value, candidate.before, candidate.after)
        source = "series run-to-run scatter, one reading per run"
    if spread is None:
        spread = _step_scatter(s.value, (candidate.left, candidate.right))
        source = "series scatter"
    if spread is not None:
        for side, level in enumerate(candidate.levels):
            if candidate.u[side] is None:
                candidate.u[side] = ALERT_Z * spread * abs(level)
        candidate.sources.add(source)


def _step_scatter(values, segments):
    """Robust relative standard deviation of the points on both sides of a step, around their side's
    median; None when fewer than three points (or no side of two) say anything about it."""
    residuals, sizes = [], []
    for left, right in segments:
        side = np.asarray([v for v in values[left:right] if v == v], dtype=float)
        if len(side) == 0:
            continue
        sizes.append(len(side))
        middle = np.median(side)
        if middle:
            residuals.extend(side / middle - 1.0)
    if sum(sizes) < 3 or max(sizes, default=0) < 2:
        return None
    return noise.robust_sd(residuals)


def reading_scatter(values, before: int, after: int):
    """Relative standard deviation of one figure from its series' successive differences (RMS over
    sqrt(2), the step's own left out); None with fewer than three."""
    values = np.asarray(values, dtype=float)
    diffs = [values[i + 1] / values[i] - 1.0 for i in range(len(values) - 1)
             if not (before <= i < after) and values[i]]
    diffs = [d for d in diffs if d == d]
    if len(diffs) < 3:
        return None
    return float(np.sqrt(np.mean(np.square(diffs))) / math.sqrt(2.0))


# -- judging one step ------------------------------------------------------------------------------
@dataclass
class Noise:
    """What a ``noise`` step was judged against: the combined 99% uncertainty and its parts."""

    combined: float
    source: str
    floor_applied: bool


def level_factor(figures: int) -> float:
    """A level's uncertainty over one figure's: the standard error of the median of ``figures``
    independent figures (of their mean for one or two)."""
    return 1.0 / math.sqrt(figures) if figures <= 2 else noise.MEDIAN_SE / math.sqrt(figures)


def noise_of(candidate: Candidate, floor_sd: float | None) -> Noise:
    """The step's combined uncertainty: each level's, from one figure's (its intervals or scatter,
    never below the machine's floor for that kind of figure) over the figures the level is the median
    of (``level_factor``), and the run correction's standard error between the two runs."""
    _interval_uncertainty(candidate)
    s, parts, applied = candidate.series, [], False
    for side, (level, segment) in enumerate(zip(candidate.levels, (candidate.left, candidate.right),
                                               strict=True)):
        own = candidate.u[side]
        floor = ALERT_Z * floor_sd * abs(level) if floor_sd is not None else None
        if floor is not None and (own is None or floor > own):
            own, applied = floor, True
        parts.append(None if own is None else own * level_factor(segment[1] - segment[0]))
    correction = abs(s.variance[candidate.after] - s.variance[candidate.before])
    corrected = s.scale[candidate.after] != 1.0 or s.scale[candidate.before] != 1.0
    if corrected and correction:
        parts.append(ALERT_Z * math.sqrt(correction) * abs(candidate.levels[1]))
    known = [p for p in parts if p is not None]
    if not known:
        return Noise(float("nan"), "unknown", False)
    intervals = sorted(n for n in candidate.sources if not n.startswith("series"))
    names = [f"intervals ({'/'.join(intervals)})"] if intervals else []
    names += sorted(n for n in candidate.sources if n.startswith("series"))
    if applied:
        names.append("the machine's noise floor for the metric")
    if corrected and correction:
        names.append("the run correction's standard error")
    one_side = " (one side only)" if None in parts[:2] else ""
    return Noise(math.hypot(*known), " + ".join(names) + one_side, applied)


def holds(candidate: Candidate) -> bool:
    """Both levels seen in two runs or more, and the new level's figures beyond every figure the series
    had before the step: a level it never reached, not one it flips back to."""
    s = candidate.series
    a, b = s.value[:candidate.left[1]], s.value[slice(*candidate.right)]
    if candidate.left[1] - candidate.left[0] < 2 or len(b) < 2:
        return False
    return bool(a.max() < b.min() or a.min() > b.max())


def seen_before(candidate: Candidate, floor_sd: float | None) -> tuple[int, float] | None:
    """``(index, value)`` of the earliest figure before the step already at the new level, within one
    noise-floor SD of it, or beyond it the way the step goes; None when the series never reached it."""
    s = candidate.series
    before, after = candidate.levels
    shown = s.value[:candidate.left[1]]
    near = abs(after) * (floor_sd or 0.0)
    reached = shown >= after - near if after > before else shown <= after + near
    found = np.flatnonzero(reached)
    return (int(found[0]), float(shown[found[0]])) if len(found) else None


def _tolerance(candidate: Candidate) -> tuple[float, str]:
    """The absolute tolerance of the series' dtype, and the dtype; float32's, the strictest, where the
    run recorded none (Training has no dtype parameter, and older runs no ``dtypes`` setting)."""
    dtype = candidate.series.dtype[candidate.after]
    if dtype not in TOLERANCE:
        return TOLERANCE["float32"][0], "float32 (the run recorded no dtype; the strictest)"
    return TOLERANCE[dtype][0], dtype


def settings_changed(rows, before: int, after: int, metric: str, regime: str | None = None) -> str:
    """The settings ``metric`` depends on that differ (or are unrecorded on one side) across the step."""
    changes = []
    for name in metrics.settings_for(metric, regime):
        col = f"setting_{name}"
        a, b = (rows[col].iloc[i] if col in rows else float("nan") for i in (before, after))
        a, b = ("unrecorded" if x is None or x != x else str(x) for x in (a, b))
        if a != b:
            changes.append(f"{name} {a} -> {b}")
    return "; ".join(changes)


def versions_changed(rows, before: int, after: int) -> str:
    """Library versions and measurement settings (``setting_*``) that differ across the step."""
    changes = []
    for col in [c for c in rows.columns if c.startswith(("version_", "setting_"))]:
        a, b = rows[col].iloc[before], rows[col].iloc[after]
        if a != b and not (a != a and b != b):  # NaN == NaN here
            shown = ["unrecorded" if x != x else x for x in (a, b)]
            name = col.removeprefix("version_").replace("setting_", "setting ", 1)
            changes.append(f"{name} {shown[0]} -> {shown[1]}")
    return "; ".join(changes)


def judge(candidate: Candidate, floors: dict, periods: dict, repo: str | None) -> dict:
    """The step as one row, with its ``verdict`` and ``why``."""
    s, b, a = candidate.series, candidate.before, candidate.after
    rows = s.rows
    metric = metrics.get(s.metric) if s.metric in metrics.names() else None
    kind = metric.judged if metric is not None else "noise"
    runs_after = candidate.runs_at_new_level
    row = {**s.keys, "metric": s.metric, "direction": s.direction, "unit": s.unit, "judged": kind,
           "commit_before": s.commit[b], "commit_after": s.commit[a],
           "position_before": s.position[b], "position_after": s.position[a],
           "value_before": candidate.levels[0] * s.scale[b], "value_after": candidate.levels[1] * s.scale[a],
           "relative_change": candidate.relative, "run_shift": s.shift[a] / s.shift[b] - 1.0,
           "runs_after": runs_after, "versions_changed": versions_changed(rows, b, a),
           "definitions_before": metrics.definitions_version(s.definitions[b]),
           "definitions_after": metrics.definitions_version(s.definitions[a]),
           "uncertainty": float("nan"), "noise_source": "", "noise_relative": float("nan"),
           "code_changed": None, "commits": "", "host_changed": False, "why": ""}
    run = (f" (against its run, whose {noise.correction_metric(s.metric, s.platform[a]) or 'figures'} moved "
           f"{row['run_shift']:+.1%})" if row["run_shift"] else "")

    def verdict(name: str, why: str) -> dict:
        return {**row, "verdict": name, "why": why + (run if name != WITHIN_NOISE else "")}

    # 1. is it beyond what this kind of figure does by itself?
    if kind == "noise":
        judged = noise_of(candidate, floor_of(floors, s))
        level = abs(candidate.levels[0])
        row.update(uncertainty=judged.combined, noise_source=judged.source,
                   noise_relative=judged.combined / level if level else float("nan"))
        if judged.combined == judged.combined and not candidate.step > judged.combined:
            return verdict(WITHIN_NOISE, f"step {candidate.step:.3g} within the combined uncertainty "
                                         f"{judged.combined:.3g} ({judged.source}){run}")
    elif kind == "tolerance":
        tolerance, dtype = _tolerance(candidate)
        before, after = candidate.levels
        crossed = after > tolerance >= before
        rose = after - before > metrics.TOLERANCE_FRACTION * tolerance
        row.update(uncertainty=metrics.TOLERANCE_FRACTION * tolerance,
                   noise_source=f"{metrics.TOLERANCE_FRACTION:g} x the {dtype} tolerance {tolerance:g}")
        if not (crossed or rose):
            return verdict(WITHIN_TOLERANCE, f"{before:.3g} -> {after:.3g}: below the {dtype} tolerance "
                                             f"{tolerance:g}, a rise of {(after - before) / tolerance:.1%} "
                                             f"of it (alerts from {metrics.TOLERANCE_FRACTION:.0%} of it, "
                                             "or a crossing)")
    elif kind == "allocator":
        if not (holds(candidate) and candidate.step >= metrics.ALLOCATOR_MIN_STEP):
            return verdict(COMPANION, f"an allocator's figure alerts only for a step of "
                                      f"{metrics.ALLOCATOR_MIN_STEP / 2**20:g} MiB or more that holds on "
                                      f"both sides (two runs or more each, no overlap): "
                                      f"{candidate.left[1] - candidate.left[0]} run(s) before, {runs_after} "
                                      f"after; read it beside the other metrics' steps")
    # 2. what explains it
    if candidate.excursion and kind != "exact":
        return verdict(ONE_RUN, f"a one-run excursion: {row['value_before']:.3g} at "
                                f"{str(row['commit_before'])[:8]} alone; the series returns to (or beyond) "
                                "its level before that run")
    earlier = seen_before(candidate, floor_of(floors, s)) if kind == "noise" else None
    if earlier is not None:
        index, value = earlier
        return verdict(SEEN_BEFORE, f"the series was at this level before ({value * s.scale[index]:.3g} at "
                                    f"{str(s.commit[index])[:8]}) and came back from it: a level it flips "
                                    "between, not a new one")
    host = hosts.host_change_text(periods.get((s.machine, s.commit[b]), (0, "")),
                                  periods.get((s.machine, s.commit[a]), (0, "")), periods, s.machine)
    if host:
        row["host_changed"] = True
        return verdict(HOST_CHANGED, f"the two runs ran on different hosts: {host}")
    benchmark = str(s.keys.get("benchmark", "")).rsplit(".", 1)[0].rsplit(".", 1)[-1]
    implementation = _text(s.keys.get("implementation"))
    changes = metrics.definition_changes(s.metric, row["definitions_before"], row["definitions_after"],
                                         regime=_text(s.regime[a]), platform=s.platform[a],
                                         impl=implementation, benchmark=benchmark)
    if changes:
        return verdict(DEFINITION_CHANGED, "; ".join(f"definitions {c.version} ({c.date}): {c.reason}"
                                                     for c in changes))
    setting = settings_changed(rows, b, a, s.metric, _text(s.regime[a]))
    if setting:
        return verdict(SETTING_CHANGED, f"a setting {s.metric} depends on changed: {setting}")
    against = (f"{candidate.relative:+.1%} against noise ±{row['noise_relative']:.1%}"
               if row["noise_relative"] == row["noise_relative"] else f"{candidate.relative:+.1%} ({kind})")
    last = " (the series' last)" if candidate.ends_series else ""
    held = (f"held for {runs_after} runs{last}" if runs_after > 1 else
            "in the series' last run only" if candidate.ends_series else "seen in one run, then back")
    changed = code.code_changed_for(repo, str(s.commit[b]), str(s.commit[a]), implementation,
                                    str(s.keys.get("benchmark", "")))
    what = ("which code changed is unknown (git does not know these commits)" if changed is None
            else f"measured code changed: {', '.join(changed.files[:3])}")
    if changed is not None:
        row.update(code_changed=len(changed.files), commits=" | ".join(changed.commits))
    if changed is not None and not changed.files:
        others = code.files_changed(repo, str(s.commit[b]), str(s.commit[a])) or ()
        only = f" (only: {', '.join(others[:4])}{' ...' if len(others) > 4 else ''})" if others else ""
        return verdict(NO_CODE_CHANGE, "no code this series measures changed between the two commits" + only
                       + ": noise or the environment"
                       + (f" ({row['versions_changed']})" if row["versions_changed"] else ""))
    first_alone = candidate.left == (0, 1)  # the series' first figure is the whole level before
    if kind == "noise" and ((runs_after == 1 and candidate.ends_series) or first_alone):
        where = ("in the series' last run only: the next run confirms it or not" if runs_after == 1 else
                 "from a level of one run, the series' first: the runs before it are missing")
        return verdict(UNCONFIRMED, f"{against}, {where} (one figure cannot tell a level from an "
                                    f"outlier); {what}")
    if changed is None:
        return verdict(REGRESSION, f"{against}, {held}; {what}")
    listed = ", ".join(changed.files[:5]) + (f" and {len(changed.files) - 5} more" if len(changed.files) > 5
                                             else "")
    commits = "; ".join(changed.commits[:4]) + (" ..." if len(changed.commits) > 4 else "")
    return verdict(REGRESSION, f"{against}, {held}; measured code changed: {listed}; commits: {commits}")


# -- the tables ------------------------------------------------------------------------------------
def find_steps(frame, thresholds: dict | None = None, *, min_size: int = 1,
               min_absolute_step: dict | None = None, repo: str | None = None, relative_to_run: bool = True,
               factors: dict | None = None, changes=None, floors: dict | None = None):
    """One row per step beyond the threshold, with its ``verdict`` (``VERDICTS``) and ``why``, the two
    levels' combined ``uncertainty`` (metric units), ``code_changed`` (None: git cannot say) and the
    ``commits`` that changed the series' code.

    ``thresholds``: metric -> relative step (default 5%); ``min_absolute_step``: unit -> smallest step
    worth reporting; ``repo``: None skips the code check. ``relative_to_run``: judge the figures
    against their run (``noise.run_factors``). ``factors``, ``changes``, ``floors``: of the whole
    results where ``frame`` is a part of them.
    """
    import pandas as pd

    thresholds = thresholds or {}
    limits = MIN_ABSOLUTE_STEP if min_absolute_step is None else min_absolute_step
    ok = noise.usable(frame)
    if ok.empty:
        return pd.DataFrame([])
    repo = os.path.abspath(repo) if repo else None
    if not relative_to_run:
        factors = {}
    elif factors is None:
        factors = noise.run_factors(noise.correction_shifts(frame))
    periods = hosts.host_periods(hosts.host_changes(frame) if changes is None else changes)
    every = list(series_of(ok, factors))
    floors = floors_of(every) if floors is None else floors
    rows = []
    for series in every:
        threshold = thresholds.get(series.metric, DEFAULT_THRESHOLD)
        judged = metrics.get(series.metric).judged if series.metric in metrics.names() else "noise"
        floor_sd = floor_of(floors, series) if judged == "noise" else None
        for candidate in candidates(series, threshold, limits.get(series.unit, 0.0), min_size, floor_sd):
            rows.append(judge(candidate, floors, periods, repo))
    return pd.DataFrame(rows)


def find_regressions(frame, thresholds: dict | None = None, **kwargs):
    """One row per step whose ``find_steps`` verdict is ``regression``."""
    steps = find_steps(frame, thresholds, **kwargs)
    if steps.empty:
        return steps
    return steps[steps["verdict"] == REGRESSION].reset_index(drop=True)
