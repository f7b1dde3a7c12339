"""``torch.nn.functional.scaled_dot_product_attention`` with one backend forced per name.

Each name runs SDPA under ``sdpa_kernel([that backend])``: if the backend cannot take the inputs
torch raises instead of silently falling back, so the name is the kernel that ran.
"""

from __future__ import annotations

import contextlib

from attention_impls._torch import TorchImpl
from attention_impls.base import RUNS, unsupported
from attention_impls.registry import register


def sdpa(q, k, v, *, causal: bool, scale: float, backend=None):
    """SDPA on [B, S, H, D] tensors (transposed to torch's [B, H, S, D]), bottom-right causal."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    kwargs = {"scale": scale, "enable_gqa": k.shape[1] != q.shape[1]}
    seq_q, seq_k = q.shape[2], k.shape[2]
    if causal and seq_q != seq_k:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(seq_q, seq_k)  # is_causal is top-left aligned
    else:
        kwargs["is_causal"] = causal
    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return out.transpose(1, 2)


class _SdpaBackend(TorchImpl):
    backend: str  # name of the torch.nn.attention.SDPBackend member

    def attention(self, q, k, v, *, causal, scale):
        from torch.nn.attention import SDPBackend

        return sdpa(q, k, v, causal=causal, scale=scale, backend=getattr(SDPBackend, self.backend))


@register
class TorchSdpaMath(_SdpaBackend):
    name = "torch-sdpa-math"
    backend = "MATH"
    summary = "SDPA forced to the MATH backend: materialized softmax in ATen ops"
