"""The compiled-for records table: one row per target x implementation x workload, its columns.

Byte columns are per device of the target (a v4 chip is two devices here, a 4-chip slice four):
``peak_bytes``, ``argument_bytes``, ``output_bytes``, ``temp_bytes``, ``alias_bytes``,
``generated_code_bytes`` are ``compiled.memory_analysis()``'s; ``hbm_bytes`` is the hardware
profile's HBM per chip (GB x 1e9) divided among the chip's devices; ``fits`` compares the two
(``attnbench.compiled_for.classify.fits``). ``inserted_copy_bytes`` are the physical bytes the
layout copies around custom calls write (``attnbench.compiled_for.hlo``).

The workload: ``workload`` is its preset's name (``attnbench.core.presets``) or ``custom``, ``phase``
prefill / training / decode; the mask (``attnbench.core.masks``) is ``mask`` in words
(``causal+window(4096)+softcap(50)``), ``mask_density`` the kept fraction of the batch's Sq x Sk
pairs, and its parts ``window`` (keys), ``softcap`` and ``documents`` (packed per sequence; a ragged
decode cache shows in ``mask`` as ``ragged-cache``). The compiled step took the mask as the measured
suite does: window and softcap bound, segment ids traced int32 ``[B, S]`` arguments.

``flops`` is the workload's own count (``Workload.flops``: the pairs the mask keeps, exactly; the
whole step, all chips); ``compiler_flops`` and ``compiler_bytes_accessed`` are ``cost_analysis()``'s
per device where the compiler gives one (``compiler_flops_source`` says whose FLOPs those are: XLA's
count, a Pallas kernel's hand-written estimate, or nothing for a kernel without one). Columns
starting with ``model_`` are the roofline model (``attnbench.compiled_for.roofline``) and libtpu's
own cost-model estimate: models, not measurements; nothing here was run on the target.
``lower_seconds`` / ``compile_seconds`` are how long this host took, the only timings in the table.
"""

from __future__ import annotations

from attnbench.core.workload import Workload

COLUMNS = [
    "target", "platform", "hardware_profile", "topology", "chips", "devices",
    "impl", "framework", "label", "execution",
    "workload", "phase", "seq_q", "seq_k", "batch", "q_heads", "kv_heads", "head_dim", "dtype", "causal",
    "mode", "mask", "mask_density", "window", "softcap", "documents",
    "status", "fits", "reason",
    "peak_bytes", "hbm_bytes", "argument_bytes", "output_bytes", "temp_bytes", "alias_bytes",
    "generated_code_bytes", "compiler_hbm_bytes", "compiler_required_bytes",
    "kernel_evidence", "custom_calls", "fusions",
    "inserted_copies", "inserted_copy_bytes", "inserted_copy_detail",
    "flops", "compiler_flops", "compiler_flops_source", "compiler_bytes_accessed",
    "roofline_bytes", "roofline_bytes_source", "peak_tflops", "hbm_tb_s", "price_per_chip_hour",
    "model_roofline_seconds", "model_roofline_bound", "model_compute_seconds", "model_memory_seconds",
    "model_roofline_usd", "model_compiler_seconds",
    "lower_seconds", "compile_seconds",
    "jax", "jaxlib", "libtpu", "jax_cuda12_plugin", "cudnn", "cuda_nvcc",
]
# The columns the CLI prints.
SUMMARY = ["target", "impl", "seq_q", "mode", "dtype", "status", "fits", "peak_bytes", "hbm_bytes",
           "inserted_copy_bytes", "model_roofline_seconds", "kernel_evidence", "reason"]
MAX_SEQ_COLUMNS = ["target", "impl", "mode", "dtype", "block", "execution", "max_feasible_seq",
                   "tried_up_to", "lengths_tried", "compiles", "stopped_by"]
# ``compile-for --max-batch``: per target x impl x mode x dtype x length, the largest batch that
# compiles and fits; ``tokens_per_chip`` is max_batch x seq_len / the target's chips, the ``_at_max``
# bytes the record's at that batch, ``stopped_by`` the record's one batch above it.
MAX_BATCH_COLUMNS = ["target", "impl", "mode", "dtype", "seq_len", "execution", "max_batch", "tried_up_to",
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
