"""SDPA forced to CUDNN_ATTENTION: cuDNN's fused flash attention (CUDA only).

Forcing and rules: ``_sdpa.py``. The boolean mask reaches cuDNN as ``attn_bias``
(``attention.cpp`` ``convert_boolean_attn_mask_cudnn``); cuDNN's graph reads the shared kv head.
"""

from __future__ import annotations

from attention_impls._sdpa import CUDA_ONLY, HALF, NO_TPU, SdpaBackendKernel
from attention_impls.base import RUNS, unsupported
from attention_impls.registry import register

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).


@register
class TorchSdpaCudnn(SdpaBackendKernel):
    name = "torch-sdpa-cudnn"
    sdpa_backend = "CUDNN_ATTENTION"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = "SDPA forced to CUDNN_ATTENTION: cuDNN's fused flash attention (CUDA)"
    platform_support = {"cpu": unsupported(CUDA_ONLY.format(kernel="CUDNN_ATTENTION (cuDNN fused attention)",
                                                            backend="CUDNN_ATTENTION")),
                        "gpu": RUNS, "tpu": NO_TPU}

    @staticmethod
    def head_dim_limit(sm) -> int:
        """check_cudnn_tensor_shapes: 256 on sm90/sm10x with cuDNN > 9.22, else 128."""
        import torch

        new_cudnn = (torch.backends.cudnn.version() or 0) > 92200
        return 256 if sm and (sm == (9, 0) or sm[0] == 10) and new_cudnn else 128

    def rules(self, w, platform, sm):
        if platform != "gpu":
            return None
        if w.dtype not in HALF:  # check_dtypes_low_precision
            return f"CUDNN_ATTENTION takes float16/bfloat16 only, not {w.dtype}"
        if sm and not (8, 0) <= sm <= (12, 1):  # check_cudnn_hardware_support
            return f"cuDNN attention needs a GPU in sm80..sm121; this one is sm{sm[0]}{sm[1]}"
        if w.head_dim % 8:  # check_cudnn_tensor_shapes
            return f"CUDNN_ATTENTION needs head_dim divisible by 8, got {w.head_dim}"
        limit = self.head_dim_limit(sm)
        if w.head_dim > limit:
            return f"CUDNN_ATTENTION needs head_dim <= {limit} on this GPU and cuDNN, got {w.head_dim}"
        if w.mode == "fwd_bwd" and 128 < w.head_dim < 256:  # check_cudnn_d256_bprop_head_dim
            return f"cuDNN attention has a backward only for head_dim <= 128 or 256, got {w.head_dim}"
        if w.seq_k == 1:
            return "cuDNN attention does not take a key/value sequence of length 1"
        if max(w.batch, w.q_heads) > 65535:
            return "cuDNN attention takes at most 65535 batch entries and heads"
        return None
