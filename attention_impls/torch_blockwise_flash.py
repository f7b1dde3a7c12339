"""FlashAttention's algorithm written in plain torch ops: KV blocks, running max and sum.

Tiles are FlashAttention-2's forward on NVIDIA GPUs for head_dim 64 (128 x 128;
``run_mha_fwd_hdim64`` in ``flash_fwd_launch_template.h``), so off a GPU this is a forced,
GPU-shaped flash kernel. ``torch_xla_blockwise`` traces the same function through XLA.

``skip_segments`` skips tiles whose segment ids cannot meet, from one host-side table per call;
it is off by default because reading tensor values on the host would cut an XLA trace.

Its gradient is FlashAttention-2's backward, a ``torch.autograd.Function``: the forward saves q, k,
v, the output and each row's log-sum-exp; the backward recomputes each tile's probabilities (outer
loop over key tiles, as FA2's), so its memory grows with the length, not its square.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from attention_impls._blockwise_tiles import BLOCK_K, BLOCK_Q, SEARCH_SPACE, Tiling, tile_reason
from attention_impls._torch_ops import attention_ops
from attention_impls.base import RUNS, AttentionImpl, unsupported
from attention_impls.registry import register

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).


def _segment_tiles(q_ids, kv_ids, block_q: int, block_k: int) -> list[list[bool]]:
    """``meet[i][j]``: whether query block i and key block j's id ranges overlap in some row.

    One host transfer of an ``[n_q_blocks, n_k_blocks]`` table.
    """
    import torch

    def ranges(ids, block):
        pad = (-ids.shape[1]) % block  # pad with the last id: it adds no new value to the range
        ids = torch.cat([ids, ids[:, -1:].expand(-1, pad)], dim=1) if pad else ids
        tiles = ids.reshape(ids.shape[0], -1, block)
        return tiles.amin(dim=-1), tiles.amax(dim=-1)

    q_lo, q_hi = ranges(q_ids, block_q)
    k_lo, k_hi = ranges(kv_ids, block_k)
    meet = (q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None])
    return meet.any(dim=0).tolist()


def blockwise_attention(q, k, v, *, causal: bool, scale: float, block_q: int = BLOCK_Q,
                        block_k: int = BLOCK_K, window: int | None = None, softcap: float | None = None,
                        q_segment_ids=None, kv_segment_ids=None, skip_segments: bool = False):
    """Online-softmax attention on [B, S, H, D] tensors; never materializes more than one tile.

    Accumulates in float32, like the CUDA kernels; mask keywords as ``attnbench.core.masks``. Its
    gradient is FlashAttention-2's backward (``_flash_function``), not autograd through the loops.
    """
    tiling = Tiling(causal, float(scale), window, softcap, block_q, block_k, skip_segments)
    return _flash_function().apply(q, k, v, q_segment_ids, kv_segment_ids, tiling)


@functools.cache
def _flash_function():
    """The kernel as a ``torch.autograd.Function`` (built on first use: importing this module imports no
    torch). Its forward saves q, k, v, the output and each row's log-sum-exp, and no tile."""
    import torch

    class FlashAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, q_ids, kv_ids, tiling):
            ctx.meet = _segment_meet(q_ids, kv_ids, tiling)  # the backward skips the same tiles
            out, lse = _forward(q, k, v, q_ids, kv_ids, tiling, ctx.meet)
            ctx.save_for_backward(q, k, v, out, lse, *(() if q_ids is None else (q_ids, kv_ids)))
            ctx.tiling = tiling
            return out

        @staticmethod
        def backward(ctx, d_out):
            q, k, v, out, lse, *ids = ctx.saved_tensors
            q_ids, kv_ids = ids if ids else (None, None)
            dq, dk, dv = _backward(q, k, v, q_ids, kv_ids, out, lse, d_out, ctx.tiling, ctx.meet)
            return dq, dk, dv, None, None, None

    return FlashAttention


class _Layout(NamedTuple):
    """The float32 [B, Hkv, group, S, D] views both passes tile (q scaled), and the mask's facts."""

    qf: object
    kf: object
    vf: object
    offset: int  # bottom-right causal alignment
    meet: list | None  # per (query tile, key tile): whether their documents can meet; None: unknown


def _segment_meet(q_ids, kv_ids, tiling: Tiling) -> list | None:
    """``_segment_tiles`` where the call skips tiles by document (one host transfer), else None."""
    if q_ids is None or not tiling.skip_segments:
        return None
    return _segment_tiles(q_ids, kv_ids, tiling.block_q, tiling.block_k)


