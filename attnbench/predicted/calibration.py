"""The calibration table: each published device time beside its program compiled for that chip.

``make calibrate`` compiles, for every published forward row with a FLOP count on a chip this
project compiles for, the row's kernel at the row's shape (``cases``), and joins the two
(``join``): one row per published row, with the compiled program's ``hlo_`` features and the grid
steps of the config the published time was taken at. ``read`` checks a table before anything is
fitted on it: a malformed one is a ``CalibrationError`` naming the file and what is wrong.

Left out, each with its reason in ``LEFT_OUT``: rows without FLOPs (a boolean mask: the cache
records its shape, not which pairs it keeps; head_dim != head_dim_v), the backward (``vjp``: the
published time is the backward's share, which no compiled program here is alone), and
``fwd_residuals`` (the forward that keeps its residuals for a backward, which the suite's forward
does not).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import Workload
from attnbench.predicted import model

DIR = os.path.join("results", "compiled-for", "calibration")
TABLE = os.path.join(DIR, "calibration.csv")
RECORDS = os.path.join(DIR, "records.csv")
LOO = os.path.join(DIR, "leave-one-out.csv")
PASSES = ("fwd",)
LEFT_OUT = {
    "vjp": "the backward's share of fwd_bwd: no program compiled here is the backward alone",
    "fwd_residuals": "the forward that keeps residuals for a backward; the suite's forward keeps none",
    "no flops": "no FLOP count (a boolean mask's pairs, or head_dim != head_dim_v): nothing to cost",
    "no target": "a chip this project does not compile for (TPU7x: docs/published.md)",
}
IDENTITY = ["source", "source_url", "hardware_profile", "target", "family", "kernel", "pass", "batch",
            "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "dtype", "causal", "config", "median_ms",
            "flops"]
COLUMNS = IDENTITY + ["status", "reason", "library_config", *model.FEATURES, "hlo_cost_notes", "peak_tflops"]
NUMBERS = {"batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "median_ms", "flops", "peak_tflops",
           *model.FEATURES}


class CalibrationError(ValueError):
    """A calibration table that cannot be fitted on; its message names the file and the fault."""


def usable(published):
    """The published rows the model is fitted on (a DataFrame), and a count of the others by reason."""
    left = {}
    keep = published["target"].fillna("") != ""
    left["no target"] = int((~keep).sum())
    for name in ("vjp", "fwd_residuals"):
        mask = keep & (published["pass"] == name)
        left[name] = int(mask.sum())
        keep &= ~mask
    no_flops = keep & published["flops"].isna()
    left["no flops"] = int(no_flops.sum())
    keep &= ~no_flops
    return published[keep & published["pass"].isin(PASSES)].copy(), left


def workload(row) -> Workload:
    """The published row's problem as a workload (forward; its dtype; causal or none)."""
    return Workload(batch=int(row["batch"]), q_heads=int(row["q_heads"]), kv_heads=int(row["kv_heads"]),
                    seq_q=int(row["seq_q"]), seq_k=int(row["seq_k"]), head_dim=int(row["head_dim"]),
                    dtype=row["dtype"], causal=str(row["causal"]) == "True", mode="fwd")


def case_key(target: str, kernel: str, w: Workload) -> tuple:
    return (target, kernel, w.batch, w.q_heads, w.kv_heads, w.seq_q, w.seq_k, w.head_dim, w.dtype, w.causal)


def cases(rows) -> list[tuple[str, str, Workload]]:
    """Each (target, kernel, workload) the rows need compiled, once, in the rows' order."""
    seen = {}
    for row in rows.to_dict("records"):
        w = workload(row)
        seen.setdefault(case_key(row["target"], row["kernel"], w), (row["target"], row["kernel"], w))
    return list(seen.values())


def join(rows, records: list[dict], families: dict[str, str]) -> list[dict]:
    """One calibration row per published row: its identity, its compiled program's features (from the
    record of the same target, kernel and shape) and the grid steps at the published config."""
    by_case = {}
    for record in records:
        w = workload(record)
        by_case[case_key(record["target"], record["impl"], w)] = record
    out = []
    for row in rows.to_dict("records"):
        w = workload(row)
        record = by_case.get(case_key(row["target"], row["kernel"], w), {})
        entry = {c: row.get(c) for c in IDENTITY}
        entry["family"] = families.get(row["target"], "")
        entry.update(status=record.get("status", "not compiled"), reason=record.get("reason"),
                     library_config=record.get("library_config"), hlo_cost_notes=record.get("hlo_cost_notes"),
                     peak_tflops=record.get("peak_tflops"))
        for feature in model.FEATURES[:-1]:
            entry[feature] = record.get(feature)
        try:
            config = json.loads(row["config"]) if isinstance(row["config"], str) and row["config"] else {}
        except json.JSONDecodeError:
            config = {}
        entry["grid_steps"] = model.grid_steps(config, batch=w.batch, q_heads=w.q_heads, seq_q=w.seq_q,
                                               seq_k=w.seq_k, causal=w.causal)
        out.append(entry)
    return out


# -------------------------------------------------------------------------------- the file
def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return format(value, ".10g")
    return str(value)


def write(rows: list[dict], path: str = TABLE, columns: list[str] = COLUMNS) -> None:
    """The table (``columns`` of ``rows``), atomically: an interrupted write leaves the old one whole."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_cell(row.get(c)) for c in columns] for row in rows)
    atomic_write_text(path, buffer.getvalue())


def read(path: str = TABLE) -> list[dict]:
    """The table's rows, every number checked; a fault is a ``CalibrationError`` naming file and line."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise CalibrationError(f"{path}: not a calibration table: missing columns "
                                       f"{', '.join(missing)}")
            rows = []
            for line, raw in enumerate(reader, start=2):
                row = dict(raw)
                for column in NUMBERS:
                    text = row.get(column) or ""
                    if text == "":
                        row[column] = None
                        continue
                    try:
                        row[column] = float(text)
                    except ValueError:
                        raise CalibrationError(f"{path}:{line}: {column} is not a number: {text!r}") from None
                    if not math.isfinite(row[column]) or row[column] < 0:
                        raise CalibrationError(f"{path}:{line}: {column} must be a finite number >= 0, "
                                               f"got {text!r}")
                if row["status"] == "ok" and not row["median_ms"]:
                    raise CalibrationError(f"{path}:{line}: a compiled row without its published median_ms")
                rows.append(row)
    except FileNotFoundError:
        raise CalibrationError(f"{path}: no such file (make calibrate writes it)") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CalibrationError(f"{path}: cannot be read: {exc}") from None
    if not rows:
        raise CalibrationError(f"{path}: no rows")
    return rows


def fitted_rows(rows: list[dict], family: str) -> list[dict]:
    """The family's rows the fit uses: compiled, with a published time."""
    return [r for r in rows if r["family"] == family and r["status"] == "ok" and r["median_ms"]]


def arrays(rows: list[dict]):
    """(features, seconds, shape groups, competing keys, kernels) of ``fitted_rows``."""
    import numpy as np

    features = np.array([[r[f] or 0.0 for f in model.FEATURES] for r in rows], dtype=float)
    seconds = np.array([r["median_ms"] / 1e3 for r in rows], dtype=float)
    groups = [tuple(r[c] for c in model.SHAPE_KEY) for r in rows]
    pair_keys = [(r["target"], r["dtype"], *g) for r, g in zip(rows, groups, strict=True)]
    kernels = [r["kernel"] for r in rows]
    return features, seconds, groups, pair_keys, kernels
