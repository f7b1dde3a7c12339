"""The report's plots, as PNG bytes: matplotlib ``Figure`` objects only (Agg, no pyplot state),
so nothing global changes in a notebook. Each takes the tidy table (or a selection of it) and
returns ``None`` when it has nothing to draw. Forced-flash lines are dashed, native solid.
"""

from __future__ import annotations

import io

from attnbench.core import metrics
from attnbench.report.select import REGIMES, newest_commit, newest_traces, not_interpreted, series_name

# Imported where used: matplotlib (the torch_xla venv has no report libraries).


# The figure helpers every picture of the report draws with (plots, verdict, compiled).
def png_bytes(fig, dpi: int = 100, metadata: dict[str, str] | None = None) -> bytes:
    """The figure as PNG (``metadata``: text chunks it carries). Its layout engine (``new_figure``:
    constrained) keeps everything inside: no ``bbox_inches="tight"``, which draws the figure once more."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata=metadata)
    return buffer.getvalue()


def new_figure(rows: int, cols: int, width: float = 6.0, height: float = 3.6):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def colors_by_name(names):
    """One colour per name, the same name the same colour in every panel."""
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return {name: cmap(i % 20) for i, name in enumerate(sorted(set(names)))}


def line_style(category) -> str:
    """Native solid, forced-flash dashed, interpreted dotted."""
    return {"forced-flash": "--", "interpreted": ":"}.get(category, "-")


def _kind(part) -> str:
    """The column a line's style follows: ``category`` (interpreted kernels dotted), else ``label``."""
    return "category" if "category" in part else "label"


def _impl_legend(fig, axes, title="solid: native, dashed: forced-flash, dotted: interpreted"):
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8, title=title, title_fontsize=8)


def _lines_by_length(ax, part, colors, ylabel: str, title: str, scale: float = 1.0) -> None:
    """One line per kernel of ``part`` against length (log-log), styled by its category."""
    for (impl, kind), series in part.groupby(["implementation", _kind(part)], sort=True):
        series = series.sort_values("seq_len")
        ax.plot(series["seq_len"], series["value"] * scale, line_style(kind), marker="o", color=colors[impl],
                label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def plot_throughput(frame) -> bytes | None:
    latest = newest_commit(frame)
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")
                    & latest["metric"].isin(["tokens_per_s", "mfu"])]
    if latest.empty:
        return None
    machines = sorted(latest["machine"].unique())
    colors = colors_by_name(latest["implementation"])
    fig, axes = new_figure(len(machines), 2)
    for i, machine in enumerate(machines):
        for j, (metric, ylabel) in enumerate((("tokens_per_s", "tokens/s"), ("mfu", "MFU"))):
            ax = axes[i][j]
            part = latest[(latest["machine"] == machine) & (latest["metric"] == metric)]
            _lines_by_length(ax, part, colors, ylabel,
                             f"{machine}: {ylabel} (Forward, static shapes; bands: intervals)")
            for impl, series in part.groupby("implementation", sort=True):
                series = series.sort_values("seq_len")
                band = series.dropna(subset=["ci_low", "ci_high"]) if "ci_low" in series else series.iloc[0:0]
                if len(band):  # the figure's recorded interval over timing rounds
                    ax.fill_between(band["seq_len"], band["ci_low"], band["ci_high"], color=colors[impl],
                                    alpha=0.15, linewidth=0)
                    if len(band) == 1:
                        ax.errorbar(band["seq_len"], band["value"], color=colors[impl], linestyle="none",
                                    yerr=[band["value"] - band["ci_low"], band["ci_high"] - band["value"]])
    _impl_legend(fig, axes)
    return png_bytes(fig)


