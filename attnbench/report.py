"""The pandas report over everything asv wrote under ``results/``: reads, never writes there.

``write_report(results_dir, out_dir)`` loads the tidy table (``asv_results.load_results``) and the
per-step traces (``analysis.load_traces``), runs the analysis (regressions, cost spikes with their
attribution, per-step trace spikes) and writes, each file atomically, into ``out_dir``
(default ``html/report/``, git-ignored beside asv's HTML; note that ``asv publish`` deletes
``html/``, so write the report after publishing):

* ``report.md``: machines, environments and commits covered; best native vs best forced-flash per
  length with cost per step and per million tokens; static vs dynamic vs bucketed cost per step;
  regressions; cost spikes with attribution; per-step trace spikes; the plots below;
* ``report.html``: the same content in one self-contained page (PNGs as base64 data URIs, no
  external reference);
* ``throughput.png``, ``memory.png``, ``regime_cost.png``, ``cost_over_commits.png``,
  ``trace_dynamic.png`` (matplotlib, Agg, no pyplot state);
* ``tidy.csv`` and ``tidy.parquet`` (the tidy table), ``regressions.csv``, ``cost_spikes.csv``,
  ``trace_spikes.csv`` (the full tables the Markdown may shorten).

CLI: ``python -m attnbench report [--results results] [--out html/report] [--threshold 0.05]
[--threshold-metric usd_per_step=0.1 ...]``.
"""

from __future__ import annotations

import base64
import datetime as dt
import html as html_lib
import io
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnbench.atomic import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_OUT = os.path.join("html", "report")
REGIMES = ("static", "dynamic", "bucketed")
MEMORY_METRICS = ("device_peak_bytes", "compiler_temp_bytes", "compiler_peak_bytes",
                  "host_profiler_peak_bytes", "host_rss_growth_bytes")
MAX_TABLE_ROWS = 40  # longer tables are cut in report.md/html; the CSVs hold every row


@dataclass
class Report:
    """What ``write_report`` wrote (paths) and the analysis tables it wrote them from."""

    out_dir: str
    markdown: str
    html: str
    tidy_csv: str
    tidy_parquet: str
    plots: dict[str, str]
    tables: dict[str, str]
    regressions: pd.DataFrame
    cost_spikes: pd.DataFrame
    trace_spikes: pd.DataFrame
    frame: pd.DataFrame = field(repr=False)

    @property
    def paths(self) -> list[str]:
        return [self.markdown, self.html, self.tidy_csv, self.tidy_parquet, *self.plots.values(),
                *self.tables.values()]


# -- tables ---------------------------------------------------------------------------------------
def short_env(env) -> str:
    return str(env).removeprefix("virtualenv-").removeprefix("existing-")


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def newest_commit(frame) -> pd.DataFrame:
    """The ok rows of each machine's newest commit (git order; commit date where git knows none)."""
    import pandas as pd

    ok = frame[frame["status"] == "ok"]
    parts = []
    for _, part in ok.groupby("machine", sort=True):
        order = "commit_position" if part["commit_position"].notna().any() else "commit_date"
        parts.append(part[part["commit_hash"] == part.loc[part[order].idxmax(), "commit_hash"]])
    return pd.concat(parts) if parts else ok.iloc[0:0]


def coverage(frame) -> pd.DataFrame:
    """Machines x environments: commits, newest commit, rows by status, library versions."""
    import pandas as pd

    rows = []
    versions = [c for c in frame.columns if c.startswith("version_")]
    for (machine, env), part in frame.groupby(["machine", "env_name"], sort=True):
        order = part.sort_values(["commit_position", "commit_date"])
        newest = order.iloc[-1]
        counts = part["status"].value_counts()
        libs = ", ".join(f"{c.removeprefix('version_')} {newest[c]}" for c in versions
                         if isinstance(newest[c], str) and newest[c])
        rows.append({"machine": machine, "env": short_env(env), "commits": part["commit_hash"].nunique(),
                     "newest": str(newest["commit_hash"])[:8], "ok": int(counts.get("ok", 0)),
                     "skipped": int(counts.get("skipped", 0)), "failed": int(counts.get("failed", 0)),
                     "libraries": libs})
    return pd.DataFrame(rows)


