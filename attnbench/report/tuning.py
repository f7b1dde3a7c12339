"""The report's "Tuned tiles": what ``make tune`` kept per kernel and workload on each machine, read
from ``results/tuning/<machine>.tuning`` (``results/tuned.py``; docs/tuning.md). Reads only."""

from __future__ import annotations

from attnbench.results import tuned

# Imported where used: pandas (the torch_xla venv has no report libraries).

COLUMNS = ["machine", "kernel", "workload", "release", "kept", "kept vs defaults", "measured", "refused",
           "failed", "why"]


def _ratio(row: dict | None) -> str:
    if not row or row.get("ratio") is None:
        return "-"
    return f"{row['ratio']:.2f}x [{row['low']:.2f}-{row['high']:.2f}]"


def tuning_table(results_dir: str):
    """One row per tuned group of every machine's file: the kept config, its paired ratio to the
    defaults (``-`` where the defaults were kept), how many candidates were measured, refused for the
    workload, or failed (to build, or the float64 check)."""
    import pandas as pd

    rows = []
    for machine in tuned.machines(results_dir):
        for entry in tuned.read(results_dir, machine).values():
            by_config = {c["config"]: c for c in entry["candidates"]}
            states = [c["status"] for c in entry["candidates"]]
            kept = entry["kept"] or "-"  # a group not tuned here: its reason is ``why``
            versus = "-" if kept in (entry["defaults"], "-") else _ratio(by_config.get(kept))
            rows.append({"machine": machine, "kernel": entry["kernel"], "workload": entry["workload"],
                         "release": entry.get("release", "-"), "kept": kept,
                         "kept vs defaults": versus,
                         "measured": states.count("ok"), "refused": states.count("refused"),
                         "failed": len(states) - states.count("ok") - states.count("refused"),
                         "why": entry["why"]})
    return pd.DataFrame(rows, columns=COLUMNS)