def plot_memory(frame) -> bytes | None:
    memory = metrics.names("memory")
    latest = newest_commit(frame)
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")
                    & latest["metric"].isin(memory)]
    latest = latest[latest["value"] > 0]
    if latest.empty:
        return None
    machines = sorted(latest["machine"].unique())
    shown = [m for m in memory if m in set(latest["metric"])]
    colors = colors_by_name(latest["implementation"])
    fig, axes = new_figure(len(machines), len(shown), width=5.0)
    for i, machine in enumerate(machines):
        for j, metric in enumerate(shown):
            ax = axes[i][j]
            part = latest[(latest["machine"] == machine) & (latest["metric"] == metric)]
            _lines_by_length(ax, part, colors, "MiB", f"{machine}: {metric}" + ("" if not part.empty
                                                                                 else " (none)"), 2**-20)
    _impl_legend(fig, axes)
    return png_bytes(fig)


def plot_regime_cost(costs) -> bytes | None:
    if costs.empty:
        return None
    panels = list(costs.groupby(["machine", "seq_len"], sort=True))
    fig, axes = new_figure(len(panels), 1, width=max(6.0, 0.7 * costs["implementation"].nunique() + 2))
    width = 0.8 / len(REGIMES)
    regime_colors = {"static": "#4c72b0", "dynamic": "#dd8452", "bucketed": "#55a868", "packed": "#8172b3"}
    for ax, ((machine, seq), part) in zip(axes.flat, panels, strict=True):
        part = part.sort_values("implementation").reset_index(drop=True)
        for k, regime in enumerate(REGIMES):
            offset = (k - (len(REGIMES) - 1) / 2) * width
            ax.bar([i + offset for i in range(len(part))], part[f"{regime} usd/step"], width,
                   label=regime, color=regime_colors[regime])
        ax.set_xticks(range(len(part)))
        ax.set_xticklabels([f"{r.implementation}{' (ff)' if r.label == 'forced-flash' else ''}"
                            for r in part.itertuples()], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("USD per step incl. compile stalls")
        ax.set_title(f"{machine}, S{int(seq)}: {' vs '.join(REGIMES)} (ff = forced-flash)",
                     fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    return png_bytes(fig)


def plot_cost_by_length(frame) -> bytes | None:
    """USD per million useful tokens, compile stalls included, against length: one panel per machine
    and regime (the measured stream), each kernel a line; interpreted kernels are left out."""
    latest = not_interpreted(newest_commit(frame))
    latest = latest[(latest["suite"] == "Forward")
                    & (latest["metric"] == "usd_per_million_useful_tokens_with_compiles")
                    & ~latest["implementation"].str.startswith("reference")]
    if latest.empty:
        return None
    machines = sorted(latest["machine"].unique())
    colors = colors_by_name(latest["implementation"])
    fig, axes = new_figure(len(machines), len(REGIMES), width=4.4)
    for i, machine in enumerate(machines):
        for j, regime in enumerate(REGIMES):
            ax = axes[i][j]
            part = latest[(latest["machine"] == machine) & (latest["regime"] == regime)]
            _lines_by_length(ax, part, colors, "USD per million useful tokens",
                             f"{machine}: {regime} (the stream's longest length)"
                             + ("" if not part.empty else " (not measured)"))
    _impl_legend(fig, axes)
    return png_bytes(fig)


def _commit_axis(frame):
    """x position per commit: ``commit_order`` (git order, else commit dates), else git position, else
    commit date order. Commits that cannot be ordered are not drawn."""
    order = "commit_order" if "commit_order" in frame and frame["commit_order"].notna().any() else None
    commits = frame.groupby("commit_hash", sort=False).agg(position=(order or "commit_position", "first"),
                                                           date=("commit_date", "first"))
    if commits["position"].notna().any():
        x = commits["position"].dropna()
    else:
        x = (commits["date"].rank(method="dense") - 1).dropna()
    return x.to_dict()


def plot_cost_over_commits(frame, spikes, metric: str = "usd_per_step", highlight: int = 8) -> bytes | None:
    """Every ``metric`` series over commits, relative to its median; series with a detected spike in
    colour (the ``highlight`` largest by name, the rest in one colour), a red line where cost rose."""
    ok = frame[(frame["status"] == "ok") & (frame["metric"] == metric)]
    if ok.empty:
        return None
    xs = _commit_axis(frame)
    machines = sorted(ok["machine"].unique())
    fig, axes = new_figure(len(machines), 1, width=9.0, height=4.0)
    keys = ["env_name", "benchmark", "implementation", "seq_len", "regime", "dtype"]
    mine = spikes[spikes["metric"] == metric] if not spikes.empty else spikes
    rank = {}
    if not mine.empty:
        for _, s in mine.reindex(mine["relative_change"].abs().sort_values(ascending=False).index).iterrows():
            rank.setdefault((s["machine"], *(s.get(k) for k in keys)), len(rank))
    for ax, machine in zip(axes.flat, machines, strict=True):
        part = ok[ok["machine"] == machine].copy()
        part["x"] = part["commit_hash"].map(xs)
        part = part.dropna(subset=["x"])  # a commit that cannot be ordered has no place on the axis
        other_labelled = False
        for key, series in part.groupby(keys, dropna=False, sort=True):
            series = series.sort_values("x")
            relative = series["value"] / series["value"].median()
            place = rank.get((machine, *key))
            if place is None:
                ax.plot(series["x"], relative, "-", color="0.6", alpha=0.35, linewidth=0.8)
            elif place < highlight:
                name = series_name(dict(zip(keys, key, strict=True)))
                ax.plot(series["x"], relative, "-o", linewidth=2, label=name, zorder=3)
            else:
                ax.plot(series["x"], relative, "-", color="salmon", linewidth=1, zorder=2,
                        label=None if other_labelled else "other series with a detected spike")
                other_labelled = True
        if not mine.empty:
            here = mine[mine["machine"] == machine]
            for commit, at in here.groupby("commit_after"):
                after = xs.get(commit)
                ax.axvline(after, color="red", linestyle=":", linewidth=1)
                ax.annotate(f"{len(at)} spike{'s' if len(at) != 1 else ''}, up to "
                            f"{at['relative_change'].max():+.0%}", (after, 1.0), xytext=(-4, 40),
                            textcoords="offset points", color="red", fontsize=8, ha="right")
        ticks = sorted(set(part["x"]))
        labels = {x: h[:8] for h, x in xs.items()}
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[t] for t in ticks], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(f"{metric} / series median")
        count = len(ticks)
        ax.set_title(f"{machine}: {metric} over {count} commit{'s' if count != 1 else ''}, each series "
                     "relative to its median; detected spikes in colour", fontsize=10)
        ax.grid(True, alpha=0.3)
    _impl_legend(fig, axes, title=f"largest {metric} spikes")
    return png_bytes(fig)


def plot_trace(traces, frame, factor: float = 2.0) -> bytes | None:
    dynamic = newest_traces(traces, frame)
    if dynamic.empty:
        return None
    panels = list(dynamic.groupby(["machine", "seq_len"], sort=True))
    colors = colors_by_name(dynamic["impl"])
    fig, axes = new_figure(len(panels), 1, width=8.0)
    for ax, ((machine, seq), part) in zip(axes.flat, panels, strict=True):
        labelled = set()
        for (impl, _), run in part.groupby(["impl", "file"], sort=True):
            run = run.sort_values("step")
            ax.plot(run["step"], run["seconds"], "-", marker=".", color=colors[impl], label=impl)
            compiled = run[run["compiled"].astype(str) == "True"]
            stalls = run[run["seconds"] >= factor * run["seconds"].median()]
            circle = {"marker": "o", "markersize": 9, "markerfacecolor": "none", "markeredgecolor": "red",
                      "linestyle": "none"}
            cross = {"marker": "x", "color": "black", "markersize": 6, "linestyle": "none"}
            for marks, name, style in ((compiled, "step compiled a new shape", circle),
                                       (stalls, f">= {factor:g}x the run's median step", cross)):
                if not marks.empty:
                    label = None if name in labelled else name
                    ax.plot(marks["step"], marks["seconds"], label=label, **style)
                    labelled.add(name)
        ax.set_yscale("log")
        ax.set_xlabel("step of the dynamic-shape stream")
        ax.set_ylabel("seconds")
        commit = part["commit8"].iloc[0]
        ax.set_title(f"{machine}, max S{seq}, commit {commit}: per-step time, dynamic shapes", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    _impl_legend(fig, axes, title="dynamic-shape traces")
    return png_bytes(fig)
