"""The naive materialized-softmax reference, in float64 on the CPU: the yardstick for correctness.

Its O(S^2) memory is the point of keeping it in the sweep beside the flash kernels. It takes every
mask feature: every other kernel is checked against it.
"""

from __future__ import annotations

import numpy as np

from attention_impls.base import MASK_FEATURES, RUNS, AttentionImpl, default_scale
from attention_impls.registry import register
from attnbench.core.masks import dense_mask


def causal_mask(seq_q: int, seq_k: int) -> np.ndarray:
    """Bottom-right aligned: query i sees keys j <= i + (seq_k - seq_q)."""
    return np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)


def _expand_kv(x: np.ndarray, q_heads: int) -> np.ndarray:
    """[B, S, Hkv, D] -> [B, S, Hq, D] by repeating each kv head for its query group."""
    return np.repeat(x, q_heads // x.shape[2], axis=2)


def _probabilities(q, k, causal, scale, window=None, q_segment_ids=None, kv_segment_ids=None,
                   softcap=None):
    """Softmax probabilities ``[B, H, Sq, Sk]`` and d(capped score)/d(raw score) (1 without a cap)."""
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    slope = 1.0
    if softcap is not None:  # before the mask, as Gemma-2 applies it
        t = np.tanh(s / softcap)
        s, slope = softcap * t, 1.0 - t * t
    if causal or window is not None or q_segment_ids is not None:
        keep = dense_mask(q.shape[1], k.shape[1], causal=causal, window=window,
                          q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
        s = np.where(keep[:, None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True), slope


def attention_fwd(q, k, v, *, causal: bool, scale: float | None = None, **mask) -> np.ndarray:
    """``mask``: ``window``, ``softcap``, ``q_segment_ids``/``kv_segment_ids`` (attnbench.core.masks)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    k, v = _expand_kv(k, q.shape[2]), _expand_kv(v, q.shape[2])
    p, _ = _probabilities(q, k, causal, default_scale(q.shape[3], scale), **mask)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def attention_grads(q, k, v, do, *, causal: bool, scale: float | None = None, **mask):
    """Analytic gradients of sum(out * do), reduced over each kv head's query group."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    kv_heads, q_heads = k.shape[2], q.shape[2]
    ke, ve = _expand_kv(k, q_heads), _expand_kv(v, q_heads)
    scale = default_scale(q.shape[3], scale)
    p, slope = _probabilities(q, ke, causal, scale, **mask)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, ve)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * slope  # through the cap's tanh
    dq = np.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale

    def reduce_group(x):  # [B, S, Hq, D] -> [B, S, Hkv, D]
        b, s, _, d = x.shape
        return x.reshape(b, s, kv_heads, q_heads // kv_heads, d).sum(axis=3)

    return dq, reduce_group(dk), reduce_group(dv)


@register
class Float64Reference(AttentionImpl):
    name = "reference-float64"
    framework = "numpy"
    executes = "eager"
    summary = "naive materialized softmax in float64 numpy on the host CPU (correctness yardstick)"
    platform_support = {"cpu": RUNS, "gpu": RUNS, "tpu": RUNS}  # always the host CPU
    supports = frozenset(MASK_FEATURES)
    gqa = "repeated"  # kv heads repeated to q_heads (np.repeat) before the einsums

    def attention(self, q, k, v, *, causal, scale, **mask):
        return attention_fwd(q, k, v, causal=causal, scale=scale, **mask)

    def attention_grads(self, q, k, v, do, *, causal, scale, **mask):
        return attention_grads(q, k, v, do, causal=causal, scale=scale, **mask)
