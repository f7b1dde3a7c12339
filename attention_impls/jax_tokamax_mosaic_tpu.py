"""Tokamax's Mosaic TPU flash attention: ``tokamax.dot_product_attention(implementation="mosaic")``
on a TPU (``ops/attention/pallas_mosaic_tpu.py``, ``PallasMosaicTpuFlashAttention``).

A Pallas Mosaic kernel built on Tokamax's own copy of splash attention, with its own backward
(``pallas_mosaic_tpu_vjp``). Tiles are Tokamax's choice: its autotuning cache for the chip and the
exact arguments where it has them (block_q / block_kv 512 to 4096 in the shipped caches), else its
heuristic 128x128 (``_get_heuristics_config``) - a GPU-shaped tile on a TPU. Tokamax runs it on TPU
v5 and newer only (``supported_on``: ``get_tpu_info().generation >= 5``).

On a CPU Tokamax refuses it ("Not supported on cpu") and has no interpret switch; the project runs the
same op in jax's TPU interpreter (``pltpu.force_tpu_interpret_mode``) through a subclass that lifts
only that device check (``interpreter_op``), so it is labelled interpreted, never timed as a kernel.
"""

from __future__ import annotations

import contextlib

from attention_impls._compile_target import jax_platform
from attention_impls._tokamax import TokamaxAttention
from attention_impls.base import RUNS, interpret_only, unsupported
from attention_impls.registry import register

# Imported where used: jax, tokamax (each venv holds only some frameworks, and the asv process none).

HEURISTIC_TILE = 128  # _get_heuristics_config's block_q = block_kv = block_kv_compute
_INTERPRETER_OP = None


def interpreter_op():
    """Tokamax's Mosaic TPU op with its device check lifted, for jax's TPU interpreter on a CPU
    (one instance per process: Tokamax keys its caches by the op)."""
    global _INTERPRETER_OP
    if _INTERPRETER_OP is None:
        from tokamax._src.ops.attention.pallas_mosaic_tpu import PallasMosaicTpuFlashAttention

        class Interpreted(PallasMosaicTpuFlashAttention):
            def supported_on(self, device):
                return True  # only ever traced under pltpu.force_tpu_interpret_mode (trace_context)

        _INTERPRETER_OP = Interpreted()
    return _INTERPRETER_OP


@register
class JaxTokamaxMosaicTpu(TokamaxAttention):
    name = "jax-tokamax-mosaic-tpu"
    implementation = "mosaic_tpu"  # what "mosaic" resolves to on a TPU (api.IMPLEMENTATIONS)
    designed_for = frozenset({"tpu"})
    is_flash = True
    interpreter_calls = {
        "jax.experimental.pallas.tpu:force_tpu_interpret_mode": (),
        "tokamax._src.ops.attention.pallas_mosaic_tpu:PallasMosaicTpuFlashAttention": (),
    }
    summary = ("Tokamax dot_product_attention(implementation='mosaic') on a TPU: Pallas Mosaic flash "
               "attention on Tokamax's splash, tiles from its autotuning cache else 128x128; TPU "
               "interpreter off-TPU")
    platform_support = {
        "cpu": interpret_only("jax's TPU interpreter (pltpu.force_tpu_interpret_mode), through the "
                              "project's subclass lifting Tokamax's device check ('Not supported on "
                              "cpu.'; Tokamax has no interpret switch)"),
        "gpu": unsupported("Tokamax runs its Mosaic TPU op on a TPU v5 or newer only (supported_on: "
                           "platform 'tpu', generation >= 5; on a GPU 'mosaic' is its Mosaic GPU "
                           "kernel, jax-tokamax-mosaic-gpu)"),
        "tpu": RUNS,
    }
    supports = frozenset({"softcap"})
    feature_notes = {
        "window": ("Tokamax's Mosaic TPU op refuses the per-row key ranges the call's local_window_size "
                   "becomes ('mask.k_start is not supported.', "
                   "pallas_mosaic_tpu_common.check_inputs_support)"),
        "segment_ids": ("the public call takes segment ids only as a dense [B, 1, Sq, Sk] mask, and its "
                        "Mosaic TPU op refuses a batched one ('Only unbatched boolean masks are "
                        "supported.', pallas_mosaic_tpu_common.build_splash_kernel)"),
    }

    def shape_reason(self, workload, platform):
        if workload.dtype not in ("bfloat16", "float32"):
            return (f"Tokamax's Mosaic TPU op takes bfloat16 and float32 only, not {workload.dtype} "
                    "(check_inputs_support)")
        if workload.seq_q % HEURISTIC_TILE or workload.seq_k % HEURISTIC_TILE:
            return (f"its tiles must divide the lengths, and its smallest (its heuristic's) is "
                    f"{HEURISTIC_TILE}: Sq {workload.seq_q} and Sk {workload.seq_k} must be multiples of "
                    f"{HEURISTIC_TILE} (splash MaskInfo: 'q_block_size=128 should divide q_seq_len')")
        if platform == "cpu" and workload.batch > 1:
            return ("jax's TPU interpreter runs it at batch 1 only: Tokamax vmaps the splash kernel over "
                    "the batch, which adds a grid axis the interpreter's dimension semantics lack "
                    "(interpret_pallas_call: 'safe_zip() argument 1 has length 2 but argument 0 has "
                    "length 3')")
        if platform == "cpu" and workload.mode == "fwd_bwd":
            return ("its backward does not run in jax's TPU interpreter: the interpreter's io_callbacks are "
                    "side effects jax's custom_vjp cannot remat ('remat optimization for custom_vjp does not "
                    "support forward functions with these side effects')")
        return super().shape_reason(workload, platform)

    def trace_context(self, platform):
        if platform == "cpu":
            from jax.experimental.pallas import tpu as pltpu

            return pltpu.force_tpu_interpret_mode()
        return contextlib.nullcontext()

    def implementation_arg(self):
        return interpreter_op() if jax_platform() == "cpu" else self.implementation
