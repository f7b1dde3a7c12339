"""Pallas TPU FlashAttention (``jax.experimental.pallas.ops.tpu.flash_attention``).

jax's default tiles (128) are too small for a v5e by its maintainers' account (jax-ml/jax issue
24633), so we use the largest of 512, 256, 128 dividing each length, as torch_xla's wrapper does.
On a CPU it runs only in jax's TPU interpreter (``pltpu.force_tpu_interpret_mode``).

Shape rules come from the kernel source (``_verify_block`` and friends); what it cannot do is
refused, never emulated.
"""

from __future__ import annotations

import contextlib

from attention_impls.base import RUNS, AttentionImpl, interpret_only, top_left_causal_reason, unsupported
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

BLOCK = 128  # the smallest tile, BlockSizes.get_default()'s: every length must be a multiple of it
TILES = (512, 256, 128)


MODULE = "jax.experimental.pallas.ops.tpu.flash_attention"

def tile(length: int) -> int:
    """The largest tile in ``TILES`` dividing ``length`` (128 for a ragged length)."""
    return next((t for t in TILES if length % t == 0), BLOCK)


def block_sizes(seq_q: int, seq_k: int):
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes

    tq, tk = tile(seq_q), tile(seq_k)
    return BlockSizes(block_q=tq, block_k_major=tk, block_k=tk, block_b=1,
                      block_q_major_dkv=tq, block_k_major_dkv=tk, block_k_dkv=tk, block_q_dkv=tq,
                      block_k_major_dq=tk, block_k_dq=tk, block_q_dq=tq)


def tpu_flash_shape_reason(workload) -> str | None:
    """Why the Pallas TPU flash kernel with default 128 tiles cannot run ``workload``."""
    if workload.seq_k % BLOCK:
        return (f"kv length must be a multiple of the {BLOCK}-key block (got {workload.seq_k}; "
                "_verify_block: kv_seq_len divisible by block_k_major)")
    if workload.seq_q < BLOCK:
        return f"query length must be at least the {BLOCK}-row block (got {workload.seq_q})"
    if workload.mode == "fwd_bwd" and workload.seq_q % BLOCK:
        return (f"the backward kernels need the query length to be a multiple of {BLOCK} "
                f"(got {workload.seq_q}; _verify_block in _flash_attention_bwd_dkv)")
    if workload.head_dim > BLOCK and workload.head_dim % BLOCK and workload.seq_k > BLOCK:
        return (f"head_dim above {BLOCK} must be a multiple of {BLOCK} (got {workload.head_dim}; "
                "_flash_attention_kernel_single_batch)")
    return top_left_causal_reason(workload, "col <= row", "not expressible without an explicit bias")


@register
class JaxPallasTpuFlash(AttentionImpl):
    name = "jax-pallas-tpu-flash"
    framework = "jax"
    designed_for = frozenset({"tpu"})
    is_flash = True
    requires_modules = (MODULE,)
    public_calls = {
        f"{MODULE}:flash_attention": ("segment_ids", "causal", "sm_scale", "block_sizes"),
        f"{MODULE}:BlockSizes": ("block_q", "block_k_major", "block_k", "block_b", "block_q_major_dkv",
                                    "block_k_major_dkv", "block_k_dkv", "block_q_dkv", "block_k_major_dq",
                                    "block_k_dq", "block_q_dq"),
        f"{MODULE}:SegmentIds": ("q", "kv"),
    }
    interpreter_calls = {"jax.experimental.pallas.tpu:force_tpu_interpret_mode": ()}
    summary = ("Pallas TPU flash_attention (jax.experimental.pallas.ops.tpu), 512/256/128 tiles; "
               "TPU interpreter off-TPU")
    supports = frozenset({"segment_ids"})
    call_name = "Pallas TPU flash_attention"
    feature_notes = {
        "window": "its only masks are causal (top-left) and segment_ids",
        "softcap": "it has no soft-cap option (ab, segment_ids, causal, sm_scale, block_sizes only)",
    }
    gqa = "repeated"  # equal head counts only ('Head count mismatch'): kv heads jnp.repeat-ed first
    platform_support = {
        "cpu": interpret_only("TPU interpreter (pltpu.force_tpu_interpret_mode), ~100x slower"),
        "gpu": unsupported(
            "Mosaic TPU kernel: pallas_call has no GPU lowering for it (Triton/Mosaic GPU cannot "
            "compile TPU VMEM/grid code); jax's TPU interpreter keeps kernel memory on the host "
            "through io_callbacks and is not verified on GPUs, so it is not run there"),
        "tpu": RUNS,
    }

    def shape_reason(self, workload, platform):
        return tpu_flash_shape_reason(workload)

    def trace_context(self, platform):
        if platform == "cpu":
            from jax.experimental.pallas import tpu as pltpu

            return pltpu.force_tpu_interpret_mode()
        return contextlib.nullcontext()

    def attention(self, q, k, v, *, causal, scale, q_segment_ids=None, kv_segment_ids=None):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.flash_attention import SegmentIds, flash_attention

        groups = q.shape[2] // k.shape[2]
        if groups > 1:  # the kernel reads kv head h for query head h: repeat each kv head per group
            k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
        segment_ids = None
        if q_segment_ids is not None:
            segment_ids = SegmentIds(q=q_segment_ids, kv=kv_segment_ids)
        out = flash_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
            segment_ids=segment_ids, causal=causal, sm_scale=scale,
            block_sizes=block_sizes(q.shape[1], k.shape[1]))
        return out.transpose(0, 2, 1, 3)
