"""Tokamax's chunked XLA attention: ``tokamax.dot_product_attention(implementation="xla_chunked")``.

Rabe and Staats' memory-efficient attention (arXiv:2112.05682) as Tokamax ships it
(``ops/attention/xla_chunked.py``): ``lax.scan`` over 512-query chunks, an online softmax over
1024-key chunks (``api._XLA_CHUNK_SIZE``), every tile computed; a ragged last chunk is handled inside.
Portable, so native everywhere: Tokamax's non-Pallas alternative to a flash kernel. Grouped kv heads
are ``jnp.repeat``-ed to the query heads first (``XlaChunkedDotProductAttention._fwd``).
"""

from __future__ import annotations

from attention_impls._tokamax import TokamaxAttention
from attention_impls.registry import register


@register
class JaxTokamaxXlaChunked(TokamaxAttention):
    name = "jax-tokamax-xla-chunked"
    implementation = "xla_chunked"
    is_flash = True  # a tiled online softmax, portable: native wherever XLA compiles it
    summary = ("Tokamax dot_product_attention(implementation='xla_chunked'): 512x1024 chunks, online "
               "softmax in lax.scan (Rabe & Staats), XLA-compiled")
    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "repeated"  # XlaChunkedDotProductAttention._fwd: jnp.repeat(k, v) to the query heads
