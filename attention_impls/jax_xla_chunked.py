"""Memory-efficient chunked attention in plain jax: a portable, native alternative to forced flash.

Rabe and Staats, "Self-attention does not need O(n^2) memory" (arXiv:2112.05682), as Tokamax's
``xla_chunked`` does it: ``lax.map`` over query chunks, a float32 online softmax ``lax.scan`` over
key chunks. The key-chunk body is ``jax.checkpoint``-ed, as in the paper, so the backward pass
recomputes scores instead of storing every tile.

Every tile is computed and masked (no tile skipping), so a masked step does the full matmul work;
plain XLA loops are what make it native everywhere.
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl, SearchSpace, config_text
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

QUERY_CHUNK = 256
KEY_CHUNK = 512
# The tuner's candidates (docs/tuning.md): the default, shorter chunks, and longer query or key chunks.
SEARCH_SPACE = SearchSpace(
    defaults=(("query_chunk", QUERY_CHUNK), ("key_chunk", KEY_CHUNK)),
    candidates=tuple((("query_chunk", q), ("key_chunk", k)) for q, k in
                     ((64, 128), (128, 256), (256, 256), (QUERY_CHUNK, KEY_CHUNK), (256, 1024), (512, 512),
                      (512, 1024))))


def _clamped(config, workload) -> tuple[int, int]:
    """The chunks a config runs at for a workload: each is clamped to its length."""
    chunks = dict(config)
    return min(chunks["query_chunk"], workload.seq_q), min(chunks["key_chunk"], workload.seq_k)


def _padded(x, length: int, axis: int = 1):
    import jax.numpy as jnp

    extra = length - x.shape[axis]
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def chunked_attention(q, k, v, *, causal: bool, scale: float, window: int | None = None,
                      softcap: float | None = None, q_segment_ids=None, kv_segment_ids=None,
                      query_chunk: int = QUERY_CHUNK, key_chunk: int = KEY_CHUNK):
    """[B, Sq, Hq, D] x [B, Sk, Hkv, D] -> [B, Sq, Hq, D] under ``attnbench.core.masks``' mask.

    Each kv head's tile meets its whole query group in one einsum, nothing is repeated."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    batch, seq_q, q_heads, head_dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    qc, kc = min(query_chunk, seq_q), min(key_chunk, seq_k)
    n_q, n_k = -(-seq_q // qc), -(-seq_k // kc)
    offset = seq_k - seq_q  # bottom-right: query i sits at position i + offset
    segmented = q_segment_ids is not None

    # [n, B, chunk, Hkv, (group,) D]: chunks first, for lax.map / lax.scan.
    q_chunks = _padded(q, n_q * qc).reshape(batch, n_q, qc, kv_heads, group, head_dim).swapaxes(0, 1)
    k_chunks = _padded(k, n_k * kc).reshape(batch, n_k, kc, kv_heads, head_dim).swapaxes(0, 1)
    v_chunks = _padded(v, n_k * kc).reshape(batch, n_k, kc, kv_heads, head_dim).swapaxes(0, 1)
    if segmented:  # [n, B, chunk]; padded positions are masked by position, their id is irrelevant
        q_ids = _padded(q_segment_ids, n_q * qc).reshape(batch, n_q, qc).swapaxes(0, 1)
        kv_ids = _padded(kv_segment_ids, n_k * kc).reshape(batch, n_k, kc).swapaxes(0, 1)
    else:  # placeholders, so that map and scan carry the same structure either way
        q_ids, kv_ids = jnp.zeros((n_q, 1, 1), jnp.int32), jnp.zeros((n_k, 1, 1), jnp.int32)

    def one_query_chunk(xs):
        q_blk, q_id, q0 = xs
        q_pos = q0 + jnp.arange(qc) + offset

        @jax.checkpoint
        def key_tile(carry, ys):
            m, denom, acc = carry
            k_blk, v_blk, k_id, k0 = ys
            k_pos = k0 + jnp.arange(kc)
            s = jnp.einsum("bqhgd,bkhd->bhgqk", q_blk, k_blk, preferred_element_type=jnp.float32) * scale
            if softcap is not None:
                s = softcap * jnp.tanh(s / softcap)
            visible = jnp.broadcast_to(k_pos[None, :] < seq_k, (qc, kc))  # padded keys never
            if causal:
                visible = visible & (k_pos[None, :] <= q_pos[:, None])
            if window is not None:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
            visible = visible[None]  # [1 or B, qc, kc]
            if segmented:
                visible = visible & (q_id[:, :, None] == k_id[:, None, :])
            s = jnp.where(visible[:, None, None], s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(axis=-1))
            m_safe = jnp.where(jnp.isneginf(m_new), 0.0, m_new)  # a row that saw no key yet
            p = jnp.exp(s - m_safe[..., None])
            correction = jnp.exp(m - m_safe)
            denom = denom * correction + p.sum(axis=-1)
            acc = acc * correction[..., None] + jnp.einsum(
                "bhgqk,bkhd->bhgqd", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
            return (m_new, denom, acc), None

        init = (jnp.full((batch, kv_heads, group, qc), -jnp.inf, jnp.float32),
                jnp.zeros((batch, kv_heads, group, qc), jnp.float32),
                jnp.zeros((batch, kv_heads, group, qc, head_dim), jnp.float32))
        (_, denom, acc), _ = lax.scan(key_tile, init, (k_chunks, v_chunks, kv_ids, jnp.arange(n_k) * kc))
        out = acc / jnp.where(denom == 0.0, 1.0, denom)[..., None]  # 0 only on padded query rows
        return jnp.moveaxis(out, 3, 1).astype(q.dtype)  # [B, qc, Hkv, group, D]

    out = lax.map(one_query_chunk, (q_chunks, q_ids, jnp.arange(n_q) * qc))  # [n_q, B, qc, Hkv, G, D]
    return out.swapaxes(0, 1).reshape(batch, n_q * qc, q_heads, head_dim)[:, :seq_q]


@register
class JaxXlaChunked(AttentionImpl):
    name = "jax-xla-chunked"
    public_calls = {"jax.lax:map": (), "jax.lax:scan": (), "jax:checkpoint": ()}
    framework = "jax"
    is_flash = True  # tiled online softmax, but portable: native wherever XLA compiles it
    summary = (f"memory-efficient chunked attention in plain jax (lax.map over query chunks, lax.scan "
               f"online softmax over key chunks, {QUERY_CHUNK}x{KEY_CHUNK} by default; Rabe & Staats), "
               "XLA-compiled")
    search_space = SEARCH_SPACE

    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "native"  # one einsum per kv head and its query group (no repeat)

    def config_reason(self, config, workload):
        """A chunk longer than its length is clamped to it: a candidate that clamps to the chunks of
        the defaults, or of a candidate before it, is the same program, refused as such."""
        mine = _clamped(config, workload)
        for other in (SEARCH_SPACE.defaults, *SEARCH_SPACE.candidates):
            if other == config:
                break
            if _clamped(other, workload) == mine:
                return (f"the same program as {config_text(other)} at this workload: chunks are clamped "
                        f"to the lengths (Sq {workload.seq_q}, Sk {workload.seq_k})")
        return None

    def attention(self, q, k, v, *, causal, scale, **mask):
        return chunked_attention(q, k, v, causal=causal, scale=scale, query_chunk=self.knob("query_chunk"),
                                 key_chunk=self.knob("key_chunk"), **mask)
