"""FlashAttention's algorithm written in plain jax: KV blocks, running max and sum, XLA loops.

The jax twin of ``torch_blockwise``. Tiles are FlashAttention-2's forward on NVIDIA GPUs for
head_dim 64 (128 x 128; ``run_mha_fwd_hdim64`` in ``flash_fwd_launch_template.h``), so off a GPU
this is a forced, GPU-shaped flash kernel.

``lax.map`` over query blocks and ``lax.scan`` over key blocks keep the traced program the same
size for every length. Key blocks the mask hides from a whole query block are skipped with
``lax.cond``, as FA2 does. Gradients come from jax autodiff through the loops (no FA2 backward).
"""

from __future__ import annotations

import functools

from attention_impls._blockwise_tiles import BLOCK_K, BLOCK_Q, SEARCH_SPACE, tile_reason
from attention_impls.base import AttentionImpl
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blockwise_attention(q, k, v, *, causal: bool, scale: float, window: int | None = None,
                        softcap: float | None = None, q_segment_ids=None, kv_segment_ids=None,
                        block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    """Online-softmax attention on [B, S, H, D] arrays; never materializes more than one tile.

    Accumulates in float32, like the CUDA kernels; mask as ``attnbench.core.masks``. Returns q's dtype.
    """
    import jax.numpy as jnp
    from jax import lax

    batch, seq_q, q_heads, head_dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    offset = seq_k - seq_q  # bottom-right causal alignment
    n_q, n_k = _cdiv(seq_q, block_q), _cdiv(seq_k, block_k)
    f32 = jnp.float32
    highest = lax.Precision.HIGHEST  # a float32 kernel: no TF32 on GPUs
    segmented = q_segment_ids is not None

    # [n_q, B, Hkv, group, block_q, D]: each kv head is read once for its whole query group (GQA).
    qf = q.astype(f32).transpose(0, 2, 1, 3).reshape(batch, kv_heads, group, seq_q, head_dim) * scale
    qf = jnp.pad(qf, ((0, 0),) * 3 + ((0, n_q * block_q - seq_q), (0, 0)))
    q_blocks = jnp.moveaxis(qf.reshape(batch, kv_heads, group, n_q, block_q, head_dim), 3, 0)

    # [n_k, B, Hkv, block_k, D]
    def kv_blocks(x):
        x = x.astype(f32).transpose(0, 2, 1, 3)
        x = jnp.pad(x, ((0, 0), (0, 0), (0, n_k * block_k - seq_k), (0, 0)))
        return jnp.moveaxis(x.reshape(batch, kv_heads, n_k, block_k, head_dim), 2, 0)

    k_blocks, v_blocks = kv_blocks(k), kv_blocks(v)
    k_starts = jnp.arange(n_k, dtype=jnp.int32) * block_k
    ragged_k = seq_k % block_k != 0

    # [n, B, block] segment ids. Edge padding repeats the last real id, so a padded position never
    # widens its block's id range (the block skip below compares ranges); padded keys stay masked
    # by position.
    def id_blocks(ids, length, n, block):
        ids = jnp.pad(ids.astype(jnp.int32), ((0, 0), (0, n * block - length)), mode="edge")
        return ids.reshape(batch, n, block).swapaxes(0, 1)

    if segmented:
        q_ids = id_blocks(q_segment_ids, seq_q, n_q, block_q)
        kv_ids = id_blocks(kv_segment_ids, seq_k, n_k, block_k)
    else:  # placeholders, so that map and scan carry the same structure either way
        q_ids, kv_ids = jnp.zeros((n_q, 1, 1), jnp.int32), jnp.zeros((n_k, 1, 1), jnp.int32)

    def one_query_block(xs):
        q_blk, q_id, q0 = xs  # [B, Hkv, group, block_q, D], [B, block_q], first row
        q_pos = q0 + offset + jnp.arange(block_q, dtype=jnp.int32)

        def tile(carry, k_blk, v_blk, k_id, k0):
            acc, row_max, row_sum = carry
            scores = jnp.einsum("bhgqd,bhkd->bhgqk", q_blk, k_blk, precision=highest)
            if softcap is not None:
                scores = softcap * jnp.tanh(scores / softcap)
            k_idx = k0 + jnp.arange(block_k, dtype=jnp.int32)
            keep = []  # [block_q or 1, block_k] position rules, then [B, block_q, block_k] ids
            if ragged_k:
                keep.append(k_idx[None, :] < seq_k)
            if causal:
                keep.append(k_idx[None, :] <= q_pos[:, None])
            if window is not None:
                keep.append(k_idx[None, :] > q_pos[:, None] - window)
            if segmented:
                keep.append(q_id[:, :, None] == k_id[:, None, :])
            if keep:
                visible = functools.reduce(jnp.logical_and, keep)
                if visible.ndim == 3:  # per batch row: broadcast over the heads
                    visible = visible[:, None, None]
                scores = jnp.where(visible, scores, -jnp.inf)
            new_max = jnp.maximum(row_max, scores.max(axis=-1, keepdims=True))
            # A row that has seen no visible key yet (window, documents): keep exp() finite.
            safe_max = jnp.where(jnp.isneginf(new_max), 0.0, new_max)
            probs = jnp.exp(scores - safe_max)
            correction = jnp.exp(row_max - safe_max)
            row_sum = row_sum * correction + probs.sum(axis=-1, keepdims=True)
            acc = acc * correction + jnp.einsum("bhgqk,bhkd->bhgqd", probs, v_blk, precision=highest)
            return acc, new_max, row_sum

        def step(carry, xs):
            k_blk, v_blk, k_id, k0 = xs
            # Skip a key block the mask hides from every row of this query block, as FA2 does. The
            # segment test compares id ranges: exact, never skips a visible pair.
            needed = []
            if causal:
                needed.append(k0 <= q0 + block_q - 1 + offset)
            if window is not None:
                needed.append(k0 + block_k - 1 > q0 + offset - window)
            if segmented:
                overlap = (q_id.min(axis=1) <= k_id.max(axis=1)) & (k_id.min(axis=1) <= q_id.max(axis=1))
                needed.append(overlap.any())
            if not needed:
                return tile(carry, k_blk, v_blk, k_id, k0), None
            run = functools.reduce(jnp.logical_and, needed)
            return lax.cond(run, lambda c: tile(c, k_blk, v_blk, k_id, k0), lambda c: c, carry), None

        init = (jnp.zeros(q_blk.shape, f32),
                jnp.full(q_blk.shape[:-1] + (1,), -jnp.inf, f32),
                jnp.zeros(q_blk.shape[:-1] + (1,), f32))
        (acc, _, row_sum), _ = lax.scan(step, init, (k_blocks, v_blocks, kv_ids, k_starts))
        return acc / jnp.where(row_sum == 0.0, 1.0, row_sum)  # 0 only on padded query rows

    q_starts = jnp.arange(n_q, dtype=jnp.int32) * block_q
    out = lax.map(one_query_block, (q_blocks, q_ids, q_starts))  # [n_q, B, Hkv, group, block_q, D]
    out = jnp.moveaxis(out, 0, 3).reshape(batch, q_heads, n_q * block_q, head_dim)[:, :, :seq_q]
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


@register
class JaxBlockwise(AttentionImpl):
    name = "jax-blockwise-flash"
    public_calls = {"jax.lax:map": (), "jax.lax:scan": (), "jax.lax:cond": ()}
    framework = "jax"
    designed_for = frozenset({"gpu"})
    is_flash = True
    reimplements = "FlashAttention-2's GPU algorithm (default tiles 128x128, FA2's)"
    summary = ("FlashAttention-2 online softmax in jax (lax.map over query tiles, lax.scan over key "
               "tiles; GPU tile sizes 128x128 by default), compiled by XLA on every backend")
    search_space = SEARCH_SPACE

    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "native"  # q is [B, Hkv, group, ...]: each kv tile is read once for its query group

    def config_reason(self, config, workload):
        return tile_reason(config, workload)

    def attention(self, q, k, v, *, causal, scale, **mask):
        return blockwise_attention(q, k, v, causal=causal, scale=scale, block_q=self.knob("block_q"),
                                   block_k=self.knob("block_k"), **mask)
