"""The production streams as a server sees them, from each machine's newest run (read only).

``stream_table``: per workload x kernel x regime, where the stream's lengths came from (the trace,
how many steps ran of how many, their Kolmogorov-Smirnov distance from the whole trace), what the
regime paid on them (padding, distinct shapes, compiles), and what a server sees: p50 / p95 / p99
step latency with compile stalls included, the longest stall, useful tokens per second and USD per
million useful tokens, and the held-out check of the model that prices it beyond its measured steps.
``plot_lengths``: each trace stream's lengths beside its source trace's, the KS distance printed. The
streams are rebuilt from the trace and the case's recorded settings
(``core/traffic.py`` is deterministic), so the picture shows exactly the lengths that ran.
"""

from __future__ import annotations

import json
import math
import os

from attnbench.core import presets, regimes, traffic
from attnbench.report import streams as pricing
from attnbench.report.plots import new_figure, png_bytes
from attnbench.report.select import newest_commit
from attnbench.results.noise import series_scatter
from attnbench.results.steps import noise_floors

SUITES = ("Forward", "Training", "Models")
STREAM_COLUMNS = ["machine", "workload", "seq", "kernel", "regime", "trace", "steps", "KS", "padding",
                  "shapes", "compiles", "p50 ms", "p95 ms", "p99 ms", "longest stall ms", "useful tok/s",
                  "USD / M useful tok", "model check"]
METRICS = {"compiles": "compiles", "padding": "padding_waste", "tokens": "useful_tokens_per_s",
           "usd": "usd_per_million_useful_tokens_with_compiles"}


# -- a case's stream, as the verdict reads it -----------------------------------------------------
STREAM_FIELDS = {"regime_steps": "steps", "stream_steps_planned": "planned", "traffic": "traffic",
                 "traffic_ks": "ks", "traffic_requests": "requests", "latency_p99_s": "p99_s",
                 "longest_stall_s": "stall_s",
                 "distinct_shapes": "shapes", "window_seconds": "window_seconds",
                 "window_useful_tokens": "window_tokens", "setting_stream_windows": "windows",
                 "window_steady_seconds": "window_steady", "stream_steady_s": "stream_steady_s",
                 "stream_round_s": "stream_round_s", "stream_round_ids": "stream_round_ids",
                 "first_call_round_s": "first_call_round_s",
                 "first_call_round_ids": "first_call_round_ids"}


def stream_fields(rows, regime: str) -> dict:
    """A regime's stream as its case recorded it (the sidecar's fields, on every row of the case):
    steps run and planned, trace, KS distance, p99 step, longest stall, shapes, per-window figures."""
    out = {}
    for column, name in STREAM_FIELDS.items():
        values = rows[column].dropna() if column in rows else []
        value = values.iloc[0] if len(values) else None
        if (name.startswith(("window", "stream_round", "first_call_round"))) and isinstance(value, str):
            value = json.loads(value)
        out[f"{regime}:{name}"] = value
    return out


TRAFFIC_NAMES = {"azure-conv": "the conversation trace", "azure-code": "the code trace",
                 "uniform": "synthetic uniform lengths"}


def traffic_name(source) -> str:
    """How a stream's source reads in a sentence."""
    if not isinstance(source, str) or not source:
        return "an unrecorded stream"
    return TRAFFIC_NAMES.get(source, f"trace {os.path.basename(source)}")


