"""Regressions and cost spikes in the tidy results, and what moved with them. Reads, never writes.

``find_steps`` runs asv's step detection per series in commit order (directions honoured; a figure
that follows the step time is divided by its run's factor, so a machine moving a whole run is no
kernel's step) and gives each step a verdict (``VERDICTS``; docs/reports.md). Contended figures are
left out of every series. ``find_cost_spikes`` attributes cost regressions to what moved with them;
``noise_floor``, ``run_shifts`` and ``host_changes`` say how noisy each machine is, how far whole runs
moved (which no interval within a run can see) and which host each run ran on.
"""

from __future__ import annotations

import functools
import glob
import math
import os
import subprocess
from dataclasses import dataclass

from attnbench.core import metrics
from attnbench.hardware.fingerprint import IDENTITY
from attnbench.hardware.fingerprint import identity
from attnbench.asv import sidecar
import numpy as np
import re
from collections import Counter
import warnings
# Imported where used: pandas (the torch_xla venv has no report libraries); asv (the main venv only).

PARAMS = ["implementation", "seq_len", "workload", "phase", "regime", "dtype", "target", "mode", "length"]
# workload, phase: Models; target, mode: CompiledFor; workload, phase, length: CompiledForModels
SERIES = ["machine", "env_name", "benchmark", *PARAMS]
DEFAULT_THRESHOLD = 0.05
# Steps smaller than this in absolute terms are noise whatever their relative size: the process's
# resident high-water mark moves in 4 KiB pages, so 0 -> 8 KiB would read as an infinite regression.
MIN_ABSOLUTE_STEP = {"bytes": 2**20}
# A figure without an interval: SCATTER_Z robust SDs of its series' scatter, a 99% band (as asv's).
SCATTER_Z = 2.576
MAD_SIGMA = 1.4826  # MAD -> standard deviation of a normal distribution
# A step is the code's only where these differ: the kernels, the harness minus its reports, the suite.
MEASURED_CODE = ("attention_impls", "attnbench", "benchmarks")
NOT_MEASURED = ("attnbench/report/", "attnbench/results/", "attnbench/checks/selfcheck_report.py",
                "attnbench/offline_html/",
                # their paths in older commits
                "attnbench/analysis.py", "attnbench/asv_results.py", "attnbench/selfcheck_report.py")
NOT_MEASURED_SUFFIXES = (".md", ".rst", ".txt", ".ipynb")
REGRESSION, WITHIN_NOISE = "regression", "within noise"
NO_CODE_CHANGE, DEFINITION_CHANGED = "no measured code changed", "definition changed"
HOST_CHANGED = "host changed"
VERDICTS = (REGRESSION, HOST_CHANGED, DEFINITION_CHANGED, NO_CODE_CHANGE, WITHIN_NOISE)


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


# -- what a figure's uncertainty is -----------------------------------------------------------------
def _column(frame, name, dtype=float):
    if name not in frame:
        return np.full(len(frame), np.nan) if dtype is float else np.full(len(frame), None, dtype=object)
    if dtype is float:
        import pandas as pd

        return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)
    return frame[name].to_numpy()


def _spans_rounds(frame):
    """Per row: whether its figure's interval spans timing rounds (``case_ci_basis == "rounds"``)."""
    return _column(frame, "case_ci_basis", object) == "rounds"


def intervals(frame):
    """``(low, high, source)`` arrays over ``frame``'s rows, in the metric's units (NaN where none).
    Only intervals over independent timing rounds count: one window's interval is far narrower than
    the run-to-run noise, so such figures are judged by their series' scatter instead."""
    value = _column(frame, "value")
    low, high = np.full(len(frame), np.nan), np.full(len(frame), np.nan)
    source = np.full(len(frame), None, dtype=object)
    metric = _column(frame, "metric", object)
    between_rounds = _spans_rounds(frame)
    candidates = [("ci", _column(frame, "ci_low"), _column(frame, "ci_high"), None),
                  ("quartiles", _column(frame, "q_25"), _column(frame, "q_75"), None),
                  ("engine", _column(frame, "case_ci_low_s"), _column(frame, "case_ci_high_s"),
                   metric == "seconds_per_step")]
    for name, lo, hi, only in candidates:
        good = (np.isfinite(lo) & np.isfinite(hi) & (hi >= lo) & np.isnan(low)
                & (lo <= value) & (value <= hi) & between_rounds)
        if only is not None:
            good &= only
        low[good], high[good], source[good] = lo[good], hi[good], name
    return low, high, source


