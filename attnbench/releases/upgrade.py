"""What an upgrade costs in speed: the steps, their judging and their table.

A ``Step`` is a framework, the release before and the release after, each a ``Side`` (a release
venv's python, and an overlay first on its path); ``rounds.py`` times it in paired rounds. ``judge``
reads a cell's rounds as the after / before ratio with its interval (``core.stats.paired_ratio``)
and one state: ``slower``, ``faster``, ``equal (±10%)`` or ``can't tell`` (with its interval's
width). An A/A step (a release against itself: two processes of one environment) is the control: it
should come out equal. The rounds are kept per commit under ``results/releases/upgrades/``
(``rounds_path``), the table in ``upgrades.csv``.
"""

from __future__ import annotations

import dataclasses
import json
import os

from attnbench.core.atomic import atomic_write_text
from attnbench.core.stats import ABOVE, BELOW, CONFIDENCE, EQUAL, UNCLEAR, paired_ratio
from attnbench.releases import matrix

SLOWER, FASTER, SAME, CANT_TELL, NOT_TIMED = "slower", "faster", "equal (±10%)", "can't tell", "not timed"
STATES = {ABOVE: SLOWER, BELOW: FASTER, EQUAL: SAME, UNCLEAR: CANT_TELL}
UPGRADE, CONTROL, PLANTED = "upgrade", "A/A control", "planted"
ROUNDS_DIR = os.path.join("results", "releases", "upgrades")
TABLE = os.path.join("results", "releases", "upgrades.csv")
MARGIN = 0.10  # equal within +-10%


@dataclasses.dataclass(frozen=True)
class Side:
    """One release's environment: its python, and what goes first on its path (an overlay)."""

    release: str  # "0.10.2", or "0.10.2+planted-slow"
    python: str
    pythonpath: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    framework: str
    before: Side
    after: Side
    kind: str = UPGRADE  # UPGRADE, CONTROL or PLANTED

    @property
    def name(self) -> str:
        return f"{self.framework} {self.before.release} -> {self.after.release}"


def consecutive_steps(framework: str, sides: dict[str, Side]) -> list[Step]:
    """Each release of ``framework`` that has a side, to the next one that has one, oldest first."""
    ordered = [sides[v] for v in sorted(sides, key=matrix.version_key)]
    return [Step(framework, a, b) for a, b in zip(ordered, ordered[1:], strict=False)]


# ------------------------------------------------------------------------------------- judging
def judge(before: list[float], after: list[float], margin: float = MARGIN,
          confidence: float = CONFIDENCE) -> dict:
    """A cell's upgrade ratio from its rounds (after / before, round by round): the median ratio, its
    interval at ``confidence`` (order statistics of the log ratios: never below zero) and its state
    against 1 within ``margin``."""
    if not before:
        return {"rounds": 0, "ratio": None, "ratio_low": None, "ratio_high": None, "state": CANT_TELL}
    ratio = paired_ratio(after, before, confidence)
    return {"rounds": ratio.rounds, "ratio": ratio.ratio, "ratio_low": ratio.low, "ratio_high": ratio.high,
            "state": STATES[ratio.against_one(margin)]}


# ------------------------------------------------------------------------------------- the store
def rounds_path(commit: str, root: str = ROUNDS_DIR) -> str:
    """JSON, but not named ``.json``: asv reads every ``*.json`` under ``results/`` as a result file."""
    return os.path.join(root, f"{commit[:8]}.rounds")


def load_rounds(path: str) -> dict:
    """``{step name: {"kind", "cells": {cell key: {...}}}}`` of a rounds file; ``{}`` without one.
    Reading never writes."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)



# ------------------------------------------------------------------------------------- the table
COLUMNS = ["framework", "step", "before", "after", "kind", "impl", "workload", "execution", "state", "ratio",
           "ratio_low", "ratio_high", "confidence", "width", "rounds", "stopped", "reason", "before_versions",
           "after_versions", "commit"]


def table_rows(store: dict, commit: str) -> list[dict]:
    """One row per step x cell: its ratio, its 99% interval and its state (``judge``); the interval's
    width (high / low) says how far a ``can't tell`` is from deciding."""
    rows = []
    for name, step in store.items():
        for entry in step["cells"].values():
            rounds = entry.get("rounds") or []
            verdict = judge([r[1] for r in rounds], [r[2] for r in rounds])
            if not rounds:
                verdict["state"] = NOT_TIMED
            low, high = verdict["ratio_low"], verdict["ratio_high"]
            rows.append({"framework": step["framework"], "step": name, "before": step["before"],
                         "after": step["after"], "kind": step["kind"], "impl": entry["impl"],
                         "workload": entry["workload"], "execution": entry.get("execution"), **verdict,
                         "confidence": CONFIDENCE, "width": high / low if low else None,
                         "stopped": entry.get("stopped"), "reason": entry.get("reason"),
                         "before_versions": _versions(entry.get("versions_before")),
                         "after_versions": _versions(entry.get("versions_after")), "commit": commit})
    return rows


def _versions(found: dict | None) -> str | None:
    if not found:
        return None
    return ", ".join(f"{k} {v}" for k, v in found.items() if v and k in ("jax", "jaxlib", "torch", "numpy"))


def write_table(rows: list[dict], path: str = TABLE) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=COLUMNS)
    atomic_write_text(path, frame.to_csv(index=False, float_format="%.6g"))
    return path


def load_table(path: str = TABLE):
    import pandas as pd

    frame = pd.read_csv(path, dtype={"before": str, "after": str})
    missing = [c for c in ("step", "impl", "state", "ratio") if c not in frame]
    if missing:
        raise ValueError(f"{path} is not an upgrade table: no column {', '.join(missing)}")
    return frame


def share_decided(frame) -> tuple[int, int]:
    """``(decided or equal, timed)`` over the real upgrade steps' timed cells (kernel x workload x step)."""
    timed = frame[(frame["kind"] == UPGRADE) & (frame["state"] != NOT_TIMED)]
    return int(timed["state"].isin([SLOWER, FASTER, SAME]).sum()), len(timed)