def production_basis(sides, steps: int, measured_steps: int) -> dict:
    """What the production answer rests on: ``production`` reads ``measured: 200 steps of the code
    trace``, or where ``steps`` (a horizon) goes beyond what a kernel's way measured ``modelled beyond
    the 200 measured steps: ...``, naming each stream cut by its budget below the suite's
    ``measured_steps``; ``production_steps`` is the stream priced, ``production_source`` its lengths'
    source and ``production_measured`` the fewest steps measured where some were modelled (else None)."""
    sources = " and ".join(sorted({traffic_name(case.get(f"{cost['regime']}:traffic"))
                                   for case, cost in sides}))
    ran, cut = {}, []
    for case, cost in sides:
        figures = pricing.stream_figures(case, cost["regime"], 0, measured_steps)
        if figures is None:
            continue
        ran[case["implementation"]] = figures["measured_steps"]
        if figures["measured_steps"] < measured_steps:
            cut.append(f"{case['implementation']} {pricing.STRATEGY[cost['regime']]} measured "
                       f"{figures['measured_steps']:,}")
    least = min(ran.values()) if ran else measured_steps
    head = f"{steps:,} steps of {sources}"
    if steps <= least:
        text = f"measured: {head}"
    else:
        text = f"modelled beyond the {least:,} measured steps: {head}"
        text += f" ({'; '.join(cut)})" if cut else ""
    return {"production": text, "production_steps": steps, "production_source": sources,
            "production_measured": least if steps > least else None}


def window_spread(forced: dict, f_regime: str, native: dict, n_regime: str) -> float:
    """The standard error of the two kernels' log cost ratio over the trace windows both ran, each
    window warm (its stalled steps at the steady step: the stalls are ``sd_once``'s, and where a
    new shape first turned up is not a stretch of traffic costing more): how far the answer moves
    from one stretch of traffic to another (0 with fewer than two such windows). A stream recorded
    before its warm windows were (2026-12-04) has its windows with stalls, the first left out."""
    warm = all(isinstance(case.get(f"{regime}:window_steady"), list)
               for case, regime in ((forced, f_regime), (native, n_regime)))

    def per_token(case: dict, regime: str) -> list[float]:
        seconds = case.get(f"{regime}:window_steady" if warm else f"{regime}:window_seconds")
        tokens = case.get(f"{regime}:window_tokens")
        if not isinstance(seconds, list) or not isinstance(tokens, list):
            return []
        return [s / t if s and t and s > 0 and t > 0 else float("nan")
                for s, t in zip(seconds, tokens, strict=False)]

    a, b = per_token(forced, f_regime), per_token(native, n_regime)
    logs = [math.log(x / y) for x, y in list(zip(a, b, strict=False))[0 if warm else 1:] if x == x and y == y]
    if len(logs) < 2:
        return 0.0
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1) / len(logs))


def _series_key(r: dict) -> tuple:
    suite = str(r["benchmark"]).split(".")[1] if "." in str(r["benchmark"]) else r["benchmark"]
    return r["machine"], suite, r["implementation"], r["seq_len"], r["dtype"], r["regime"]


def stream_scatter(frame) -> dict:
    """Run-to-run relative spread of each series' steady and stalled step cost:
    ``{(machine, suite, impl, seq_len, dtype, regime, metric): sd}``, and of each regime's steady
    step against the same run's static one: ``{(..., regime, "regime/static"): sd}``."""
    import numpy as np
    import pandas as pd

    part = frame[frame["suite"].isin(["Forward", "Training", "Models"])
                 & frame["metric"].isin(["usd_per_step", "usd_per_step_with_compiles"])]
    if part.empty:
        return {}
    part = part.assign(seq_len=part["seq_len"].fillna(-1), dtype=part["dtype"].fillna("-"),
                       regime=part["regime"].fillna("static"))
    out = {}
    for r in series_scatter(part).to_dict("records"):
        if r["scatter"] == r["scatter"]:
            out[(*_series_key(r), r["metric"])] = float(r["scatter"])
    steady = part[part["metric"] == "usd_per_step"]
    keys = ["machine", "env_name", "benchmark", "implementation", "seq_len", "dtype", "commit_hash"]
    static = steady[steady["regime"] == "static"].set_index(keys)["value"]
    static = static[~static.index.duplicated()]
    moving = steady[steady["regime"] != "static"].copy()
    moving["static"] = static.reindex(pd.MultiIndex.from_frame(moving[keys])).to_numpy()
    moving = moving[moving["static"] > 0]
    if len(moving):  # the regime's steady step over its run's static one: the run's drift cancels
        moving = moving.assign(value=np.asarray(moving["value"], dtype=float) / moving["static"],
                               metric="regime/static")
        for r in series_scatter(moving).to_dict("records"):
            if r["scatter"] == r["scatter"]:
                out[(*_series_key(r), "regime/static")] = float(r["scatter"])
    return out


