"""Judging one step a series took (``results/steps.py`` finds them): is it beyond what that kind of
figure does by itself, and if so, does anything but the code explain it. Reads, never writes.

Each step is judged by what its metric is (``Metric.judged``; docs/reports.md):

* ``noise``: the step must exceed the two levels' combined uncertainty, each level's never below the
  machine's noise floor for the metric (``steps.floors_of``), plus the run correction's own standard
  error where the figure is divided by its run's shift;
* ``exact``: deterministic figures (compiler bytes, counts, the compiled-for tier's figures): any step
  beyond the threshold is real, at once;
* ``allocator``: alerts only for a step that holds on both sides (two runs or more each, no overlap)
  and exceeds ``ALLOCATOR_MIN_STEP``;
* ``tolerance``: an error alerts when it crosses its dtype's tolerance or rises by more than
  ``TOLERANCE_FRACTION`` of it.

A step that passes is then explained, in order, as a one-run excursion, a level seen before, a host
change, a definition change (``DEFINITION_CHANGES``), a change of a setting the metric depends on
(``SETTINGS_THAT_MATTER``), or no change in the code the series measures (``results/code.py``); a
noise step in the series' last run only is ``unconfirmed`` until a paired re-measurement of the two
commits (``attnbench confirm``, ``results/confirmations.py``) confirms it or dismisses it. What is
left is a regression, naming the commits that changed that code, the step against the noise it beat,
and how many runs it has held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import attention_impls
from attention_impls.base import config_text
from attnbench.core import metrics
from attnbench.core.numerics import TOLERANCE
from attnbench.results import code, confirmations, hosts, noise
from attnbench.results.noise import SCATTER_Z
from attnbench.results.series import Candidate, Series, _text

# A noise step alerts beyond ALERT_Z standard deviations of each level (combined in quadrature): a
# 99.9% band, not 99%, as one history judges hundreds of candidate steps, and a 99% band let several
# noise-only steps through per synthetic history (tests/test_regression_rule.py; docs/reports.md).
ALERT_Z = 3.291
REGRESSION, WITHIN_NOISE = "regression", "within noise"
ONE_RUN, UNCONFIRMED, SEEN_BEFORE = "one-run excursion", "unconfirmed", "level seen before"
WITHIN_TOLERANCE, COMPANION = "within tolerance", "companion only"
HOST_CHANGED, DEFINITION_CHANGED, SETTING_CHANGED = "host changed", "definition changed", "setting changed"
NO_CODE_CHANGE, DISMISSED = "no measured code changed", "dismissed by re-measurement"
VERDICTS = (REGRESSION, UNCONFIRMED, DISMISSED, HOST_CHANGED, DEFINITION_CHANGED, SETTING_CHANGED,
            NO_CODE_CHANGE, ONE_RUN, SEEN_BEFORE, WITHIN_NOISE, WITHIN_TOLERANCE, COMPANION)
COMPILED_FOR_PREFIX = "compiled_"  # the compiled-for tier's metrics: compiler output, deterministic


def judged_kind(metric: str) -> str:
    """How a step of ``metric`` is judged: its row's ``judged`` in the metric table; the compiled-for
    tier's figures (the compiler's word, the same for the same compiler) exactly; else as noise."""
    if metric in metrics.names():
        return metrics.get(metric).judged
    return "exact" if str(metric).startswith(COMPILED_FOR_PREFIX) else "noise"


def floor_of(floors: dict, series: Series) -> float | None:
    """The noise floor of a series' figures: its kind's, else its metric's on its machine."""
    found = floors.get(series.kind)
    return found if found is not None else floors.get((series.machine, series.metric))


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


def stream_steps_changed(rows, before: int, after: int, regime: str | None) -> str:
    """``stream steps N -> M`` where a stream (the dynamic and bucketed regimes) timed another number
    of its trace's steps across the step: its figures (counts, padding, rates, costs) are of another
    prefix of the trace, other work; a cut stream stops where its budget or ceiling says."""
    if (regime or "static") == "static" or "stream_steps_timed" not in rows:
        return ""
    a, b = (rows["stream_steps_timed"].iloc[i] for i in (before, after))
    a, b = ("unrecorded" if x is None or x != x else f"{x:g}" for x in (a, b))
    if a == b or "unrecorded" in (a, b):
        return ""
    cut = rows["stream_cut"].iloc[after] if "stream_cut" in rows else None
    return f"stream steps timed {a} -> {b}" + (f" (cut: {cut})" if isinstance(cut, str) and cut else "")


def config_changed(rows, before: int, after: int, implementation: str) -> str:
    """``tile config A -> B`` where the kernel ran at another tile config across the step (``make tune``
    moved it); a run that recorded none ran at the kernel's defaults (before tuning existed)."""
    if "config" not in rows:
        return ""
    try:
        space = attention_impls.get(implementation).search_space
    except KeyError:
        return ""
    defaults = config_text(space.defaults) if space is not None else ""
    recorded = (rows["config"].iloc[i] for i in (before, after))
    a, b = (x if isinstance(x, str) and x else defaults for x in recorded)
    return f"tile config {a} -> {b} (results/tuning/)" if a != b else ""


def versions_changed(rows, before: int, after: int) -> str:
    """Library versions and measurement settings (``setting_*``) that differ across the step."""
    changes = []
    columns = [c for c in rows.columns if c.startswith(("version_", "setting_"))]
    pair = rows[columns].iloc[[before, after]].to_numpy(dtype=object)  # one take, not one per column
    for col, a, b in zip(columns, pair[0], pair[1], strict=True):
        if a != b and not (a != a and b != b):  # NaN == NaN here
            shown = ["unrecorded" if x != x else x for x in (a, b)]
            name = col.removeprefix("version_").replace("setting_", "setting ", 1)
            changes.append(f"{name} {shown[0]} -> {shown[1]}")
    return "; ".join(changes)


