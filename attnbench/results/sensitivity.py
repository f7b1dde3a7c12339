"""The smallest change the analysis can detect on a machine, per kind of figure: between two runs of
the history (its noise floor), within the newest run (its intervals), and through a paired
re-measurement of two commits (``attnbench confirm``). Reads, never writes.
"""

from __future__ import annotations

import math

import numpy as np

from attnbench.core import metrics
from attnbench.results import noise
from attnbench.results.judge import ALERT_Z

# Imported where used: pandas (the torch_xla venv has no report libraries).

KINDS = (("seconds_per_step", "static"), ("seconds_per_step", "dynamic"), ("seconds_per_step", "bucketed"),
         ("seconds_per_step", "packed"),
         ("usd_per_million_useful_tokens_with_compiles", "static"), ("compile_seconds", "static"),
         ("first_call_seconds", "static"), ("compile_seconds", "dynamic"))
COLUMNS = ["machine", "figure", "runs", "noise floor", "smallest step between runs",
           "newest run: median 99% half-width", "smallest step a paired re-measurement confirms"]


def sensitivity(frame, floors: dict, thresholds: dict | None, confirmed: dict | None):
    """One row per machine and kind of figure (``KINDS``, where the machine has them): the run-to-run
    noise floor, the smallest step the history flags between single runs (max of the threshold and
    ``ALERT_Z`` x sqrt(2) x the floor), the newest run's median 99% half-width of that figure, and, for a
    figure of the steady step, the smallest step a paired re-measurement resolves (max of the threshold
    and the median half-width of the confirmations made here; ``-`` where none was made yet)."""
    import pandas as pd

    thresholds = thresholds or {}
    rows = []
    ok = frame[frame["status"] == "ok"]
    paired = _confirmation_half_widths(confirmed)
    for machine, mine in ok.groupby("machine", sort=True):
        order = pd.to_numeric(mine[noise.order_column(mine)], errors="coerce")
        # commits that cannot be ordered have no newest run: its half-width reads "-"
        newest = (mine[mine["commit_hash"] == mine.loc[order.idxmax(), "commit_hash"]] if order.notna().any()
                  else mine.iloc[:0])
        for metric, regime in KINDS:
            floor = floors.get((machine, metric, regime, False))
            part = newest[(newest["metric"] == metric)
                          & (newest["regime"].fillna("static") == regime)
                          & (newest["category"] != "interpreted")]
            if floor is None and part.empty:
                continue
            threshold = thresholds.get(metric, 0.05)
            low, high, _ = noise.intervals(part)
            value = part["value"].to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                half = (high - low) / 2.0 / np.abs(value)
            half = half[np.isfinite(half)]
            steady = metric in metrics.names() and metrics.get(metric).time_exponent and regime == "static"
            mine_paired = paired.get(machine, [])
            rows.append({
                "machine": machine, "figure": f"{metric} ({regime})",
                "runs": int(mine["commit_hash"].nunique()),
                "noise floor": _pct(floor),
                "smallest step between runs": _pct(max(threshold, ALERT_Z * math.sqrt(2.0) * floor))
                if floor is not None else "-",
                "newest run: median 99% half-width": _pct(float(np.median(half))) if len(half) else "-",
                "smallest step a paired re-measurement confirms":
                    (_pct(max(threshold, float(np.median(mine_paired)))) if mine_paired else
                     f"{threshold:.0%} or more (none made yet)") if steady else "- (the next run)",
            })
    return pd.DataFrame(rows, columns=COLUMNS)


def _pct(value) -> str:
    return "-" if value is None or value != value else f"{value:.1%}"


def _confirmation_half_widths(confirmed: dict | None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for key, entry in (confirmed or {}).items():
        low, high, ratio = entry.get("ci_low"), entry.get("ci_high"), entry.get("ratio")
        if all(isinstance(v, (int, float)) and v == v and v > 0 for v in (low, high, ratio)):
            out.setdefault(key[0], []).append((high - low) / 2.0 / ratio)
    return out
