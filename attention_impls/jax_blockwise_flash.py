"""FlashAttention's algorithm written in plain jax: KV blocks, running max and sum, XLA loops.

The jax twin of ``torch_blockwise``: tile sizes are the ones FlashAttention-2's forward picks on
NVIDIA GPUs for head_dim 64 without dropout (128 query rows x 128 keys; ``run_mha_fwd_hdim64`` in
``flash_fwd_launch_template.h``), so off a GPU this is a forced, GPU-shaped flash kernel.
It is ordinary XLA code and runs compiled on every backend.

Query blocks are a ``lax.map`` and key blocks a ``lax.scan`` inside it, so the traced program has
the same size for every sequence length. Under a causal mask a key block lying entirely above the
diagonal is skipped with ``lax.cond``, as the CUDA kernel skips it. Lengths that are not multiples
of the tiles are padded internally; padded keys are masked out and padded query rows are dropped.
Gradients come from jax autodiff through the loops (no hand-written FA2 backward), so the backward
pass keeps per-tile residuals like ``torch_blockwise`` does under autograd.
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register

BLOCK_Q = 128
BLOCK_K = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blockwise_attention(q, k, v, *, causal: bool, scale: float, block_q: int = BLOCK_Q,
                        block_k: int = BLOCK_K):
    """Online-softmax attention on [B, S, H, D] arrays; never materializes more than one tile.

    Accumulates in float32 whatever the input dtype, like the CUDA kernels do; causal masks are
    bottom-right aligned (query i sees keys j <= i + seq_k - seq_q). Returns q's dtype.
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

    def one_query_block(xs):
        q_blk, q0 = xs  # [B, Hkv, group, block_q, D]
        q_idx = q0 + jnp.arange(block_q, dtype=jnp.int32)

        def tile(carry, k_blk, v_blk, k0):
            acc, row_max, row_sum = carry
            scores = jnp.einsum("bhgqd,bhkd->bhgqk", q_blk, k_blk, precision=highest)
            k_idx = k0 + jnp.arange(block_k, dtype=jnp.int32)
            visible = None
            if ragged_k:
                visible = jnp.broadcast_to(k_idx[None, :] < seq_k, (block_q, block_k))
            if causal:
                diag = k_idx[None, :] <= q_idx[:, None] + offset
                visible = diag if visible is None else visible & diag
            if visible is not None:
                scores = jnp.where(visible, scores, -jnp.inf)
            new_max = jnp.maximum(row_max, scores.max(axis=-1, keepdims=True))
            probs = jnp.exp(scores - new_max)
            correction = jnp.exp(row_max - new_max)
            row_sum = row_sum * correction + probs.sum(axis=-1, keepdims=True)
            acc = acc * correction + jnp.einsum("bhgqk,bhkd->bhgqd", probs, v_blk, precision=highest)
            return acc, new_max, row_sum

        def step(carry, xs):
            k_blk, v_blk, k0 = xs
            if not causal:
                return tile(carry, k_blk, v_blk, k0), None
            # The block's first key is above the diagonal for every row of this query block:
            # nothing in it is visible, skip it as FA2 does.
            needed = k0 <= q0 + block_q - 1 + offset
            return lax.cond(needed, lambda c: tile(c, k_blk, v_blk, k0), lambda c: c, carry), None

        init = (jnp.zeros(q_blk.shape, f32),
                jnp.full(q_blk.shape[:-1] + (1,), -jnp.inf, f32),
                jnp.zeros(q_blk.shape[:-1] + (1,), f32))
        (acc, _, row_sum), _ = lax.scan(step, init, (k_blocks, v_blocks, k_starts))
        return acc / row_sum

    q_starts = jnp.arange(n_q, dtype=jnp.int32) * block_q
    out = lax.map(one_query_block, (q_blocks, q_starts))  # [n_q, B, Hkv, group, block_q, D]
    out = jnp.moveaxis(out, 0, 3).reshape(batch, q_heads, n_q * block_q, head_dim)[:, :, :seq_q]
    return jnp.swapaxes(out, 1, 2).astype(q.dtype)


@register
class JaxBlockwise(AttentionImpl):
    name = "jax-blockwise-flash"
    framework = "jax"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = ("FlashAttention-2 online softmax in jax (lax.map over 128-row query tiles, lax.scan "
               "over 64-key tiles, GPU tile sizes), compiled by XLA on every backend")

    def attention(self, q, k, v, *, causal, scale):
        return blockwise_attention(q, k, v, causal=causal, scale=scale)