def judge(candidate: Candidate, floors: dict, periods: dict, repo: str | None, confirmed: dict | None,
          rows) -> dict:
    """The step as one row, with its ``verdict`` and ``why``; ``confirmed``: the paired re-measurements
    (``results/confirmations.py``), which confirm or dismiss a step of a figure that follows the step
    time before the history's noise or any explanation but a definition or setting change does;
    ``rows``: the step's two figures' rows, before and after (``steps._explaining_rows``): what
    explains it is in them."""
    s, b, a = candidate.series, candidate.before, candidate.after
    metric = metrics.get(s.metric) if s.metric in metrics.names() else None
    kind = judged_kind(s.metric)
    runs_after = candidate.runs_at_new_level
    found = (confirmations.lookup(confirmed, s.keys, s.machine, s.commit[b], s.commit[a])
             if kind == "noise" and metric is not None and metric.time_exponent else None)
    seen = found is not None and found["verdict"] == confirmations.SLOWER  # every step here is a slowdown
    refuted = found is not None and found["verdict"] in (confirmations.NO_CHANGE, confirmations.FASTER)
    row = {**s.keys, "metric": s.metric, "direction": s.direction, "unit": s.unit, "judged": kind,
           "commit_before": s.commit[b], "commit_after": s.commit[a],
           "position_before": s.position[b], "position_after": s.position[a],
           "value_before": candidate.levels[0] * s.scale[b], "value_after": candidate.levels[1] * s.scale[a],
           "relative_change": candidate.relative, "run_shift": s.shift[a] / s.shift[b] - 1.0,
           "runs_after": runs_after, "versions_changed": versions_changed(rows, 0, 1),
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
        if refuted:
            return verdict(DISMISSED, f"a paired re-measurement of both commits here found no such step: "
                                      f"{confirmations.words(found)}, {found['verdict']}")
        if not seen and judged.combined == judged.combined and not candidate.step > judged.combined:
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
    # 2. what explains it (a confirmed step is no excursion, old level or host's doing: both commits
    # were measured again here, in the same rounds)
    if candidate.excursion and kind != "exact" and not seen:
        return verdict(ONE_RUN, f"a one-run excursion: {row['value_before']:.3g} at "
                                f"{str(row['commit_before'])[:8]} alone; the series returns to (or beyond) "
                                "its level before that run")
    earlier = seen_before(candidate, floor_of(floors, s)) if kind == "noise" and not seen else None
    if earlier is not None:
        index, value = earlier
        return verdict(SEEN_BEFORE, f"the series was at this level before ({value * s.scale[index]:.3g} at "
                                    f"{str(s.commit[index])[:8]}) and came back from it: a level it flips "
                                    "between, not a new one")
    host = hosts.host_change_text(periods.get((s.machine, s.commit[b]), (0, "")),
                                  periods.get((s.machine, s.commit[a]), (0, "")), periods, s.machine)
    if host and not seen:
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
    setting = settings_changed(rows, 0, 1, s.metric, _text(s.regime[a])) \
        or stream_steps_changed(rows, 0, 1, _text(s.regime[a])) or config_changed(rows, 0, 1, implementation)
    if setting:
        return verdict(SETTING_CHANGED, f"a setting {s.metric} depends on changed: {setting}")
    against = (f"{candidate.relative:+.1%} against noise ±{row['noise_relative']:.1%}"
               if row["noise_relative"] == row["noise_relative"] else f"{candidate.relative:+.1%} ({kind})")
    last = (" (its host's last; a later host cannot say it held)" if candidate.ends_host
            else " (the series' last)" if candidate.ends_series else "")
    held = (f"held for {runs_after} runs{last}" if runs_after > 1 else
            "in its host's last run only" if candidate.ends_host else
            "in the series' last run only" if candidate.ends_series else "seen in one run, then back")
    changed = code.code_changed_for(repo, str(s.commit[b]), str(s.commit[a]), implementation,
                                    str(s.keys.get("benchmark", "")), s.metric, _text(s.regime[a]))
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
    if kind == "noise" and not seen and ((runs_after == 1 and candidate.ends_series) or first_alone):
        again = ("`attnbench confirm` measures both commits again, paired, or the next run confirms it"
                 if confirmations.settles(s.metric, _text(s.regime[a]))
                 else "a figure `attnbench confirm` cannot measure again (it times the static step): "
                      "the next run confirms it")
        where = ("in its host's last run only: the runs after it ran on another host, whose figures "
                 "cannot say whether the level held" if runs_after == 1 and candidate.ends_host else
                 f"in the series' last run only: {again}" if runs_after == 1 else
                 "from a level of one run, the series' first: the runs before it are missing")
        tried = (f"; the paired re-measurement could not tell ({confirmations.words(found)})"
                 if found is not None else "")
        return verdict(UNCONFIRMED, f"{against}, {where} (one figure cannot tell a level from an "
                                    f"outlier){tried}; {what}")
    if seen:
        against = f"{against}, confirmed by a paired re-measurement here ({confirmations.words(found)})"
    if changed is None:
        return verdict(REGRESSION, f"{against}, {held}; {what}")
    listed = ", ".join(changed.files[:5]) + (f" and {len(changed.files) - 5} more" if len(changed.files) > 5
                                             else "")
    commits = "; ".join(changed.commits[:4]) + (" ..." if len(changed.commits) > 4 else "")
    return verdict(REGRESSION, f"{against}, {held}; measured code changed: {listed}; commits: {commits}")
