"""A regime run's per-step trace, written as CSV beside the run (``results/<machine>/traces/``):
each step's length, padding, compile and cost."""

from __future__ import annotations

import csv
import io
import os

from attnbench.core import regimes
from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import CUSTOM
from attnbench.measure import cost


def write_trace(result, record: dict, trace_dir: str, pricing=None) -> str | None:
    """The per-step trace of a regime run as CSV, each step's ``usd`` at the on-demand price (None
    when unpriced); returns the path."""

    rows = regimes.trace_to_rows(result)
    if not rows:
        return None
    for row in rows:
        usd = cost.cost_per_step(row["seconds"], pricing) if pricing is not None else {}
        row["usd"] = usd.get("usd_per_step_on_demand")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    name = "{impl}__{regime}__S{seq_q}__{mode}__{dtype}".format(**record)
    if record.get("workload") not in (None, CUSTOM):  # a preset's (two presets' decodes share S1)
        name += f"__{record['workload']}-{record['phase']}"
    path = os.path.join(trace_dir, f"{name}.csv")
    atomic_write_text(path, buffer.getvalue())
    return path
