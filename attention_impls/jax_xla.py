"""``jax.nn.dot_product_attention`` with XLA's own lowering: native on every backend.

``is_causal`` and ``local_window_size`` are top-left aligned (jax ``_src/nn/functions.py``
``_get_window_mask``), so with ``Sq != Sk`` causal and the window go in as an explicit ``mask``.
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).


def bottom_right_mask(seq_q: int, seq_k: int, window: int | None = None):
    """Boolean [1, 1, Sq, Sk]: bottom-right causal, optionally the last ``window`` keys only."""
    import jax.numpy as jnp

    pos = jnp.arange(seq_q)[:, None] + (seq_k - seq_q)
    keys = jnp.arange(seq_k)[None, :]
    keep = keys <= pos
    if window is not None:
        keep = keep & (keys > pos - window)
    return keep[None, None]


def segment_mask(q_segment_ids, kv_segment_ids):
    """Boolean [B, 1, Sq, Sk]: True where query and key carry the same segment id."""
    return (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :])[:, None]


@register
class JaxXla(AttentionImpl):
    name = "jax-xla"
    public_calls = {"jax.nn:dot_product_attention": ("mask", "scale", "implementation", "is_causal",
                                                     "local_window_size")}
    framework = "jax"
    summary = "jax.nn.dot_product_attention(implementation='xla'): XLA fuses a materialized softmax"
    supports = frozenset({"window", "segment_ids"})
    call_name = "jax.nn.dot_product_attention"
    feature_notes = {"softcap": ("it has no soft-cap option (only bias, mask, is_causal, sequence lengths "
                                 "and local_window_size)")}
    gqa = "native"  # the xla path groups query heads per kv head (reshape + vmap), no repeat

    def attention(self, q, k, v, *, causal, scale, window=None, q_segment_ids=None,
                  kv_segment_ids=None):
        import jax

        seq_q, seq_k = q.shape[1], k.shape[1]
        options = {}
        mask = None
        if causal and seq_q != seq_k:
            # is_causal and local_window_size are top-left aligned in jax; ours is bottom-right.
            mask = bottom_right_mask(seq_q, seq_k, window)
        else:
            options["is_causal"] = causal
            if window is not None:
                options["local_window_size"] = (window - 1, 0)  # W keys: itself and W - 1 before
        if q_segment_ids is not None:
            segments = segment_mask(q_segment_ids, kv_segment_ids)
            mask = segments if mask is None else mask & segments
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla",
                                            **options)
