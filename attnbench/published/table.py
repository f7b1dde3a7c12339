"""The published table: its columns, and its CSV written stably and read without writing.

One row per (source, device, op, argument spec, config) with a result (``tokamax_caches``):

- ``evidence`` is always ``published``: measured by others, on their devices, never here.
- ``source`` (a wheel's version or a repository commit), ``source_file`` (the path in the package or
  repository) and ``source_url`` (where to read it; "" for a wheel) say where the figure is written.
- ``device_kind`` is jax's, as the cache's folder names it; ``device``, ``hardware_profile`` and ``target``
  are the project's names for it ("" where it has none).
- ``op`` is tokamax's op (without ``_vjp``), ``kernel`` the project's kernel that calls it and
  ``implementation`` tokamax's ``implementation=`` name; ``pass`` is ``fwd``, ``fwd_residuals`` (the
  forward run for training, saving residuals) or ``vjp`` (the backward).
- the shape: ``batch`` (the product of the leading dims), ``q_heads``, ``kv_heads``, ``seq_q``,
  ``seq_k``, ``head_dim``, ``head_dim_v``, ``dtype``, ``causal``, ``mask`` (``none``, ``causal``, a bool
  mask's or a bias's shape, joined by `` + ``), ``logits_soft_cap``, ``precision``.
- ``config``: the config as the cache writes it (``{}`` for an op without knobs).
- the timing: ``n_evaluations``, ``median_ms``, ``min_ms``, ``max_ms``, ``spread`` ((max - min) /
  median), ``compile_ms``, ``lower_ms``, ``peak_memory_mb``.
- ``flops`` (the project's convention, ``attnbench.core.workload``; a vjp's is the backward's share,
  fwd_bwd - fwd) and ``tflops_per_s`` (flops over the median), empty where the convention cannot
  count the entry; ``note`` says why, and anything else a row should say.
"""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING

from attnbench.core.atomic import atomic_write_text
from attnbench.published.tokamax_caches import COLUMNS as ROW_COLUMNS
from attnbench.published.tokamax_caches import PublishedError

# Imported where used: pandas (the torch_xla venv has none, and the CLI imports this module there).

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = list(ROW_COLUMNS)
DEFAULT_PATH = "results/published/tokamax.csv"
SHAPE_COLUMNS = ["batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "head_dim_v", "dtype",
                 "causal", "mask", "logits_soft_cap", "precision"]
# The rows' order in the file: device, op, pass, shape and source, then enough more that rows rarely tie
# (a tie keeps reading order, itself fixed: files sorted, keys as written).
SORT_BY = (["device_kind", "op", "pass"] + SHAPE_COLUMNS + ["source", "config", "median_ms", "min_ms",
                                                            "max_ms", "compile_ms", "lower_ms"])
INT_COLUMNS = {"batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "head_dim_v", "n_evaluations",
               "flops"}
FLOAT_COLUMNS = {"logits_soft_cap", "median_ms", "min_ms", "max_ms", "spread", "compile_ms", "lower_ms",
                 "peak_memory_mb", "tflops_per_s"}
TEXT_COLUMNS = [c for c in COLUMNS if c not in INT_COLUMNS | FLOAT_COLUMNS | {"causal"}]
FLOAT_DIGITS = ".10g"  # every float to 10 significant digits: the committed file stays the same


def _cell(column: str, value) -> str:
    """One value as the CSV writes it: "" for none, ints whole, floats to ``FLOAT_DIGITS``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "True" if value else "False"
    if column in INT_COLUMNS:
        return str(int(value))
    return format(float(value), FLOAT_DIGITS)


def _check_columns(columns, where: str) -> None:
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise PublishedError(f"{where}: missing columns {', '.join(missing)}")


def csv_text(df: pd.DataFrame) -> str:
    """The table as CSV text: ``COLUMNS`` in order, rows sorted by ``SORT_BY``, floats formatted stably."""
    _check_columns(df.columns, "the table")
    rows = df[COLUMNS].sort_values(SORT_BY, kind="stable", na_position="first")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for record in rows.to_dict("records"):
        writer.writerow([_cell(c, record[c]) for c in COLUMNS])
    return out.getvalue()


def write_csv(df: pd.DataFrame, path: str = DEFAULT_PATH) -> None:
    """Write the table atomically: an interrupted write leaves the old file whole."""
    atomic_write_text(path, csv_text(df))


def read_csv(path: str = DEFAULT_PATH) -> pd.DataFrame:
    """The table a ``write_csv`` wrote, its columns checked (a missing one is a ``PublishedError`` naming
    them); it only reads the file."""
    import pandas as pd

    try:
        with open(path, encoding="utf-8", newline="") as f:
            header = next(csv.reader(f), [])
    except FileNotFoundError:
        raise PublishedError(f"{path}: no such file (python -m attnbench published writes it)") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise PublishedError(f"{path}: cannot be read: {exc}") from None
    _check_columns(header, path)
    try:
        frame = pd.read_csv(path, dtype={c: str for c in TEXT_COLUMNS}, keep_default_na=False, na_values=[""])
    except (ValueError, pd.errors.ParserError) as exc:
        raise PublishedError(f"{path}: cannot be read as the table: {' '.join(str(exc).split())}") from None
    for column in TEXT_COLUMNS:
        frame[column] = frame[column].fillna("")
    return frame