def commits_table(frame) -> pd.DataFrame:
    table = (frame.groupby("commit_hash", sort=False)
             .agg(position=("commit_position", "first"), date=("commit_date", "first"),
                  machines=("machine", lambda s: ", ".join(sorted(set(s)))))
             .reset_index().sort_values(["position", "date"]))
    table["commit"] = table["commit_hash"].str[:8]
    table["date"] = table["date"].dt.strftime("%Y-%m-%d %H:%M")
    return table[["position", "commit", "date", "machines"]]


def best_native_vs_forced(frame) -> pd.DataFrame:
    """Per machine, length and dtype (Forward, static shapes, newest commit): the fastest native and
    the fastest forced-flash implementation, with cost per step and per million tokens."""
    import pandas as pd

    latest = newest_commit(frame)
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")]
    if latest.empty:
        return pd.DataFrame()
    wide = latest.pivot_table(index=["machine", "seq_len", "dtype", "implementation", "label"],
                              columns="metric", values="value", aggfunc="first").reset_index()
    rows = []
    for (machine, seq, dtype), group in wide.groupby(["machine", "seq_len", "dtype"], sort=True):
        row = {"machine": machine, "seq_len": seq, "dtype": dtype}
        for label, prefix in (("native", "native"), ("forced-flash", "forced")):
            part = group[group["label"] == label]
            if "seconds_per_step" not in part:
                continue
            part = part.dropna(subset=["seconds_per_step"])
            if part.empty:
                continue
            best = part.loc[part["seconds_per_step"].idxmin()]
            row.update({prefix: best["implementation"], f"{prefix}_ms": best["seconds_per_step"] * 1e3,
                        f"{prefix}_usd_per_step": best.get("usd_per_step"),
                        f"{prefix}_usd_per_mtok": best.get("usd_per_million_tokens")})
        if "native_usd_per_mtok" in row and "forced_usd_per_mtok" in row:
            row["forced/native cost"] = row["forced_usd_per_mtok"] / row["native_usd_per_mtok"]
        rows.append(row)
    return pd.DataFrame(rows)


def regime_costs(frame) -> pd.DataFrame:
    """Forward at the newest commit: USD per step (compile stalls included) and compiles per regime."""
    import pandas as pd

    latest = newest_commit(frame)
    latest = latest[(latest["suite"] == "Forward")
                    & latest["metric"].isin(["usd_per_step_with_compiles", "usd_per_step", "compiles"])]
    if latest.empty:
        return pd.DataFrame()
    wide = latest.pivot_table(index=["machine", "implementation", "label", "seq_len", "dtype"],
                              columns=["metric", "regime"], values="value", aggfunc="first")
    out = pd.DataFrame(index=wide.index)
    for regime in REGIMES:
        for metric, name in (("usd_per_step_with_compiles", f"{regime} usd/step"),
                             ("usd_per_step", f"{regime} steady usd/step"),
                             ("compiles", f"{regime} compiles")):
            out[name] = wide[(metric, regime)] if (metric, regime) in wide else float("nan")
    out = out.reset_index().dropna(subset=[f"{r} usd/step" for r in REGIMES], how="all")
    return out.sort_values(["machine", "seq_len", "implementation"]).reset_index(drop=True)


def series_name(row) -> str:
    parts = [str(row.get("implementation") or "")]
    if row.get("seq_len") == row.get("seq_len") and row.get("seq_len") is not None:
        parts.append(f"S{int(row['seq_len'])}")
    for key in ("regime", "dtype"):
        value = row.get(key)
        if isinstance(value, str) and value:
            parts.append(value)
    return " ".join(p for p in parts if p)


