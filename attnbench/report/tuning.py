"""The report's "Tuned tiles": what ``make tune`` kept per kernel and workload on each machine, read
from ``results/tuning/<machine>.tuning`` (``results/tuned.py``; docs/tuning.md); and a verdict row's
tuning columns: its kernels' configs, and its paper answer with both kernels at their defaults. Reads
only."""

from __future__ import annotations

from attnbench.core.stats import pair_rounds, paired_ratio
from attnbench.report.answers import CANT_TELL, EQUAL, FORCED, NATIVE, answer_of
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


# -- what tuning changed in a verdict row ------------------------------------------------------------
TUNING_COLUMNS = ["forced_config", "native_config", "paper_at_defaults", "paper_at_defaults_ratio",
                  "paper_at_defaults_low", "paper_at_defaults_high", "tuning"]


def config_words(case: dict | None) -> str:
    """``tuned block_q=256,block_k=256`` / ``defaults block_q=128,block_k=128 (kept by tuning)`` /
    ``defaults ... (not tuned here)``; "" for a kernel without tile knobs."""
    if case is None or not case.get("config"):
        return ""
    source = case.get("config_source")
    if source == "tuned" and case.get("defaults_rounds"):
        return f"tuned {case['config']}"
    if source == "tuned":
        return f"defaults {case['config']} (kept by tuning)"
    return f"{source or 'defaults'} {case['config']}" + (" (not tuned here)" if source == "defaults" else "")


def _rounds_at_defaults(case: dict) -> dict[int, float]:
    """A case's rounds with its kernel at its defaults: the defaults timed beside its tuned config, or
    its own where it ran at them."""
    return case["defaults_rounds"] if case.get("defaults_rounds") else case["rounds"]


def tuning_columns(forced: dict | None, native: dict | None, paper: str | None, margin: float) -> dict:
    """The row's configs, and its paper answer with both kernels at their defaults (paired in the same
    rounds as the tuned one), where tuning changed either kernel's config."""
    out = {"forced_config": config_words(forced), "native_config": config_words(native),
           "paper_at_defaults": "-", "tuning": "-"}
    if forced is None or native is None:
        return out
    changed = [c["implementation"] for c in (forced, native) if c.get("defaults_rounds")]
    if not changed:
        tuned_any = any(c.get("config_source") == "tuned" for c in (forced, native))
        out["tuning"] = "defaults kept" if tuned_any else "not tuned"
        return out
    a, b = pair_rounds(_rounds_at_defaults(forced), _rounds_at_defaults(native))
    ratio = paired_ratio(a, b) if a else None
    if ratio is None or not ratio.carried:
        out.update(paper_at_defaults=CANT_TELL, tuning=f"tuned {', '.join(changed)}; at defaults: can't tell")
        return out
    at_defaults = answer_of(ratio.low, ratio.high, margin)
    out.update(paper_at_defaults=at_defaults, paper_at_defaults_ratio=ratio.ratio,
               paper_at_defaults_low=ratio.low, paper_at_defaults_high=ratio.high)
    settled, moved = (FORCED, NATIVE, EQUAL), f"tuned {', '.join(changed)}"
    if paper in settled and at_defaults in settled and paper != at_defaults:
        out["tuning"] = f"{moved}: changed the paper answer, {at_defaults} at defaults, {paper} tuned"
    elif paper == at_defaults:
        out["tuning"] = f"{moved}: the same paper answer at defaults ({paper})"
    else:
        out["tuning"] = f"{moved}: on paper {at_defaults} at defaults, {paper} tuned"
    return out