def cost_floors(frame) -> dict:
    """The machine's noise floor of each kind of cost figure (``results.steps.noise_floors``)."""
    costs = frame[frame["metric"].isin(["usd_per_step", "usd_per_step_with_compiles"])]
    return noise_floors(costs) if len(costs) else {}


def stream_noise(frame) -> tuple[dict, dict]:
    """(``stream_scatter``, ``cost_floors``) of ``frame``: what one run's stream cost is uncertain by.
    The verdict and its picture both read it: a report makes it once and hands it to each."""
    return stream_scatter(frame), cost_floors(frame)


# -- the streams table and pictures --------------------------------------------------------------
def _streams(frame):
    """One row per measured stream of each machine's newest run, with its recorded stream fields."""
    latest = newest_commit(frame)
    if latest.empty or "traffic" not in latest:
        return latest.iloc[0:0]
    latest = latest[latest["suite"].isin(SUITES) & latest["traffic"].notna()]
    return latest


def _workload_name(row) -> str:
    if isinstance(row.get("workload"), str) and row.get("phase"):
        return f"{row['workload']} {row['phase']}"
    return {"Forward": "causal fwd", "Training": "causal fwd+bwd"}.get(row["suite"], row["suite"])


def _ms(value) -> str:
    return f"{value * 1e3:.3g}" if value is not None and value == value else "-"


def stream_table(frame):
    """Each stream of each machine's newest run: trace, steps, KS, padding, shapes, compiles, latency
    percentiles, longest stall, useful tokens per second and USD per million useful tokens."""
    import pandas as pd

    rows = []
    streams = _streams(frame)
    keys = ["machine", "suite", "implementation", "seq_len", "workload", "phase", "regime", "dtype"]
    keys = [k for k in keys if k in streams]
    for _, part in streams.groupby(keys, sort=True, dropna=False):
        first = part.iloc[0]
        values = {m: float(v) for m, v in zip(part["metric"], part["value"], strict=True) if v == v}
        ran, planned = _number(first.get("regime_steps")), _number(first.get("stream_steps_planned"))
        timed = _number(first.get("stream_steps_timed"))
        steps = f"{ran}" if ran is not None else "-"
        if planned is not None and ran is not None and planned > ran:
            cut = first.get("stream_cut")
            steps += (f" of {planned} (cut: {cut})" if isinstance(cut, str) and cut
                      else f" of {planned} (cut by the stream budget)")
        if timed is not None and ran is not None and timed < ran:
            steps += f" ({timed} timed, one shape)"
        if first["regime"] == regimes.PACKED and ran is not None:
            steps += " packed"  # fewer, fuller steps: the same requests as the other ways' streams
        ks, shape = first.get("traffic_ks"), _shape(first)
        padding = values.get(METRICS["padding"])
        tokens, usd = values.get(METRICS["tokens"]), values.get(METRICS["usd"])
        rows.append({
            "machine": first["machine"], "workload": _workload_name(first),
            "seq": shape[1] if shape else "-", "kernel": first["implementation"],
            "regime": first["regime"] if isinstance(first["regime"], str) else "static",
            "trace": str(first["traffic"]), "steps": steps,
            "KS": f"{ks:.3f}" if ks is not None and ks == ks else "-",
            "padding": f"{padding:.0%}" if padding is not None else "-",
            "shapes": _count(first.get("distinct_shapes")),
            "compiles": _count(values.get(METRICS["compiles"])),
            "p50 ms": _ms(first.get("latency_p50_s")), "p95 ms": _ms(first.get("latency_p95_s")),
            "p99 ms": _ms(first.get("latency_p99_s")), "longest stall ms": _ms(first.get("longest_stall_s")),
            "useful tok/s": f"{tokens:,.0f}" if tokens else "-",
            "USD / M useful tok": f"{usd:.3g}" if usd else "-",
            "model check": _held_out_text(first),
        })
    return pd.DataFrame(rows, columns=STREAM_COLUMNS)


