"""The record of one measured case: its columns, their units, and the statuses it can end in.

One record is one implementation x workload x shape regime x device. Every metric column is named
with its unit or source so that nothing is mixed. A metric column's unit comes from
``attnbench/core/metrics.py``; ``LAYOUT`` only places it (``METRIC``), and unplaced ones are appended.
"""

from __future__ import annotations

import dataclasses

from attnbench.core import metrics
from attnbench.core.statuses import (  # noqa: F401  (re-exported: callers name them records.OK, ...)
    ERROR,
    NUMERICS_FAILED,
    OK,
    OOM,
    STATUS_CODES,
    STATUSES,
    TIMEOUT,
    UNSUPPORTED,
)
from attnbench.core.workload import Workload

METRIC = None  # a column a metric reads: its unit is the metric table's
# column -> unit ("" for labels). Order here is the column order of written tables.
LAYOUT = {
    # what ran
    "impl": "", "framework": "", "label": "", "execution": "", "platform": "", "device": "",
    "kernel_evidence": "", "kernel_verified": "bool", "status": "", "reason": "",
    # the tile config the figures ran at (``block_q=64,block_k=128``; "" for a kernel without knobs)
    # and where it came from: "defaults", "tuned" (results/tuning/, docs/tuning.md) or "given"
    "config": "", "config_source": "",
    # the workload
    "workload": "", "phase": "",
    "batch": "", "q_heads": "", "kv_heads": "", "gqa": "", "seq_q": "tokens", "seq_k": "tokens",
    "head_dim": "",
    "dtype": "", "causal": "bool", "mode": "", "mask": "", "window": "tokens",
    # a preset's own window where a scaled-down suite size ran a smaller one (None: not scaled)
    "window_scaled_from": "tokens", "softcap": "",
    "documents": "count", "ragged": "bool", "mask_density": "fraction", "flops": "FLOP",
    "dense_flops": "FLOP", "min_bytes": "bytes", "tokens": "tokens",
    # shape regime
    "regime": "", "bucket_policy": "", "regime_steps": "steps", "compile_cache": "", "compiles": METRIC,
    "compile_seconds_total": METRIC, "compile_cache_hits": "count", "padding_waste": METRIC,
    "useful_tokens_per_s": METRIC,
    "seconds_per_step_with_compiles": "s",
    "trace_file": "",
    # the stream's lengths (core/traffic.py): the trace, its KS distance from the whole trace (before
    # clipping), the scale and the lengths clipped, the requests taken; what a server sees of it
    "traffic": "", "traffic_label": "", "traffic_ks": "", "traffic_scale": "", "traffic_clipped": "count",
    "traffic_requests": "count", "stream_steps_planned": "steps", "stream_steps_timed": "steps",
    "distinct_shapes": "count",
    "latency_p50_s": "s", "latency_p95_s": "s", "latency_p99_s": METRIC, "longest_stall_s": METRIC,
    # per trace window, its seconds (stalls included) and useful tokens: the stream's interval
    "window_seconds": "s", "window_useful_tokens": "tokens",
    # each window warm: its stalled steps at the stream's steady step (the stalls are their own figure)
    "window_steady_seconds": "s", "stream_steady_s": "s",
    # a priced way's later rounds (run/adaptive.py): each round's mean step of its stream sample, warm
    "stream_round_s": "s", "stream_round_ids": "", "stream_rounds": "count", "stream_round_median_s": "s",
    "stream_round_ci_low_s": "s", "stream_round_ci_high_s": "s", "stream_round_ci_method": "",
    # a probed static way's first call again, in a fresh process, in each later round
    "first_call_round_s": "s", "first_call_round_ids": "",
    # why a stream stopped before its last step: its budget, or dearer than the kernel's static stream
    "stream_cut": "",
    # timing
    "threads": "count", "timer": "", "first_call_s": METRIC, "first_call_compile_s": METRIC, "lower_s": "s",
    "compile_s": "s",
    "seconds_per_step": METRIC, "ci_low_s": "s", "ci_high_s": "s", "ci_basis": "", "ci_coverage": "fraction",
    # the interval's confidence and how it was made (core/stats.py)
    "ci_confidence": "fraction", "ci_method": "",
    "iqr_s": "s", "samples": "count",
    "steps_per_sample": "count", "rounds": "count", "rounds_dropped": "count", "round_medians_s": "s",
    # each round's id in its sweep (0: the first window): kernels of one round pair by it; the rounds
    # another process shared (left out of the figure's own median, kept in pairs)
    "round_ids": "", "contended_rounds": "",
    # an A/A control's second window of each round, and its rounds (run/adaptive.py)
    "control_round_medians_s": "s", "control_round_ids": "",
    # a tuned case's kernel at its defaults, timed beside it in each later round (docs/tuning.md)
    "defaults_round_medians_s": "s", "defaults_round_ids": "",
    # why the case's later rounds stopped, and whether the sweep may add more (resume)
    "rounds_stopped": "", "rounds_complete": "bool",
    # seconds the engine spent per step of its recipe (regime stream, build, timing, after timing)
    "phase_seconds": "s",
    "timing_samples_s": "s",
    # what the rest of the machine did while the step was timed (attnbench/measure/contention.py)
    "contended": "bool", "contention_reason": "", "contention_retries": "count", "other_cpu_share": "cores",
    "steal_share": "cores", "cpu_pressure_share": "fraction", "load_1min": "",
    # throughput
    "tokens_per_s": METRIC, "tflops": METRIC, "peak_tflops": "TFLOP/s", "peak_source": "",
    "mfu": METRIC, "seconds_per_million_tokens": METRIC,
    "bytes_per_s": METRIC, "peak_bytes_per_s": "bytes/s", "bandwidth_source": "",
    "bandwidth_utilisation": "fraction",
    # memory, by source
    "device_peak_bytes": METRIC, "compiler_temp_bytes": METRIC, "compiler_argument_bytes": "bytes",
    "compiler_output_bytes": "bytes", "compiler_peak_bytes": METRIC,
    "host_profiler_peak_bytes": METRIC, "host_rss_growth_bytes": METRIC, "memory_note": "",
    "saved_for_backward_bytes": METRIC,
    # numerics against the float64 reference
    "max_abs_err": METRIC, "max_rel_err": "", "numerics_ok": "bool", "numerics_workload": "",
    # cost
    "usd_per_hour_on_demand": "USD/h", "usd_per_hour_spot": "USD/h",
    "usd_per_step_on_demand": METRIC, "usd_per_step_spot": "USD",
    "usd_per_million_tokens_on_demand": METRIC, "usd_per_million_tokens_spot": "USD",
    "usd_per_step_with_compiles_on_demand": METRIC, "usd_per_step_with_compiles_spot": "USD",
    "usd_per_million_useful_tokens_with_compiles_on_demand": METRIC,
    "usd_per_million_useful_tokens_with_compiles_spot": "USD",
    "price_source": "", "price_kind": "", "cost_note": "",
}