def series_scatter(frame):
    """Per series of ``frame`` (ok rows in commit order): the robust relative standard deviation of
    successive figures, ``1.4826 * median(|v[i] / v[i-1] - 1|) / sqrt(2)`` (steps barely move it),
    and the number of figures. Columns: the series keys, ``metric``, ``scatter``, ``figures``."""
    import pandas as pd

    order_col = _order_column(frame)
    ok = frame[(frame["status"] == "ok") & frame[order_col].notna()]
    ok = ok[~is_contended(ok)]
    keys = [c for c in SERIES if c in ok]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "metric", "scatter", "figures"])
    ok = ok.sort_values([*keys, order_col])
    codes = ok.groupby(keys, dropna=False, sort=False).ngroup().to_numpy()
    value = pd.to_numeric(ok["value"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.abs(value[1:] / value[:-1] - 1.0)
    same = (codes[1:] == codes[:-1]) & np.isfinite(diff) & (value[:-1] != 0)
    diffs = pd.DataFrame({"code": codes[1:][same], "d": diff[same]})
    spread = diffs.groupby("code")["d"].median() * MAD_SIGMA / math.sqrt(2.0)
    first = ok.groupby(codes, sort=True).first()
    table = first[keys + ["metric"]].copy()
    table["figures"] = pd.Series(codes).value_counts().sort_index().to_numpy()
    table["scatter"] = spread.reindex(table.index).to_numpy()
    table.loc[table["figures"] < 3, "scatter"] = np.nan  # one difference says nothing about noise
    return table.reset_index(drop=True)


def _order_column(frame) -> str:
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


def _text(value):
    """A text cell, None where it is missing (None or NaN)."""
    return value if isinstance(value, str) and value else None


# -- which code changed between two commits ----------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def measured_code_changed(repo: str | None, before: str, after: str) -> tuple[str, ...] | None:
    """The measured files that differ between two commits (``git diff``); None where git cannot say."""
    if not repo:
        return None
    try:
        out = subprocess.run(["git", "diff", "--name-only", before, after, "--", *MEASURED_CODE], cwd=repo,
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    files = [f for f in out.splitlines() if f.strip()]
    return tuple(f for f in files if not f.startswith(NOT_MEASURED) and not f.endswith(NOT_MEASURED_SUFFIXES))


KERNEL_DIR = "attention_impls/"
KERNEL_SHARED = ("base.py", "registry.py", "__init__.py")  # with every "_*.py": shared by all kernels


def _kernel_module(path: str) -> str | None:
    """The kernel module a changed file is (``attention_impls/jax_xla.py`` -> ``jax_xla``: one kernel
    per file), or None for anything else, shared kernel code included."""
    if not path.startswith(KERNEL_DIR):
        return None
    name = path[len(KERNEL_DIR):]
    if "/" in name or not name.endswith(".py") or name.startswith("_") or name in KERNEL_SHARED:
        return None
    return name[:-3]


def _git_text(repo: str, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


KERNEL_IMPORT = r"attention_impls\.[A-Za-z0-9_]+"  # a Python regex and a `git grep -E` pattern


def _kernel_imports(text: str) -> list[str]:
    """The modules ``attention_impls.<module>`` that ``text`` names."""
    return [m.removeprefix("attention_impls.") for m in re.findall(KERNEL_IMPORT, text)]


@functools.lru_cache(maxsize=1024)
def _kernel_modules_of_harness(repo: str, commit: str) -> frozenset[str]:
    """The kernel modules the measured harness itself imports at ``commit`` (the float64 reference
    checks every kernel): every kernel's series depends on them."""
    excluded = [f":(exclude){path}" for path in NOT_MEASURED]
    text = _git_text(repo, "grep", "-h", "-o", "-E", KERNEL_IMPORT, commit, "--", "attnbench", "benchmarks",
                     *excluded) or ""
    return frozenset(_kernel_imports(text))


@functools.lru_cache(maxsize=4096)
def _kernel_modules_used(repo: str, commit: str, implementation: str) -> frozenset[str]:
    """The kernel modules ``implementation`` runs at ``commit``: its own file, the kernel files it
    imports (transitively), and those the harness itself imports."""
    seen, todo = set(), [implementation.replace("-", "_")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_kernel_imports(_git_text(repo, "show", f"{commit}:{KERNEL_DIR}{module}.py") or ""))
    return frozenset(seen) | _kernel_modules_of_harness(repo, commit)


def code_changed_for(repo: str | None, before: str, after: str, implementation: str | None):
    """``measured_code_changed`` narrowed to what ``implementation`` runs: another kernel's file
    (one it does not import) changes nothing it measures. None where git cannot say."""
    files = measured_code_changed(repo, before, after)
    if not files or not implementation:
        return files
    used = (_kernel_modules_used(repo, after, implementation)
            | _kernel_modules_used(repo, before, implementation))
    return tuple(f for f in files if _kernel_module(f) is None or _kernel_module(f) in used)


# -- which host each run ran on --------------------------------------------------------------------
def run_hosts(frame):
    """Per machine x commit (a run), oldest first: ``identity`` (its sidecar's host fingerprint, None
    where none), ``probe`` (CPU GEMM probe TFLOP/s: recorded, else float32 TFLOP/s over MFU on a CPU),
    ``probe_source``, ``probe_spread`` (best round over median - 1) and ``fingerprint`` (a dict)."""
    import pandas as pd


    columns = ["machine", "commit_hash", "order", "identity", "probe", "probe_source", "probe_spread"]
    order_col = _order_column(frame) if len(frame) else "commit_position"
    if frame.empty or order_col not in frame:
        return pd.DataFrame(columns=columns)
    derived = _derived_probes(frame)
    host_cols = [f"host_{k}" for k in IDENTITY if f"host_{k}" in frame]
    rows = []
    probe_cols = [c for c in ("host_gemm_peak_tflops", "host_gemm_median_tflops") if c in frame]
    for (machine, commit), run in frame.groupby(["machine", "commit_hash"], sort=False):
        # a run's environments without a sidecar host (the compiled-for tier's) leave these empty
        recorded = {c: run[c].dropna() for c in host_cols + probe_cols}
        fingerprint = {c.removeprefix("host_"): (recorded[c].iloc[0] if len(recorded[c]) else None)
                       for c in host_cols}
        best, median = (_number(recorded[c].iloc[0]) if c in recorded and len(recorded[c]) else float("nan")
                        for c in ("host_gemm_peak_tflops", "host_gemm_median_tflops"))
        if best == best:
            probe, source = best, "recorded"
            spread = best / median - 1.0 if median == median and median > 0 else float("nan")
        else:
            probe = derived.get((machine, commit), float("nan"))
            source, spread = ("tflops / mfu" if probe == probe else None), float("nan")
        rows.append({"machine": machine, "commit_hash": commit, "order": run[order_col].min(),
                     "identity": identity(fingerprint), "fingerprint": fingerprint, "probe": probe,
                     "probe_source": source, "probe_spread": spread})
    out = pd.DataFrame(rows, columns=[*columns, "fingerprint"])
    out = out[np.isfinite(pd.to_numeric(out["order"], errors="coerce"))]
    return out.sort_values(["machine", "order"]).reset_index(drop=True)


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _derived_probes(frame) -> dict:
    """``{(machine, commit): probe TFLOP/s}`` from the float32 rows of CPU machines: TFLOP/s over MFU
    (the engine's MFU is TFLOP/s over the run's probe), the median over the run's cases."""
    import pandas as pd

    keys = [c for c in ("machine", "env_name", "commit_hash", "implementation", "seq_len", "regime")
            if c in frame]
    part = frame[(frame["metric"].isin(["tflops", "mfu"])) & (frame["status"] == "ok")]
    if "dtype" in part:
        part = part[part["dtype"] == "float32"]
    if "machine_platform" in part:
        part = part[part["machine_platform"] == "cpu"]
    if part.empty:
        return {}
    part = part.assign(suite=part["benchmark"].str.rsplit(".", n=1).str[0])
    wide = part.pivot_table(index=[*keys, "suite"], columns="metric", values="value", aggfunc="first")
    if not {"tflops", "mfu"} <= set(wide.columns):
        return {}
    peak = (pd.to_numeric(wide["tflops"]) / pd.to_numeric(wide["mfu"])).dropna()
    peak = peak[peak > 0]
    return peak.groupby(level=["machine", "commit_hash"]).median().to_dict()


def host_changes(frame, hosts=None):
    """Each machine's consecutive runs and whether the host changed (``changed``, ``why``): both
    fingerprints recorded and different, or the CPU GEMM probe moved beyond ``probe_noise`` (from the
    machine's probe scatter or the runs' own round spreads; no probe test under three moves)."""
    import pandas as pd

    hosts = run_hosts(frame) if hosts is None else hosts
    columns = ["machine", "commit_before", "commit_after", "changed", "why", "probe_move", "probe_noise"]
    rows = []
    for machine, runs in hosts.groupby("machine", sort=True):
        probe = runs["probe"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            moves = probe[1:] / probe[:-1] - 1.0
        known = np.abs(moves[np.isfinite(moves)])
        scatter_band = (SCATTER_Z * MAD_SIGMA * float(np.median(known))) if len(known) >= 3 else float("nan")
        records = runs.to_dict("records")
        for a, b, move in zip(records, records[1:], moves, strict=False):
            spreads = (x if x == x else 0.0 for x in (a["probe_spread"], b["probe_spread"]))
            own = SCATTER_Z * math.hypot(*spreads)
            noise = max(scatter_band, own) if scatter_band == scatter_band else float("nan")
            why = []
            if _text(a["identity"]) and _text(b["identity"]) and a["identity"] != b["identity"]:
                before, after = a["fingerprint"], b["fingerprint"]
                why += [f"{k} {before.get(k)} -> {after.get(k)}" for k in before
                        if before.get(k) != after.get(k)]
            if move == move and noise == noise and abs(move) > noise:
                why.append(f"CPU GEMM probe {a['probe']:.3g} -> {b['probe']:.3g} TFLOP/s ({move:+.1%}, "
                           f"beyond its noise ±{noise:.1%})")
            rows.append({"machine": machine, "commit_before": a["commit_hash"],
                         "commit_after": b["commit_hash"], "changed": bool(why), "why": "; ".join(why),
                         "probe_move": move, "probe_noise": noise})
    return pd.DataFrame(rows, columns=columns)


def host_periods(changes) -> dict:
    """``{(machine, commit): (period, why)}``: each machine's runs numbered by host period, with why
    the period's host differs."""
    periods, current = {}, {}
    for row in changes.to_dict("records"):
        machine = row["machine"]
        period = periods.setdefault((machine, row["commit_before"]), (current.get(machine, 0), ""))[0]
        if row["changed"]:
            period += 1
        current[machine] = period
        periods[(machine, row["commit_after"])] = (period, row["why"] if row["changed"] else "")
    return periods


def hosts_table(frame, changes=None, hosts=None):
    """Per machine: ``runs``, ``fingerprinted``, ``hosts`` (1 + host changes), ``host_changes`` and
    ``probe_noise``. ``hosts``, ``changes``: ``run_hosts`` and ``host_changes`` if already computed."""
    import pandas as pd

    hosts = run_hosts(frame) if hosts is None else hosts
    changes = host_changes(frame, hosts) if changes is None else changes
    rows = []
    for machine, runs in hosts.groupby("machine", sort=True):
        mine = changes[changes["machine"] == machine]
        rows.append({"machine": machine, "runs": len(runs),
                     "fingerprinted": int(runs["identity"].map(_text).notna().sum()),
                     "hosts": 1 + int(mine["changed"].sum()), "host_changes": int(mine["changed"].sum()),
                     "probe_noise": float(mine["probe_noise"].median()) if len(mine) else float("nan")})
    return pd.DataFrame(rows, columns=["machine", "runs", "fingerprinted", "hosts", "host_changes",
                                       "probe_noise"])


# -- steps ----------------------------------------------------------------------------------------
def _side_uncertainty(rel, points, level):
    """A level's uncertainty from its figures' relative half-widths (facing the other level), or None."""
    known = rel[points]
    known = known[np.isfinite(known)]
    return float(np.median(known)) * abs(level) if len(known) else None


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
    return MAD_SIGMA * float(np.median(np.abs(residuals)))


def reading_scatter(values, before: int, after: int):
    """Standard deviation of one figure from its series' successive differences (RMS over sqrt(2), the
    step's own left out); None with fewer than three. Not robust on purpose: a series that flips
    between two levels carries those flips as its noise."""
    values = np.asarray(values, dtype=float)
    diffs = [values[i + 1] - values[i] for i in range(len(values) - 1) if not (before <= i < after)]
    diffs = [d for d in diffs if d == d]
    if len(diffs) < 3:
        return None
    return float(np.sqrt(np.mean(np.square(diffs))) / math.sqrt(2.0))


def run_exponent(metric: str, platform: str | None) -> int:
    """The power of its run's shift a figure is divided by: the metric's ``shift_exponent``, 0 for a
    figure already divided by its run's own CPU probe (``per_run_peak`` on a CPU)."""
    if metric not in set(metrics.names()):
        return 0
    row = metrics.get(metric)
    if row.per_run_peak and (platform or "cpu") == "cpu":
        return 0
    return row.shift_exponent


def find_steps(frame, thresholds: dict | None = None, *, min_size: int = 1,
               min_absolute_step: dict | None = None, repo: str | None = None, relative_to_run: bool = True,
               factors: dict | None = None, changes=None):
    """One row per step beyond the threshold, with its ``verdict`` (``VERDICTS``; docs/reports.md),
    the two levels' combined ``uncertainty`` (metric units), ``code_changed`` (None: git cannot say).

    ``thresholds``: metric -> relative step (default asv's 5%); ``min_absolute_step``: unit -> smallest
    step worth reporting; ``repo``: None skips the code check. ``relative_to_run``: judge against the
    run (``run_factors``; ``value_before``/``value_after`` stay the series' own levels). ``factors``,
    ``changes``: of the whole results where ``frame`` is a part of them.
    """
    import pandas as pd

    thresholds = thresholds or {}
    floors = MIN_ABSOLUTE_STEP if min_absolute_step is None else min_absolute_step
    order_col = _order_column(frame)
    ok = frame[(frame["status"] == "ok") & frame[order_col].notna()]
    ok = ok[~is_contended(ok)]
    if ok.empty:
        return pd.DataFrame([])
    repo = os.path.abspath(repo) if repo else None
    if not relative_to_run:
        factors = {}
    elif factors is None:
        factors = run_factors(run_shifts(frame))
    periods = host_periods(host_changes(frame) if changes is None else changes)
    one_reading = {m.name for m in metrics.METRICS if m.one_reading}
    rows, pending = [], []
    for series in _series_of(ok, order_col, factors):
        for row in _series_steps(series, thresholds, floors, min_size, periods, one_reading):
            rows.append(row)
            if row["_scatter"] is None and None in row["_u"]:
                pending.append(row)
    if not rows:
        return pd.DataFrame()
    machine_scatter = {}
    if pending:  # series too short for their own scatter: the machine's other series of the metric
        spread = series_scatter(frame[frame["metric"].isin({r["metric"] for r in pending})])
        machine_scatter = spread.dropna(subset=["scatter"]).groupby(["machine", "metric"])["scatter"].median()
        machine_scatter = machine_scatter.to_dict()
    return pd.DataFrame([_judge(row, machine_scatter, repo) for row in rows])


@dataclass
class _Series:
    """One series' figures in commit order, as arrays, divided by each figure's ``scale`` (its run
    factor to the metric's power); ``up`` and ``down``: the intervals' relative half-widths."""

    keys: dict  # the series' parameters (``SERIES`` columns)
    table: object  # the analysed tidy rows, and this series' positions in them (commit order)
    index: object
    metric: str
    direction: str
    unit: str
    machine: str
    commit: object
    position: object
    value: object
    up: object
    down: object
    ci_low: object
    ci_high: object
    source: object
    scale: object
    seconds: object
    definitions: object
    platform: object
    regime: object

    def rows(self):
        """The series' rows of the tidy table, in commit order (only a step's versions need them)."""
        return self.table.iloc[self.index]


def _series_of(ok, order_col: str, factors: dict):
    """Every series of ``ok`` (its rows sorted by series, then commit order), one ``_Series`` each.
    Plain arrays sliced per series, not one DataFrame per series: this runs over 100k rows."""
    keys = [c for c in SERIES if c in ok]
    grouped = ok.groupby(keys, dropna=False)
    group_keys = grouped.size().index
    codes = grouped.ngroup().to_numpy()
    positions = ok[order_col].to_numpy()  # int64 when git knows every commit: kept as is
    order = np.lexsort((positions.astype(float), codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    starts, ends = np.concatenate(([0], bounds)), np.concatenate((bounds, [len(order)]))
    value = ok["value"].to_numpy(dtype=float)[order]
    commit = ok["commit_hash"].to_numpy()[order]
    metric, machine = ok["metric"].to_numpy()[order], ok["machine"].to_numpy()[order]
    low, high, source = (a[order] for a in intervals(ok))
    # asv's 99% interval weighs a figure in asv's step detection, where it spans rounds (``intervals``)
    trusted = _spans_rounds(ok)[order]
    ci_low = np.where(trusted, _column(ok, "ci_low")[order], np.nan)
    ci_high = np.where(trusted, _column(ok, "ci_high")[order], np.nan)
    # the platform a figure ran on, else the one the machine's name says
    platform = np.array([_text(p) or _text(m) for p, m in zip(_column(ok, "platform", object)[order],
                                                             _column(ok, "machine_platform", object)[order],
                                                             strict=True)], dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        up, down = (high - value) / np.abs(value), (value - low) / np.abs(value)  # relative half-widths
    scale, seconds = _run_scales(ok, order, factors, metric, machine, commit, platform)
    columns = {"commit": commit, "position": positions[order], "value": value / scale, "up": up,
               "down": down, "ci_low": ci_low / scale, "ci_high": ci_high / scale, "source": source,
               "scale": scale, "seconds": seconds, "platform": platform,
               "definitions": _column(ok, "setting_definitions", object)[order],
               "regime": _column(ok, "regime", object)[order]}
    direction, unit = ok["direction"].to_numpy()[order], ok["unit"].to_numpy()[order]
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        key = group_keys[codes[order[start]]]
        key = key if isinstance(key, tuple) else (key,)
        yield _Series(keys=dict(zip(keys, key, strict=True)), table=ok, index=order[start:end],
                      metric=metric[start], direction=direction[start], unit=unit[start],
                      machine=machine[start], **{k: v[start:end] for k, v in columns.items()})


def _run_scales(ok, order, factors: dict, metric, machine, commit, platform):
    """Each figure's run factor to its metric's power (``scale``) and as is (``seconds``); 1 where none."""
    scale, seconds = np.ones(len(order)), np.ones(len(order))
    if not factors:
        return scale, seconds
    benchmark, env = ok["benchmark"].to_numpy()[order], ok["env_name"].to_numpy()[order]
    exponents, chain_of = {}, _factor_chains(factors)
    for i in range(len(order)):
        where = (metric[i], platform[i])
        exponent = exponents.get(where)
        if exponent is None:
            exponent = exponents[where] = run_exponent(*where)
        suite = chain_of((machine[i], env[i], str(benchmark[i]).rsplit(".", 1)[0]))
        factor = factors.get((machine[i], env[i], suite, commit[i])) if exponent else None
        if factor:
            scale[i], seconds[i] = factor ** exponent, factor
    return scale, seconds


def _series_steps(series: _Series, thresholds: dict, floors: dict, min_size: int, periods: dict,
                  one_reading: set) -> list[dict]:
    """The steps of one series beyond its threshold (asv's step detection), each a row for ``_judge``."""
    from asv.step_detect import detect_regressions, detect_steps

    commits = series.commit
    if len(set(commits.tolist())) < 2 or series.direction not in ("lower", "higher"):
        return []  # one commit, or neither way is better: nothing can regress
    higher = series.direction == "higher"
    shown = series.value
    values = [1.0 / v if v else None for v in shown.tolist()] if higher else shown.tolist()
    threshold = thresholds.get(series.metric, DEFAULT_THRESHOLD)
    if _cannot_regress(values, threshold):
        return []
    weights = None  # asv's own weighting of a figure: 2 / width of its 99% interval
    lo, hi = series.ci_low, series.ci_high
    with np.errstate(divide="ignore", invalid="ignore"):
        width = np.abs(1.0 / lo - 1.0 / hi) if higher else np.abs(hi - lo)
    if np.isfinite(width).any() and (width > 0).any():
        weights = [2.0 / w if np.isfinite(w) and w > 0 else None for w in width]
    steps = detect_steps(values, weights)
    _, _, found = detect_regressions(steps, threshold=threshold, min_size=min_size)
    segments = {(left, right) for left, right, *_ in steps}
    levels = {(left, right): level for left, right, level, *_ in steps}
    rows = []
    for before, after, value_before, value_after in found or ():
        shown_before = 1.0 / value_before if higher else value_before
        shown_after = 1.0 / value_after if higher else value_after
        if abs(shown_after - shown_before) < floors.get(series.unit, 0.0):
            continue
        left = next(((a, b) for a, b in segments if b - 1 == before), (before, before + 1))
        right = next(((a, b) for a, b in segments if a == after), (after, after + 1))
        # Out of a one-figure level back to (or below) the level before it: a one-run excursion.
        prior = next((levels[(a, b)] for a, b in segments if b == left[0]), None)
        excursion = (left[1] - left[0] == 1 and prior is not None
                     and value_after <= prior + threshold * abs(prior))
        rising = shown_after > shown_before
        u_before = _side_uncertainty(series.up if rising else series.down, slice(*left), shown_before)
        u_after = _side_uncertainty(series.down if rising else series.up, slice(*right), shown_after)
        sources = {str(s) for s in series.source[left[0]:left[1]].tolist()
                   + series.source[right[0]:right[1]].tolist() if s is not None}
        scatter = None
        if series.metric in one_reading and u_before is None and u_after is None:
            spread = reading_scatter(shown, before, after)
            if spread is not None:
                u_before = u_after = SCATTER_Z * spread
                sources = {"series run-to-run scatter, one reading per run"}
        if u_before is None or u_after is None:
            scatter = _step_scatter(shown, (left, right))
        host_before = periods.get((series.machine, commits[before]), (0, ""))
        host_after = periods.get((series.machine, commits[after]), (0, ""))
        rows.append({
            **series.keys, "metric": series.metric, "direction": series.direction, "unit": series.unit,
            "commit_before": commits[before], "commit_after": commits[after],
            "position_before": series.position[before], "position_after": series.position[after],
            "value_before": shown_before * series.scale[before],
            "value_after": shown_after * series.scale[after],
            # a step up from 0 (compiles, padding, status code): an infinite relative step
            "relative_change": ((shown_after - shown_before) / abs(shown_before)) if shown_before
            else float("inf"),
            # how far the run moved across the step, in seconds per step (0: not judged by it)
            "run_shift": series.seconds[after] / series.seconds[before] - 1.0,
            "host_changed": _host_change(host_before, host_after, periods, series.machine),
            "_excursion": excursion,
            "_levels": (shown_before, shown_after),
            "versions_changed": _versions_changed(series.rows(), before, after),
            "definitions_before": metrics.definitions_version(series.definitions[before]),
            "definitions_after": metrics.definitions_version(series.definitions[after]),
            "_u": (u_before, u_after), "_scatter": scatter, "_sources": sources,
            "_platform": series.platform[after],
            "_regime": _text(series.regime[after]), "_machine": series.machine})
    return rows


def _judge(row: dict, machine_scatter: dict, repo: str | None) -> dict:
    """Fill a step's uncertainty and verdict (see ``find_steps``)."""
    (u_before, u_after), scatter, sources = row.pop("_u"), row.pop("_scatter"), row.pop("_sources")
    level_before, level_after = row.pop("_levels")  # against the run (find_steps' relative_to_run)
    platform, regime, machine = row.pop("_platform"), row.pop("_regime"), row.pop("_machine")
    used = set()
    if sources and all(s.startswith("series run-to-run") for s in sources):
        used |= sources
    elif u_before is not None or u_after is not None:
        used.add("intervals (" + "/".join(sorted(sources)) + ")" if sources else "intervals")
    if (u_before is None or u_after is None) and scatter is None:
        scatter = machine_scatter.get((machine, row["metric"]))
        if scatter is not None:
            used.add("machine scatter")
    elif scatter is not None:
        used.add("series scatter")
    if scatter is not None:
        u_before = SCATTER_Z * scatter * abs(level_before) if u_before is None else u_before
        u_after = SCATTER_Z * scatter * abs(level_after) if u_after is None else u_after
    if u_before is None and u_after is None:
        combined, source = float("nan"), "unknown"
    else:
        combined = math.hypot(u_before or 0.0, u_after or 0.0)
        source = " + ".join(sorted(used)) + ("" if u_before is not None and u_after is not None
                                               else " (one side only)")
    step = abs(level_after - level_before)
    row.update(uncertainty=combined, noise_source=source,
               noise_relative=combined / abs(level_before) if level_before else float("nan"),
               code_changed=None, why="")
    run = (f" (against its run, whose seconds per step moved {row['run_shift']:+.1%})"
           if row["run_shift"] else "")
    host, prior = row.pop("host_changed"), row.pop("_excursion")
    row["host_changed"] = bool(host)
    if combined == combined and not step > combined:
        row.update(verdict=WITHIN_NOISE,
                   why=f"step {step:.3g} within the combined uncertainty {combined:.3g} ({source}){run}")
        return row
    if prior:
        row.update(verdict=WITHIN_NOISE,
                   why=f"a one-run excursion: {row['value_before']:.3g} at {str(row['commit_before'])[:8]} "
                       f"alone; the series returns to (or beyond) its level before that run{run}")
        return row
    if host:
        row.update(verdict=HOST_CHANGED, why=f"the two runs ran on different hosts: {host}{run}")
        return row
    changes = metrics.definition_changes(row["metric"], row["definitions_before"], row["definitions_after"],
                                         regime=regime, platform=platform)
    files = code_changed_for(repo, str(row["commit_before"]), str(row["commit_after"]),
                             _text(row.get("implementation")))
    row["code_changed"] = None if files is None else len(files)
    if changes:
        row.update(verdict=DEFINITION_CHANGED,
                   why="; ".join(f"definitions {c.version} ({c.date}): {c.reason}" for c in changes))
    elif files is not None and not files:
        others = measured_code_changed(repo, str(row["commit_before"]), str(row["commit_after"])) or ()
        row.update(verdict=NO_CODE_CHANGE, why="no measured code changed between the two commits"
                   + (f" for this kernel (only other kernels' files: {', '.join(others[:5])})"
                      if others else "")
                   + ": noise or the environment"
                   + (f" ({row['versions_changed']})" if row["versions_changed"] else ""))
    elif files is None:
        row.update(verdict=REGRESSION, why="which code changed is unknown (git does not know these commits)")
    else:
        listed = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        row.update(verdict=REGRESSION, why=f"measured code changed: {listed}")
    row["why"] += run if row["verdict"] != WITHIN_NOISE else ""
    return row


def _host_change(before: tuple, after: tuple, periods: dict, machine: str) -> str:
    """Why the host differs between two runs' host periods (``host_periods``); "" for the same host."""
    if before[0] == after[0]:
        return ""
    whys = [why for (m, _), (period, why) in periods.items()
            if m == machine and before[0] < period <= after[0] and why]
    return "; ".join(dict.fromkeys(whys)) or "host changed"


def find_regressions(frame, thresholds: dict | None = None, *, min_size: int = 1,
                     min_absolute_step: dict | None = None, repo: str | None = None,
                     factors: dict | None = None, changes=None):
    """One row per step whose ``find_steps`` verdict is ``regression``."""
    steps = find_steps(frame, thresholds, min_size=min_size, min_absolute_step=min_absolute_step, repo=repo,
                       factors=factors, changes=changes)
    if steps.empty:
        return steps
    return steps[steps["verdict"] == REGRESSION].reset_index(drop=True)


def noise_floor(frame, thresholds: dict | None = None, metric: str = "seconds_per_step"):
    """Per machine, how noisy its ``metric`` figures are (``noise_floor``: median interval half-width,
    else ``SCATTER_Z`` x series scatter) and so the smallest step ``find_steps`` can call a regression."""
    import pandas as pd

    threshold = (thresholds or {}).get(metric, DEFAULT_THRESHOLD)
    part = frame[(frame["metric"] == metric) & (frame["status"] == "ok")]
    rows = []
    spread = series_scatter(part)
    for machine, mine in part.groupby("machine", sort=True):
        contended = is_contended(mine)
        clean = mine[~contended]
        low, high, _ = intervals(clean)
        value = clean["value"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            half = (high - low) / 2.0 / np.abs(value)
        half = half[np.isfinite(half)]
        scatter = spread[(spread["machine"] == machine)]["scatter"].dropna()
        row = {"machine": machine, "figures": len(clean), "contended": int(contended.sum()),
               "with_intervals": len(half),
               "interval_half_width": float(np.median(half)) if len(half) else float("nan"),
               "series": len(scatter),
               "series_scatter": float(scatter.median()) if len(scatter) else float("nan")}
        if len(half):
            floor, by = row["interval_half_width"], "median interval half-width"
        elif len(scatter):
            floor, by = SCATTER_Z * row["series_scatter"], f"{SCATTER_Z:g} x series scatter"
        else:
            floor, by = float("nan"), "no intervals, no series of three figures"
        row.update(noise_floor=floor, measured_by=by, threshold=threshold,
                   smallest_detectable_step=max(threshold, math.sqrt(2.0) * floor) if floor == floor
                   else float("nan"))
        rows.append(row)
    return pd.DataFrame(rows)


def run_shifts(frame, metric: str = "seconds_per_step"):
    """How far each whole run moved: per machine x environment x benchmark class and consecutive
    commit pair, the median (``shift``) and quartiles of after / before - 1 over the static ``metric``
    series measured at both. Every series moving together is the machine or shared code, not a kernel."""
    import pandas as pd

    columns = ["machine", "env_name", "benchmark", "commit_before", "commit_after", "series", "shift",
               "q25", "q75"]
    ok = frame[(frame["metric"] == metric) & (frame["status"] == "ok")]
    ok = ok[~is_contended(ok)]
    if "regime" in ok:
        ok = ok[ok["regime"].isna() | (ok["regime"] == "static")]
    order_col = _order_column(ok) if len(ok) else "commit_position"
    if ok.empty or order_col not in ok:
        return pd.DataFrame(columns=columns)
    ok = ok[ok[order_col].notna()]
    params = [c for c in PARAMS if c in ok]
    if not params:
        return pd.DataFrame(columns=columns)
    rows = []
    for (machine, env, benchmark), group in ok.groupby(["machine", "env_name", "benchmark"], sort=True):
        table = group.pivot_table(index=params, columns="commit_hash", values="value", aggfunc="first",
                                  dropna=False)
        order = group.groupby("commit_hash")[order_col].first().sort_values()
        commits = [c for c in order.index if c in table.columns]
        for before, after in zip(commits, commits[1:], strict=False):
            ratio = (table[after] / table[before]).dropna()
            ratio = ratio[ratio > 0]
            if len(ratio) < 3:
                continue
            rows.append({"machine": machine, "env_name": env, "benchmark": benchmark,
                         "commit_before": before, "commit_after": after, "series": len(ratio),
                         "shift": float(ratio.median()) - 1.0, "q25": float(ratio.quantile(0.25)) - 1.0,
                         "q75": float(ratio.quantile(0.75)) - 1.0})
    return pd.DataFrame(rows, columns=columns)


def run_factors(shifts) -> dict:
    """``{(machine, env_name, class, commit): factor}``: each run's speed against the first of its
    chain of ``run_shifts`` pairs; a run after a pair with too few series keeps the previous factor."""
    factors, last = {}, {}
    for row in shifts.to_dict("records"):
        group = (row["machine"], row["env_name"], str(row["benchmark"]).rsplit(".", 1)[0])
        before = factors.setdefault((*group, row["commit_before"]), last.get(group, 1.0))
        last[group] = factors[(*group, row["commit_after"])] = before * (1.0 + row["shift"])
    return factors


def _factor_chains(factors: dict):
    """``(machine, env_name, class) -> class``: whose ``run_factors`` chain a class's figures use: its
    own, or for a class too small to say (torch_xla's Training), its environment's busiest class's."""
    runs = Counter((m, e, c) for m, e, c, _ in factors)
    best = {}
    for (m, e, c), n in runs.items():
        if n > runs.get((m, e, best.get((m, e))), 0):
            best[(m, e)] = c
    return lambda key: key[2] if key in runs else best.get(key[:2])


def _versions_changed(group, before: int, after: int) -> str:
    """Library versions and measurement settings (``setting_*``) that differ across the step."""
    columns = [c for c in group.columns if c.startswith(("version_", "setting_"))]
    changes = []
    for column in columns:
        a, b = group[column].iloc[before], group[column].iloc[after]
        if a != b and not (a != a and b != b):  # NaN == NaN here
            shown = ["unrecorded" if x != x else x for x in (a, b)]
            name = column.removeprefix("version_").replace("setting_", "setting ", 1)
            changes.append(f"{name} {shown[0]} -> {shown[1]}")
    return "; ".join(changes)


def find_cost_spikes(frame, thresholds: dict | None = None, *, repo: str | None = None,
                     factors: dict | None = None, changes=None):
    """Cost regressions (``find_regressions``), each with the companion metrics' change across the
    same two commits. Run factors and host changes come from the whole ``frame``: cost rows hold no
    step times and no probe."""
    import pandas as pd

    factors = run_factors(run_shifts(frame)) if factors is None else factors
    changes = host_changes(frame) if changes is None else changes
    regressions = find_regressions(frame[frame["metric"].isin(metrics.names("cost"))], thresholds, repo=repo,
                                   factors=factors, changes=changes)
    if regressions.empty:
        return regressions
    ok = frame[frame["status"] == "ok"]
    attributed = []
    for _, spike in regressions.iterrows():
        same = ok[(ok["machine"] == spike["machine"]) & (ok["env_name"] == spike["env_name"])]
        for param in PARAMS:
            if param in same and pd.notna(spike.get(param)):
                same = same[same[param] == spike[param]]
        same = same[same["benchmark"].str.rpartition(".")[0] == spike["benchmark"].rpartition(".")[0]]
        moved = {}
        for metric in metrics.companions():
            before = same[(same["metric"] == metric) & (same["commit_hash"] == spike["commit_before"])]
            after = same[(same["metric"] == metric) & (same["commit_hash"] == spike["commit_after"])]
            if before.empty or after.empty:
                continue
            a, b = float(before["value"].iloc[0]), float(after["value"].iloc[0])
            if a == b:
                continue
            moved[metric] = (b / a - 1.0) if a else float("inf")
        price = _price_change(same, spike)
        if price is not None:
            moved["price_per_hour"] = price
        ranked = sorted(moved.items(), key=lambda kv: -abs(kv[1]))
        attributed.append({**spike.to_dict(), "companions": ranked,
                           "attribution": "; ".join(f"{m} {v:+.0%}" for m, v in ranked[:4]
                                                    if abs(v) >= 0.02) or "no companion metric moved"})
    return pd.DataFrame(attributed)


def _price_change(same, spike):
    """Change of the hourly price implied by usd_per_step / seconds_per_step (a profile change)."""
    def hourly(commit):
        usd = same[(same["metric"] == "usd_per_step") & (same["commit_hash"] == commit)]["value"]
        sec = same[(same["metric"] == "seconds_per_step") & (same["commit_hash"] == commit)]["value"]
        if usd.empty or sec.empty or not sec.iloc[0]:
            return None
        return float(usd.iloc[0]) / float(sec.iloc[0]) * 3600

    a, b = hourly(spike["commit_before"]), hourly(spike["commit_after"])
    if a is None or b is None or abs(b / a - 1.0) < 1e-9:
        return None
    return b / a - 1.0


def load_traces(results_dir: str = "results"):
    """Every per-step trace the suite wrote (results/<machine>/traces/<commit8>-<env>/*.csv), with
    ``contended`` from the run's sidecar."""
    import pandas as pd

    frames, sidecars = [], {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*", "traces", "*", "*.csv"))):
        run_dir = os.path.basename(os.path.dirname(path))
        machine = os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path))))
        try:
            trace = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            warnings.warn(f"{path}: unreadable trace ({exc}); skipped", stacklevel=2)
            continue
        commit8, _, env = run_dir.partition("-")
        trace.insert(0, "machine", machine)
        trace.insert(1, "commit8", commit8)
        trace.insert(2, "env_name", env)
        trace["file"] = path
        trace["contended"] = _trace_contended(results_dir, machine, commit8, env, os.path.basename(path),
                                              sidecars)
        frames.append(trace)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _trace_contended(results_dir, machine, commit8, env, name, cache: dict):
    """Whether the sidecar says the case of a trace file (``impl__regime__S<n>__mode__dtype.csv``)
    was timed under contention; None where it says nothing."""
    parts = name.removesuffix(".csv").split("__")
    if len(parts) != 5 or not parts[2].startswith("S") or not parts[2][1:].isdigit():
        return None
    impl, regime, seq, mode, dtype = parts
    suite = {"fwd": "Forward", "fwd_bwd": "Training"}.get(mode)

    if (machine, commit8, env) not in cache:
        cache[machine, commit8, env] = sidecar.read(results_dir, machine, commit8, env).get("cases") or {}
    entry = cache[machine, commit8, env].get(sidecar.case_id(suite, impl, int(seq[1:]), regime, dtype))
    return entry.get("contended") if isinstance(entry, dict) else None


def find_trace_spikes(traces, factor: float = 2.0):
    """Steps at least ``factor`` times their run's median step: compile stalls, mostly. Runs of a
    case timed under contention (``contended``, from the sidecar) are never called spikes."""
    import pandas as pd

    if traces.empty:
        return traces
    if "contended" in traces:
        traces = traces[~is_contended(traces)]
    out = []
    for _, run in traces.groupby("file"):
        median = run["seconds"].median()
        spikes = run[run["seconds"] >= factor * median].copy()
        spikes["times_median"] = spikes["seconds"] / median
        spikes["cause"] = [("compiled a new shape" if c is True or c == "True" else
                            "padding" if p > n else "no compile or padding recorded")
                           for c, p, n in zip(spikes["compiled"], spikes["padded_length"], spikes["length"],
                                              strict=True)]
        out.append(spikes)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