def held_out_error(seconds: list, ran: int, planned: int, windows: int) -> float | None:
    """The check of the model that prices a trace's dynamic or bucketed stream beyond its measured
    steps (``streams.price_stream``: its cost per step, stalls included, goes on at the measured
    rate), fitted to the first half of its windows and scored on the second: predicted over measured
    seconds per step of the held-out half, minus 1. ``planned`` steps in ``windows`` windows, of which
    ``ran`` ran (a stream cut by its budget ends in a short window). None with fewer than two."""
    if not isinstance(seconds, list) or len(seconds) < 2 or not ran or not planned or not windows:
        return None
    per_window = -(-planned // windows)
    steps = [per_window] * (len(seconds) - 1) + [ran - per_window * (len(seconds) - 1)]
    half = len(seconds) // 2
    fitted, held = sum(seconds[:half]) / sum(steps[:half]), sum(seconds[half:]) / max(1, sum(steps[half:]))
    return fitted / held - 1.0 if held > 0 else None


def _held_out_text(row) -> str:
    """``+12%``: the held-out check of the model beyond a dynamic or bucketed stream's steps."""
    if row.get("regime") not in ("dynamic", "bucketed"):
        return "-"
    seconds = row.get("window_seconds")
    seconds = json.loads(seconds) if isinstance(seconds, str) else seconds
    windows = row.get("setting_stream_windows")
    error = held_out_error(seconds, _number(row.get("regime_steps")) or 0,
                           _number(row.get("stream_steps_planned")) or 0,
                           _number(windows) or traffic.DEFAULT_WINDOWS)
    return f"{error:+.0%}" if error is not None else "-"


def _number(value) -> int | None:
    return int(value) if value is not None and value == value else None


def _count(value) -> str:
    return str(int(value)) if value is not None and value == value else "-"


def rebuilt_streams(frame) -> list[dict]:
    """Each distinct trace stream of the newest runs, rebuilt (``traffic.trace_stream``) from its
    trace and the case's recorded length, batch and steps: ``{"name", "stream"}``. Streams whose
    trace file is not here (a user's, on another machine) are left out."""
    out, seen = [], set()
    streams = _streams(frame)
    keys = [k for k in ("machine", "suite", "implementation", "seq_len", "workload", "phase", "regime")
            if k in streams]
    for row in streams.drop_duplicates(keys).to_dict("records"):
        source = row.get("traffic")
        if not traffic.is_trace(source) or not (source in traffic.BUILTIN or os.path.isfile(source)):
            continue
        shape = _shape(row)
        if shape is None:
            continue
        phase, max_len, batch, steps = shape
        windows = row.get("setting_stream_windows")
        windows = int(windows) if windows is not None and windows == windows else traffic.DEFAULT_WINDOWS
        key = (source, phase, max_len, batch, steps, windows)
        if key in seen:
            continue
        seen.add(key)
        stream = traffic.trace_stream(traffic.load(source), phase, max_len, batch, steps, windows)
        out.append({"name": f"{_workload_name(row)} up to {max_len}", "stream": stream})
    return out


def _shape(row) -> tuple[str, int, int, int] | None:
    """(phase, longest length, batch, steps) of a recorded stream: a preset's from its phase at the
    run's preset size; Forward and Training's batch from the requests the stream took per step."""
    steps = _number(row.get("stream_steps_planned"))
    if steps is None:
        return None
    if isinstance(row.get("workload"), str) and row.get("phase"):
        size = row.get("setting_preset_size")
        workload = presets.workload(row["workload"], row["phase"],
                                    size=size if isinstance(size, str) else "default")
        return workload.phase, workload.stream_length, workload.batch, steps
    requests, seq = row.get("traffic_requests"), row.get("seq_len")
    if requests is None or requests != requests or seq is None or seq != seq:
        return None
    return "prefill", int(seq), max(1, int(requests) // steps), steps


def plot_lengths(frame) -> bytes | None:
    """Each trace stream's lengths (before clipping) beside its source trace's, at the same scale,
    with their Kolmogorov-Smirnov distance and what was clipped."""
    import numpy as np

    found = rebuilt_streams(frame)
    if not found:
        return None
    fig, axes = new_figure(1, len(found), width=3.8, height=3.0)
    for ax, item in zip(axes[0], found, strict=True):
        stream = item["stream"]
        sample = np.fromiter((n for step in stream.unclipped for n in step), dtype=float)
        top = max(sample.max(), np.percentile(stream.population, 99.5))
        bins = np.linspace(0, top, 40)
        # both are large (a million lengths): binned here, once, and drawn from their counts
        trace_counts, _ = np.histogram(stream.population, bins=bins)
        sample_counts, _ = np.histogram(sample, bins=bins)
        ax.hist(bins[:-1], bins=bins, weights=trace_counts, density=True, color="grey", alpha=0.5,
                label=f"{stream.label} (scaled x{stream.factor:.3g})")
        ax.hist(bins[:-1], bins=bins, weights=sample_counts, density=True, histtype="step", color="C0",
                linewidth=1.5,
                label=f"measured stream: {len(stream.steps)} steps, {stream.requests} requests")
        ax.axvline(stream.max_len, color="black", linestyle=":", linewidth=0.8)
        ax.set_title(f"{item['name']}\nKS {stream.ks_distance():.3f}, {stream.clipped} clipped at the dotted "
                     "line", fontsize=8)
        ax.set_xlabel("cache length per sequence" if stream.phase == "decode" else "tokens per sequence",
                      fontsize=8)
        ax.legend(fontsize=6)
    return png_bytes(fig)


def plot_timeline(traces, frame) -> bytes | None:
    """Cost spikes over the trace's timeline: each step's USD per thousand useful tokens in the order
    the stream served the trace, per regime of the newest run's Forward streams at their longest
    length, one line per kernel; compiling steps circled, each trace window's start dotted (a new
    stretch of traffic). A spike at a window's start is new traffic; one at a circle, a compile."""
    import pandas as pd

    from attnbench.report.plots import colors_by_name
    from attnbench.report.select import newest_traces

    panels = []
    for regime in ("static", "bucketed", "dynamic", "packed"):
        part = newest_traces(traces, frame, regime)
        if part.empty or "window" not in part or "usd" not in part:
            continue
        names = part["file"].map(lambda path: os.path.basename(str(path)).removesuffix(".csv").split("__"))
        part = part[names.map(lambda n: len(n) == 5 and n[3] == "fwd")]  # Forward's, not a preset's
        part = part[part["seq_len"] == part["seq_len"].max()] if not part.empty else part
        if not part.empty and part["usd"].notna().any():
            panels.append((regime, part))
    if not panels:
        return None
    colors = colors_by_name(pd.concat([p for _, p in panels])["impl"])
    fig, axes = new_figure(len(panels), 1, width=8.0, height=2.8)
    for ax, (regime, part) in zip(axes.flat, panels, strict=True):
        for impl, run in part.groupby("impl", sort=True):
            run = run.sort_values("step")
            per_k = run["usd"] / run["tokens"].clip(lower=1) * 1e3
            ax.plot(run["step"], per_k, "-", linewidth=0.8, color=colors[impl], label=impl)
            hit = run["compiled"].astype(str) == "True"
            ax.plot(run["step"][hit], per_k[hit], "o", markersize=5, markerfacecolor="none",
                    markeredgecolor=colors[impl], linestyle="none")
        for start in sorted(part.groupby("window")["step"].min())[1:]:
            ax.axvline(start, color="grey", linestyle=":", linewidth=0.7)
        ax.set_yscale("log")
        ax.set_ylabel("USD / 1k useful tokens", fontsize=8)
        ax.set_title(f"{part['machine'].iloc[0]}, {regime}, lengths up to {int(part['seq_len'].max())}: "
                     "each step over the trace (circles compiled; dotted: a new trace window)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=3)
    axes.flat[-1].set_xlabel("step of the stream, in the trace's order")
    return png_bytes(fig)
