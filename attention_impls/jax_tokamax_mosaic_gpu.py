"""Tokamax's Mosaic GPU flash attention: ``tokamax.dot_product_attention(implementation="mosaic")``
on an NVIDIA Hopper or Blackwell GPU (``ops/attention/pallas_mosaic_gpu.py``,
``PallasMosaicGpuFlashAttention``: warp-specialized sm90 / sm100 kernels, FA3-class, with its own
backward). Tokamax refuses other GPUs ("Only supported for sm90 and sm100 GPUs") and inputs other than
float16 / bfloat16 at the default precision.

Unlike jax's ``attention_mgpu`` (``jax-pallas-mgpu-attention``), Tokamax's op compiles ahead of time
for a deviceless H100/H200 target here (custom call ``mosaic_gpu_v2``), so the compiled-for tier has it.
"""

from __future__ import annotations

from attention_impls._tokamax import TokamaxAttention
from attention_impls.base import RUNS, unsupported
from attention_impls.jax_cudnn import gpu_compute_capability
from attention_impls.registry import register

MGPU_DTYPES = ("float16", "bfloat16")


@register
class JaxTokamaxMosaicGpu(TokamaxAttention):
    name = "jax-tokamax-mosaic-gpu"
    implementation = "mosaic_gpu"  # what "mosaic" resolves to on an NVIDIA GPU (api.IMPLEMENTATIONS)
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = ("Tokamax dot_product_attention(implementation='mosaic') on an NVIDIA GPU: Mosaic GPU "
               "flash attention for sm90/sm100 (FA3-class), configs from its autotuning cache")
    platform_support = {
        "cpu": unsupported("Mosaic GPU compiles for NVIDIA sm90/sm100 GPUs only and has no interpreter; "
                           "Tokamax refuses a CPU ('Not supported on cpu.')"),
        "gpu": RUNS,
        "tpu": unsupported("Mosaic GPU compiles for NVIDIA GPUs only; on a TPU 'mosaic' is Tokamax's "
                           "Mosaic TPU kernel (jax-tokamax-mosaic-tpu)"),
    }
    supports = frozenset({"window", "softcap", "segment_ids"})

    def shape_reason(self, workload, platform):
        if workload.dtype not in MGPU_DTYPES:
            return (f"Tokamax's Mosaic GPU op takes float16/bfloat16 at the default precision, not "
                    f"{workload.dtype} ('Only f16 and bf16 supported for precision=DEFAULT')")
        if platform == "gpu":
            capability = gpu_compute_capability()
            if capability is not None and capability[0] not in (9, 10):
                return (f"Tokamax's Mosaic GPU kernels are for sm90 and sm100 only, not "
                        f"sm{capability[0]}{capability[1]} ('Only supported for sm90 and sm100 GPUs.')")
        return super().shape_reason(workload, platform)
