"""Tokamax's plain XLA attention: ``tokamax.dot_product_attention(implementation="xla")``.

Tokamax's reference op (``ops/attention/base.py`` ``DotProductAttention``): scores materialized and
fused by XLA, as ``jax-xla``. Native on every backend; the field's baseline in Tokamax's own tables.
Shared rules (top-left causal, segment ids as a dense mask): ``attention_impls/_tokamax.py``.
"""

from __future__ import annotations

from attention_impls._tokamax import TokamaxAttention
from attention_impls.registry import register


@register
class JaxTokamaxXla(TokamaxAttention):
    name = "jax-tokamax-xla"
    implementation = "xla"
    summary = ("Tokamax dot_product_attention(implementation='xla'): its reference op, XLA fuses a "
               "materialized softmax")
    supports = frozenset({"window", "softcap", "segment_ids"})