def units(table: list[metrics.Metric] | None = None) -> dict[str, str]:
    """Column -> unit of a record: ``LAYOUT`` with the metric table's units, then unplaced metric columns."""
    from_metrics = metrics.column_units(table)
    out = {}
    for column, unit in LAYOUT.items():
        if unit is METRIC:
            if column not in from_metrics:
                raise ValueError(f"records.LAYOUT places {column!r} as a metric column, but no metric "
                                 "reads it as is (attnbench/core/metrics.py)")
            unit = from_metrics[column]
        elif column in from_metrics:
            raise ValueError(f"{column!r} is a metric column (attnbench/core/metrics.py gives its unit): "
                             "mark it METRIC in records.LAYOUT")
        out[column] = unit
    for column, unit in from_metrics.items():
        out.setdefault(column, unit)
    return out


UNITS = units()
COLUMNS = list(UNITS)


def new_record(workload: Workload | None = None, **fields) -> dict:
    """A record, the one way to make one: every column, ``None`` unless ``workload`` (its columns)
    or ``fields`` fill it. A field that is no column is refused: it would be written as a column no
    reader knows."""
    unknown = sorted(set(fields) - set(UNITS))
    if unknown:
        raise KeyError(f"not a record column: {', '.join(unknown)} (attnbench/core/records.py LAYOUT)")
    record = dict.fromkeys(COLUMNS)
    if workload is not None:
        record.update(workload_columns(workload))
    record.update(fields)
    return record


def workload_columns(w: Workload) -> dict:
    """A workload's columns: its fields (its name as ``workload``) and what follows from them."""
    columns = dataclasses.asdict(w)
    columns["workload"] = columns.pop("name")
    if columns.pop("packed") is not None:  # a layout is one step's of a packed stream, never a case's
        raise ValueError("a record's workload is a case's: a packed layout belongs to one stream step")
    return {**columns, "phase": w.phase, "mask": w.mask, "mask_density": w.mask_density, "flops": w.flops,
            "dense_flops": w.dense_flops, "min_bytes": w.min_bytes, "tokens": w.tokens}
