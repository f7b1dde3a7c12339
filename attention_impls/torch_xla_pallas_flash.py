"""torch_xla's Pallas TPU flash attention (``torch_xla.experimental.custom_kernel.flash_attention``).

torch_xla embeds the kernel's Mosaic ``tpu_custom_call``, which only libtpu executes, so there is
no CPU path, not even interpreted (tests/test_support_torch_xla.py), nor a GPU one.

Shape rules come from torch_xla's wrapper (``FlashAttention.DEFAULT_BLOCK_SIZES``,
``_fa_custom_forward_single_device``, ``_fa_custom_backward_single_device``) and jax's kernel.
"""

from __future__ import annotations

from attention_impls.base import RUNS, AttentionImpl, top_left_causal_reason, unsupported
from attention_impls.registry import register

# Imported where used: torch_xla (each venv holds only some frameworks, and the asv process none).

# torch_xla's FlashAttention.DEFAULT_BLOCK_SIZES (maxtext's), which the wrapper clips to the shape.
BLOCK_Q_DQ, BLOCK_MAJOR, BLOCK_K_DQ, LANES = 1024, 512, 256, 128

CPU_REASON = ("Pallas TPU kernel with no CPU path: jax will not lower it for CPU ('Only interpret mode "
              "is supported on CPU backend.'), torch_xla has no interpret mode (jax's leaves no "
              "tpu_custom_call to embed), and XLA:CPU cannot run the Mosaic tpu_custom_call "
              "('No registered implementation ... for Host')")
GPU_REASON = ("Pallas TPU kernel: torch_xla embeds it as a Mosaic tpu_custom_call, which only the TPU "
              "PJRT runtime (libtpu) executes; torch_xla tests it only when device_type() == 'TPU' "
              "(v3+, test/test_pallas.py)")

OPTIONS = "its only options are causal, segment ids, sm_scale and an additive bias (ab)"


def _divides(block_cap: int, n: int) -> bool:
    """torch_xla clips each block to ``min(cap, n)`` and jax requires it to divide ``n``."""
    return n % min(block_cap, n) == 0


@register
class TorchXlaPallasFlash(AttentionImpl):
    name = "torch-xla-pallas-flash"
    framework = "torch_xla"
    designed_for = frozenset({"tpu"})
    is_flash = True
    summary = "torch_xla.experimental.custom_kernel.flash_attention: jax's Pallas TPU flash kernel"
    platform_support = {"cpu": unsupported(CPU_REASON), "gpu": unsupported(GPU_REASON), "tpu": RUNS}
    supports = frozenset({"segment_ids"})
    call_name = "torch_xla's flash_attention"
    feature_notes = {"window": OPTIONS, "softcap": f"{OPTIONS}; jax's kernel applies no tanh"}
    gqa = "refused"  # each grid step reads the kv head of its query head's index (shape_reason)

    def shape_reason(self, workload, platform):
        w = workload
        if w.is_gqa:
            return ("no grouped-query attention: each grid step reads the kv head of its query "
                    f"head's index; {w.q_heads} q heads vs {w.kv_heads} kv heads fails while tracing")
        top_left = top_left_causal_reason(w, "key j <= query i")
        if top_left:
            return top_left
        if not w.causal and w.seq_k > BLOCK_MAJOR and w.seq_k % BLOCK_MAJOR:
            return (f"torch_xla pads K/V with zeros to a multiple of {BLOCK_MAJOR} without masking "
                    f"the padding, so non-causal seq_k={w.seq_k} would attend to padded keys")
        if w.segmented and (w.seq_k % LANES or (w.seq_k > BLOCK_MAJOR and w.seq_k % BLOCK_MAJOR)):
            return (f"with segment ids seq_k must be a multiple of {LANES} (the kv block min({BLOCK_MAJOR}, "
                    f"seq_k) masks in {LANES}-lane steps), and of {BLOCK_MAJOR} above it (torch_xla pads "
                    f"K/V but not kv_segment_ids); got seq_k={w.seq_k}")
        if w.mode == "fwd_bwd":
            # The backward pass does not pad: dq and dkv kernels need blocks dividing the lengths.
            if not (_divides(BLOCK_Q_DQ, w.seq_q) and _divides(BLOCK_MAJOR, w.seq_q)):
                return (f"backward needs seq_q <= {BLOCK_MAJOR} or a multiple of {BLOCK_MAJOR} "
                        f"(and of {BLOCK_Q_DQ} above it), got {w.seq_q}")
            if w.seq_k % LANES or not (_divides(BLOCK_MAJOR, w.seq_k) and _divides(BLOCK_K_DQ, w.seq_k)):
                return (f"backward needs seq_k a multiple of {LANES} dividing into its {BLOCK_K_DQ}/"
                        f"{BLOCK_MAJOR} kv blocks (128, 256 or a multiple of 512), got {w.seq_k}")
        return None

    def attention(self, q, k, v, *, causal, scale, q_segment_ids=None, kv_segment_ids=None):
        from torch_xla.experimental.custom_kernel import flash_attention

        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        return flash_attention(q, k, v, causal=causal, q_segment_ids=q_segment_ids,
                               kv_segment_ids=kv_segment_ids, sm_scale=scale).transpose(1, 2)
