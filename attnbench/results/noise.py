"""How far a figure can be trusted: its interval, its series' scatter, the machine's noise floor per
metric, and how far whole runs moved (with the run correction's own uncertainty). Reads, never writes.

A figure's uncertainty is never below what the machine's history shows for that metric
(``noise_floors``): a series that happens to be flat, or a level of one point, says nothing about how
much the next run can move. A run correction divides the steady step's figures by the run's shift of
seconds per step, and the compile and first-call figures by the shift of their own metric, never one
by the other's; its standard error over the run's series adds to the step's uncertainty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnbench.core import metrics

# Imported where used: pandas and scipy (the torch_xla venv has no report libraries).

# A figure without an interval: SCATTER_Z robust SDs of its series' scatter, a 99% band (as asv's).
SCATTER_Z = 2.576
MEDIAN_SE = 1.2533  # standard error of a median over n normal draws: 1.2533 sigma / sqrt(n)
IQR_SIGMA = 1.349  # interquartile range -> standard deviation of a normal distribution
MIN_RUN_SERIES = 3  # series a run shift needs; fewer and the run keeps the factor before it (a kept row)
# kernels those series must span: one kernel's series moving together are that kernel, not the machine
# (a run of one kernel, ATTNBENCH_IMPLS=..., would otherwise take its own change for the run's); two,
# as torch_xla's environment has two
MIN_RUN_KERNELS = 2
SERIES = ["machine", "env_name", "benchmark", "implementation", "seq_len", "workload", "phase", "regime",
          "dtype", "target", "mode", "length"]
PARAMS = SERIES[3:]


def column(frame, name, dtype=float):
    """``frame[name]`` as an array (floats coerced; NaN or None where the column is missing)."""
    if name not in frame:
        return np.full(len(frame), np.nan) if dtype is float else np.full(len(frame), None, dtype=object)
    if dtype is float:
        import pandas as pd

        return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
    return frame[name].to_numpy()


def order_column(frame) -> str:
    """``commit_order`` where the frame has one, else ``commit_position`` (hand-made frames)."""
    if "commit_order" in frame and frame["commit_order"].notna().any():
        return "commit_order"
    return "commit_position"


def is_contended(frame):
    """Rows of figures measured while the machine was busy (sidecar ``contended`` true)."""
    import pandas as pd

    if "contended" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["contended"].map(_true).astype(bool)


def _true(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == "true"
    try:
        return value == value and value is not None and bool(value)
    except (TypeError, ValueError):
        return False


def usable(frame):
    """The rows a series is made of: ok, placed in commit order, not contended. ``frame`` itself where
    every row is (callers only read it): a copy of a whole history is the report's largest allocation."""
    keep = (frame["status"] == "ok") & frame[order_column(frame)].notna() & ~is_contended(frame)
    return frame if keep.all() else frame[keep]


# -- one figure's interval -----------------------------------------------------------------------
def spans_rounds(frame):
    """Per row: whether its figure's interval spans timing rounds (``case_ci_basis == "rounds"``)."""
    return column(frame, "case_ci_basis", object) == "rounds"


def intervals(frame):
    """``(low, high, source)`` arrays over ``frame``'s rows, in the metric's units (NaN where none).
    Only intervals over independent timing rounds count: one window's interval is far narrower than
    the run-to-run noise, so such figures are judged by their series' scatter instead."""
    value = column(frame, "value")
    low, high = np.full(len(frame), np.nan), np.full(len(frame), np.nan)
    source = np.full(len(frame), None, dtype=object)
    metric = column(frame, "metric", object)
    between_rounds = spans_rounds(frame)
    candidates = [("ci", column(frame, "ci_low"), column(frame, "ci_high"), None),
                  ("quartiles", column(frame, "q_25"), column(frame, "q_75"), None),
                  ("engine", column(frame, "case_ci_low_s"), column(frame, "case_ci_high_s"),
                   metric == "seconds_per_step")]
    for name, lo, hi, only in candidates:
        good = (np.isfinite(lo) & np.isfinite(hi) & (hi >= lo) & np.isnan(low)
                & (lo <= value) & (value <= hi) & between_rounds)
        if only is not None:
            good &= only
        low[good], high[good], source[good] = lo[good], hi[good], name
    return low, high, source


