"""Tokamax's Triton flash attention: ``tokamax.dot_product_attention(implementation="triton")``
(``ops/attention/pallas_triton.py``, ``PallasTritonFlashAttention``, with its own backward).

A Pallas kernel lowered to Triton for NVIDIA (and ROCm) GPUs. Tiles, warps and stages are Tokamax's
choice: its autotuning cache for the GPU and the exact arguments where it has them, else its heuristic
(block 16 to 64 by length, 4 warps, 2 stages).
"""

from __future__ import annotations

from attention_impls._tokamax import TokamaxAttention
from attention_impls.base import RUNS, unsupported
from attention_impls.registry import register


@register
class JaxTokamaxTriton(TokamaxAttention):
    name = "jax-tokamax-triton"
    implementation = "triton"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = ("Tokamax dot_product_attention(implementation='triton'): Pallas Triton flash attention, "
               "configs from its autotuning cache else its heuristics")
    platform_support = {
        "cpu": unsupported("Tokamax runs its Triton op on a GPU only (supported_on: "
                           "gpu_utils.has_triton_support; on a CPU 'Not supported on cpu.') and passes "
                           "pallas_call no interpret switch; jax's TPU interpreter refuses its Triton "
                           "compiler params (interpret_pallas_call: assert isinstance(compiler_params, "
                           "mosaic_core.CompilerParams))"),
        "gpu": RUNS,
        "tpu": unsupported("Triton has no TPU lowering; Tokamax's Triton op refuses a TPU (supported_on: "
                           "gpu_utils.has_triton_support)"),
    }
    supports = frozenset({"window", "softcap", "segment_ids"})
