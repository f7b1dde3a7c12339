"""The release matrix as a table: built from the filed cells, read back, drawn as a kernel x release
grid (status, and step time relative to the newest release). Reading never writes."""

from __future__ import annotations

import io

from attnbench.core.atomic import atomic_write_text
from attnbench.releases import matrix

# Imported where used: pandas (the torch_xla venv has no report libraries).

GRID_INDEX = ["framework", "target", "impl", "workload", "seq_len"]


def release_of(row: dict) -> str | None:
    """The row's framework version without a local build tag (``2.13.0+cpu`` is 2.13.0)."""
    version = row.get(row.get("framework") or "jax")
    return None if version is None or version != version else str(version).split("+")[0]


def matrix_frame(rows: list[dict]):
    """``matrix.COLUMNS`` frame of cell rows, with release, date and ``relative_to_newest``."""
    import pandas as pd

    dates = {(r.framework, r.version): r.date for r in matrix.RELEASES}
    frame = pd.DataFrame(rows)
    for column in matrix.COLUMNS:
        if column not in frame:
            frame[column] = None
    frame["release"] = [release_of(r) for r in frame.to_dict("records")]
    frame["release_date"] = [
        dates.get((f, v)) for f, v in zip(frame["framework"], frame["release"], strict=True)
    ]
    frame["relative_to_newest"] = relative_to_newest(frame)
    order = frame["release"].map(lambda v: matrix.version_key(str(v)))
    frame = frame.assign(_order=order).sort_values(
        ["framework", "target", "impl", "workload", "seq_len", "_order"]
    )
    return frame[matrix.COLUMNS].reset_index(drop=True)


def relative_to_newest(frame):
    """Per row: seconds per step over the newest timed release's of the same cell; None without times."""
    import pandas as pd

    seconds = pd.to_numeric(frame["seconds_per_step"], errors="coerce")
    out = []
    keys = [tuple(v) for v in frame[GRID_INDEX].astype(str).itertuples(index=False)]
    newest = {}
    for k, release, s in zip(keys, frame["release"], seconds, strict=True):
        if s == s and (
            k not in newest or matrix.version_key(str(release)) > matrix.version_key(str(newest[k][0]))
        ):
            newest[k] = (release, s)
    for k, s in zip(keys, seconds, strict=True):
        base = newest.get(k)
        out.append(None if base is None or s != s or not base[1] else round(float(s) / base[1], 3))
    return out


def write_table(frame, path: str) -> None:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    atomic_write_text(path, buffer.getvalue())


def load_table(path: str):
    import pandas as pd

    frame = pd.read_csv(path, dtype={"release": str, "jax": str, "jaxlib": str, "libtpu": str, "torch": str})
    missing = [c for c in ("framework", "release", "impl", "status") if c not in frame]
    if missing:
        raise ValueError(f"{path} is not a release-matrix table: no column {', '.join(missing)}")
    return frame


def cell_text(status: str, relative, cause: str | None = None) -> str:
    """``ok 1.04x``; a broken cell by its cause where its error tells one (``packaging``,
    ``adapter``, ``capability``, ``api-changed``), else by its status."""
    if status == matrix.OK:
        return "ok" if relative != relative or relative is None else f"ok {relative:.2f}x"
    if status in matrix.BROKEN and cause not in (None, UNEXPLAINED):
        return str(cause)
    return str(status)


def grid(frame):
    """Cell rows by release columns: ``ok 1.04x``, a broken cell's cause, or the status."""
    import pandas as pd

    causes = [cause_of(r)[0] if r["status"] in matrix.BROKEN else None
              for r in frame[["status", "reason"]].to_dict("records")]
    text = [cell_text(s, r, c) for s, r, c in
            zip(frame["status"], frame["relative_to_newest"], causes, strict=True)]
    table = frame.assign(cell=text, seq_len=frame["seq_len"].astype("Int64"))
    out = table.pivot_table(index=GRID_INDEX, columns="release", values="cell", aggfunc="first")
    columns = sorted(out.columns, key=lambda v: matrix.version_key(str(v)))
    return out[columns].fillna("-") if len(out) else pd.DataFrame()


def broken(frame) -> list[dict]:
    """Each cell that broke in some release: kernel, where, release, status, reason, and its ``cause``
    with the ``evidence`` for it (``cause_of``)."""
    bad = frame[frame["status"].isin(matrix.BROKEN)]
    cells = bad[["framework", "impl", "target", "workload", "release", "status", "reason", "line"]].to_dict(
        "records"
    )
    for cell in cells:
        cell["cause"], cell["evidence"] = cause_of(cell)
    return cells


# Why a cell broke (docs/releases.md "Causes"): what an upgrade breaks (an upstream API), told apart
# from a release's packaging fault, a feature an older release lacks, and the project's own adapter.
API, PACKAGING, CAPABILITY = "api-changed", "packaging", "capability"
ADAPTER, UNEXPLAINED = "adapter", "unexplained"
# Known from the releases themselves (../shared/REFERENCE.md section 14, checked against jax's history):
# modules a release imports without declaring them, and the project's switches a release predates.
UNDECLARED_IMPORTS = {"absl": "absl-py (jax imports it without declaring it: jax 0.9.2's pallas.tpu, and "
                              "jax._src.test_util, which Mosaic GPU attention imports, in every release); "
                              "pip install absl-py mends it"}
PROJECT_SWITCHES = {"force_tpu_interpret_mode": "the project's switch to jax's TPU interpreter on a CPU "
                                                "(pltpu.force_tpu_interpret_mode, first in jax 0.7.0); "
                                                "a TPU never calls it, and flash_attention() itself is "
                                                "unchanged from 0.6.2 to 0.10.2"}
MISSING_FEATURES = {"should be a multiple of 128": "splash attention refuses a head dim that is not a "
                                                   "multiple of 128 before jax 0.7.1 (lifted in c9a5799a2a)"}


def cause_of(cell: dict) -> tuple[str, str]:
    """``(cause, evidence)`` of a broken cell, from its recorded error: a module the release does not
    declare is ``packaging``, the project's own interpreter switch ``adapter``, a feature an older
    release lacks ``capability``; an import or attribute error left over is ``api-changed`` only where
    a public name the kernel calls is missing, else ``unexplained``."""
    reason = str(cell.get("reason") or "")
    for module, evidence in UNDECLARED_IMPORTS.items():
        if f"No module named '{module}" in reason:
            return PACKAGING, f"No module named '{module}': {evidence}"
    for name, evidence in PROJECT_SWITCHES.items():
        if name in reason:
            return ADAPTER, evidence
    for text, evidence in MISSING_FEATURES.items():
        if text in reason:
            return CAPABILITY, evidence
    if "has no attribute" in reason or "cannot import name" in reason:
        return API, f"the release lacks a name the kernel calls: {reason[:200]}"
    return UNEXPLAINED, reason[:200]


def grid_markdown(frame) -> str:
    lines = []
    for framework in sorted(frame["framework"].dropna().unique()):
        part = grid(frame[frame["framework"] == framework])
        if part.empty:
            continue
        lines.append(f"### {framework}\n")
        lines.append(part.reset_index().to_markdown(index=False))
        lines.append("")
    return "\n".join(lines)