def _grouped(x, kv_heads: int):
    """A [B, S, Hq, D] tensor as float32 [B, Hkv, group, S, D]: each kv head is read once for its
    whole query group (GQA)."""
    batch, seq, q_heads, head_dim = x.shape
    return x.float().transpose(1, 2).reshape(batch, kv_heads, q_heads // kv_heads, seq, head_dim)


def _layout(q, k, v, tiling: Tiling, meet: list | None) -> _Layout:
    return _Layout(_grouped(q, k.shape[2]) * tiling.scale, k.float().transpose(1, 2),
                   v.float().transpose(1, 2), k.shape[1] - q.shape[1], meet)


def _key_range(tiling: Tiling, q0: int, rows: int, seq_k: int, offset: int) -> range:
    """The key tiles a query tile sees: those above the causal diagonal or left of every row's window
    are skipped, as FA2 does."""
    k_end = min(seq_k, q0 + rows + offset) if tiling.causal else seq_k
    k_begin = ((max(0, q0 + offset - tiling.window + 1) // tiling.block_k) * tiling.block_k
               if tiling.window is not None else 0)
    return range(k_begin, k_end, tiling.block_k)


def _tile_scores(tiling: Tiling, lay: _Layout, q_rows, k0: int, q0: int, rows: int, q_ids, kv_ids):
    """One tile's scores ``[B, Hkv, group, rows, cols]`` (soft-capped, masked to -inf) and the tanh
    the cap took (None: no cap)."""
    import torch

    batch, kv_heads, group = lay.qf.shape[:3]
    scores = (q_rows @ lay.kf[..., k0:k0 + tiling.block_k, :].transpose(-1, -2)).view(
        batch, kv_heads, group, rows, -1)
    capped = None
    if tiling.softcap is not None:
        capped = torch.tanh(scores / tiling.softcap)
        scores = tiling.softcap * capped
    cols, offset = scores.shape[-1], lay.offset
    q_idx = torch.arange(q0, q0 + rows, device=scores.device)[:, None] + offset
    k_idx = torch.arange(k0, k0 + cols, device=scores.device)[None, :]
    drop = None
    if tiling.causal and k0 + cols > q0 + offset + 1:  # the diagonal cuts this tile
        drop = k_idx > q_idx
    if tiling.window is not None and k0 <= q0 + rows - 1 + offset - tiling.window:  # the window cuts it
        cut = k_idx <= q_idx - tiling.window
        drop = cut if drop is None else drop | cut
    if q_ids is not None:  # [B, 1, 1, rows, cols], broadcast over kv heads and the query group
        other = q_ids[:, None, None, q0:q0 + rows, None] != kv_ids[:, None, None, None, k0:k0 + cols]
        drop = other if drop is None else drop | other
    if drop is not None:
        scores = scores.masked_fill(drop, float("-inf"))
    return scores, capped


def _tiles(tiling: Tiling, lay: _Layout, seq_q: int, seq_k: int):
    """``(query tile index, q0, rows, key tile starts)`` of every query tile, in order."""
    for qb, q0 in enumerate(range(0, seq_q, tiling.block_q)):
        rows = min(tiling.block_q, seq_q - q0)
        keys = [k0 for k0 in _key_range(tiling, q0, rows, seq_k, lay.offset)
                if lay.meet is None or lay.meet[qb][k0 // tiling.block_k]]
        yield qb, q0, rows, keys


def _forward(q, k, v, q_ids, kv_ids, tiling: Tiling, meet: list | None):
    """FlashAttention-2's forward: the output (q's dtype) and each row's log-sum-exp
    ``[B, Hkv, group, Sq, 1]``, float32. ``meet``: ``_segment_meet``'s table."""
    import torch

    batch, seq_q, q_heads, head_dim = q.shape
    lay = _layout(q, k, v, tiling, meet)
    kv_heads, group = lay.qf.shape[1], lay.qf.shape[2]
    out_blocks, lse_blocks = [], []
    for _, q0, rows, keys in _tiles(tiling, lay, seq_q, k.shape[1]):
        q_blk = lay.qf[..., q0:q0 + rows, :]
        # The group's rows stacked: one matmul per kv head, never a copy per query head.
        q_rows = q_blk.reshape(batch, kv_heads, group * rows, head_dim)
        acc = torch.zeros_like(q_blk)
        row_max = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), device=q.device)
        row_sum = torch.zeros_like(row_max)
        for k0 in keys:
            scores, _ = _tile_scores(tiling, lay, q_rows, k0, q0, rows, q_ids, kv_ids)
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            # Shift a fully masked row by 0 so exp(-inf - -inf) is not NaN (FA2's Check_inf).
            shift = torch.where(new_max == float("-inf"), torch.zeros_like(new_max), new_max)
            probs = torch.exp(scores - shift)
            correction = torch.exp(row_max - shift)
            row_sum = row_sum * correction + probs.sum(dim=-1, keepdim=True)
            v_tile = lay.vf[..., k0:k0 + tiling.block_k, :]
            tile_out = probs.reshape(batch, kv_heads, group * rows, -1) @ v_tile
            acc = acc * correction + tile_out.view(batch, kv_heads, group, rows, head_dim)
            row_max = new_max
        out_blocks.append(acc / row_sum)
        lse_blocks.append(row_max + torch.log(row_sum))
    out = torch.cat(out_blocks, dim=-2).reshape(batch, q_heads, seq_q, head_dim)
    return out.transpose(1, 2).to(q.dtype), torch.cat(lse_blocks, dim=-2)


def _backward(q, k, v, q_ids, kv_ids, out, lse, d_out, tiling: Tiling, meet: list | None):
    """FlashAttention-2's backward (Dao 2023, Algorithm 2): ``delta = rowsum(dO * O)`` first; then
    for each key tile (the outer loop) and each query tile that sees it, the tile's probabilities are
    recomputed from the saved log-sum-exp, dK and dV accumulate per key tile and dQ per query tile;
    the tiles the forward skips are skipped."""
    import torch

    batch, seq_q, q_heads, head_dim = q.shape
    seq_k = k.shape[1]
    lay = _layout(q, k, v, tiling, meet)
    kv_heads, group = lay.qf.shape[1], lay.qf.shape[2]
    d_out_f = _grouped(d_out, kv_heads)
    delta = (d_out_f * _grouped(out, kv_heads)).sum(dim=-1, keepdim=True)
    lse = lse.masked_fill(lse == float("-inf"), float("inf"))  # a row that sees no key: probabilities 0
    dq = torch.zeros_like(lay.qf)
    dk, dv = torch.zeros_like(lay.kf), torch.zeros_like(lay.vf)
    seen_by: dict[int, list[tuple[int, int]]] = {}  # key tile -> the query tiles that see it
    for _, q0, rows, keys in _tiles(tiling, lay, seq_q, seq_k):
        for k0 in keys:
            seen_by.setdefault(k0, []).append((q0, rows))
    for k0 in sorted(seen_by):
        k_tile, v_tile = lay.kf[..., k0:k0 + tiling.block_k, :], lay.vf[..., k0:k0 + tiling.block_k, :]
        cols = k_tile.shape[-2]
        dk_tile = torch.zeros_like(k_tile)
        dv_tile = torch.zeros_like(v_tile)
        for q0, rows in seen_by[k0]:
            q_rows = lay.qf[..., q0:q0 + rows, :].reshape(batch, kv_heads, group * rows, head_dim)
            scores, capped = _tile_scores(tiling, lay, q_rows, k0, q0, rows, q_ids, kv_ids)
            probs = torch.exp(scores - lse[..., q0:q0 + rows, :])  # masked: exp(-inf) = 0
            do_rows = d_out_f[..., q0:q0 + rows, :].reshape(batch, kv_heads, group * rows, head_dim)
            probs_rows = probs.reshape(batch, kv_heads, group * rows, cols)
            dv_tile += probs_rows.transpose(-1, -2) @ do_rows
            d_probs = (do_rows @ v_tile.transpose(-1, -2)).view(batch, kv_heads, group, rows, cols)
            d_scores = probs * (d_probs - delta[..., q0:q0 + rows, :])
            if capped is not None:  # d(c tanh(s / c)) / ds
                d_scores = d_scores * (1.0 - capped * capped)
            d_rows = d_scores.reshape(batch, kv_heads, group * rows, cols)
            dk_tile += d_rows.transpose(-1, -2) @ q_rows
            dq[..., q0:q0 + rows, :] += (d_rows @ k_tile).view(batch, kv_heads, group, rows, head_dim)
        dk[..., k0:k0 + cols, :] = dk_tile
        dv[..., k0:k0 + cols, :] = dv_tile
    dq = (dq * tiling.scale).reshape(batch, q_heads, seq_q, head_dim).transpose(1, 2)
    return dq.to(q.dtype), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype)


def blockwise_evidence(ops: dict[str, int]) -> str:
    """Our loop ran when the profiler saw its tile matmuls and no ATen attention kernel."""
    fused, tiles = attention_ops(ops), ops.get("aten::bmm", 0)
    if fused or not tiles:
        return f"not verified: profiler saw {tiles} aten::bmm and attention ops {fused or 'none'}"
    return (f"profiler saw {tiles} tile matmuls (aten::bmm) and no ATen attention op: "
            "the blockwise loop, eager")


@register
class TorchBlockwise(AttentionImpl):
    name = "torch-blockwise-flash"
    public_calls = {"torch:where": (), "torch:exp": (), "torch:maximum": ()}
    framework = "torch"
    executes = "eager"
    designed_for = frozenset({"gpu"})
    is_flash = True
    reimplements = "FlashAttention-2's GPU algorithm (default tiles 128x128, FA2's)"
    platform_support = {"cpu": RUNS, "gpu": RUNS,
                        "tpu": unsupported("plain torch reaches a TPU only through torch_xla: "
                                           "see torch-xla-blockwise-flash")}
    summary = "FlashAttention-2 online softmax in torch ops with GPU tile sizes (128x128 by default), eager"
    search_space = SEARCH_SPACE
    evidence_from_ops = staticmethod(blockwise_evidence)
    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "native"

    def config_reason(self, config, workload):
        return tile_reason(config, workload)

    def attention(self, q, k, v, *, causal, scale, **mask):
        return blockwise_attention(q, k, v, causal=causal, scale=scale, skip_segments=True,
                                   block_q=self.knob("block_q"), block_k=self.knob("block_k"), **mask)
