"""The time model scored against the real thing: predicted / measured, row by row, when a device run lands.

A machine's measured cases (the case table of its newest commit) meet the compile-for records of the
compile target of the same name (``h200``), kernel, length, mode and dtype at the B1 H8 D64 causal
shape the Forward class measures (Training's backward has no prediction). Each pair gives
``predicted / measured`` and whether the measured time lies in the predicted range. Reads only;
``attnbench calibrate --score-device`` appends the summary to results/LOG.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attnbench.core.workload import CUSTOM

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

FORWARD_SHAPE = {"batch": 1, "q_heads": 8, "kv_heads": 8, "head_dim": 64}  # the Forward classes' workload
COLUMNS = ["machine", "impl", "seq_len", "mode", "dtype", "predicted_ms", "predicted_low_ms",
           "predicted_high_ms", "measured_ms", "ratio", "in_range", "family"]


def device_scores(cases, records) -> pd.DataFrame:
    """One row per measured jax case of a machine that is also a calibrated compile target."""
    import pandas as pd

    if cases is None or len(cases) == 0 or records is None or len(records) == 0 \
            or "predicted_seconds" not in records:
        return pd.DataFrame(columns=COLUMNS)
    named = records["workload"].fillna(CUSTOM) if "workload" in records else CUSTOM
    mine = records[(named == CUSTOM) & records["predicted_seconds"].notna()
                   & (records["seq_q"] == records["seq_k"])]
    for column, value in FORWARD_SHAPE.items():
        mine = mine[mine[column] == value]
    mine = mine[mine["causal"].astype(str) == "True"]
    index = {(r["target"], r["impl"], int(r["seq_q"]), r["mode"], r["dtype"]): r
             for r in mine.to_dict("records")}
    rows = []
    measured = cases[cases["framework"] == "jax"] if "framework" in cases else cases
    for c in measured.to_dict("records"):
        mode = "fwd_bwd" if c.get("suite") == "Training" else "fwd" if c.get("suite") == "Forward" else None
        if mode is None or c.get("busy"):
            continue
        r = index.get((c["machine"], c["implementation"], int(c["seq_len"]), mode, c["dtype"]))
        if r is None:
            continue
        measured_s = float(c["step_s"])
        rows.append({"machine": c["machine"], "impl": c["implementation"], "seq_len": int(c["seq_len"]),
                     "mode": mode, "dtype": c["dtype"], "predicted_ms": r["predicted_seconds"] * 1e3,
                     "predicted_low_ms": r["predicted_seconds_low"] * 1e3,
                     "predicted_high_ms": r["predicted_seconds_high"] * 1e3, "measured_ms": measured_s * 1e3,
                     "ratio": r["predicted_seconds"] / measured_s,
                     "in_range": bool(r["predicted_seconds_low"] <= measured_s
                                      <= r["predicted_seconds_high"]),
                     "family": str(r.get("predicted_basis") or "").partition("(")[2].partition(")")[0]})
    return pd.DataFrame(rows, columns=COLUMNS)


def score_summary(scores) -> list[str]:
    """Per machine: rows, median |ln(predicted / measured)| as a factor, share in range, worst row."""
    lines = []
    for machine, part in scores.groupby("machine", sort=True):
        errors = part["ratio"].map(lambda r: abs(math.log(r)))
        worst = part.loc[errors.idxmax()]
        lines.append(f"{machine}: {len(part)} rows, median error x{math.exp(errors.median()):.2f}, "
                     f"{int(part['in_range'].sum())}/{len(part)} measured times inside the predicted range; "
                     f"worst {worst['impl']} {worst['mode']} {int(worst['seq_len'])} "
                     f"(predicted / measured {worst['ratio']:.2f})")
    return lines


def family_table(fitted) -> pd.DataFrame:
    """Per calibrated family: its chips, rows, leave-one-shape-out error, whether it reaches the verdict."""
    import pandas as pd

    rows = []
    for name, family in fitted.families.items():
        score = family.score
        lo, hi = score.error_range
        rows.append({"family": name, "fitted on": family.chips, "rows": len(family.rows),
                     "median error": f"x{math.exp(score.median_abs_error):.2f}",
                     "90% of errors": f"x{math.exp(lo):.2f} to x{math.exp(hi):.2f}",
                     "kernel pairs ordered": f"{score.pairs_ordered}/{score.pairs} ({score.order_share:.0%})",
                     "reaches the verdict": "yes" if score.passes else "no: misses a bar"})
    return pd.DataFrame(rows)


def predicted_part(results_dir: str, cases, records) -> dict | None:
    """The report's section "Predicted speed on the chips" (``None`` without a calibration table): the
    model's leave-one-shape-out error per family, and its score against any device run."""
    import os

    from attnbench.predicted import calibration
    from attnbench.predicted.predict import Calibrated
    from attnbench.report.render import Table

    path = os.path.join(results_dir, os.path.relpath(calibration.TABLE, "results"))
    if not os.path.exists(path):
        return None
    fitted = Calibrated.load(path)
    scores = device_scores(cases, records)
    return {"families": Table.of(family_table(fitted)),
            "device": Table.of(scores.round({"predicted_ms": 3, "predicted_low_ms": 3, "predicted_high_ms": 3,
                                             "measured_ms": 3, "ratio": 2}))
            if not scores.empty else None,
            "device_summary": score_summary(scores) if not scores.empty else []}
