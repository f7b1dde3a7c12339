"""Pallas GPU FlashAttention (``jax.experimental.pallas.ops.gpu.attention.mha``), as shipped.

A Triton-lowered kernel with jax's default tiles (forward 128x128, backward 32x32) and its own
fused backward. Off a GPU it runs with ``interpret=True`` (Pallas's HLO interpreter). Shape rules
are from ``mha``, ``_mha_backward`` and Triton's block rules.

Its ``segment_ids`` is ONE ``[B, S]`` array for queries and keys alike, so it expresses packed
documents but not a ragged decode cache.
"""

from __future__ import annotations

from attention_impls._compile_target import jax_platform
from attention_impls.base import RUNS, AttentionImpl, interpret_only, top_left_causal_reason
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

BLOCK_FWD = 128  # BlockSizes.get_default(): block_q = block_k = 128
BLOCK_BWD = 32  # block_q_dkv = block_kv_dkv = block_q_dq = block_kv_dq = 32
INTERPRETER = "Pallas interpret mode (interpret=True): the kernel body as plain XLA ops per grid step"


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def gpu_mha_shape_reason(workload) -> str | None:
    """Why the Pallas GPU mha kernel with default tiles cannot run ``workload``."""
    if workload.segmented and (workload.ragged or workload.seq_q != workload.seq_k):
        return ("its segment ids are one [B, S] array shared by queries and keys (mha's segment_ids, "
                "read at both the query and the key positions), so they need seq_q == seq_k and "
                f"the same ids for both: a ragged cache's query and key segment ids differ (got "
                f"seq_q={workload.seq_q}, seq_k={workload.seq_k})")
    if workload.is_gqa:
        return (f"no GQA: the kernel indexes k and v with the query head, so head counts must be "
                f"equal (got {workload.q_heads} vs {workload.kv_heads})")
    for what, length in (("query", workload.seq_q), ("kv", workload.seq_k)):
        if length >= BLOCK_FWD and length % BLOCK_FWD:
            return (f"{what} length must be a multiple of the {BLOCK_FWD} block (got {length}; "
                    "mha: seq_len must be a multiple of block size)")
        if length < BLOCK_FWD and not (_is_power_of_two(length) and length >= 16):
            return (f"a {what} length below {BLOCK_FWD} becomes one block, which Triton needs to be "
                    f"a power of two >= 16 (got {length})")
    top_left = top_left_causal_reason(workload, "q_pos >= k_pos")
    if top_left:
        return top_left
    if workload.mode == "fwd_bwd" and workload.seq_q != workload.seq_k:
        return (f"its fused backward needs seq_q and seq_k split into the same number of "
                f"{BLOCK_BWD}-blocks, i.e. equal lengths (got {workload.seq_q} and {workload.seq_k}; "
                "_mha_backward)")
    if workload.head_dim <= 8:
        return (f"Triton's dot needs the head_dim block (head_dim padded to a power of two) to be "
                f">= 16 (got {workload.head_dim})")
    return None


@register
class JaxPallasGpuMha(AttentionImpl):
    name = "jax-pallas-gpu-mha"
    framework = "jax"
    designed_for = frozenset({"gpu"})
    is_flash = True
    requires_modules = ("jax.experimental.pallas.ops.gpu.attention",)
    public_calls = {
        "jax.experimental.pallas.ops.gpu.attention:mha": (
            "segment_ids", "sm_scale", "causal", "block_sizes", "interpret"),
        "jax.experimental.pallas.ops.gpu.attention:BlockSizes.get_default": (),
    }
    summary = ("Pallas GPU flash attention (jax.experimental.pallas.ops.gpu.attention.mha, Triton), "
               "default tiles; Pallas interpreter off-GPU")
    supports = frozenset({"segment_ids"})
    call_name = "Pallas GPU mha"
    feature_notes = {
        "window": "its only masks are causal (top-left) and segment_ids",
        "softcap": "it has no soft-cap option (segment_ids, sm_scale, causal, block_sizes only)",
    }
    gqa = "refused"  # the kernel indexes k and v with the query head (gpu_mha_shape_reason)
    segment_kinds = frozenset({"documents"})  # one [B, S] array for queries and keys alike (module doc)
    platform_support = {
        "cpu": interpret_only(INTERPRETER),
        "gpu": RUNS,
        "tpu": interpret_only(f"{INTERPRETER}; Triton/Mosaic GPU have no TPU lowering "
                              "(not verified on a TPU here)"),
    }

    def shape_reason(self, workload, platform):
        return gpu_mha_shape_reason(workload)

    def attention(self, q, k, v, *, causal, scale, q_segment_ids=None, kv_segment_ids=None):
        from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

        # One array for both sides (module doc): packed documents give q and kv the same ids.
        del q_segment_ids
        return mha(q, k, v, segment_ids=kv_segment_ids, sm_scale=scale, causal=causal,
                   block_sizes=BlockSizes.get_default(), interpret=jax_platform() != "gpu")
