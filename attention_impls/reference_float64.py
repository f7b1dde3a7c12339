"""The naive materialized-softmax reference, in float64 on the CPU: the yardstick for correctness.

It builds the full [Sq, Sk] score matrix, so its memory grows as O(S^2): that is the point of
keeping it in the sweep beside the flash kernels.
"""

from __future__ import annotations

import numpy as np

from attention_impls.base import RUNS, AttentionImpl, default_scale
from attention_impls.registry import register


def causal_mask(seq_q: int, seq_k: int) -> np.ndarray:
    """Bottom-right aligned: query i sees keys j <= i + (seq_k - seq_q)."""
    return np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)


def _expand_kv(x: np.ndarray, q_heads: int) -> np.ndarray:
    """[B, S, Hkv, D] -> [B, S, Hq, D] by repeating each kv head for its query group."""
    return np.repeat(x, q_heads // x.shape[2], axis=2)


def _probabilities(q, k, causal, scale):
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        s = np.where(causal_mask(q.shape[1], k.shape[1]), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def attention_fwd(q, k, v, *, causal: bool, scale: float | None = None) -> np.ndarray:
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    k, v = _expand_kv(k, q.shape[2]), _expand_kv(v, q.shape[2])
    p = _probabilities(q, k, causal, default_scale(q.shape[3], scale))
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def attention_grads(q, k, v, do, *, causal: bool, scale: float | None = None):
    """Analytic gradients of sum(out * do), reduced over each kv head's query group."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    kv_heads, q_heads = k.shape[2], q.shape[2]
    ke, ve = _expand_kv(k, q_heads), _expand_kv(v, q_heads)
    scale = default_scale(q.shape[3], scale)
    p = _probabilities(q, ke, causal, scale)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    dp = np.einsum("bqhd,bkhd->bhqk", do, ve)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
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
    summary = "naive materialized softmax in float64 numpy on the host CPU (correctness yardstick)"
    platform_support = {"cpu": RUNS, "gpu": RUNS, "tpu": RUNS}  # always the host CPU

    def attention(self, q, k, v, *, causal, scale):
        return attention_fwd(q, k, v, causal=causal, scale=scale)

    def attention_grads(self, q, k, v, do, *, causal, scale):
        return attention_grads(q, k, v, do, causal=causal, scale=scale)
