"""FlashAttention's algorithm written in plain jax: KV blocks, running max and sum, XLA loops.

The jax twin of ``torch_blockwise``. Tiles are FlashAttention-2's forward on NVIDIA GPUs for
head_dim 64 (128 x 128; ``run_mha_fwd_hdim64`` in ``flash_fwd_launch_template.h``), so off a GPU
this is a forced, GPU-shaped flash kernel.

``lax.map`` over query blocks and ``lax.scan`` over key blocks keep the traced program the same
size for every length. Key blocks the mask hides from a whole query block are skipped with
``lax.cond``, as FA2 does. Its gradient is FA2's backward, a ``jax.custom_vjp``: the forward keeps
q, k, v, the output and each row's log-sum-exp; the backward recomputes each tile's probabilities
(outer loop over key tiles, as FA2's), so its memory grows with the length, not its square.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from attention_impls._blockwise_tiles import BLOCK_K, BLOCK_Q, SEARCH_SPACE, Tiling, tile_reason
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
    Its gradient is FlashAttention-2's backward (``_backward``), not autodiff through the loops.
    """
    tiling = Tiling(causal, float(scale), window, softcap, block_q, block_k)
    return _flash()(tiling, q, k, v, q_segment_ids, kv_segment_ids)


@functools.cache
def _flash():
    """The kernel as a ``jax.custom_vjp`` (built on first use: importing this module imports no jax).
    The forward keeps q, k, v, the segment ids, the output and each row's log-sum-exp, and no tile."""
    import jax

    def flash(tiling, q, k, v, q_ids, kv_ids):
        return _forward(tiling, q, k, v, q_ids, kv_ids)[0]

    def flash_fwd(tiling, q, k, v, q_ids, kv_ids):
        out, lse = _forward(tiling, q, k, v, q_ids, kv_ids)
        return out, (q, k, v, q_ids, kv_ids, out, lse)

    def flash_bwd(tiling, residuals, d_out):
        return (*_backward(tiling, residuals, d_out), None, None)

    flash = jax.custom_vjp(flash, nondiff_argnums=(0,))
    flash.defvjp(flash_fwd, flash_bwd)
    return flash


class _Blocks(NamedTuple):
    """The inputs cut into tiles, float32, q scaled: q-side ``[n_q, B, Hkv, group, block_q, D]``,
    kv-side ``[n_k, B, Hkv, block_k, D]``, ids ``[n, B, block]``, each tile's first position."""

    q: object
    k: object
    v: object
    q_ids: object
    kv_ids: object
    q_starts: object
    k_starts: object


def _shape(q, k):
    batch, seq_q, q_heads, head_dim = q.shape
    return batch, seq_q, q_heads, head_dim, k.shape[1], k.shape[2]


