"""The verdict as one picture: a forest plot of each headline row's forced / native ratio with its
interval, on a log axis, the equivalence band shaded and the answer in colour.

``forest_rows`` takes the rows from the verdict table (``verdict.verdict_table``), never from
anywhere else: the picture is the verdict CSV's intervals drawn, and the PNG carries those rows in its
metadata (``FOREST_KEY``), so a test can hold any copy of the picture against the CSV. Two kinds of
evidence, each in a panel of its own, never mixed on one axis:

- **measured**: the production answer, the 99% interval of the paired cost per useful token at the
  verdict's horizon; where the paper answer (static steps) is another state, it is drawn beside it.
- **predicted**: the time model's forced / native step time on a compile target, its range the
  calibration's error (not a confidence interval), never measured there.

The compile targets' rows without a ratio (memory only) and the published figures (no ratio in the
verdict) are counted in the caption, not drawn.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from attnbench.report.answers import CANT_TELL, EQUAL, FORCED, NATIVE
from attnbench.report.plots import new_figure, png_bytes
from attnbench.report.verdict import DEFAULT_MARGIN, _text, headline
from attnbench.report.verdict import _float as _number  # a cell as a float, None where it holds none

# Imported where used: pandas and matplotlib (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

MEASURED, PREDICTED = "measured", "predicted"  # the evidence kinds this picture draws, a panel each
COLOURS = {FORCED: "#d95f02", NATIVE: "#1b9e77", EQUAL: "#7570b3", CANT_TELL: "#9a9a9a"}
FOREST_KEY = "attnbench-verdict-forest"  # the PNG text chunk that holds the rows drawn, as JSON
FOREST_COLUMNS = ["evidence", "machine", "basis", "framework", "workload", "seq_len", "dtype", "label",
                  "state", "ratio", "low", "high", "interval_of", "extrapolated", "paper_state",
                  "paper_ratio", "paper_low", "paper_high"]
# Where each drawn interval comes from in the verdict CSV, per evidence kind: (state, ratio, low, high)
SOURCE = {MEASURED: ("answer", "ratio", "ratio_low", "ratio_high"),
          PREDICTED: ("predicted", "predicted_ratio", "predicted_ratio_low", "predicted_ratio_high")}
PAPER = ("paper", "paper_ratio", "paper_low", "paper_high")


def row_label(row: dict, evidence: str) -> str:
    """What a person reads on the row: ``torch · llama-3.1-8b prefill · 512`` (a dtype where the row
    has one), the compile target first where it was predicted."""
    parts = [row["framework"], row["workload"], str(int(row["seq_len"]))]
    if _text(row.get("dtype")) not in ("", "-"):
        parts.append(row["dtype"])
    if evidence == PREDICTED:
        parts.insert(0, str(row["machine"]))
    return " · ".join(parts)


def forest_rows(table) -> pd.DataFrame:
    """The picture's rows (``FOREST_COLUMNS``): the verdict's headline rows (``verdict.headline``) that
    hold an interval, measured rows first, in the table's order; their state and interval copied
    from the verdict's own columns (``SOURCE``, ``PAPER``), nothing recomputed."""
    import pandas as pd

    rows = []
    shown = headline(table) if table is not None and not table.empty else None
    for row in ([] if shown is None else shown.to_dict("records")):
        evidence = MEASURED if row["basis"] == "measured" else PREDICTED
        state, ratio, low, high = (row.get(c) for c in SOURCE[evidence])
        ratio, low, high = _number(ratio), _number(low), _number(high)
        if ratio is None or low is None or high is None:
            continue  # no ratio here: a compile target's memory-only row
        paper = {"paper_state": None, "paper_ratio": None, "paper_low": None, "paper_high": None}
        if evidence == MEASURED:
            values = [row.get(c) for c in PAPER]
            paper = {"paper_state": _text(values[0]) or None, "paper_ratio": _number(values[1]),
                     "paper_low": _number(values[2]), "paper_high": _number(values[3])}
        rows.append({"evidence": evidence, "machine": row["machine"], "basis": row["basis"],
                     "framework": row["framework"], "workload": row["workload"],
                     "seq_len": int(row["seq_len"]), "dtype": _text(row.get("dtype")) or "-",
                     "label": row_label(row, evidence), "state": _text(state) or CANT_TELL,
                     "ratio": ratio, "low": low, "high": high, "interval_of": SOURCE[evidence][1],
                     "extrapolated": (evidence == PREDICTED
                                      and str(row.get("predicted_extrapolated")) == "True"), **paper})
    frame = pd.DataFrame(rows, columns=FOREST_COLUMNS)
    order = frame["evidence"].map({MEASURED: 0, PREDICTED: 1})
    return frame.iloc[order.argsort(kind="stable")].reset_index(drop=True)


