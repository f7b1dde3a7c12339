"""Pallas GPU decode attention (``jax.experimental.pallas.ops.gpu.decode_attention.gqa``), as shipped.

A Triton-lowered split-K ("flash decoding") kernel: one query per sequence against a KV cache,
with ``gqa``'s defaults (``k_splits=16``, ``block_k=128``, ``block_h=16``). GQA is native (one
kernel per kv head and its query group), though ``gqa`` first transposes k and v, which XLA
materialises.

A left-padded ragged cache's segment ids and a sliding window both become ``start_idx`` (the
first visible key per row), computed inside the traced function; packed documents are refused.
Shape rules are from ``decode_attn_unbatched``'s asserts and Triton's block rules, applied on
every platform, so off-GPU (``interpret=True``) refuses what the GPU would.
"""

from __future__ import annotations

from attention_impls._compile_target import jax_platform
from attention_impls.base import RUNS, AttentionImpl, interpret_only
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

K_SPLITS = 16  # gqa's defaults
BLOCK_K = 128
BLOCK_H = 16
MIN_SPLIT = 16  # decode_attn_unbatched: k_seq_len // k_splits must be >= 16
INTERPRETER = "Pallas interpret mode (interpret=True): the kernel body as plain XLA ops per grid step"
DECODE_ONLY = ("{name} is a decode kernel: it takes a few queries against a KV cache, not "
               "prefill/training (this workload's phase is {phase})")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def gpu_decode_shape_reason(workload, name: str = "jax-pallas-gpu-decode") -> str | None:
    """Why the Pallas GPU decode kernel with gqa's default tiles cannot run ``workload``."""
    if workload.packs_documents:
        return ("segment ids of packed documents are not expressible: decode_attention takes only a "
                "ragged cache's left padding (start_idx per sequence)")
    if workload.phase != "decode":
        return DECODE_ONLY.format(name=name, phase=workload.phase)
    if workload.seq_q != 1:
        return (f"decode_attention takes exactly one query per sequence (q is [batch, heads, head_dim]); "
                f"got seq_q={workload.seq_q}")
    seq_k = workload.seq_k
    if seq_k % K_SPLITS or seq_k // K_SPLITS < MIN_SPLIT:
        return (f"kv length must be a multiple of k_splits={K_SPLITS} with at least {MIN_SPLIT} keys "
                f"per split, i.e. >= {K_SPLITS * MIN_SPLIT} (got {seq_k}; decode_attn_unbatched)")
    split = seq_k // K_SPLITS
    block_k = min(BLOCK_K, split)
    if split % block_k:
        return (f"each of the {K_SPLITS} splits ({split} keys) must be a multiple of block_k={block_k} "
                f"(got kv length {seq_k}; decode_attn_unbatched)")
    if not _is_power_of_two(block_k):
        return (f"Triton loads need power-of-two blocks: the kv block is {block_k} keys "
                f"(kv length {seq_k} / {K_SPLITS} splits)")
    if not (_is_power_of_two(workload.head_dim) and workload.head_dim >= 16):
        return (f"head_dim must be a power of two >= 16 (got {workload.head_dim}): the kernel loads "
                "whole [block, head_dim] tiles, and Triton needs power-of-two tiles and dots >= 16")
    return None


@register
class JaxPallasGpuDecode(AttentionImpl):
    name = "jax-pallas-gpu-decode"
    framework = "jax"
    designed_for = frozenset({"gpu"})
    is_flash = True
    requires_modules = ("jax.experimental.pallas.ops.gpu.decode_attention",)
    public_calls = {"jax.experimental.pallas.ops.gpu.decode_attention:gqa": (
        "start_idx", "sm_scale", "block_h", "block_k", "k_splits", "interpret")}
    summary = ("Pallas GPU split-K decode attention (jax.experimental.pallas.ops.gpu.decode_attention.gqa, "
               "Triton), one query per sequence, k_splits=16; Pallas interpreter off-GPU")
    platform_support = {
        "cpu": interpret_only(INTERPRETER),
        "gpu": RUNS,
        "tpu": interpret_only(f"{INTERPRETER}; Triton has no TPU lowering (not verified on a TPU here)"),
    }
    supports = frozenset({"window", "segment_ids"})
    call_name = "Pallas GPU decode_attention"
    feature_notes = {"softcap": "its kernel only scales and masks its scores (no soft-cap option)"}
    gqa = "native"
    segment_kinds = frozenset({"ragged"})  # start_idx per sequence: a cache's left padding only

    def shape_reason(self, workload, platform):
        return gpu_decode_shape_reason(workload, self.name)

    def attention(self, q, k, v, *, causal, scale, window=None, q_segment_ids=None,
                  kv_segment_ids=None):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.gpu.decode_attention import gqa

        del causal  # the one query is the cache's last position: causal keeps every key
        seq_k = k.shape[1]
        start = None
        if kv_segment_ids is not None:
            # Left padding: the leading keys whose id is not the query's (traced: no Python branching).
            start = jnp.sum(kv_segment_ids != q_segment_ids[:, :1], axis=1).astype(jnp.int32)
        if window is not None and window < seq_k:
            first = jnp.int32(seq_k - window)  # the window's keys are the last W
            start = jnp.full((k.shape[0],), first) if start is None else jnp.maximum(start, first)
        out = gqa(q[:, 0], k, v, start_idx=start, sm_scale=scale, block_h=BLOCK_H, block_k=BLOCK_K,
                  k_splits=K_SPLITS, interpret=jax_platform() != "gpu")
        return out[:, None]
