"""``F.scaled_dot_product_attention`` on an XLA device: XLA's own materialized-softmax lowering.

No ``sdpa_kernel`` backend is forced: on an XLA device SDPA decomposes into ATen math ops
(``_scaled_dot_product_attention_math``), which torch_xla lowers to HLO and XLA fuses; the HLO
holds no custom call (``Step.kernel_evidence`` says so). GQA (``enable_gqa``) and the bottom-right
causal bias (``causal_lower_right``, materialized as a boolean mask off CUDA) both lower on XLA.
"""

from __future__ import annotations

from attention_impls._sdpa import sdpa
from attention_impls.base import AttentionImpl
from attention_impls.registry import register


@register
class TorchXlaSdpa(AttentionImpl):
    name = "torch-xla-sdpa"
    framework = "torch_xla"
    summary = "torch SDPA traced by torch_xla: XLA-compiled materialized softmax, native everywhere"

    def attention(self, q, k, v, *, causal, scale):
        return sdpa(q, k, v, causal=causal, scale=scale, backend=None)