def margin_of(cases, margin: float | None = None) -> float:
    """The equivalence margin the verdict read its rows against: ``margin`` where one was asked for,
    else the one every newest run recorded (``case_table``'s ``margin``), else ``DEFAULT_MARGIN``."""
    if margin is not None:
        return margin
    if cases is None or cases.empty or "margin" not in cases:
        return DEFAULT_MARGIN
    recorded = set(cases["margin"].dropna())
    return float(recorded.pop()) if len(recorded) == 1 else DEFAULT_MARGIN


def paper_differs(row: dict) -> bool:
    """Whether the paper answer is another state than the production one, with an interval to draw:
    where the mission's flip shows."""
    return (row["evidence"] == MEASURED and bool(row["paper_state"]) and row["paper_state"] != row["state"]
            and all(_number(row[c]) is not None for c in ("paper_ratio", "paper_low", "paper_high")))


def _interval_text(state: str, ratio: float, low: float, high: float) -> str:
    return f"{state} {ratio:.2f}x [{low:.2f}-{high:.2f}]"


def plot_verdict_forest(table, *, margin: float = DEFAULT_MARGIN,
                        horizon: str | None = None) -> bytes | None:
    """The forest plot of ``table``'s headline rows (``forest_rows``), as PNG bytes whose metadata
    holds those rows; None when no row has an interval."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = forest_rows(table)
    if rows.empty:
        return None
    panels = [(kind, rows[rows["evidence"] == kind].to_dict("records")) for kind in (MEASURED, PREDICTED)]
    panels = [(kind, part) for kind, part in panels if part]
    heights = [len(part) + sum(paper_differs(r) for r in part) * 0.45 + 1.2 for _, part in panels]
    fig, axes = new_figure(len(panels), 1, width=11.0, height=1.0)
    fig.set_size_inches(11.0, 0.32 * sum(heights) + 1.4)
    grid = axes[0][0].get_gridspec()
    grid.set_height_ratios(heights)
    for ax, (kind, part) in zip(axes[:, 0], panels, strict=True):
        _panel(ax, kind, part, margin, horizon)
    handles = [Patch(color=COLOURS[s], label=s) for s in (FORCED, NATIVE, EQUAL, CANT_TELL)]
    handles += [Patch(color="#dddddd", label=f"equal within ±{margin:.0%}"),
                Line2D([], [], color="black", marker="o", lw=1.5, label="production (measured)"),
                Line2D([], [], color="black", marker="s", mfc="white", lw=0.8, ls="--",
                       label="on paper, where its answer differs"),
                Line2D([], [], color="black", marker="D", mfc="white", lw=1.0, label="predicted (model)")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=7, frameon=False)
    return png_bytes(fig, metadata={FOREST_KEY: json.dumps(_records(rows))})


def _records(rows) -> list[dict]:
    """``rows`` as JSON can hold them exactly: Python floats (every digit), None where NaN."""
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in rows.astype(object).to_dict("records")]


def _panel(ax, kind: str, part: list[dict], margin: float, horizon: str | None) -> None:
    """One evidence kind's rows, top to bottom in the table's order."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    y, ticks, labels = 0.0, [], []
    lows, highs = [], []
    for row in part:
        colour = COLOURS.get(row["state"], COLOURS[CANT_TELL])
        marker = "o" if kind == MEASURED else "D"
        ax.plot([row["low"], row["high"]], [y, y], color=colour, lw=2.2 if kind == MEASURED else 1.4,
                solid_capstyle="butt")
        ax.plot([row["ratio"]], [y], marker=marker, ms=6, color=colour,
                mfc=colour if kind == MEASURED else "white", mec=colour)
        ax.annotate(_interval_text(row["state"], row["ratio"], row["low"], row["high"])
                    + (", extrapolated" if row["extrapolated"] else ""), (1.005, y),
                    xycoords=("axes fraction", "data"), va="center", fontsize=7, color=colour)
        ticks.append(y)
        labels.append(row["label"])
        lows.append(row["low"])
        highs.append(row["high"])
        if paper_differs(row):
            y += 0.45
            paper_colour = COLOURS.get(row["paper_state"], COLOURS[CANT_TELL])
            ax.plot([row["paper_low"], row["paper_high"]], [y, y], color=paper_colour, lw=1.0, ls="--")
            ax.plot([row["paper_ratio"]], [y], marker="s", ms=5, color=paper_colour, mfc="white",
                    mec=paper_colour)
            ax.annotate("on paper " + _interval_text(row["paper_state"], row["paper_ratio"], row["paper_low"],
                                                     row["paper_high"]),
                        (1.005, y), xycoords=("axes fraction", "data"), va="center", fontsize=6.5,
                        color=paper_colour)
            lows.append(row["paper_low"])
            highs.append(row["paper_high"])
        y += 1.0
    ax.axvspan(1.0 - margin, 1.0 + margin, color="#dddddd", zorder=0)
    ax.axvline(1.0, color="black", lw=0.8, zorder=1)
    ax.set_xscale("log")
    left, right = min(min(lows), 1.0 - margin), max(max(highs), 1.0 + margin)
    ax.set_xlim(left / 1.25, right * 1.25)
    decades = math.log10(right / left)  # 1-2-5 ticks over a few decades, a tick a decade beyond
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(y - 0.4, -0.6)
    ax.set_yticks(ticks, labels, fontsize=7.5)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.grid(True, axis="x", which="both", alpha=0.25)
    ax.text(0.0, 1.01, "← forced cheaper", transform=ax.transAxes, fontsize=7, ha="left", va="bottom")
    ax.text(1.0, 1.01, "native cheaper →", transform=ax.transAxes, fontsize=7, ha="right", va="bottom")
    if kind == MEASURED:
        machines = ", ".join(sorted({str(r["machine"]) for r in part}))
        ax.set_title(f"measured on {machines}: forced / native cost per useful token"
                     + (f" at a {horizon} horizon" if horizon else "")
                     + ", 99% interval (paired rounds)", fontsize=8.5, loc="left", pad=14)
        ax.set_xlabel("forced / native cost (log)", fontsize=7.5)
    else:
        ax.set_title("predicted on compile targets (nothing ran there): forced / native step time from the "
                     "time model;\nthe range is its calibration's error, not a 99% interval"
                     + ("; extrapolated: outside the rows it was fitted on"
                        if any(r["extrapolated"] for r in part) else ""), fontsize=8.5, loc="left", pad=14)
        ax.set_xlabel("forced / native step time, predicted (log)", fontsize=7.5)


def rows_in_png(png: bytes) -> list[dict]:
    """The rows a forest PNG was drawn from (its ``FOREST_KEY`` metadata); [] where it has none."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        text = image.text.get(FOREST_KEY) if hasattr(image, "text") else None
    return json.loads(text) if text else []
