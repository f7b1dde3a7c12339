"""SDPA forced to FLASH_ATTENTION: FlashAttention-2 on CUDA, ATen's own tiled flash kernel on CPU.

Forcing and rules: ``_sdpa.py``. A window and segment ids work on CPU (a boolean ``attn_mask``);
on CUDA the FLASH gate rejects any explicit mask (``check_for_attn_mask``) and SDPA does not
expose FlashAttention-2's own ``window_size``.
"""

from __future__ import annotations

from attention_impls._sdpa import HALF, SdpaBackendKernel
from attention_impls.registry import register


@register
class TorchSdpaFlash(SdpaBackendKernel):
    name = "torch-sdpa-flash"
    sdpa_backend = "FLASH_ATTENTION"
    designed_for = frozenset({"cpu", "gpu"})  # FA2 on CUDA; ATen's own CPU FlashAttentionKernel.cpp
    is_flash = True
    summary = "SDPA forced to FLASH_ATTENTION: FlashAttention-2 on CUDA, ATen's tiled CPU flash kernel"

    def rules(self, w, platform, sm):
        if platform != "gpu":  # CPU kernel: fp32/fp64/bf16/fp16, any head_dim, masks, GQA
            return None
        needs_mask = [f for f, on in (("a sliding window", w.window is not None),
                                      ("segment ids", w.segmented)) if on]
        if needs_mask:  # check_for_attn_mask
            return (f"the torch SDPA FLASH backend on CUDA takes no explicit mask (sdp_utils.cpp "
                    f"check_for_attn_mask), and {' and '.join(needs_mask)} "
                    f"{'needs' if needs_mask == ['a sliding window'] else 'need'} one")
        if w.dtype not in HALF:  # check_dtypes_flash_attention
            return f"FLASH_ATTENTION on CUDA takes float16/bfloat16 only, not {w.dtype}"
        if sm and not (8, 0) <= sm <= (12, 1):  # check_flash_attention_hardware_support
            return f"FlashAttention-2 needs a GPU in sm80..sm121; this one is sm{sm[0]}{sm[1]}"
        if w.head_dim > 256:  # check_head_dim_size_flash
            return f"FLASH_ATTENTION on CUDA needs head_dim <= 256, got {w.head_dim}"
        consumer = sm and ((8, 6) <= sm <= (8, 9) or (12, 0) <= sm <= (12, 1))
        if w.mode == "fwd_bwd" and consumer and 192 < w.head_dim <= 224:
            # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
            return f"FlashAttention-2 has no backward for head_dim in (192, 224] on sm{sm[0]}{sm[1]}"
        return None