def _regression_rows(table, *, attribution: bool):
    rows = []
    for _, r in table.iterrows():
        row = {"machine": r["machine"], "env": short_env(r["env_name"]),
               "benchmark": r["benchmark"].removeprefix("attention."), "case": series_name(r),
               "commits": f"{str(r['commit_before'])[:8]} -> {str(r['commit_after'])[:8]}",
               "before": _fmt(r["value_before"]), "after": _fmt(r["value_after"]),
               "change": f"{r['relative_change']:+.1%}", "versions changed": r["versions_changed"] or "-"}
        if attribution:
            row["moved with"] = r["attribution"]
        rows.append(row)
    return rows


def spike_sentences(spikes) -> list[str]:
    """One sentence per cost spike: what rose, where, by how much, and what moved with it."""
    out = []
    for _, s in spikes.iterrows():
        versions = s["versions_changed"] or "no library version changed"
        out.append(f"`{s['metric']}` of {series_name(s)} ({s['benchmark'].removeprefix('attention.')}) "
                   f"on {s['machine']} / {short_env(s['env_name'])} rose {s['relative_change']:+.1%} "
                   f"({_fmt(s['value_before'])} -> {_fmt(s['value_after'])} {s['unit'] or ''}) between "
                   f"{str(s['commit_before'])[:8]} and {str(s['commit_after'])[:8]}: moved with "
                   f"{s['attribution']}; {versions}.")
    return out


# -- plots (no pyplot: Figure objects only, so nothing global changes in a notebook) --------------
def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _figure(rows: int, cols: int, width: float = 6.0, height: float = 3.6):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def _colors(names):
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return {name: cmap(i % 20) for i, name in enumerate(sorted(set(names)))}


def _style(label) -> str:
    return "--" if label == "forced-flash" else "-"


def _impl_legend(fig, axes, title="solid: native, dashed: forced-flash"):
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8, title=title, title_fontsize=8)


