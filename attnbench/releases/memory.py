"""What an upgrade costs in memory on the chips: each kernel's compiled peak, temporaries and inserted
copies under consecutive jax + libtpu builds, and every change between two of them.

These are compiler output (``compiled``, not measured), deterministic for the builds, so any change
between consecutive builds is an alert at once: no interval is needed. Two upgrade paths:

- ``jax[tpu]``: each jax release with the libtpu its ``tpu`` extra pins (what ``pip install -U
  jax[tpu]`` moves a team along), in release order, then any planted build after the one it overlays;
- ``libtpu alone``: one jax release under each libtpu the matrix installs, in libtpu order;

and a planted build (``planted.py``: the same jax and libtpu, one kernel's temporaries made larger)
against the build it overlays: the proof that a change is caught.

Reads ``results/releases/releases.csv`` and ``planted.csv``; never writes them.
"""

from __future__ import annotations

from attnbench.releases import matrix
from attnbench.releases.planted import BLOATED

FIGURES = (("peak_bytes", "peak"), ("temp_bytes", "temporaries"), ("inserted_copy_bytes", "inserted copies"),
           ("max_batch", "largest batch that fits"))
CELL = ["target", "impl", "seq_len"]
PLANTED_TAG = BLOATED


def builds(frame):
    """The TPU cells with their build: ``jax`` and ``libtpu`` versions, ``build`` (``jax 0.9.2 +
    libtpu 0.0.37``), ``axis`` (the path a pinned pair lies on) and ``order``; the bare environment
    is left out (its compiles are the companions' again, or broke for packaging)."""
    tpu = frame[(frame["target"] != "cpu") & (frame["environment"] != "bare")].copy()
    tpu["jax_release"] = tpu["release"].astype(str)
    tpu["build"] = [f"jax {j} + libtpu {t}" for j, t in zip(tpu["jax_release"], tpu["libtpu"], strict=True)]
    return tpu


def _order(row) -> tuple:
    return matrix.version_key(str(row["jax_release"])), matrix.version_key(str(row["libtpu"]))


def changes(frame, planted=None) -> list[dict]:
    """Every change of a kernel's compiled memory between consecutive builds, on either path, and
    between each planted build (``planted``: its table) and the build it overlays: the release pair,
    the kernel, the chip and length, and what grew or shrank, with both figures. A kernel that
    compiled under one build and not the next is a break (``table.upgrade_steps``), not a memory
    change, and is not listed here."""
    tpu = builds(frame)
    out = []
    pinned = tpu[[matrix.pinned_libtpu(str(j)) == str(t)
                  for j, t in zip(tpu["jax_release"], tpu["libtpu"], strict=True)]]
    paths = [("jax[tpu]", pinned)] + [("libtpu alone", part) for _, part in tpu.groupby("jax_release")]
    for axis, part in paths:
        for _, cell in part.groupby(CELL):
            rows = sorted(cell.to_dict("records"), key=_order)
            for before, after in zip(rows, rows[1:], strict=False):
                out += _differences(axis, before, after)
    if planted is not None and len(planted):
        real = {(r["build"], r["target"], r["impl"], int(r["seq_len"])): r for r in tpu.to_dict("records")}
        for row in builds(planted).to_dict("records"):
            before = real.get((row["build"], row["target"], row["impl"], int(row["seq_len"])))
            if before is not None:
                after = {**row, "build": f"{row['build']} + {PLANTED_TAG}"}
                out += _differences("planted", before, after)
    return out


def _differences(axis: str, before: dict, after: dict) -> list[dict]:
    if before["status"] != matrix.OK or after["status"] != matrix.OK:
        return []
    out = []
    for column, what in FIGURES:
        a, b = before.get(column), after.get(column)
        if a is None or b is None or a != a or b != b or int(a) == int(b):
            continue
        change = (b - a) / a if a else float("inf")
        out.append({"axis": axis, "before": before["build"], "after": after["build"],
                    "planted": axis == "planted", "target": after["target"],
                    "impl": after["impl"], "seq_len": int(after["seq_len"]), "figure": what,
                    "before_value": int(a), "after_value": int(b), "change": change,
                    "worse": change < 0 if column == "max_batch" else change > 0,
                    "alert": f"{after['impl']} on {after['target']} at {int(after['seq_len'])} tokens: "
                             f"{what} {_amount(column, a)} -> {_amount(column, b)} ({percent(change)}) "
                             f"from {before['build']} to "
                             f"{after['build']}"})
    return out


def holding(frame, alerts: list[dict]) -> list[dict]:
    """Per kernel, chip and length: the builds it compiled under with the same memory (the libtpu
    builds it holds across), and how many changes it saw: what a team can trust before an upgrade."""
    tpu = builds(frame)
    found = [a for a in alerts if not a["planted"]]  # ``changes``' alerts, computed once by the caller
    out = []
    for (target, impl, seq), cell in tpu.groupby(CELL):
        ok = cell[cell["status"] == matrix.OK]
        moved = [c for c in found if (c["target"], c["impl"], c["seq_len"]) == (target, impl, int(seq))]
        out.append({"target": target, "impl": impl, "seq_len": int(seq),
                    "libtpu_builds": len(set(ok["libtpu"].astype(str))), "builds_compiled": len(ok),
                    "builds_tried": len(cell), "changes": len(moved),
                    "peak": _mb(ok["peak_bytes"].iloc[0]) if len(ok) and not moved else None,
                    "largest batch": _largest(ok) if not moved else None})
    return out


def _largest(ok) -> int | None:
    values = ok["max_batch"].dropna() if "max_batch" in ok else []
    return int(values.iloc[0]) if len(values) else None


def _amount(column: str, value) -> str:
    return f"batch {int(value)}" if column == "max_batch" else _mb(value)


def _mb(value) -> str:
    return f"{float(value) / 2**20:,.1f} MiB"


def percent(change: float) -> str:
    """``+40%``; a change under 1% with its first decimal (``-0.3%``), never a bare ``-0%``."""
    if change == float("inf"):
        return "new"
    return f"{change:+.1%}" if abs(change) < 0.01 else f"{change:+.0%}"
