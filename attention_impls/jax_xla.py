"""``jax.nn.dot_product_attention`` with XLA's own lowering: native on every backend.

Mask features, all through ``jax.nn.dot_product_attention``'s own options (jax
``_src/nn/functions.py``; the xla path ``_apply_masks`` turns each into a boolean mask over the
materialized [Sq, Sk] logits):

- sliding window: ``local_window_size=(W - 1, 0)`` with ``is_causal=True`` keeps
  ``i - (W - 1) <= j <= i`` (``_get_window_mask``: query and key positions both count from 0, so
  it is top-left aligned). That is ``attnbench.core.masks``' window when ``Sq == Sk``; with
  ``Sq != Sk`` (decode) the bottom-right causal window goes in ``mask`` instead, as causal does;
- segment ids: ``mask = q_segment_ids[b, i] == kv_segment_ids[b, j]`` ([B, 1, Sq, Sk], boolean,
  built from the traced id arrays);
- logit soft-capping: refused, ``dot_product_attention`` has no such option.

Grouped-query heads are native: the xla path reshapes the queries to [B, T, K, G, H] and vmaps over
the group, so each kv head enters one batched dot_general for its whole group (no repeat).
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register


def bottom_right_mask(seq_q: int, seq_k: int, window: int | None = None):
    """Boolean [1, 1, Sq, Sk] mask, True where query i may see key j: bottom-right causal, and the
    last ``window`` keys only when given (``attnbench.core.masks``)."""
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
    framework = "jax"
    summary = "jax.nn.dot_product_attention(implementation='xla'): XLA fuses a materialized softmax"
    supports = frozenset({"window", "segment_ids"})
    feature_notes = {
        "softcap": ("jax.nn.dot_product_attention takes no logit soft-capping: it has no soft-cap "
                    "option (only bias, mask, is_causal, sequence lengths and local_window_size)"),
    }
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
