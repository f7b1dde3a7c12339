"""SDPA forced to EFFICIENT_ATTENTION: xformers' CUTLASS memory-efficient kernel (CUDA only).

Forcing and rules: ``_sdpa.py``. The boolean mask becomes an additive bias padded to 16 keys
(``attention.cpp`` ``preprocess_mask``). GQA is declared native, as pytorch#191085 makes it;
releases before that gate it out (``check_batch_size_and_num_heads_dense<false>``), which the
dispatcher, asked in ``shape_reason``, reports.
"""

from __future__ import annotations

from attention_impls._sdpa import CUDA_ONLY, HALF, NO_TPU, SdpaBackendKernel
from attention_impls.base import RUNS, unsupported
from attention_impls.registry import register


@register
class TorchSdpaEfficient(SdpaBackendKernel):
    name = "torch-sdpa-efficient"
    sdpa_backend = "EFFICIENT_ATTENTION"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = "SDPA forced to EFFICIENT_ATTENTION: xformers' CUTLASS memory-efficient kernel (CUDA)"
    platform_support = {"cpu": unsupported(CUDA_ONLY.format(kernel="EFFICIENT_ATTENTION (xformers/CUTLASS)",
                                                            backend="EFFICIENT_ATTENTION")),
                        "gpu": RUNS, "tpu": NO_TPU}

    def rules(self, w, platform, sm):
        if platform != "gpu":
            return None
        if sm and sm < (5, 0):  # check_mem_efficient_hardware_support
            return f"EFFICIENT_ATTENTION needs sm50 or newer; this GPU is sm{sm[0]}{sm[1]}"
        if w.dtype == "bfloat16" and sm and sm < (8, 0):  # dtype list below sm80: half, float
            return f"EFFICIENT_ATTENTION takes bfloat16 only on sm80+; this GPU is sm{sm[0]}{sm[1]}"
        # check_head_dim_size_mem_efficient with minimum_gemm_alignment: 128-bit tensor-core rows.
        if sm and sm < (8, 0):
            align = 8 if w.dtype in HALF and sm >= (7, 0) else 1
        else:
            align = 8 if w.dtype in HALF else 4
        if w.head_dim % align:
            return f"EFFICIENT_ATTENTION needs head_dim divisible by {align} for {w.dtype}, got {w.head_dim}"
        return None  # GQA depends on the torch version: the dispatcher is asked (shape_reason)
