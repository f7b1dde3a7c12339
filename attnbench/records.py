"""The record of one measured case: its columns, their units, and the statuses it can end in.

One record is one implementation x workload x shape regime x device. Every metric column is named
with its unit or its source, so that nothing is mixed (e.g. ``compiler_temp_bytes`` is XLA's
estimate, ``host_rss_growth_bytes`` how far the process's resident high-water mark rose).
"""

from __future__ import annotations

OK = "ok"
UNSUPPORTED = "unsupported"
OOM = "oom"
TIMEOUT = "timeout"
NUMERICS_FAILED = "numerics-failed"
ERROR = "error"
STATUSES = (OK, UNSUPPORTED, OOM, TIMEOUT, NUMERICS_FAILED, ERROR)

# column -> unit ("" for labels). Order here is the column order of written tables.
UNITS = {
    # what ran
    "impl": "", "framework": "", "label": "", "execution": "", "platform": "", "device": "",
    "kernel_evidence": "", "kernel_verified": "bool", "status": "", "reason": "",
    # the workload
    "batch": "", "q_heads": "", "kv_heads": "", "seq_q": "tokens", "seq_k": "tokens", "head_dim": "",
    "dtype": "", "causal": "bool", "mode": "", "flops": "FLOP", "min_bytes": "bytes",
    "tokens": "tokens",
    # shape regime
    "regime": "", "bucket_policy": "", "regime_steps": "steps", "compile_cache": "", "compiles": "count",
    "compile_seconds_total": "s", "padding_waste": "fraction", "useful_tokens_per_s": "tokens/s",
    "seconds_per_step_with_compiles": "s",
    "trace_file": "",
    # timing
    "threads": "count", "first_call_s": "s", "lower_s": "s", "compile_s": "s",
    "seconds_per_step": "s", "iqr_s": "s", "samples": "count", "steps_per_sample": "count",
    # throughput
    "tokens_per_s": "tokens/s", "tflops": "TFLOP/s", "peak_tflops": "TFLOP/s", "peak_source": "",
    "mfu": "fraction", "seconds_per_million_tokens": "s",
    # memory, by source
    "device_peak_bytes": "bytes", "compiler_temp_bytes": "bytes", "compiler_argument_bytes": "bytes",
    "compiler_output_bytes": "bytes", "compiler_peak_bytes": "bytes",
    "host_profiler_peak_bytes": "bytes", "host_rss_growth_bytes": "bytes",
    # numerics against the float64 reference
    "max_abs_err": "", "max_rel_err": "", "numerics_ok": "bool", "numerics_workload": "",
    # cost
    "usd_per_hour_on_demand": "USD/h", "usd_per_hour_spot": "USD/h",
    "usd_per_step_on_demand": "USD", "usd_per_step_spot": "USD",
    "usd_per_million_tokens_on_demand": "USD", "usd_per_million_tokens_spot": "USD",
    "usd_per_step_with_compiles_on_demand": "USD", "usd_per_step_with_compiles_spot": "USD",
    "price_source": "", "cost_note": "",
}
COLUMNS = list(UNITS)


def empty_record() -> dict:
    return dict.fromkeys(COLUMNS)
