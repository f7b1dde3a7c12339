"""``F.scaled_dot_product_attention`` on an XLA device: XLA's own materialized-softmax lowering.

No ``sdpa_kernel`` backend is forced: on an XLA device SDPA decomposes into ATen math ops, which
torch_xla lowers to HLO and XLA fuses (no custom call). The math path repeats the kv heads
(``repeat_interleave``), so GQA is ``repeated``. Masks go in as in ``_sdpa.sdpa``.
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
    supports = frozenset({"window", "segment_ids"})
    call_name = "torch's F.scaled_dot_product_attention"
    feature_notes = {"softcap": "its attn_mask only adds to or masks the scores; it cannot apply tanh"}
    gqa = "repeated"

    def attention(self, q, k, v, *, causal, scale, **mask):
        return sdpa(q, k, v, causal=causal, scale=scale, backend=None, **mask)
