"""What the report shows, selected from the tidy table (``asv_results.load_results``) and the traces.

Plain pandas in, plain pandas out. "Newest" is always per machine (its newest commit by
``commit_order``), since machines are benchmarked at different commits.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from attnbench.core import regimes
from attnbench.results.noise import is_contended

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

REGIMES = regimes.REGIMES


def short_env(env) -> str:
    return str(env).removeprefix("virtualenv-").removeprefix("existing-")


def series_name(row) -> str:
    parts = [str(row.get("implementation") or "")]
    if row.get("seq_len") == row.get("seq_len") and row.get("seq_len") is not None:
        parts.append(f"S{int(row['seq_len'])}")
    for key in ("regime", "dtype"):
        value = row.get(key)
        if isinstance(value, str) and value:
            parts.append(value)
    return " ".join(p for p in parts if p)


def trace_seq(path: str) -> int | None:
    match = re.search(r"__S(\d+)__", os.path.basename(str(path)))
    return int(match.group(1)) if match else None


def order_column(frame) -> str:
    """The column commits are ordered by: ``commit_order``, else ``commit_position``, else ``commit_date``."""
    for column in ("commit_order", "commit_position"):
        if column in frame and frame[column].notna().any():
            return column
    return "commit_date"


ORDER_COLUMNS = ("commit_order", "commit_position", "commit_date")


def newest_commit(frame) -> pd.DataFrame:
    """The ok rows of each machine's newest commit (``order_column``)."""

    ok = frame["status"] == "ok"
    # the commits from a narrow copy, the rows in one selection: a history is wide, and many ask this
    head = frame.loc[ok, [c for c in ("machine", "commit_hash", *ORDER_COLUMNS) if c in frame]]
    newest = {}
    for machine, part in head.groupby("machine", sort=True):
        order = order_column(part)
        if part[order].notna().any():
            newest[machine] = part.loc[part[order].idxmax(), "commit_hash"]
    rows = frame[ok & frame["machine"].map(newest).eq(frame["commit_hash"])]
    return rows.sort_values("machine", kind="stable") if len(newest) > 1 else rows  # machine by machine


def coverage(frame, unmeasured=None) -> pd.DataFrame:
    """Machines x environments: commits, newest commit, rows by status, library versions. ``skipped``:
    the grid cells that hold nothing (n/a), from ``unmeasured`` (``asv_results.Tidy``), else the
    frame's rows of that status (a tidy table written before such cells were counted)."""
    import pandas as pd

    n_a = ({} if unmeasured is None or unmeasured.empty else
           unmeasured.groupby(["machine", "env_name"])["cells"].sum().to_dict())
    rows = []
    versions = [c for c in frame.columns if c.startswith("version_")]
    needs = ["machine", "env_name", "commit_hash", "status", *ORDER_COLUMNS, *versions]
    narrow = frame[[c for c in dict.fromkeys(needs) if c in frame]]  # grouping copies what it groups
    for (machine, env), part in narrow.groupby(["machine", "env_name"], sort=True):
        order = part.sort_values([order_column(part), "commit_date"])
        newest = order.iloc[-1]
        counts = part["status"].value_counts()
        libs = ", ".join(f"{c.removeprefix('version_')} {newest[c]}" for c in versions
                         if isinstance(newest[c], str) and newest[c])
        rows.append({"machine": machine, "env": short_env(env), "commits": part["commit_hash"].nunique(),
                     "newest": str(newest["commit_hash"])[:8], "ok": int(counts.get("ok", 0)),
                     "skipped": int(n_a.get((machine, env), counts.get("skipped", 0))),
                     "failed": int(counts.get("failed", 0)),
                     "libraries": libs})
    return pd.DataFrame(rows)


def commits_table(frame) -> pd.DataFrame:
    """Commits in the order the analysis takes them: ``position`` (``order_column``), ``ordered by``
    (git, date, or none where a commit cannot be placed), the commit date asv recorded."""
    order = order_column(frame)
    table = (frame.groupby("commit_hash", sort=False)
             .agg(position=(order, "first"), date=("commit_date", "first"),
                  machines=("machine", lambda s: ", ".join(sorted(set(s)))))
             .reset_index().sort_values(["position", "date"]))
    if "commit_order_source" in frame:
        table["ordered by"] = table["commit_hash"].map(
            frame.drop_duplicates("commit_hash").set_index("commit_hash")["commit_order_source"])
    elif order == "commit_position":
        table["ordered by"] = table["position"].notna().map({True: "git", False: "none"})
    else:
        table["ordered by"] = "date"
    table["commit"] = table["commit_hash"].str[:8]
    table["date"] = table["date"].dt.strftime("%Y-%m-%d %H:%M")
    return table[["position", "commit", "date", "ordered by", "machines"]]


def not_interpreted(frame) -> pd.DataFrame:
    """The rows of kernels that did not run in an interpreter (``execution`` != ``interpret``)."""
    if "execution" not in frame:
        return frame
    return frame[frame["execution"] != "interpret"]