def _q_side(x, tiling: Tiling, kv_heads: int):
    """A [B, Sq, Hq, D] array as float32 query tiles ``[n_q, B, Hkv, group, block_q, D]`` (GQA: each kv
    head's query group together, so a kv tile is read once for its whole group)."""
    import jax.numpy as jnp

    batch, seq_q, q_heads, head_dim = x.shape
    n_q = _cdiv(seq_q, tiling.block_q)
    x = x.astype(jnp.float32).transpose(0, 2, 1, 3).reshape(batch, kv_heads, q_heads // kv_heads, seq_q,
                                                           head_dim)
    x = jnp.pad(x, ((0, 0),) * 3 + ((0, n_q * tiling.block_q - seq_q), (0, 0)))
    return jnp.moveaxis(x.reshape(batch, kv_heads, q_heads // kv_heads, n_q, tiling.block_q, head_dim), 3, 0)


def _q_unside(x, seq_q: int):
    """Query tiles back to [B, Sq, Hq, D] (float32)."""
    import jax.numpy as jnp

    n_q, batch, kv_heads, group, block_q, head_dim = x.shape
    x = jnp.moveaxis(x, 0, 3).reshape(batch, kv_heads * group, n_q * block_q, head_dim)[:, :, :seq_q]
    return jnp.swapaxes(x, 1, 2)


def _kv_side(x, tiling: Tiling):
    import jax.numpy as jnp

    batch, seq_k, kv_heads, head_dim = x.shape
    n_k = _cdiv(seq_k, tiling.block_k)
    x = x.astype(jnp.float32).transpose(0, 2, 1, 3)
    x = jnp.pad(x, ((0, 0), (0, 0), (0, n_k * tiling.block_k - seq_k), (0, 0)))
    return jnp.moveaxis(x.reshape(batch, kv_heads, n_k, tiling.block_k, head_dim), 2, 0)


def _kv_unside(x, seq_k: int):
    import jax.numpy as jnp

    n_k, batch, kv_heads, block_k, head_dim = x.shape
    x = jnp.moveaxis(x, 0, 2).reshape(batch, kv_heads, n_k * block_k, head_dim)
    return x[:, :, :seq_k].swapaxes(1, 2)


def _blocks(tiling: Tiling, q, k, v, q_ids, kv_ids) -> _Blocks:
    import jax.numpy as jnp

    batch, seq_q, _, _, seq_k, kv_heads = _shape(q, k)
    n_q, n_k = _cdiv(seq_q, tiling.block_q), _cdiv(seq_k, tiling.block_k)

    # [n, B, block] segment ids. Edge padding repeats the last real id, so a padded position never
    # widens its block's id range (the block skip compares ranges); padded keys stay masked by position.
    def id_blocks(ids, length, n, block):
        ids = jnp.pad(ids.astype(jnp.int32), ((0, 0), (0, n * block - length)), mode="edge")
        return ids.reshape(batch, n, block).swapaxes(0, 1)

    if q_ids is not None:
        q_idb = id_blocks(q_ids, seq_q, n_q, tiling.block_q)
        kv_idb = id_blocks(kv_ids, seq_k, n_k, tiling.block_k)
    else:  # placeholders, so that the loops carry the same structure either way
        q_idb, kv_idb = jnp.zeros((n_q, 1, 1), jnp.int32), jnp.zeros((n_k, 1, 1), jnp.int32)
    return _Blocks(_q_side(q, tiling, kv_heads) * tiling.scale, _kv_side(k, tiling), _kv_side(v, tiling),
                   q_idb, kv_idb, jnp.arange(n_q, dtype=jnp.int32) * tiling.block_q,
                   jnp.arange(n_k, dtype=jnp.int32) * tiling.block_k)


def _tile_scores(tiling: Tiling, q_blk, k_blk, q_id, k_id, q0, k0, seq_k: int, offset: int, segmented: bool):
    """One tile's scores (soft-capped, masked to -inf) and the tanh the cap took (None: no cap)."""
    import jax.numpy as jnp
    from jax import lax

    block_q, block_k = q_blk.shape[-2], k_blk.shape[-2]
    scores = jnp.einsum("bhgqd,bhkd->bhgqk", q_blk, k_blk, precision=lax.Precision.HIGHEST)
    capped = None
    if tiling.softcap is not None:
        capped = jnp.tanh(scores / tiling.softcap)
        scores = tiling.softcap * capped
    q_pos = q0 + offset + jnp.arange(block_q, dtype=jnp.int32)
    k_idx = k0 + jnp.arange(block_k, dtype=jnp.int32)
    keep = []  # [block_q or 1, block_k] position rules, then [B, block_q, block_k] ids
    if seq_k % block_k:
        keep.append(k_idx[None, :] < seq_k)
    if tiling.causal:
        keep.append(k_idx[None, :] <= q_pos[:, None])
    if tiling.window is not None:
        keep.append(k_idx[None, :] > q_pos[:, None] - tiling.window)
    if segmented:
        keep.append(q_id[:, :, None] == k_id[:, None, :])
    if keep:
        visible = functools.reduce(jnp.logical_and, keep)
        if visible.ndim == 3:  # per batch row: broadcast over the heads
            visible = visible[:, None, None]
        scores = jnp.where(visible, scores, -jnp.inf)
    return scores, capped


def _tile_needed(tiling: Tiling, q_id, k_id, q0, k0, offset: int, segmented: bool):
    """Whether some row of the query tile sees some key of the key tile (None: every tile is), as FA2
    skips a tile the mask hides whole. The segment test compares id ranges: never skips a visible pair."""
    import jax.numpy as jnp

    needed = []
    if tiling.causal:
        needed.append(k0 <= q0 + tiling.block_q - 1 + offset)
    if tiling.window is not None:
        needed.append(k0 + tiling.block_k - 1 > q0 + offset - tiling.window)
    if segmented:
        overlap = (q_id.min(axis=1) <= k_id.max(axis=1)) & (k_id.min(axis=1) <= q_id.max(axis=1))
        needed.append(overlap.any())
    return functools.reduce(jnp.logical_and, needed) if needed else None


def _forward(tiling: Tiling, q, k, v, q_ids, kv_ids):
    """FlashAttention-2's forward: per query tile, a scan over key tiles with a running max and sum.
    Returns the output (q's dtype) and each row's log-sum-exp, ``[n_q, B, Hkv, group, block_q, 1]``."""
    import jax.numpy as jnp
    from jax import lax

    seq_q, seq_k = q.shape[1], k.shape[1]
    offset, segmented = seq_k - seq_q, q_ids is not None  # bottom-right causal alignment
    b = _blocks(tiling, q, k, v, q_ids, kv_ids)

    def one_query_block(xs):
        q_blk, q_id, q0 = xs  # [B, Hkv, group, block_q, D], [B, block_q], first row

        def tile(carry, k_blk, v_blk, k_id, k0):
            acc, row_max, row_sum = carry
            scores, _ = _tile_scores(tiling, q_blk, k_blk, q_id, k_id, q0, k0, seq_k, offset, segmented)
            new_max = jnp.maximum(row_max, scores.max(axis=-1, keepdims=True))
            # A row that has seen no visible key yet (window, documents): keep exp() finite.
            safe_max = jnp.where(jnp.isneginf(new_max), 0.0, new_max)
            probs = jnp.exp(scores - safe_max)
            correction = jnp.exp(row_max - safe_max)
            row_sum = row_sum * correction + probs.sum(axis=-1, keepdims=True)
            acc = acc * correction + jnp.einsum("bhgqk,bhkd->bhgqd", probs, v_blk,
                                                precision=lax.Precision.HIGHEST)
            return acc, new_max, row_sum

        def step(carry, xs):
            k_blk, v_blk, k_id, k0 = xs
            run = _tile_needed(tiling, q_id, k_id, q0, k0, offset, segmented)
            if run is None:
                return tile(carry, k_blk, v_blk, k_id, k0), None
            return lax.cond(run, lambda c: tile(c, k_blk, v_blk, k_id, k0), lambda c: c, carry), None

        init = (jnp.zeros(q_blk.shape, jnp.float32),
                jnp.full(q_blk.shape[:-1] + (1,), -jnp.inf, jnp.float32),
                jnp.zeros(q_blk.shape[:-1] + (1,), jnp.float32))
        (acc, row_max, row_sum), _ = lax.scan(step, init, (b.k, b.v, b.kv_ids, b.k_starts))
        lse = jnp.where(row_sum == 0.0, -jnp.inf, row_max + jnp.log(jnp.where(row_sum == 0.0, 1.0, row_sum)))
        return acc / jnp.where(row_sum == 0.0, 1.0, row_sum), lse  # 0 only on padded query rows

    out, lse = lax.map(one_query_block, (b.q, b.q_ids, b.q_starts))
    return _q_unside(out, seq_q).astype(q.dtype), lse


def _backward(tiling: Tiling, residuals, d_out):
    """FlashAttention-2's backward (Dao 2023, Algorithm 2): ``delta = rowsum(dO * O)`` first; then
    for each key tile (the outer loop) and each query tile under it, the tile's probabilities are
    recomputed from the saved log-sum-exp, dK and dV accumulate in the key tile's carry and dQ in a
    query-side array; tiles the mask hides are skipped as in the forward."""
    import jax.numpy as jnp
    from jax import lax

    q, k, v, q_ids, kv_ids, out, lse = residuals
    seq_q, seq_k, kv_heads = q.shape[1], k.shape[1], k.shape[2]
    offset, segmented = seq_k - seq_q, q_ids is not None
    b = _blocks(tiling, q, k, v, q_ids, kv_ids)
    d_out_blocks = _q_side(d_out, tiling, kv_heads)
    delta = (d_out_blocks * _q_side(out, tiling, kv_heads)).sum(axis=-1, keepdims=True)
    highest = lax.Precision.HIGHEST

    def one_key_block(dq, xs):
        k_blk, v_blk, k_id, k0 = xs

        def tile(dk, dv, q_blk, do_blk, lse_blk, delta_blk, q_id, q0):
            scores, capped = _tile_scores(tiling, q_blk, k_blk, q_id, k_id, q0, k0, seq_k, offset, segmented)
            probs = jnp.where(jnp.isneginf(lse_blk), 0.0, jnp.exp(scores - jnp.where(jnp.isneginf(lse_blk),
                                                                                      0.0, lse_blk)))
            dv = dv + jnp.einsum("bhgqk,bhgqd->bhkd", probs, do_blk, precision=highest)
            d_probs = jnp.einsum("bhgqd,bhkd->bhgqk", do_blk, v_blk, precision=highest)
            d_scores = probs * (d_probs - delta_blk)
            if capped is not None:  # d(c tanh(s / c)) / ds
                d_scores = d_scores * (1.0 - capped * capped)
            dk = dk + jnp.einsum("bhgqk,bhgqd->bhkd", d_scores, q_blk, precision=highest)
            return (dk, dv), jnp.einsum("bhgqk,bhkd->bhgqd", d_scores, k_blk, precision=highest)

        def step(carry, xs):
            q_blk, do_blk, lse_blk, delta_blk, q_id, q0 = xs
            run = _tile_needed(tiling, q_id, k_id, q0, k0, offset, segmented)
            if run is None:
                return tile(*carry, *xs)
            return lax.cond(run, lambda c: tile(*c, *xs), lambda c: (c, jnp.zeros_like(q_blk)), carry)

        init = (jnp.zeros(k_blk.shape, jnp.float32), jnp.zeros(k_blk.shape, jnp.float32))
        (dk, dv), dq_parts = lax.scan(step, init, (b.q, d_out_blocks, lse, delta, b.q_ids, b.q_starts))
        return dq + dq_parts, (dk, dv)

    dq, (dk, dv) = lax.scan(one_key_block, jnp.zeros(b.q.shape, jnp.float32),
                            (b.k, b.v, b.kv_ids, b.k_starts))
    return ((_q_unside(dq, seq_q) * tiling.scale).astype(q.dtype), _kv_unside(dk, seq_k).astype(k.dtype),
            _kv_unside(dv, seq_k).astype(v.dtype))


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