# -- a series' scatter and the machine's floor ---------------------------------------------------
NORMAL_MAD = 0.6744897501960817  # scipy.special.ndtri(0.75): a normal's median absolute deviation / SD


def robust_sd(deviations) -> float:
    """The standard deviation of a normal distribution that gives ``deviations`` their median
    absolute size: scipy's ``median_abs_deviation(x, center=<zero>, scale="normal")``, 1.4826 x,
    about zero, not about their median, since each is already a figure's distance from where it
    should be (NaN for none, or with a NaN). Its arithmetic, without its argument checks: a report
    asks it for thousands of series (tests/test_analysis.py holds the two equal)."""
    values = np.asarray(deviations, dtype=float)
    if values.size == 0:
        return float("nan")
    return float(np.median(np.abs(values)) / NORMAL_MAD)


def series_scatter(frame):
    """Per series of ``frame`` (ok rows in commit order): the robust relative standard deviation of
    one figure from successive figures, ``robust_sd(v[i] / v[i-1] - 1) / sqrt(2)`` (steps barely
    move it), and the number of figures. Columns: the series keys, ``metric``, ``scatter``,
    ``figures``; ``scatter`` is NaN under three figures."""
    import pandas as pd

    ok = usable(frame)
    keys = [c for c in SERIES if c in ok]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "metric", "scatter", "figures"])
    ok = ok.sort_values([*keys, order_column(ok)])
    codes = ok.groupby(keys, dropna=False, sort=False).ngroup().to_numpy()
    value = pd.to_numeric(ok["value"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        move = value[1:] / value[:-1] - 1.0
    same = (codes[1:] == codes[:-1]) & np.isfinite(move) & (value[:-1] != 0)
    moves = pd.DataFrame({"code": codes[1:][same], "move": move[same]})
    spread = moves.groupby("code")["move"].agg(robust_sd) / math.sqrt(2.0)
    first = ok.groupby(codes, sort=True).first()
    table = first[keys + ["metric"]].copy()
    table["figures"] = pd.Series(codes).value_counts().sort_index().to_numpy()
    table["scatter"] = spread.reindex(table.index).to_numpy()
    table.loc[table["figures"] < 3, "scatter"] = np.nan  # one difference says nothing about noise
    return table.reset_index(drop=True)


# -- how far whole runs moved --------------------------------------------------------------------
def correction_metric(metric: str, platform: str | None) -> str | None:
    """The metric whose run shift a figure is divided by: seconds per step for the steady step's
    figures (``time_exponent``); the figure's own metric for those already over their run's own CPU
    probe (``per_run_peak`` on a CPU: the probe does not follow every kernel's move). None for the
    compile, first-call and with-compiles figures: they mix compilation with one step, in proportions
    that differ between compiled and eager kernels, so no run's shift describes them; their noise
    floor (the series' own kind's) carries the runs' drift instead. None for memory and counts."""
    if metric not in set(metrics.names()):
        return None
    row = metrics.get(metric)
    if row.per_run_peak and (platform or "cpu") == "cpu":
        return metric
    return "seconds_per_step" if row.time_exponent else None


def correction_exponent(metric: str, platform: str | None) -> int:
    """The power of its correction's shift a figure is divided by (0: not corrected)."""
    source = correction_metric(metric, platform)
    if source is None:
        return 0
    return metrics.get(metric).time_exponent if source == "seconds_per_step" else 1


def run_shifts(frame, metric: str = "seconds_per_step"):
    """How far each whole run moved in ``metric``: per machine x environment x benchmark class and
    consecutive commit pair, the median (``shift``), quartiles and standard error (``se``, of the
    median: 1.2533 x IQR / 1.349 / sqrt(series)) of after / before - 1 over the static series
    measured at both. Every series moving together is the machine or shared code, not a kernel: so
    the series must span ``MIN_RUN_KERNELS`` kernels (a run of one kernel has no shift of its own:
    a ``kept`` row, shift 0)."""
    import pandas as pd

    columns = ["machine", "env_name", "benchmark", "metric", "commit_before", "commit_after", "series",
               "shift", "q25", "q75", "se", "kept"]
    ok = usable(frame[(frame["metric"] == metric)]) if len(frame) else frame
    if "regime" in ok:
        ok = ok[ok["regime"].isna() | (ok["regime"] == "static")]
    params = [c for c in PARAMS if c in ok]
    if ok.empty or not params:
        return pd.DataFrame(columns=columns)
    order_col = order_column(ok)
    rows = []
    for (machine, env, benchmark), group in ok.groupby(["machine", "env_name", "benchmark"], sort=True):
        table = group.pivot_table(index=params, columns="commit_hash", values="value", aggfunc="first",
                                  dropna=False)
        order = group.groupby("commit_hash")[order_col].first().sort_values()
        commits = [c for c in order.index if c in table.columns]
        for before, after in zip(commits, commits[1:], strict=False):
            ratio = (table[after] / table[before]).dropna()
            ratio = ratio[np.isfinite(ratio) & (ratio > 0)]  # a 0 before (compiles, bytes) is no shift
            pair = {"machine": machine, "env_name": env, "benchmark": benchmark, "metric": metric,
                    "commit_before": before, "commit_after": after, "series": len(ratio)}
            if len(ratio) < MIN_RUN_SERIES or _kernels(ratio) < MIN_RUN_KERNELS:
                # too few to say how the run moved: it keeps the factor before it (``kept``)
                rows.append({**pair, "shift": 0.0, "q25": 0.0, "q75": 0.0, "se": 0.0, "kept": True})
                continue
            q25, q75 = float(ratio.quantile(0.25)), float(ratio.quantile(0.75))
            rows.append({**pair, "shift": float(ratio.median()) - 1.0, "q25": q25 - 1.0, "q75": q75 - 1.0,
                         "se": MEDIAN_SE * (q75 - q25) / IQR_SIGMA / math.sqrt(len(ratio)), "kept": False})
    return pd.DataFrame(rows, columns=columns)


def _kernels(ratio) -> int:
    """How many implementations a pivot's rows (indexed by ``PARAMS``) span; a frame without an
    implementation column passes (``MIN_RUN_KERNELS``)."""
    names = getattr(ratio.index, "names", None) or []
    if "implementation" not in names:
        return MIN_RUN_KERNELS
    return int(ratio.index.get_level_values("implementation").nunique())


def is_kept(value) -> bool:
    """Whether a ``run_shifts`` row's ``kept`` (a bool, numpy's, a CSV's text, or missing) is true."""
    return value is not None and value == value and str(value) == "True"


def correction_shifts(frame):
    """``run_shifts`` of every metric some figure is corrected by (``correction_metric``)."""
    import pandas as pd

    sources = {correction_metric(m.name, "gpu") for m in metrics.METRICS} - {None}
    present = set(frame["metric"].unique()) if "metric" in frame else set()
    shifts = [run_shifts(frame, source) for source in sorted(sources) if source in present]
    return pd.concat(shifts, ignore_index=True) if shifts else run_shifts(frame.iloc[0:0])


@dataclass(frozen=True)
class RunFactor:
    """A run's speed in one metric against the first run of its chain, and the variance the chain's
    links add up to (relative, from each link's standard error)."""

    factor: float
    variance: float


def run_factors(shifts) -> dict:
    """``{(machine, env_name, class, metric, commit): RunFactor}``: each run against the first of its
    chain of ``run_shifts`` pairs; a run after a pair with too few series keeps the previous one (a
    ``kept`` pair). A class whose every pair was kept has no chain of its own (its figures follow
    their environment's busiest class: ``steps._factor_chains``)."""
    factors, last = {}, {}
    rows = shifts.to_dict("records")

    def group_of(row) -> tuple:
        return (row["machine"], row["env_name"], str(row["benchmark"]).rsplit(".", 1)[0],
                row.get("metric", "seconds_per_step"))

    measured = {group_of(row) for row in rows if not is_kept(row.get("kept"))}
    for row in rows:
        group = group_of(row)
        if group not in measured:
            continue
        before = factors.setdefault((*group, row["commit_before"]), last.get(group, RunFactor(1.0, 0.0)))
        se = row.get("se")
        se = se if se == se and se is not None else 0.0
        last[group] = factors[(*group, row["commit_after"])] = RunFactor(
            before.factor * (1.0 + row["shift"]), before.variance + se**2)
    return factors
