"""Pallas GPU FlashAttention (``jax.experimental.pallas.ops.gpu.attention.mha``), as shipped.

A Triton-lowered kernel with jax's default tiles (forward 128x128, backward 32x32) and its own
fused backward; its ``BlockSizes`` are the tuner's knobs (``SEARCH_SPACE``, defaults jax's). Off a
GPU it runs with ``interpret=True`` (Pallas's HLO interpreter). Shape rules
are from ``mha``, ``_mha_backward`` and Triton's block rules.

Its ``segment_ids`` is ONE ``[B, S]`` array for queries and keys alike, so it expresses packed
documents but not a ragged decode cache.
"""

from __future__ import annotations

from attention_impls._compile_target import jax_platform
from attention_impls.base import RUNS, AttentionImpl, SearchSpace, interpret_only, top_left_causal_reason
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

BLOCK_FWD = 128  # BlockSizes.get_default(): block_q = block_k = 128
BLOCK_BWD = 32  # block_q_dkv = block_kv_dkv = block_q_dq = block_kv_dq = 32
# The tuner's knobs: the forward's query and key tiles, the backward's query and key tiles (dkv and dq
# alike). Defaults: BlockSizes.get_default(), 128x128 forward, 32x32 backward.
KNOBS = ("block_q", "block_k", "block_q_bwd", "block_k_bwd")
SEARCH_SPACE = SearchSpace(
    defaults=tuple(zip(KNOBS, (BLOCK_FWD, BLOCK_FWD, BLOCK_BWD, BLOCK_BWD), strict=True)),
    candidates=tuple(tuple(zip(KNOBS, values, strict=True)) for values in (
        (64, 64, 32, 32), (128, 64, 32, 32), (BLOCK_FWD, BLOCK_FWD, BLOCK_BWD, BLOCK_BWD),
        (128, 128, 64, 64), (64, 128, 32, 32))))
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
        "jax.experimental.pallas.ops.gpu.attention:BlockSizes": (
            "block_q", "block_k", "block_q_dkv", "block_kv_dkv", "block_q_dq", "block_kv_dq"),
    }
    summary = ("Pallas GPU flash attention (jax.experimental.pallas.ops.gpu.attention.mha, Triton), "
               "jax's default tiles by default (BlockSizes tuned on the compile targets); Pallas interpreter "
               "off-GPU")
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

    search_space = SEARCH_SPACE

    def shape_reason(self, workload, platform):
        return gpu_mha_shape_reason(workload)

    def config_reason(self, config, workload):
        knobs = dict(config)
        lengths = {"block_q": ("queries", workload.seq_q), "block_k": ("keys", workload.seq_k)}
        if workload.mode == "fwd_bwd":
            lengths.update(block_q_bwd=("queries", workload.seq_q), block_k_bwd=("keys", workload.seq_k))
        for name, (what, length) in lengths.items():
            value = knobs[name]
            if not _is_power_of_two(value) or value < 16:
                return f"{name}={value}: Triton's blocks are powers of two >= 16"
            if value > length:  # mha clamps it to the length: the program of a shorter candidate
                return f"{name}={value} is longer than the {length} {what} it tiles"
            if length % value:
                return (f"{name}={value} does not divide the {length} {what} (mha: seq_len must be a "
                        "multiple of block size)")
        return None

    def attention(self, q, k, v, *, causal, scale, q_segment_ids=None, kv_segment_ids=None):
        from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

        # One array for both sides (module doc): packed documents give q and kv the same ids.
        del q_segment_ids
        tq, tk = self.knob("block_q_bwd"), self.knob("block_k_bwd")
        blocks = BlockSizes(block_q=self.knob("block_q"), block_k=self.knob("block_k"), block_q_dkv=tq,
                            block_kv_dkv=tk, block_q_dq=tq, block_kv_dq=tk)
        return mha(q, k, v, segment_ids=kv_segment_ids, sm_scale=scale, causal=causal,
                   block_sizes=blocks, interpret=jax_platform() != "gpu")
