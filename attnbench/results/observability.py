"""The observability table, read: ``results/observability/<machine>-<framework>.csv``, which
``python -m attnbench observability`` (``checks/observability.py``) writes. Reads, never writes."""

from __future__ import annotations

import glob
import os

# Imported where used: pandas.

FRAMEWORKS = ("jax", "torch", "torch_xla")
COLUMNS = ["framework", "impl", "label", "execution", "profiler_visible", "profiler", "attributed_to",
           "attributed_share", "top_ops", "reason", "framework_version", "platform", "seq_len", "dtype"]


def load_observability(results_dir: str = "results"):
    """Every ``<results_dir>/observability/*.csv`` as one ``pandas.DataFrame`` (read only), with a
    ``machine`` column from each file's name; an empty frame with the columns when there are none."""
    import pandas as pd

    frames = []
    for path in sorted(glob.glob(os.path.join(results_dir, "observability", "*.csv"))):
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        stem = os.path.basename(path)[:-len(".csv")]
        framework = next((f for f in sorted(FRAMEWORKS, key=len, reverse=True) if stem.endswith(f"-{f}")), "")
        frame.insert(0, "machine", stem[:-len(framework) - 1] if framework else stem)
        frames.append(frame)
    if not frames:
        return pd.DataFrame({"machine": pd.Series(dtype=str),
                             **{c: pd.Series(dtype=str) for c in COLUMNS}})
    frame = pd.concat(frames, ignore_index=True)
    visible = frame["profiler_visible"].map({"True": True, "False": False})
    frame["profiler_visible"] = visible.astype("boolean")
    frame["attributed_share"] = pd.to_numeric(frame["attributed_share"].replace("", None), errors="coerce")
    frame["seq_len"] = pd.to_numeric(frame["seq_len"].replace("", None), errors="coerce").astype("Int64")
    return frame
