"""Steps in the tidy results: every series in commit order, the machine's noise floor per kind of
figure, and the steps asv's step detection finds beyond the threshold (directions honoured), each
judged by ``results/judge.py``. Reads, never writes.
"""

from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np

from attnbench.core import metrics
from attnbench.results import code, confirmations, hosts, noise
from attnbench.results.judge import (  # noqa: F401  (the verdicts' names, as callers import them here)
    ALERT_Z,
    COMPANION,
    DEFINITION_CHANGED,
    DISMISSED,
    HOST_CHANGED,
    NO_CODE_CHANGE,
    ONE_RUN,
    REGRESSION,
    SEEN_BEFORE,
    SETTING_CHANGED,
    UNCONFIRMED,
    VERDICTS,
    WITHIN_NOISE,
    WITHIN_TOLERANCE,
    _text,
    floor_of,
    judge,
    judged_kind,
)
from attnbench.results.noise import column
from attnbench.results.series import Candidate, Series

# Imported where used: pandas (the torch_xla venv has no report libraries); asv (the main venv only).
DEFAULT_THRESHOLD = 0.05
# Steps smaller than this in absolute terms are noise whatever their relative size: the process's
# resident high-water mark moves in 4 KiB pages, so 0 -> 8 KiB would read as an infinite regression.
MIN_ABSOLUTE_STEP = {"bytes": 2**20}

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


EXPLAINING_PREFIXES = ("version_", "setting_")  # the columns judge.py explains a step with
EXPLAINING = ("config", "stream_steps_timed", "stream_cut")


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

def noise_floors(frame, factors: dict | None = None) -> dict[tuple, float]:
    """``floors_of`` the usable series of ``frame``, corrected by ``factors`` (default: its own)."""
    factors = noise.run_factors(noise.correction_shifts(frame)) if factors is None else factors
    return floors_of(all_series(frame, factors))


def all_series(frame, factors: dict) -> list[Series]:
    """Every series of ``frame``'s usable rows (``noise.usable``), corrected by ``factors``: what the
    noise floors and the steps are both found in."""
    ok = noise.usable(frame)
    return list(series_of(ok, factors)) if not ok.empty else []


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
# the middle of 12 figures of 5% noise is found 97-99% of the time, a noise-only series split in
# about 3% (by a step beyond 10% in about 1.2%; simulated, docs/reports.md); asv's own choice of the
# penalty (detect_steps) found such a step in about half of the series, as it reads a step in a short
# series as correlated noise.
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


def _host_spans(steps: list[tuple], hosts_of: list | None) -> list[list[tuple]]:
    """The fitted levels of each host period but the last, cut to the period, where the series ran on
    more than one host: asv's ``detect_regressions`` keeps only a step that lasts to the latest level,
    and a later host's level (scaled by its run factor) says nothing of whether a step on an earlier
    host lasted. A host period's own latest level does."""
    if not hosts_of or len(set(hosts_of)) < 2:
        return []
    spans, start = [], 0
    for j in range(1, len(hosts_of) + 1):
        if j == len(hosts_of) or hosts_of[j] != hosts_of[start]:
            spans.append((start, j))
            start = j
    return [[(max(left, a), min(right, b), *rest) for left, right, *rest in steps if left < b and right > a]
            for a, b in spans[:-1] if b - a > 1]


