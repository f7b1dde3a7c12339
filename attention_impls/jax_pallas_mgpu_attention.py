"""Mosaic GPU flash attention for Hopper (``jax.experimental.pallas.ops.gpu.attention_mgpu``), as shipped.

Lowered through Mosaic GPU, not Triton: warp-specialised, TMA copies and ``wgmma`` on sm90. Tiles
``block_q=64, block_kv=128, max_concurrent_steps=2`` are the module's own benchmark's first choice
that fits shared memory at head_dim 64 and 128. No softmax-scale argument, so q is scaled first.

Mosaic GPU has no interpreter and targets Hopper only, so everywhere else it is refused. Shape
rules are the module's own (``_attention_forward``, ``_attention_bwd``).
"""

from __future__ import annotations

from attention_impls._compile_target import compile_target
from attention_impls.base import RUNS, AttentionImpl, unsupported
from attention_impls.jax_cudnn import gpu_compute_capability
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

MODULE = "jax.experimental.pallas.ops.gpu.attention_mgpu"
BLOCK_Q, BLOCK_KV, STEPS = 64, 128, 2
BLOCK_BWD = 64  # block_q_dkv = block_kv_dkv = block_q_dq = block_kv_dq
DTYPES = ("float16", "bfloat16")
HOPPER = (9, 0)
# Tracing calls cuda_versions.cuda_runtime_get_version(), which fails without a CUDA driver.
AHEAD_OF_TIME = ("Mosaic GPU asks the CUDA runtime for its version while tracing (attention_mgpu's "
                 "causal check), which needs a GPU driver: it cannot be compiled ahead of time without one")


def mgpu_shape_reason(workload, capability) -> str | None:
    """Why the Mosaic GPU Hopper kernel with these tiles cannot run ``workload`` on ``capability``."""
    if capability != HOPPER:
        where = f"sm{capability[0]}{capability[1]}" if capability else "no visible CUDA GPU"
        return f"Mosaic GPU attention_mgpu is written for Hopper (sm90: wgmma, TMA); this is {where}"
    if workload.dtype not in DTYPES:
        return f"it takes float16/bfloat16 only, not {workload.dtype} (_attention_forward)"
    if workload.head_dim % 64:
        return f"head_dim must be a multiple of 64 (got {workload.head_dim}; _attention_forward)"
    if workload.seq_q % (2 * BLOCK_Q):
        return (f"query length must be a multiple of 2 * block_q = {2 * BLOCK_Q} (got {workload.seq_q}: "
                "two compute warpgroups take a block each)")
    if workload.seq_k % BLOCK_KV:
        return f"kv length must be a multiple of block_kv = {BLOCK_KV} (got {workload.seq_k})"
    if workload.causal and workload.seq_q != workload.seq_k:
        return ("its causal mask is aligned at the top left (query tile i sees kv tiles <= i); bottom-right "
                "causal with seq_q != seq_k is not what it computes")
    if workload.mode == "fwd_bwd" and workload.causal:
        return ("no causal backward: 'Causal attention not supported in the backwards pass yet.' "
                "(_attention_bwd)")
    if workload.mode == "fwd_bwd" and (workload.seq_q % BLOCK_BWD or workload.seq_k % BLOCK_BWD):
        return f"its backward needs both lengths a multiple of {BLOCK_BWD} (_attention_bwd)"
    return None


@register
class JaxPallasMgpuAttention(AttentionImpl):
    name = "jax-pallas-mgpu-attention"
    framework = "jax"
    designed_for = frozenset({"gpu"})
    is_flash = True
    requires_modules = (MODULE,)
    public_calls = {f"{MODULE}:attention": (), f"{MODULE}:TuningConfig": (
        "block_q", "block_kv", "max_concurrent_steps", "causal", "block_q_dkv", "block_kv_dkv", "block_q_dq",
        "block_kv_dq")}
    summary = ("Mosaic GPU flash attention for Hopper (jax.experimental.pallas.ops.gpu.attention_mgpu: "
               "warp-specialised, TMA + wgmma), 64x128 tiles")
    call_name = "attention_mgpu.attention"
    feature_notes = {
        "window": "its TuningConfig's only mask is causal",
        "softcap": "it has no soft-cap option (q, k, v and a TuningConfig only)",
        "segment_ids": "it has no segment-id or mask argument (q, k, v and a TuningConfig only)",
    }
    gqa = "native"  # kv head q_head // q_heads_per_kv_head read in the kernel, no repeat
    platform_support = {
        "cpu": unsupported("Mosaic GPU compiles for an NVIDIA Hopper GPU only and has no interpreter"),
        "gpu": RUNS,
        "tpu": unsupported("Mosaic GPU compiles for an NVIDIA Hopper GPU only; a TPU has no lowering"),
    }

    def shape_reason(self, workload, platform):
        if compile_target() is not None:
            return AHEAD_OF_TIME
        return mgpu_shape_reason(workload, gpu_compute_capability())

    def attention(self, q, k, v, *, causal, scale):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.gpu import attention_mgpu

        config = attention_mgpu.TuningConfig(
            block_q=BLOCK_Q, block_kv=BLOCK_KV, max_concurrent_steps=STEPS, causal=causal,
            block_q_dkv=BLOCK_BWD, block_kv_dkv=BLOCK_BWD, block_q_dq=BLOCK_BWD, block_kv_dq=BLOCK_BWD)
        qs = (q.astype(jnp.float32) * scale).astype(q.dtype)  # no scale argument: scale q in float32
        return attention_mgpu.attention(qs, k, v, config)
