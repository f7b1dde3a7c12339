"""FlashAttention's algorithm written in plain torch ops: KV blocks, running max and sum.

Tiles are FlashAttention-2's forward on NVIDIA GPUs for head_dim 64 (128 x 128;
``run_mha_fwd_hdim64`` in ``flash_fwd_launch_template.h``), so off a GPU this is a forced,
GPU-shaped flash kernel. ``torch_xla_blockwise`` traces the same function through XLA.

``skip_segments`` skips tiles whose segment ids cannot meet, from one host-side table per call;
it is off by default because reading tensor values on the host would cut an XLA trace.
"""

from __future__ import annotations

from attention_impls._blockwise_tiles import BLOCK_K, BLOCK_Q, SEARCH_SPACE, tile_reason
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

    Accumulates in float32, like the CUDA kernels; mask keywords as ``attnbench.core.masks``.
    """
    import torch

    batch, seq_q, q_heads, head_dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    # [B, Hkv, group, S, D]: each kv head is read once for its whole query group (GQA).
    qf = q.float().transpose(1, 2).reshape(batch, kv_heads, group, seq_q, head_dim) * scale
    kf = k.float().transpose(1, 2)  # [B, Hkv, S, D]
    vf = v.float().transpose(1, 2)
    offset = seq_k - seq_q  # bottom-right causal alignment
    segmented = q_segment_ids is not None
    meet = _segment_tiles(q_segment_ids, kv_segment_ids, block_q, block_k) if segmented and skip_segments \
        else None
    out_blocks = []
    for qb, q0 in enumerate(range(0, seq_q, block_q)):
        q_blk = qf[..., q0:q0 + block_q, :]
        rows = q_blk.shape[-2]
        # The group's rows stacked: one matmul per kv head, never a copy per query head.
        q_rows = q_blk.reshape(batch, kv_heads, group * rows, head_dim)
        acc = torch.zeros_like(q_blk)
        row_max = torch.full(q_blk.shape[:-1] + (1,), float("-inf"), device=q.device)
        row_sum = torch.zeros_like(row_max)
        # Skip key blocks above the causal diagonal or left of every row's window, as FA2 does.
        k_end = min(seq_k, q0 + rows + offset) if causal else seq_k
        k_begin = (max(0, q0 + offset - window + 1) // block_k) * block_k if window is not None else 0
        q_idx = torch.arange(q0, q0 + rows, device=q.device)[:, None] + offset
        for k0 in range(k_begin, k_end, block_k):
            if meet is not None and not meet[qb][k0 // block_k]:
                continue  # no query of this block shares a document with a key of that one
            scores = (q_rows @ kf[..., k0:k0 + block_k, :].transpose(-1, -2)).view(
                batch, kv_heads, group, rows, -1)
            if softcap is not None:
                scores = softcap * torch.tanh(scores / softcap)
            cols = scores.shape[-1]
            k_idx = torch.arange(k0, k0 + cols, device=q.device)[None, :]
            drop = None
            if causal and k0 + cols > q0 + offset + 1:  # the diagonal cuts this tile
                drop = k_idx > q_idx
            if window is not None and k0 <= q0 + rows - 1 + offset - window:  # the window cuts it
                cut = k_idx <= q_idx - window
                drop = cut if drop is None else drop | cut
            if segmented:  # [B, 1, 1, rows, cols], broadcast over kv heads and the query group
                other = (q_segment_ids[:, None, None, q0:q0 + rows, None]
                         != kv_segment_ids[:, None, None, None, k0:k0 + cols])
                drop = other if drop is None else drop | other
            if drop is not None:
                scores = scores.masked_fill(drop, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            # Shift a fully masked row by 0 so exp(-inf - -inf) is not NaN (FA2's Check_inf).
            shift = torch.where(new_max == float("-inf"), torch.zeros_like(new_max), new_max)
            probs = torch.exp(scores - shift)
            correction = torch.exp(row_max - shift)
            row_sum = row_sum * correction + probs.sum(dim=-1, keepdim=True)
            tile_out = probs.reshape(batch, kv_heads, group * rows, -1) @ vf[..., k0:k0 + block_k, :]
            acc = acc * correction + tile_out.view(batch, kv_heads, group, rows, head_dim)
            row_max = new_max
        out_blocks.append(acc / row_sum)
    out = torch.cat(out_blocks, dim=-2).reshape(batch, q_heads, seq_q, head_dim)
    return out.transpose(1, 2).to(q.dtype)


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
