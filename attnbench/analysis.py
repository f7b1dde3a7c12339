"""Regressions and cost spikes in the tidy results, and what moved with them. Reads, never writes.

* ``find_regressions``: per series (machine x environment x benchmark x parameters, ordered by git
  history), asv's own step detection (``asv.step_detect``) with each metric's direction honoured:
  a higher-is-better metric is analysed as its reciprocal, so a drop in throughput is an upward step.
* ``find_cost_spikes``: the regressions of the cost metrics (the metric table's ``cost`` group),
  each attributed to the companion metrics (its rows marked ``companion``: time, throughput,
  memory, compiles, padding) that moved across the same commits, to the hourly price, and to the
  library versions that changed there.

Which metrics are costs and companions, and each metric's direction, come from
``attnbench/metrics.py`` (read at each call).
* ``find_trace_spikes``: steps inside one run's per-step trace that took far longer than the run's
  steady step, with whether that step compiled and how much of it was padding.
"""

from __future__ import annotations

import glob
import os

from attnbench import metrics

PARAMS = ["implementation", "seq_len", "regime", "dtype"]
SERIES = ["machine", "env_name", "benchmark", *PARAMS]
DEFAULT_THRESHOLD = 0.05
# Steps smaller than this in absolute terms are noise whatever their relative size: the process's
# resident high-water mark moves in 4 KiB pages, so 0 -> 8 KiB would read as an infinite regression.
MIN_ABSOLUTE_STEP = {"bytes": 2**20}


def _series_values(group):
    group = group.sort_values("commit_position")
    values = group["value"].astype(float).tolist()
    if group["direction"].iloc[0] == "higher":
        values = [1.0 / v if v else None for v in values]
    return group, values


def _cannot_regress(values, threshold) -> bool:
    """True when no step of at least ``threshold`` can exist in ``values`` (exact, so it only saves time).

    ``detect_regressions`` reports a step when a later level exceeds an earlier one by more than
    ``max(err, threshold * level)``; every level is a segment median, so it lies within
    [min, max] of the data, and ``v + max(0, threshold * v)`` grows with ``v``: if
    ``max <= min + max(0, threshold * min)`` no level can exceed another by that much.
    """
    if threshold is None or not threshold >= 0:
        return False
    finite = [v for v in values if v is not None and v == v]
    if not finite:
        return True
    low, high = min(finite), max(finite)
    return high <= low + max(0.0, threshold * low)


def find_regressions(frame, thresholds: dict | None = None, *, min_size: int = 1,
                     min_absolute_step: dict | None = None):
    """One row per detected regression: series, commit range, values before/after, relative step.

    ``thresholds`` (metric -> relative step) default to asv's 5%; ``min_absolute_step`` (unit ->
    smallest step worth reporting) defaults to ``MIN_ABSOLUTE_STEP``.
    """
    import numpy as np
    import pandas as pd
    from asv.step_detect import detect_regressions, detect_steps

    thresholds = thresholds or {}
    floors = MIN_ABSOLUTE_STEP if min_absolute_step is None else min_absolute_step
    ok = frame[(frame["status"] == "ok") & frame["commit_position"].notna()]
    keys = [c for c in SERIES if c in ok]
    rows = []
    if ok.empty:
        return pd.DataFrame(rows)
    # Series by group number (numbered in iteration order), sorted by git position within each:
    # plain arrays per series instead of one DataFrame per series.
    grouped = ok.groupby(keys, dropna=False)
    group_keys = grouped.size().index
    codes = grouped.ngroup().to_numpy()
    positions = ok["commit_position"].to_numpy()  # int64 when git knows every commit: kept as is
    order = np.lexsort((positions.astype(float), codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(order)]))
    value_all = ok["value"].to_numpy(dtype=float)[order]
    commit_all = ok["commit_hash"].to_numpy()[order]
    position_all = positions[order]
    metric_all = ok["metric"].to_numpy()[order]
    direction_all = ok["direction"].to_numpy()[order]
    unit_all = ok["unit"].to_numpy()[order]
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        commits = commit_all[start:end]
        if len(set(commits.tolist())) < 2:
            continue
        key = group_keys[codes[order[start]]]
        key = key if isinstance(key, tuple) else (key,)
        direction = direction_all[start]
        if direction not in ("lower", "higher"):  # neither way is better: nothing can regress
            continue
        values = value_all[start:end].tolist()
        if direction == "higher":
            values = [1.0 / v if v else None for v in values]
        metric = metric_all[start]
        threshold = thresholds.get(metric, DEFAULT_THRESHOLD)
        if _cannot_regress(values, threshold):
            continue
        steps = detect_steps(values)
        _, _, found = detect_regressions(steps, threshold=threshold, min_size=min_size)
        if not found:
            continue
        group = ok.iloc[order[start:end]]
        for before, after, value_before, value_after in found:
            higher = direction == "higher"
            shown_before = 1.0 / value_before if higher else value_before
            shown_after = 1.0 / value_after if higher else value_after
            if abs(shown_after - shown_before) < floors.get(unit_all[start], 0.0):
                continue
            rows.append({**dict(zip(keys, key, strict=True)), "metric": metric,
                         "direction": direction, "unit": unit_all[start],
                         "commit_before": commits[before],
                         "commit_after": commits[after],
                         "position_before": position_all[start + before],
                         "position_after": position_all[start + after],
                         "value_before": shown_before, "value_after": shown_after,
                         # a step up from 0 (compiles, padding, status code): an infinite relative step
                         "relative_change": (shown_after / shown_before - 1.0) if shown_before
                         else float("inf"),
                         "versions_changed": _versions_changed(group, before, after)})
    return pd.DataFrame(rows)


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


def find_cost_spikes(frame, thresholds: dict | None = None):
    """Cost regressions, each with the companion metrics' change across the same two commits."""
    import pandas as pd

    regressions = find_regressions(frame[frame["metric"].isin(metrics.names("cost"))], thresholds)
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
    """Every per-step trace the suite wrote (results/<machine>/traces/<commit8>-<env>/*.csv)."""
    import warnings

    import pandas as pd

    frames = []
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
        frames.append(trace)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def find_trace_spikes(traces, factor: float = 2.0):
    """Steps at least ``factor`` times their run's median step: compile stalls, mostly."""
    import pandas as pd

    if traces.empty:
        return traces
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
