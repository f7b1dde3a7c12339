"""``F.scaled_dot_product_attention`` on an XLA device: XLA's own materialized-softmax lowering.

No ``sdpa_kernel`` backend is forced: on an XLA device SDPA decomposes into ATen math ops
(``_scaled_dot_product_attention_math``), which torch_xla lowers to HLO and XLA fuses; the HLO
holds no custom call (``Step.kernel_evidence`` says so). GQA (``enable_gqa``) and the bottom-right
causal bias (``causal_lower_right``, materialized as a boolean mask off CUDA) both lower on XLA.
The math path repeats the kv heads to the query heads (``repeat_interleave``) before its matmuls,
so GQA is ``repeated``.

Mask features: a sliding window and segment ids go in as SDPA's own ``attn_mask``: one boolean
``[B or 1, 1, Sq, Sk]`` tensor built on the device inside the traced graph (``_sdpa.keep_mask``,
causal folded in, since SDPA refuses ``attn_mask`` together with ``is_causal``), which the math
path turns into a ``-inf`` bias before its softmax.
Logit soft-capping is refused: SDPA has no option for it (``attn_mask`` can only add to or mask
the scores, not apply ``tanh``).
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
    feature_notes = {"softcap": "torch's F.scaled_dot_product_attention has no logit soft-capping option "
                                "(its attn_mask only adds to or masks the scores; it cannot apply tanh)"}
    gqa = "repeated"

    def attention(self, q, k, v, *, causal, scale, **mask):
        # mask: window and/or segment ids only (check() refuses softcap); sdpa() makes them attn_mask.
        return sdpa(q, k, v, causal=causal, scale=scale, backend=None, **mask)
