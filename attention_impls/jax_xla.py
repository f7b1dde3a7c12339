"""``jax.nn.dot_product_attention`` with XLA's own lowering: native on every backend."""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register


def bottom_right_mask(seq_q: int, seq_k: int):
    """Boolean [1, 1, Sq, Sk] mask, True where query i may see key j (bottom-right aligned)."""
    import jax.numpy as jnp

    return (jnp.arange(seq_k)[None, :] <= jnp.arange(seq_q)[:, None] + (seq_k - seq_q))[None, None]


@register
class JaxXla(AttentionImpl):
    name = "jax-xla"
    framework = "jax"
    summary = "jax.nn.dot_product_attention(implementation='xla'): XLA fuses a materialized softmax"

    def attention(self, q, k, v, *, causal, scale):
        import jax

        seq_q, seq_k = q.shape[1], k.shape[1]
        if causal and seq_q != seq_k:
            # is_causal is top-left aligned in jax; our convention is bottom-right.
            return jax.nn.dot_product_attention(q, k, v, mask=bottom_right_mask(seq_q, seq_k),
                                                scale=scale, implementation="xla")
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, scale=scale, implementation="xla")