def plot_throughput(frame) -> bytes | None:
    latest = newest_commit(frame)
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")
                    & latest["metric"].isin(["tokens_per_s", "mfu"])]
    if latest.empty:
        return None
    machines = sorted(latest["machine"].unique())
    colors = _colors(latest["implementation"])
    fig, axes = _figure(len(machines), 2)
    for i, machine in enumerate(machines):
        for j, (metric, ylabel) in enumerate((("tokens_per_s", "tokens/s"), ("mfu", "MFU"))):
            ax = axes[i][j]
            part = latest[(latest["machine"] == machine) & (latest["metric"] == metric)]
            for (impl, label), series in part.groupby(["implementation", "label"], sort=True):
                series = series.sort_values("seq_len")
                ax.plot(series["seq_len"], series["value"], _style(label), marker="o", color=colors[impl],
                        label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{machine}: {ylabel} (Forward, static shapes)", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    _impl_legend(fig, axes)
    return _png(fig)


def plot_memory(frame) -> bytes | None:
    latest = newest_commit(frame)
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")
                    & latest["metric"].isin(MEMORY_METRICS)]
    latest = latest[latest["value"] > 0]
    if latest.empty:
        return None
    machines = sorted(latest["machine"].unique())
    metrics = [m for m in MEMORY_METRICS if m in set(latest["metric"])]
    colors = _colors(latest["implementation"])
    fig, axes = _figure(len(machines), len(metrics), width=5.0)
    for i, machine in enumerate(machines):
        for j, metric in enumerate(metrics):
            ax = axes[i][j]
            part = latest[(latest["machine"] == machine) & (latest["metric"] == metric)]
            for (impl, label), series in part.groupby(["implementation", "label"], sort=True):
                series = series.sort_values("seq_len")
                ax.plot(series["seq_len"], series["value"] / 2**20, _style(label), marker="o",
                        color=colors[impl], label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("MiB")
            ax.set_title(f"{machine}: {metric}" + ("" if not part.empty else " (none)"), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    _impl_legend(fig, axes)
    return _png(fig)


def plot_regime_cost(costs) -> bytes | None:
    if costs.empty:
        return None
    panels = list(costs.groupby(["machine", "seq_len"], sort=True))
    fig, axes = _figure(len(panels), 1, width=max(6.0, 0.7 * costs["implementation"].nunique() + 2))
    width = 0.27
    regime_colors = {"static": "#4c72b0", "dynamic": "#dd8452", "bucketed": "#55a868"}
    for ax, ((machine, seq), part) in zip(axes.flat, panels, strict=True):
        part = part.sort_values("implementation").reset_index(drop=True)
        for k, regime in enumerate(REGIMES):
            ax.bar([i + (k - 1) * width for i in range(len(part))], part[f"{regime} usd/step"], width,
                   label=regime, color=regime_colors[regime])
        ax.set_xticks(range(len(part)))
        ax.set_xticklabels([f"{r.implementation}{' (ff)' if r.label == 'forced-flash' else ''}"
                            for r in part.itertuples()], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("USD per step incl. compile stalls")
        ax.set_title(f"{machine}, S{int(seq)}: static vs dynamic vs bucketed (ff = forced-flash)",
                     fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    return _png(fig)


def _commit_axis(frame):
    """x position and tick label per commit: git order, else commit date order."""
    commits = frame.groupby("commit_hash", sort=False).agg(position=("commit_position", "first"),
                                                           date=("commit_date", "first"))
    if commits["position"].notna().all():
        x = commits["position"]
    else:
        x = commits["date"].rank(method="dense") - 1
    return x.to_dict()


def plot_cost_over_commits(frame, spikes, metric: str = "usd_per_step", highlight: int = 8) -> bytes | None:
    """Every ``metric`` series over commits, relative to its median; series with a detected spike in
    colour (the ``highlight`` largest by name, the rest in one colour), a red line where cost rose."""
    ok = frame[(frame["status"] == "ok") & (frame["metric"] == metric)]
    if ok.empty:
        return None
    xs = _commit_axis(frame)
    machines = sorted(ok["machine"].unique())
    fig, axes = _figure(len(machines), 1, width=9.0, height=4.0)
    keys = ["env_name", "benchmark", "implementation", "seq_len", "regime", "dtype"]
    mine = spikes[spikes["metric"] == metric] if not spikes.empty else spikes
    rank = {}
    if not mine.empty:
        for _, s in mine.reindex(mine["relative_change"].abs().sort_values(ascending=False).index).iterrows():
            rank.setdefault((s["machine"], *(s.get(k) for k in keys)), len(rank))
    for ax, machine in zip(axes.flat, machines, strict=True):
        part = ok[ok["machine"] == machine].copy()
        part["x"] = part["commit_hash"].map(xs)
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
    return _png(fig)


def trace_seq(path: str) -> int | None:
    match = re.search(r"__S(\d+)__", os.path.basename(str(path)))
    return int(match.group(1)) if match else None


def newest_traces(traces, frame, regime: str = "dynamic") -> pd.DataFrame:
    """The ``regime`` traces of each machine's newest traced commit."""
    import pandas as pd

    if traces.empty or "regime" not in traces:
        return traces.iloc[0:0] if not traces.empty else traces
    part = traces[traces["regime"] == regime]
    positions = {str(h)[:8]: p for h, p in zip(frame["commit_hash"], frame["commit_position"], strict=True)}
    out = []
    for _, runs in part.groupby("machine", sort=True):
        commits = sorted(set(runs["commit8"]), key=lambda c: (positions.get(c, float("-inf")), c))
        newest = runs[runs["commit8"] == commits[-1]].copy()
        newest["seq_len"] = newest["file"].map(trace_seq)
        out.append(newest)
    return pd.concat(out, ignore_index=True) if out else part


def plot_trace(traces, frame, factor: float = 2.0) -> bytes | None:
    dynamic = newest_traces(traces, frame)
    if dynamic.empty:
        return None
    panels = list(dynamic.groupby(["machine", "seq_len"], sort=True))
    colors = _colors(dynamic["impl"])
    fig, axes = _figure(len(panels), 1, width=8.0)
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
    return _png(fig)


# -- documents ------------------------------------------------------------------------------------
class Doc:
    """Blocks rendered twice: Markdown (images by file name) and one self-contained HTML page."""

    def __init__(self):
        self.blocks: list[tuple] = []

    def h(self, level: int, text: str):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def items(self, texts: list[str]):
        self.blocks.append(("ul", texts))

    def table(self, rows: list[dict], columns: list[str] | None = None, total: int | None = None):
        columns = columns or (list(rows[0]) if rows else [])
        cut = rows[:MAX_TABLE_ROWS]
        self.blocks.append(("table", [{c: _fmt(r.get(c)) for c in columns} for r in cut], columns))
        if (total or len(rows)) > len(cut):
            self.p(f"({len(cut)} of {total or len(rows)} rows shown; every row is in the CSV beside this "
                   "report.)")

    def image(self, name: str, png: bytes, caption: str):
        self.blocks.append(("img", name, png, caption))

    def markdown(self) -> str:
        from attnbench.table import render

        out = []
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                out.append("#" * block[1] + " " + block[2])
            elif kind == "p":
                out.append(block[1])
            elif kind == "ul":
                out.append("\n".join(f"- {t}" for t in block[1]))
            elif kind == "table":
                out.append(render(block[1], block[2], markdown=True) if block[1] else "_(none)_")
            elif kind == "img":
                out.append(f"![{block[3]}]({block[1]})\n\n_{block[3]}_")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        esc = html_lib.escape

        def inline(text: str) -> str:  # `code` and **bold**, the only Markdown the blocks use
            text = esc(text)
            text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
            return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)

        body = []
        for block in self.blocks:
            kind = block[0]
            if kind == "h":
                body.append(f"<h{block[1]}>{inline(block[2])}</h{block[1]}>")
            elif kind == "p":
                body.append(f"<p>{inline(block[1])}</p>")
            elif kind == "ul":
                body.append("<ul>" + "".join(f"<li>{inline(t)}</li>" for t in block[1]) + "</ul>")
            elif kind == "table":
                rows, columns = block[1], block[2]
                if not rows:
                    body.append("<p><em>(none)</em></p>")
                    continue
                head = "".join(f"<th>{esc(c)}</th>" for c in columns)
                cells = "".join("<tr>" + "".join(f"<td>{esc(r[c])}</td>" for c in columns) + "</tr>"
                                for r in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
            elif kind == "img":
                data = base64.b64encode(block[2]).decode("ascii")
                body.append(f'<figure><img alt="{esc(block[3])}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{esc(block[3])}</figcaption></figure>")
        style = ("body{font-family:sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;font-size:12px;margin:.5em 0}"
                 "th,td{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f0f0f0}"
                 "img{max-width:100%}figcaption{font-size:12px;color:#555}code{background:#f4f4f4}")
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
                f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def threshold_text(thresholds: dict | None) -> str:
    from collections import Counter

    from attnbench.analysis import DEFAULT_THRESHOLD

    thresholds = thresholds or {}
    common = Counter(thresholds.values()).most_common(1)
    default = common[0][0] if common and len(thresholds) > 1 else DEFAULT_THRESHOLD
    others = ", ".join(f"{k} {v:.3g}" for k, v in sorted(thresholds.items()) if v != default)
    return f"{default:.3g} (relative step) for every metric" + (f" but {others}" if others else "")


def _frame_rows(table, columns=None) -> list[dict]:
    if table is None or table.empty:
        return []
    columns = columns or list(table.columns)
    return table[columns].to_dict("records")


def write_report(results_dir: str = "results", out_dir: str = DEFAULT_OUT, *, repo: str | None = None,
                 thresholds: dict | None = None, trace_factor: float = 2.0) -> Report:
    """Load ``results_dir`` (read only), analyse it and write the report into ``out_dir``.

    ``repo`` orders commits (``git rev-list``); default: the folder that holds ``results_dir``.
    ``thresholds``: relative step per metric that counts as a regression (default 5%).
    Raises ``asv_results.ResultsError`` when nothing loadable is there.
    """
    from attnbench.analysis import find_cost_spikes, find_regressions, find_trace_spikes, load_traces
    from attnbench.asv_results import load_results

    repo = repo or os.path.dirname(os.path.abspath(results_dir))
    frame = load_results(results_dir, repo=repo)
    traces = load_traces(results_dir)
    regressions = find_regressions(frame, thresholds)
    spikes = find_cost_spikes(frame, thresholds)
    trace_spikes = find_trace_spikes(traces, factor=trace_factor)
    best = best_native_vs_forced(frame)
    costs = regime_costs(frame)

    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in ("report.md", "report.html", "tidy.csv",
                                                             "tidy.parquet")}
    plots, pngs = {}, {}
    for name, make in (("throughput.png", lambda: plot_throughput(frame)),
                       ("memory.png", lambda: plot_memory(frame)),
                       ("regime_cost.png", lambda: plot_regime_cost(costs)),
                       ("cost_over_commits.png", lambda: plot_cost_over_commits(frame, spikes)),
                       ("trace_dynamic.png", lambda: plot_trace(traces, frame, trace_factor))):
        png = make()
        if png is not None:
            plots[name] = os.path.join(out_dir, name)
            pngs[name] = png
            atomic_write_bytes(plots[name], png)

    atomic_write_text(paths["tidy.csv"], frame.to_csv(index=False))
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write_bytes(paths["tidy.parquet"], buffer.getvalue())
    tables = {}
    for name, table in (("regressions.csv", regressions), ("cost_spikes.csv", spikes),
                        ("trace_spikes.csv", trace_spikes)):
        tables[name] = os.path.join(out_dir, name)
        atomic_write_text(tables[name], table.to_csv(index=False))

    doc = _document(frame, results_dir, regressions, spikes, traces, trace_spikes, best, costs, pngs,
                    thresholds, trace_factor)
    atomic_write_text(paths["report.md"], doc.markdown())
    atomic_write_text(paths["report.html"], doc.html("attnbench report"))
    return Report(out_dir=out_dir, markdown=paths["report.md"], html=paths["report.html"],
                  tidy_csv=paths["tidy.csv"], tidy_parquet=paths["tidy.parquet"], plots=plots, tables=tables,
                  regressions=regressions,
                  cost_spikes=spikes, trace_spikes=trace_spikes, frame=frame)


def _document(frame, results_dir, regressions, spikes, traces, trace_spikes, best, costs, pngs,
              thresholds, trace_factor) -> Doc:
    doc = Doc()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc.h(1, "attnbench report: forced-flash vs native attention")
    doc.p(f"Generated {stamp} from `{results_dir}` ({len(frame):,} tidy rows: "
          f"{int((frame['status'] == 'ok').sum()):,} ok, {int((frame['status'] == 'skipped').sum()):,} "
          f"skipped (n/a here), {int((frame['status'] == 'failed').sum()):,} failed). Regression threshold: "
          f"{threshold_text(thresholds)}.")

    doc.h(2, "Coverage")
    doc.table(_frame_rows(coverage(frame)))
    doc.p("Commits, oldest first (git order):")
    commits = commits_table(frame)
    doc.table(_frame_rows(commits))

    doc.h(2, "Best native vs best forced-flash")
    doc.p("Per machine and sequence length: the fastest native and the fastest forced-flash "
          "implementation (causal forward B1 H8 D64, static shapes, newest commit), with cost per step and "
          "per million tokens at on-demand prices. `forced/native cost` > 1: forcing the flash kernel "
          "costs more.")
    doc.table(_frame_rows(best))
    if "throughput.png" in pngs:
        doc.image("throughput.png", pngs["throughput.png"],
                  "Throughput (tokens/s) and MFU vs sequence length; solid native, dashed forced-flash")
    if "memory.png" in pngs:
        doc.image("memory.png", pngs["memory.png"],
                  "Memory vs sequence length, one panel per memory source the machine reports")

    doc.h(2, "Static vs dynamic vs bucketed shapes")
    doc.p("USD per step with compile stalls included (the mean step of the regime's length stream), the "
          "steady USD per step (steps that did not compile) and compiles, per regime, newest commit.")
    doc.table(_frame_rows(costs))
    if "regime_cost.png" in pngs:
        doc.image("regime_cost.png", pngs["regime_cost.png"],
                  "USD per step incl. compile stalls: static vs dynamic vs bucketed")

    doc.h(2, "Cost spikes")
    if spikes.empty:
        doc.p("No cost spike detected (cost metrics: usd_per_step, usd_per_step_with_compiles, "
              "usd_per_million_tokens)" + (" — only one commit so far." if frame["commit_hash"].nunique() < 2
                                          else "."))
    else:
        largest = spikes.reindex(spikes["relative_change"].abs().sort_values(ascending=False).index)
        doc.p(f"{len(spikes)} cost spike(s), largest first, each attributed to the companion metrics that "
              "moved across the same two commits and to the library versions that changed there:")
        doc.items(spike_sentences(largest.head(MAX_TABLE_ROWS)))
        doc.table(_regression_rows(largest, attribution=True), total=len(spikes))
    if "cost_over_commits.png" in pngs:
        doc.image("cost_over_commits.png", pngs["cost_over_commits.png"],
                  "USD per step over commits (each series relative to its median); spikes in colour, "
                  "red line at the commit where cost rose")

    doc.h(2, "Regressions")
    if regressions.empty:
        doc.p("No regressions detected.")
    else:
        ordered = regressions.reindex(regressions["relative_change"].abs().sort_values(ascending=False).index)
        doc.p(f"{len(regressions)} regression(s) over all metrics (asv's step detection, each metric's "
              "direction honoured), largest first:")
        doc.table(_regression_rows(ordered, attribution=False), total=len(regressions))

    doc.h(2, "Per-step trace spikes")
    if trace_spikes.empty:
        doc.p("No per-step traces found." if traces.empty else
              f"No step took {trace_factor:g}x its run's median step or more.")
    else:
        summary = (trace_spikes.groupby(["machine", "regime", "cause"], sort=True)
                   .agg(steps=("step", "size"), worst_times_median=("times_median", "max"),
                        stall_seconds=("seconds", "sum")).reset_index())
        doc.p(f"Steps that took at least {trace_factor:g}x their run's median step, by cause:")
        doc.table(_frame_rows(summary))
        worst = trace_spikes.sort_values("times_median", ascending=False)
        worst = worst.assign(seq_len=worst["file"].map(trace_seq))
        columns = [c for c in ["machine", "commit8", "impl", "regime", "seq_len", "step", "length",
                               "padded_length", "compiled", "seconds", "times_median", "cause"] if c in worst]
        doc.p("Worst steps:")
        doc.table(_frame_rows(worst, columns), total=len(worst))
    if "trace_dynamic.png" in pngs:
        doc.image("trace_dynamic.png", pngs["trace_dynamic.png"],
                  "Per-step time of the dynamic-shape stream (newest commit); red circles: steps that "
                  "compiled")
    return doc
