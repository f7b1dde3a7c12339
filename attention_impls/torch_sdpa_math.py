"""ATen's MATH backend of SDPA: the materialized softmax in plain ATen ops (portable, native).

The backend is forced with ``sdpa_kernel([backend])``: torch raises instead of falling back, so
the name is the kernel that ran. Rules and the dispatcher check live in ``_sdpa.py``.

Mask features: a sliding window and segment ids as SDPA's boolean ``attn_mask`` (``_sdpa.sdpa``),
which ``_scaled_dot_product_attention_math`` adds as a ``-inf`` bias before its ``_safe_softmax``;
no logit soft-capping (SDPA has no option for it). GQA is ``repeated``: with ``enable_gqa`` the
math path ``repeat_interleave``s the kv heads to the query heads before its matmuls
(``attention.cpp`` ``pre_process_group_query_attention_input``; the profiler shows
``aten::repeat_interleave``).
"""

from __future__ import annotations

from attention_impls._sdpa import SdpaBackendKernel
from attention_impls.registry import register


@register
class TorchSdpaMath(SdpaBackendKernel):
    name = "torch-sdpa-math"
    sdpa_backend = "MATH"
    summary = "SDPA forced to the MATH backend: materialized softmax in ATen ops"
    gqa = "repeated"
