"""The report's section "Fragility across releases": the committed release matrix, read only.

``releases_part`` gives the context of ``templates/releases.j2`` (a kernel x release grid per
framework and target, broken cells with their reasons) and ``releases.png``; ``None`` without
``results/releases/releases.csv``.
"""

from __future__ import annotations

import os

from attnbench.core.atomic import atomic_write_bytes
from attnbench.releases import costs, matrix, memory, upgrade
from attnbench.releases.table import (
    GRID_INDEX,
    api_moves,
    broken,
    first_breaks,
    grid,
    libtpu_grid,
    load_table,
    upgrade_steps,
)
from attnbench.report.plots import new_figure, png_bytes
from attnbench.report.render import Table

# Imported where used: matplotlib (the torch_xla venv has no report libraries).

TABLE = os.path.join("releases", "releases.csv")
UPGRADES = os.path.join("releases", "upgrades.csv")
PLANTED = os.path.join("releases", "planted.csv")
# Status colours: green ok, grey refused here, amber does not fit, red every kind of breakage.
COLOURS = {
    matrix.OK: "#4caf50",
    matrix.UNSUPPORTED: "#d0d0d0",
    matrix.DOES_NOT_FIT: "#ffb74d",
    matrix.API_CHANGED: "#e53935",
    matrix.COMPILE_FAILED: "#c62828",
    matrix.NUMERICS_FAILED: "#ad1457",
    matrix.RUNTIME_ERROR: "#6a1b9a",
}
MISSING = "#ffffff"


def releases_part(results_dir: str, out_dir: str) -> dict | None:
    path = os.path.join(results_dir, TABLE)
    if not os.path.exists(path):
        return None
    frame = load_table(path)
    grids = []
    for (framework, target), part in frame.groupby(["framework", "target"], sort=True):
        table = grid(part)
        if not table.empty:
            grids.append({"name": f"{framework} on {target}", "table": Table.of(table.reset_index())})

    png = grid_png(frame)
    atomic_write_bytes(os.path.join(out_dir, "releases.png"), png)
    upgrades = upgrades_part(results_dir, frame)
    images, plots = {"releases.png": png}, {"releases.png": os.path.join(out_dir, "releases.png")}
    if upgrades:
        atomic_write_bytes(os.path.join(out_dir, "upgrades.png"), upgrades["png"])
        images["upgrades.png"] = upgrades["png"]
        plots["upgrades.png"] = os.path.join(out_dir, "upgrades.png")
    bad = broken(frame)
    steps = upgrade_steps(frame)
    firsts = first_breaks(steps)
    libtpu = libtpu_grid(frame)
    return {
        "path": path,
        "grids": grids,
        "broken": Table.of(bad),
        "n_broken": len(bad),
        "causes": _counts(bad),
        "first_breaks": Table.of(firsts),
        "n_first_breaks": len(firsts),
        "api_moves": api_moves(frame),
        "upgrades": upgrades,
        "libtpu": Table.of(libtpu.reset_index()) if not libtpu.empty else None,
        "releases": release_names(frame),
        "images": images,
        "plots": plots,
    }


def upgrades_part(results_dir: str, frame) -> dict | None:
    """"What an upgrade costs": per kernel and release pair its speed (paired rounds, this host) and
    its memory on the chips (compiled); the first bad release per kernel; the controls and the
    planted faults. ``None`` without ``upgrades.csv``."""
    path = os.path.join(results_dir, UPGRADES)
    if not os.path.exists(path):
        return None
    ups = upgrade.load_table(path)
    planted_path = os.path.join(results_dir, PLANTED)
    planted = load_table(planted_path) if os.path.exists(planted_path) else None
    decided, timed = upgrade.share_decided(ups)
    axis_order = {"jax[tpu]": 0, "planted": 1, "libtpu alone": 2}  # the long libtpu list last
    alerts = sorted(memory.changes(frame, planted), key=lambda a: axis_order[a["axis"]])
    controls = ups[ups["kind"] == upgrade.CONTROL]
    states = controls["state"].value_counts()
    png = upgrades_png(ups)
    return {
        "png": png,
        "path": path,
        "decided": decided,
        "timed": timed,
        "share": f"{decided / timed:.0%}" if timed else "n/a",
        "controls": ", ".join(f"{n} {s}" for s, n in states.items()) or "none",
        "per_step": [{"framework": fw, "table": Table.of(part.drop(columns=["framework"]))}
                     for fw, part in costs.per_step(ups, frame, alerts).groupby("framework", sort=True)],
        "first_bad": Table.of(costs.first_bad(ups, frame, alerts)),
        "alerts": Table.of([{k: a[k] for k in ("axis", "before", "after", "alert")} for a in alerts]),
        "n_alerts": len(alerts),
        "holding": Table.of(memory.holding(frame, alerts)),
    }


