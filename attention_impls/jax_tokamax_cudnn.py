"""Tokamax's cuDNN attention: ``tokamax.dot_product_attention(implementation="cudnn")``
(``ops/attention/jax_nn.py``: ``JaxNnDotProductAttention(implementation="cudnn")``, which calls
``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused flash attention).

The same cuDNN kernel as ``jax-cudnn``, reached through Tokamax's API: Tokamax adds its own refusals
(no soft cap, no residuals) and keeps jax's (``check_layout``, ``check_is_flash_attention``).
"""

from __future__ import annotations

from attention_impls._tokamax import TokamaxAttention
from attention_impls.base import RUNS, unsupported
from attention_impls.jax_cudnn import cudnn_layout_reason
from attention_impls.registry import register


@register
class JaxTokamaxCudnn(TokamaxAttention):
    name = "jax-tokamax-cudnn"
    implementation = "cudnn"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = ("Tokamax dot_product_attention(implementation='cudnn'): cuDNN fused flash attention "
               "through jax.nn")
    platform_support = {
        "cpu": unsupported("cuDNN needs an NVIDIA GPU: Tokamax refuses a CPU ('Not supported on cpu.')"),
        "gpu": RUNS,
        "tpu": unsupported("cuDNN needs an NVIDIA GPU; a TPU has no cuDNN"),
    }
    supports = frozenset({"window", "segment_ids"})
    feature_notes = {"softcap": ("Tokamax's jax.nn op refuses it ('`logits_soft_cap` not supported.', "
                                 "JaxNnDotProductAttention._fwd)")}

    def shape_reason(self, workload, platform):
        return cudnn_layout_reason(workload, platform) or super().shape_reason(workload, platform)
