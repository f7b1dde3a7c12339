"""The compiled-for records table: one row per target x implementation x workload, its columns.

The columns are described in docs/compiled-for.md. Byte columns are per device of the target (a
v4 chip is two devices); ``flops`` is the whole step's, all chips. ``model_`` columns are models,
not measurements; ``lower_seconds`` / ``compile_seconds`` (this host) are the only timings.
"""

from __future__ import annotations

import os

from attnbench.core.workload import Workload

COLUMNS = [
    "target", "platform", "hardware_profile", "topology", "chips", "devices",
    "impl", "framework", "label", "execution",
    "workload", "phase", "seq_q", "seq_k", "batch", "q_heads", "kv_heads", "head_dim", "dtype", "causal",
    "mode", "mask", "mask_density", "window", "softcap", "documents",
    "status", "fits", "reason",
    "peak_bytes", "hbm_bytes", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes",
    "generated_code_bytes", "compiler_hbm_bytes", "compiler_required_bytes",
    "kernel_evidence", "library_config", "custom_calls", "fusions",
    "inserted_copies", "inserted_copy_bytes", "inserted_copy_detail",
    "flops", "compiler_flops", "compiler_flops_source", "compiler_bytes_accessed",
    "roofline_bytes", "roofline_bytes_source", "peak_tflops", "hbm_tb_s", "price_per_chip_hour", "price_kind",
    "model_roofline_seconds", "model_roofline_bound", "model_compute_seconds", "model_memory_seconds",
    "model_roofline_usd", "model_compiler_seconds",
    "hlo_flops", "hlo_bytes", "hlo_launches", "hlo_kernel_seconds", "hlo_matmul_seconds", "hlo_other_seconds",
    "hlo_compute_bound_seconds", "hlo_memory_bound_seconds", "hlo_cost_notes",
    "predicted_seconds", "predicted_seconds_low", "predicted_seconds_high", "predicted_bound",
    "predicted_share_of_peak", "predicted_ranks", "predicted_basis",
    "lower_seconds", "compile_seconds",
    "jax", "jaxlib", "libtpu", "jax_cuda12_plugin", "cudnn", "cuda_nvcc",
]
# The columns the CLI prints.
SUMMARY = ["target", "impl", "seq_q", "mode", "dtype", "status", "fits", "peak_bytes", "hbm_bytes",
           "inserted_copy_bytes", "model_roofline_seconds", "predicted_seconds", "kernel_evidence", "reason"]
MAX_SEQ_COLUMNS = ["target", "impl", "mode", "dtype", "block", "execution", "max_feasible_seq",
                   "tried_up_to", "lengths_tried", "compiles", "stopped_by"]
# ``compile-for --max-batch``; ``stopped_by`` is the record one batch above the maximum.
MAX_BATCH_COLUMNS = ["target", "impl", "workload", "phase", "mode", "dtype", "seq_len", "execution",
                     "max_batch", "tried_up_to",
                     "batches_tried", "compiles", "capped", "tokens_per_chip", "peak_bytes_at_max",
                     "hbm_bytes", "inserted_copy_bytes_at_max", "stopped_by", "skipped"]


def new_record(target, impl_name: str, workload: Workload, **fields) -> dict:
    """A record with the case's identity filled and every other column empty."""
    record = dict.fromkeys(COLUMNS)
    record.update(target=target.name, platform=target.platform, hardware_profile=target.hardware_profile,
                  topology=target.topology or target.device_name, chips=target.chips, impl=impl_name,
                  seq_q=workload.seq_q, seq_k=workload.seq_k, batch=workload.batch,
                  q_heads=workload.q_heads, kv_heads=workload.kv_heads, head_dim=workload.head_dim,
                  dtype=workload.dtype, causal=workload.causal, mode=workload.mode,
                  workload=workload.name, phase=workload.phase, mask=workload.mask,
                  mask_density=workload.mask_density, window=workload.window, softcap=workload.softcap,
                  documents=workload.documents, flops=workload.flops)
    record.update(fields)
    return record


def case_key(target: str, impl: str, workload: Workload) -> str:
    """One string per case (the asv class's cache key)."""
    return f"{target}|{impl}|{workload.describe()}"


KEPT_COLUMNS = [
    "target", "impl", "workload", "phase", "mode", "dtype", "seq_len", "kept_config", "config_source",
    "candidates", "compiled", "feasible", "max_batch", "tokens_per_chip", "peak_bytes", "temp_bytes",
    "kernel_vmem_bytes", "model_tokens_per_s_per_chip", "defaults_max_batch", "why", "speed",
]


def load_kept(results_dir: str = "results"):
    """``compiled-for-kept.csv`` as a DataFrame (empty when the tuner has not run). A report only reads."""
    import pandas as pd

    path = os.path.join(results_dir, "tuning", "compiled-for-kept.csv")
    return pd.read_csv(path) if os.path.exists(path) else pd.DataFrame(columns=KEPT_COLUMNS)
