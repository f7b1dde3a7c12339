"""Memory-efficient chunked attention in plain jax: a portable, native alternative to forced flash.

Rabe and Staats, "Self-attention does not need O(n^2) memory" (arXiv:2112.05682), as Tokamax's
``xla_chunked`` does it: queries in chunks (``lax.map``), and for each chunk an online softmax
over key chunks (``lax.scan`` carrying the running max, normaliser and output, in float32).
Only one [q_chunk, k_chunk] score tile is live at a time, so memory grows with the chunk sizes,
not with the square of the length. The key-chunk body is ``jax.checkpoint``-ed, as in the paper,
so the backward pass recomputes the tile's scores instead of storing every tile.

Every tile is computed and masked (no causal tile skipping), so a causal step does the full
non-causal matmul work; XLA compiles the whole loop for any backend, which is what makes it
native everywhere (no Pallas, no Mosaic, no Triton). Lengths that the chunks do not divide are
padded inside the kernel and the padded keys masked out.
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register

QUERY_CHUNK = 256
KEY_CHUNK = 512


def _padded(x, length: int, axis: int = 1):
    import jax.numpy as jnp

    extra = length - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def chunked_attention(q, k, v, *, causal: bool, scale: float, query_chunk: int = QUERY_CHUNK,
                      key_chunk: int = KEY_CHUNK):
    """[B, Sq, Hq, D] x [B, Sk, Hkv, D] -> [B, Sq, Hq, D], bottom-right causal, GQA by repetition."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    batch, seq_q, q_heads, head_dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    if kv_heads != q_heads:
        k, v = (jnp.repeat(x, q_heads // kv_heads, axis=2) for x in (k, v))
    qc, kc = min(query_chunk, seq_q), min(key_chunk, seq_k)
    n_q, n_k = -(-seq_q // qc), -(-seq_k // kc)
    offset = seq_k - seq_q  # bottom-right: query i sees keys j <= i + offset

    # [n, B, chunk, H, D]: chunks first, for lax.map / lax.scan.
    q_chunks = _padded(q, n_q * qc).reshape(batch, n_q, qc, q_heads, head_dim).swapaxes(0, 1)
    k_chunks = _padded(k, n_k * kc).reshape(batch, n_k, kc, q_heads, head_dim).swapaxes(0, 1)
    v_chunks = _padded(v, n_k * kc).reshape(batch, n_k, kc, q_heads, head_dim).swapaxes(0, 1)

    def one_query_chunk(xs):
        q_blk, q0 = xs
        q_pos = q0 + jnp.arange(qc)

        @jax.checkpoint
        def key_tile(carry, ys):
            m, denom, acc = carry
            k_blk, v_blk, k0 = ys
            k_pos = k0 + jnp.arange(kc)
            s = jnp.einsum("bqhd,bkhd->bhqk", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
            visible = k_pos[None, :] < seq_k
            if causal:
                visible = visible & (k_pos[None, :] <= q_pos[:, None] + offset)
            s = jnp.where(visible, s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=-1))
            m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # a row that saw no key yet
            p = jnp.exp(s - m_safe[..., None])
            correction = jnp.exp(m - m_safe)
            denom = denom * correction + p.sum(axis=-1)
            acc = acc * correction[..., None] + jnp.einsum(
                "bhqk,bkhd->bhqd", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
            return (m_new, denom, acc), None

        init = (jnp.full((batch, q_heads, qc), -jnp.inf, jnp.float32),
                jnp.zeros((batch, q_heads, qc), jnp.float32),
                jnp.zeros((batch, q_heads, qc, head_dim), jnp.float32))
        (_, denom, acc), _ = lax.scan(key_tile, init, (k_chunks, v_chunks, jnp.arange(n_k) * kc))
        out = acc / jnp.where(denom == 0.0, 1.0, denom)[..., None]  # 0 only on padded query rows
        return out.swapaxes(1, 2).astype(q.dtype)  # [B, qc, H, D]

    out = lax.map(one_query_chunk, (q_chunks, jnp.arange(n_q) * qc))  # [n_q, B, qc, H, D]
    return out.swapaxes(0, 1).reshape(batch, n_q * qc, q_heads, head_dim)[:, :seq_q]


@register
class JaxXlaChunked(AttentionImpl):
    name = "jax-xla-chunked"
    framework = "jax"
    is_flash = True  # tiled online softmax, but portable: native wherever XLA compiles it
    summary = (f"memory-efficient chunked attention in plain jax (lax.map over {QUERY_CHUNK}-query "
               f"chunks, lax.scan online softmax over {KEY_CHUNK}-key chunks; Rabe & Staats), XLA-compiled")

    def attention(self, q, k, v, *, causal, scale):
        return chunked_attention(q, k, v, causal=causal, scale=scale)