def best_native_vs_forced(frame) -> pd.DataFrame:
    """Per machine, length and dtype (Forward, static shapes, that machine's newest commit): the
    fastest native and the fastest forced-flash implementation by seconds per step, with cost per
    step and per million tokens on demand, by the labels recorded at measurement time. Interpreted
    kernels and contended figures (named in ``contended (excluded)``) compete on neither side;
    ``forced/native cost`` is forced over native USD per million tokens. ``attnbench summary`` prints it.
    """
    import pandas as pd


    latest = not_interpreted(newest_commit(frame))
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")]
    if latest.empty:
        return pd.DataFrame()
    keys = ["machine", "seq_len", "dtype", "implementation"]
    busy = latest[is_contended(latest) & (latest["metric"] == "seconds_per_step")]
    excluded = {}
    if not busy.empty:
        for (machine, seq, dtype, impl), _ in busy.groupby(keys, sort=True):
            excluded.setdefault((machine, seq, dtype), []).append(impl)
        flagged = pd.MultiIndex.from_frame(busy[keys].drop_duplicates())
        latest = latest[~pd.MultiIndex.from_frame(latest[keys]).isin(flagged)]
        if latest.empty:
            return pd.DataFrame()
    wide = latest.pivot_table(index=["machine", "seq_len", "dtype", "implementation", "label"],
                              columns="metric", values="value", aggfunc="first").reset_index()
    rows = []
    for (machine, seq, dtype), group in wide.groupby(["machine", "seq_len", "dtype"], sort=True):
        row = {"machine": machine, "seq_len": seq, "dtype": dtype}
        for label, side in (("native", "native"), ("forced-flash", "forced")):
            part = group[group["label"] == label]
            if "seconds_per_step" not in part:
                continue
            part = part.dropna(subset=["seconds_per_step"])
            if part.empty:
                continue
            best = part.loc[part["seconds_per_step"].idxmin()]
            row.update({f"best_{side}": best["implementation"],
                        f"{side}_ms_per_step": best["seconds_per_step"] * 1e3,
                        f"{side}_usd_per_step": best.get("usd_per_step"),
                        f"{side}_usd_per_mtok": best.get("usd_per_million_tokens")})
        if row.get("native_usd_per_mtok") is not None and row.get("forced_usd_per_mtok") is not None:
            row["forced/native cost"] = row["forced_usd_per_mtok"] / row["native_usd_per_mtok"]
        if excluded.get((machine, seq, dtype)):
            row["contended (excluded)"] = ", ".join(excluded[(machine, seq, dtype)])
        rows.append(row)
    return pd.DataFrame(rows)


def interpreted_runs(frame) -> pd.DataFrame:
    """Forward, static, each machine's newest commit: the kernels that ran in an interpreter (their
    figures say nothing about the kernel on its own hardware), with ms per step and platform."""
    import pandas as pd

    latest = newest_commit(frame)
    if "execution" not in latest:
        return pd.DataFrame()
    latest = latest[(latest["suite"] == "Forward") & (latest["regime"] == "static")
                    & (latest["execution"] == "interpret") & (latest["metric"] == "seconds_per_step")]
    if latest.empty:
        return pd.DataFrame()
    table = latest.assign(ms_per_step=latest["value"] * 1e3)
    columns = ["machine", "seq_len", "dtype", "implementation", "label", "platform", "ms_per_step"]
    table = table[columns].sort_values(["machine", "seq_len", "dtype", "implementation"])
    return table.reset_index(drop=True)


def provenance(frame) -> pd.DataFrame:
    """Machines x environments x commits (git order): the sidecar's settings (``-`` where none) and
    whether the rows' labels were recorded at measurement time or recomputed from today's code."""
    import pandas as pd

    settings = [c for c in frame.columns if c.startswith("setting_")]
    first = ["setting_suite", "setting_compile_cache"]
    settings = [c for c in first if c in settings] + sorted(c for c in settings if c not in first)
    rows = []
    keys = ["machine", "env_name", "commit_hash"]
    order = order_column(frame)
    for (machine, env, commit), part in frame.groupby(keys, sort=False):
        sources = sorted(set(part["labels_source"].dropna())) if "labels_source" in part else []
        row = {"machine": machine, "env": short_env(env), "commit": str(commit)[:8],
               "position": part[order].iloc[0], "date": part["commit_date"].iloc[0],
               "labels": "/".join(sources) or "-"}
        for column in settings:
            values = part[column].dropna()
            row[column.removeprefix("setting_")] = values.iloc[0] if len(values) else None
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).sort_values(["machine", "env", "position", "date"])
    return table.drop(columns=["position", "date"]).reset_index(drop=True)


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


