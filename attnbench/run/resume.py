"""``attnbench run --out DIR --resume``: finish a sweep an interruption (a preemption) cut short.

The records table is rewritten atomically after every case; resuming measures only the cases
missing from it (``IDENTITY``) and keeps the rows there first and unchanged (a CSV byte for byte).
Any row counts as done: an ``error`` or ``timeout`` is a measurement, and resuming is not retrying;
but a case whose later timing rounds were cut short rejoins the sweep with the rounds it kept.
Options that change a measurement but not the case are kept in ``run-args.txt`` (JSON, named so
that asv, which reads every ``*.json`` under ``results/`` as its own, never warns about it;
``run-args.json`` of an older folder is still read); resuming with different ones is refused.
"""

from __future__ import annotations

import csv
import io
import json
import os

from attnbench.core.atomic import atomic_write_text
from attnbench.measure.engine import Case
from attnbench.run import sweep

# Imported where used: pandas (the torch_xla venv has no report libraries).

ARGS_FILE = "run-args.txt"
OLD_ARGS_FILE = "run-args.json"  # before 2026-12-06
IDENTITY = ("impl", "batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "dtype", "causal", "mode",
            "window", "softcap", "documents", "ragged", "regime")
# cmd_run's options that change what a case's record means without changing which case it is
MEASUREMENT_OPTIONS = ("steps", "min_seconds", "bucket_policy", "no_numerics", "compile_cache", "timer",
                       "threads", "timeout", "memory_cap", "no_isolate", "hardware_profile", "price_per_hour",
                       "spot_price_per_hour", "price_kind", "rounds", "max_rounds", "margin", "precision",
                       "round_seconds")


def case_identity(impl: str, workload, regime: str) -> tuple[str, ...]:
    """The identity of a planned case, as strings, the way a written table holds it."""
    values = {"impl": impl, "regime": regime, **{f: getattr(workload, f) for f in IDENTITY[1:-1]}}
    return tuple("" if values[f] is None else str(values[f]) for f in IDENTITY)


def row_identity(row: dict) -> tuple[str, ...]:
    return tuple("" if row.get(f) is None else str(row.get(f)) for f in IDENTITY)


def read_done(path: str) -> list[dict]:
    """The rows of a records table: CSV rows as the strings written (so they are written back
    byte for byte), Parquet rows as values."""
    if path.endswith(".parquet"):
        import pandas as pd

        frame = pd.read_parquet(path)
        return frame.astype(object).where(frame.notna(), None).to_dict("records")
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def check_args(out_dir: str, args, resuming: bool = True) -> None:
    """Record the sweep's measurement options (a fresh run); refuse a resume that changes them."""
    path, old = os.path.join(out_dir, ARGS_FILE), os.path.join(out_dir, OLD_ARGS_FILE)
    kept = path if os.path.exists(path) or not os.path.exists(old) else old
    mine = {name: getattr(args, name, None) for name in MEASUREMENT_OPTIONS}
    if resuming and os.path.exists(kept):
        with open(kept, encoding="utf-8") as fh:
            theirs = json.load(fh)
        changed = {k: (theirs.get(k), v) for k, v in mine.items() if k in theirs and theirs.get(k) != v}
        if changed:
            said = ", ".join(f"--{k.replace('_', '-')} {old!r} then, {new!r} now"
                             for k, (old, new) in changed.items())
            raise ValueError(f"--resume: {out_dir} was measured with other options ({said}); resume with "
                             "the same ones or measure into a new --out folder")
    else:
        atomic_write_text(path, json.dumps(mine, indent=1, sort_keys=True))


def split(path: str, cases: list[Case]) -> tuple[list[dict], list[Case], dict[int, dict]]:
    """``(rows done in the table at path, cases to measure, {index in those cases: the record its
    row holds})``: a case missing from the table is measured; a case whose later timing rounds the
    interruption cut short (``rounds_complete`` false) goes on from the rounds its row kept. A table
    with a row for a case that is not planned now keeps it too."""
    if not os.path.exists(path):
        return [], list(cases), {}
    rows = read_done(path)
    unfinished = {row_identity(row): record_of(row) for row in rows
                  if str(row.get("rounds_complete")) == "False"}
    done = {row_identity(row) for row in rows} - set(unfinished)
    todo = [c for c in cases if case_identity(c.impl, c.workload, c.regime) not in done]
    prior = {i: unfinished[key] for i, c in enumerate(todo)
             if (key := case_identity(c.impl, c.workload, c.regime)) in unfinished}
    kept = [row for row in rows if row_identity(row) in done]
    return kept, todo, prior


def record_of(row: dict) -> dict:
    """A written row as a record again: CSV's strings read back as None, booleans and numbers (a
    list stays its JSON text, as the record keeps it)."""
    out = {}
    for key, value in row.items():
        if not isinstance(value, str):
            out[key] = value
        elif value == "":
            out[key] = None
        elif value in ("True", "False"):
            out[key] = value == "True"
        else:
            out[key] = _number(value)
    return out


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def write_resumed(kept: list[dict], new_rows: list[dict], path: str, metadata: dict) -> str:
    """The table: the kept rows as read (first, unchanged), then the new ones with this run's metadata."""
    if not kept or path.endswith(".parquet"):
        return sweep.write_table([*kept, *({**metadata, **r} for r in new_rows)], path)
    columns = list(kept[0])
    fresh = [{**metadata, **r} for r in new_rows]
    extra = [c for c in dict.fromkeys(k for row in fresh for k in row) if c not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns + extra)
    writer.writeheader()
    writer.writerows(kept)  # the same strings, columns and dialect as written: the same bytes
    writer.writerows(fresh)
    atomic_write_text(path, buffer.getvalue())
    return path