def candidates(series: Series, threshold: float, floor: float, min_size: int = 1,
               floor_sd: float | None = None, hosts_of: list | None = None) -> list[Candidate]:
    """The steps of one series beyond ``threshold`` and the absolute ``floor`` (``fit_levels``, then
    asv's ``detect_regressions`` on the whole series and on each earlier host's part of it,
    ``_host_spans``); ``floor_sd``: the noise floor of the series' kind, if it has one; ``hosts_of``:
    each figure's host period."""
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
    found = []
    for part in [steps, *_host_spans(steps, hosts_of)]:
        for step in detect_regressions(part, threshold=threshold, min_size=min_size)[2] or ():
            if all(step[:2] != seen[:2] for seen in found):
                found.append(step)
    segments = {(left, right) for left, right, *_ in steps}
    levels = {(left, right): level for left, right, level, *_ in steps}
    out = []
    for before, after, value_before, value_after in found:
        shown_levels = (1.0 / value_before, 1.0 / value_after) if higher else (value_before, value_after)
        if abs(shown_levels[1] - shown_levels[0]) < floor:
            continue
        left = next(((a, b) for a, b in segments if b - 1 == before), (before, before + 1))
        right = next(((a, b) for a, b in segments if a == after), (after, after + 1))
        prior = next((levels[(a, b)] for a, b in segments if b == left[0]), None)
        excursion = (left[1] - left[0] == 1 and prior is not None
                     and value_after <= prior + threshold * abs(prior))
        end = next((j for j in range(after + 1, len(hosts_of or ())) if hosts_of[j] != hosts_of[after]), None)
        if end is not None:
            right = (right[0], min(right[1], end))
        out.append(Candidate(series, before, after, left, right, shown_levels, excursion, end=end))
    return out

# -- the tables ------------------------------------------------------------------------------------
def find_steps(frame, thresholds: dict | None = None, *, min_size: int = 1,
               min_absolute_step: dict | None = None, repo: str | None = None, relative_to_run: bool = True,
               factors: dict | None = None, changes=None, floors: dict | None = None,
               confirmed: dict | None = None, series: list[Series] | None = None):
    """One row per step beyond the threshold, with its ``verdict`` (``VERDICTS``) and ``why``, the two
    levels' combined ``uncertainty`` (metric units), ``code_changed`` (None: git cannot say) and the
    ``commits`` that changed the series' code.

    ``thresholds``: metric -> relative step (default 5%); ``min_absolute_step``: unit -> smallest step
    worth reporting; ``repo``: None skips the code check. ``relative_to_run``: judge the figures
    against their run (``noise.run_factors``). ``factors``, ``changes``, ``floors``: of the whole
    results where ``frame`` is a part of them. ``confirmed``: paired re-measurements of steps
    (``results.confirmations.load``). ``series``: ``all_series(frame, factors)`` already made.
    """
    import pandas as pd

    thresholds = thresholds or {}
    limits = MIN_ABSOLUTE_STEP if min_absolute_step is None else min_absolute_step
    repo = os.path.abspath(repo) if repo else None
    if not relative_to_run:
        factors = {}
    elif factors is None:
        factors = noise.run_factors(noise.correction_shifts(frame))
    every = all_series(frame, factors) if series is None else series
    if not every:
        return pd.DataFrame([])
    periods = hosts.host_periods(hosts.host_changes(frame) if changes is None else changes)
    floors = floors_of(every) if floors is None else floors
    found = []
    for one in every:
        threshold = thresholds.get(one.metric, DEFAULT_THRESHOLD)
        floor_sd = floor_of(floors, one) if judged_kind(one.metric) == "noise" else None
        hosts_of = [periods.get((one.machine, c), (0, ""))[0] for c in one.commit]
        found += candidates(one, threshold, limits.get(one.unit, 0.0), min_size, floor_sd, hosts_of)
    explaining = _explaining_rows(found)
    return pd.DataFrame([judge(c, floors, periods, repo, confirmed, rows=rows)
                         for c, rows in zip(found, explaining, strict=True)])


def _explaining_rows(found: list[Candidate]) -> list:
    """Each candidate's two figures' rows (before, after), of the columns that can explain a step
    (``EXPLAINING``): one selection of the series' table for all candidates, as plain objects, not one
    selection of the wide table for each."""
    import pandas as pd

    if not found:
        return []
    ok = found[0].series.table  # every series of one call is of one table
    pairs = [c.series.index[[c.before, c.after]] for c in found]
    wanted = np.unique(np.concatenate(pairs))
    columns = [c for c in ok.columns if c.startswith(EXPLAINING_PREFIXES) or c in EXPLAINING]
    values = ok[columns].iloc[wanted].to_numpy(dtype=object)
    table = pd.DataFrame(values, columns=columns, dtype=object)  # one block: two rows of it per candidate
    return [table.iloc[np.searchsorted(wanted, pair)] for pair in pairs]