def newest_traces(traces, frame, regime: str = "dynamic") -> pd.DataFrame:
    """The ``regime`` traces of each machine's newest traced commit."""
    import pandas as pd

    if traces.empty or "regime" not in traces:
        return traces.iloc[0:0] if not traces.empty else traces
    part = traces[traces["regime"] == regime]
    rank = frame[order_column(frame)].rank(method="dense")  # NaN where a commit cannot be ordered
    positions = {str(h)[:8]: p for h, p in zip(frame["commit_hash"], rank.fillna(-1.0), strict=True)}
    out = []
    for _, runs in part.groupby("machine", sort=True):
        commits = sorted(set(runs["commit8"]), key=lambda c: (positions.get(c, float("-inf")), c))
        newest = runs[runs["commit8"] == commits[-1]].copy()
        newest["seq_len"] = newest["file"].map(trace_seq)
        out.append(newest)
    return pd.concat(out, ignore_index=True) if out else part


def trace_spike_summary(trace_spikes) -> pd.DataFrame:
    """Trace spikes by machine, regime and cause: how many, the worst, and the seconds they took."""
    return (trace_spikes.groupby(["machine", "regime", "cause"], sort=True)
            .agg(steps=("step", "size"), worst_times_median=("times_median", "max"),
                 stall_seconds=("seconds", "sum")).reset_index())


def worst_trace_steps(trace_spikes) -> pd.DataFrame:
    """Every trace spike, worst first, with the length of the run it belongs to."""
    worst = trace_spikes.sort_values("times_median", ascending=False)
    worst = worst.assign(seq_len=worst["file"].map(trace_seq))
    columns = [c for c in ["machine", "commit8", "impl", "regime", "seq_len", "step", "length",
                           "padded_length", "compiled", "seconds", "times_median", "cause"] if c in worst]
    return worst[columns]


def largest_first(table) -> pd.DataFrame:
    """Regressions or spikes ordered by the size of their step, largest first."""
    return table.reindex(table["relative_change"].abs().sort_values(ascending=False).index)


# Per preset workload (benchmarks/attention.py Models): what the kernels did in each phase.
WORKLOAD_METRICS = {"seconds_per_step": ("ms/step", 1e3), "tflops": ("TFLOP/s", 1.0),
                    "bytes_per_s": ("GB/s", 1e-9), "usd_per_million_tokens": ("USD/Mtok", 1.0)}
MEMORY_METRICS = ("device_peak_bytes", "host_profiler_peak_bytes", "compiler_temp_bytes")


def workload_tables(frame) -> dict[str, pd.DataFrame]:
    """``{preset: table}`` from the Models class at each machine's newest commit: per machine, phase
    and implementation, ms/step, TFLOP/s, GB/s (the minimum bytes: what bounds decode), USD per
    million tokens with what its price buys (``price kind``: machines priced as a whole instance and
    as the accelerator alone are not one kind of USD; ``-`` for a record from before it was kept)
    and peak memory (MiB), fastest first; ``best`` marks the fastest native and forced-flash of a
    phase. Interpreted and contended figures are left out."""
    import pandas as pd


    if "workload" not in frame:
        return {}
    latest = not_interpreted(newest_commit(frame))
    latest = latest[(latest["suite"] == "Models") & latest["workload"].notna() & (latest["status"] == "ok")]
    if latest.empty:
        return {}
    keys = ["machine", "workload", "phase", "implementation"]
    busy = latest[is_contended(latest) & (latest["metric"] == "seconds_per_step")]
    if not busy.empty:
        flagged = pd.MultiIndex.from_frame(busy[keys].drop_duplicates())
        latest = latest[~pd.MultiIndex.from_frame(latest[keys]).isin(flagged)]
    wide = latest.pivot_table(index=keys + ["label"], columns="metric", values="value",
                              aggfunc="first").reset_index()
    kinds = (latest.dropna(subset=["price_kind"]).groupby(keys)["price_kind"].first().to_dict()
             if "price_kind" in latest else {})
    if "seconds_per_step" not in wide:
        return {}
    order = {"prefill": 0, "training": 1, "decode": 2}
    tables = {}
    for name, group in wide.groupby("workload", sort=True):
        group = group.dropna(subset=["seconds_per_step"]).copy()
        group["_phase"] = group["phase"].map(order)
        group = group.sort_values(["machine", "_phase", "seconds_per_step"])
        rows = []
        for _, row in group.iterrows():
            out = {"machine": row["machine"], "phase": row["phase"], "implementation": row["implementation"],
                   "label": row["label"]}
            for metric, (title, factor) in WORKLOAD_METRICS.items():
                value = row.get(metric)
                out[title] = value * factor if value is not None and value == value else None
            out["price kind"] = kinds.get(tuple(row[k] for k in keys), "-")
            memory = next((row[m] for m in MEMORY_METRICS if m in row and row[m] == row[m]), None)
            out["peak MiB"] = memory / 2**20 if memory is not None else None
            rows.append(out)
        table = pd.DataFrame(rows)
        best = []
        for _, part in table.groupby(["machine", "phase"], sort=False):
            for label in ("native", "forced-flash"):
                side = part[part["label"] == label]
                best.append(side.index[0] if not side.empty else None)
        table["best"] = ["fastest " + table.at[i, "label"] if i in best else "" for i in table.index]
        tables[name] = table
    return tables