def upgrades_png(ups) -> bytes:
    """Per framework: each kernel x workload's upgrade ratio (after / before) with its 99% interval,
    along the release axis (one point per consecutive pair, oldest first); the ±10% band is equal."""
    from matplotlib.ticker import FuncFormatter

    real = ups[(ups["kind"] == upgrade.UPGRADE) & ups["ratio"].notna()]
    frameworks = sorted(real["framework"].unique()) or ["none"]
    fig, axes = new_figure(1, len(frameworks), width=5.5, height=4.2)
    for ax, framework in zip(axes[0], frameworks, strict=True):
        part = real[real["framework"] == framework]
        steps = sorted(part["step"].unique(), key=lambda s: matrix.version_key(s.split()[1]))
        for i, ((impl, workload), line) in enumerate(part.groupby(["impl", "workload"], sort=True)):
            line = line.assign(x=line["step"].map(steps.index)).sort_values("x")
            x = line["x"] + (i - 6) * 0.02  # a little apart, so that the intervals can be seen
            spread = [line["ratio"] - line["ratio_low"], line["ratio_high"] - line["ratio"]]
            ax.errorbar(x, line["ratio"], yerr=spread, marker="o", ms=3, lw=0.8, capsize=2,
                        label=f"{impl} · {workload}")
        ax.axhspan(0.9, 1.1, color="#e0e0e0", zorder=0)
        ax.set_yscale("log")
        ratio_text = FuncFormatter(lambda v, _: f"{v:.2g}x")
        ax.yaxis.set_major_formatter(ratio_text)
        ax.yaxis.set_minor_formatter(ratio_text)
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_xticks(range(len(steps)), [s.split(" ", 1)[1].replace(" -> ", "→") for s in steps], fontsize=7)
        ax.set_ylabel("step time, after / before (99% interval)", fontsize=8)
        ax.set_title(f"{framework}: what each upgrade did to speed (this host's CPU)", fontsize=9)
        ax.legend(fontsize=5.5, loc="best")
    return png_bytes(fig, dpi=110)


def _counts(bad: list[dict]) -> str:
    """``11 packaging, 1 adapter``: broken cells by cause, most first."""
    counts = {}
    for cell in bad:
        counts[cell["cause"]] = counts.get(cell["cause"], 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    return ", ".join(f"{n} {cause}" for cause, n in ranked) or "none"


def release_names(frame) -> list[str]:
    """``framework version`` of every release in the table, oldest first per framework."""
    pairs = set(zip(frame["framework"], frame["release"].astype(str), strict=True))
    return [f"{fw} {v}" for fw, v in sorted(pairs, key=lambda pair: (pair[0], matrix.version_key(pair[1])))]


def grid_png(frame) -> bytes:
    """Kernel rows x release columns per framework: status as colour, ``1.04x`` where it ran."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    parts = {fw: frame[frame["framework"] == fw] for fw in sorted(frame["framework"].dropna().unique())}
    grids = {fw: part[GRID_INDEX].drop_duplicates().sort_values(GRID_INDEX) for fw, part in parts.items()}
    heights = [len(rows) for rows in grids.values()]
    fig = Figure(figsize=(9, 1.2 + 0.28 * sum(heights) + 0.6 * len(parts)), layout="constrained")
    axes = fig.subplots(len(parts), 1, squeeze=False, height_ratios=[max(h, 1) for h in heights])
    for ax, (fw, part) in zip(axes[:, 0], parts.items(), strict=True):
        rows = grids[fw]
        releases = sorted(part["release"].astype(str).unique(), key=matrix.version_key)
        labels = [
            f"{r.impl} · {r.workload if r.target == 'cpu' else f'{r.target} {int(r.seq_len) // 1024}k'}"
            + ("" if r.environment == "bare" else f" · {r.environment}")
            for r in rows.itertuples()
        ]
        index = {tuple(str(v) for v in r): i for i, r in enumerate(rows.itertuples(index=False))}
        for record in part.to_dict("records"):
            i = index[tuple(str(record[c]) for c in GRID_INDEX)]
            j = releases.index(str(record["release"]))
            ax.add_patch(Rectangle((j, i), 1, 1, color=COLOURS.get(record["status"], MISSING)))
            rel = record.get("relative_to_newest")
            if record["status"] == matrix.OK and rel == rel and rel is not None:
                ax.text(j + 0.5, i + 0.5, f"{rel:.2f}x", ha="center", va="center", fontsize=7)
        ax.set_xlim(0, len(releases))
        ax.set_ylim(len(rows), 0)
        ax.set_xticks([j + 0.5 for j in range(len(releases))], [f"{fw} {r}" for r in releases], fontsize=8)
        ax.set_yticks([i + 0.5 for i in range(len(rows))], labels, fontsize=7)
        ax.tick_params(length=0)
    handles = [Patch(color=c, label=s) for s, c in COLOURS.items() if (frame["status"] == s).any()]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=7,
               frameon=False)
    fig.suptitle("Release matrix: status per release; text: step time relative to the newest release "
                 "that timed the cell",
                 fontsize=9)
    return png_bytes(fig, dpi=110)