def find_regressions(frame, thresholds: dict | None = None, **kwargs):
    """One row per step whose ``find_steps`` verdict is ``regression``."""
    steps = find_steps(frame, thresholds, **kwargs)
    if steps.empty:
        return steps
    return steps[steps["verdict"] == REGRESSION].reset_index(drop=True)


# -- what a paired re-measurement can settle ---------------------------------------------------
# What a re-measurement can settle: steps the history cannot call (within its noise, seen in the
# last run only, a level seen before, a one-run excursion, a host change) or calls on one figure.
CONFIRMABLE = {UNCONFIRMED, WITHIN_NOISE, SEEN_BEFORE, ONE_RUN, HOST_CHANGED, REGRESSION}
NOT_CONFIRMABLE = {DEFINITION_CHANGED, SETTING_CHANGED, NO_CODE_CHANGE}


def to_confirm(frame, steps, machine: str, repo: str, done: dict | None = None) -> list[dict]:
    """The steps at ``machine``'s newest commit a paired re-measurement can settle, one per case
    (several metrics of one case share its measurement): ``{"commit_before", "commit_after",
    "env_name", "suite", "implementation", "seq_len", "workload", "phase", "dtype", "metrics"}``; not
    those ``done`` (``results.confirmations.load``) already holds."""
    if steps is None or steps.empty:
        return []
    mine = frame[frame["machine"] == machine]
    if mine.empty:
        return []
    order = noise.order_column(mine)
    newest = mine.loc[mine[order].idxmax(), "commit_hash"]
    newest_steps = mine[(mine["commit_hash"] == newest) & (mine["metric"] == "seconds_per_step")]
    found: dict[tuple, dict] = {}
    for r in steps[(steps["machine"] == machine) & (steps["commit_after"] == newest)].to_dict("records"):
        metric = r["metric"]
        if (not confirmations.settles(metric, r.get("regime"))
                or r["verdict"] not in CONFIRMABLE or r.get("judged") != "noise"
                or confirmations.lookup(done, r, machine, str(r["commit_before"]), str(newest))):
            continue
        if not code.paired_measurement_at(repo, str(r["commit_before"])):
            continue  # measured whole by its own engine there: no paired re-measurement
        if _ran_tuned(newest_steps, r):
            continue  # compare builds a kernel at its defaults: a tuned config's step waits for its run
        suite = confirmations.suite_of(r["benchmark"])
        changed = code.code_changed_for(repo, str(r["commit_before"]), str(newest), r.get("implementation"),
                                        str(r["benchmark"]))
        if changed is not None and not changed.files:
            continue  # no code it measures changed: there is nothing to measure again
        key = confirmations.case_key(machine, r["env_name"], suite, r["implementation"], r.get("seq_len"),
                                     r.get("workload"), r.get("phase"), r.get("dtype"))
        entry = found.setdefault((*key, r["commit_before"]), {
            "commit_before": str(r["commit_before"]), "commit_after": str(newest), "env_name": r["env_name"],
            "suite": suite, "implementation": r["implementation"], "seq_len": _plain(r.get("seq_len")),
            "workload": _plain(r.get("workload")), "phase": _plain(r.get("phase")),
            "dtype": _plain(r.get("dtype")), "metrics": []})
        entry["metrics"].append(metric)
    return list(found.values())


def _ran_tuned(rows, step: dict) -> bool:
    """Whether the step's case ran at a tuned config other than its kernel's defaults, as ``rows`` (the
    static step times of the step's newest commit) say: ``config_source`` tuned, and rounds at the
    defaults beside."""
    if "config_source" not in rows or "defaults_round_ids" not in rows:
        return False
    same = ((rows["implementation"] == step.get("implementation"))
            & (rows["benchmark"].str.rsplit(".", n=1).str[0] == str(step["benchmark"]).rsplit(".", 1)[0]))
    for field in ("seq_len", "workload", "phase", "dtype"):
        value = step.get(field)
        if field in rows and isinstance(value, (str, int, float)) and value == value:
            same &= rows[field] == value
    hit = rows[same]
    return bool(((hit["config_source"] == "tuned") & hit["defaults_round_ids"].notna()).any())


def _plain(value):
    if value is None or value != value:
        return None
    return int(value) if isinstance(value, float) and value.is_integer() else value
