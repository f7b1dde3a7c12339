"""``jax.nn.dot_product_attention(implementation='cudnn')``: cuDNN's fused flash attention.

The shape rules are the ones jax enforces before calling cuDNN (``_src/cudnn/
fused_attention_stablehlo.py``: ``check_layout``, ``check_is_flash_attention``), written as reasons
so a refused case is skipped with its cause instead of crashing mid-sweep.

A sliding window is ``local_window_size=(W - 1, 0)`` (cuDNN gets ``sliding_window_length = W``);
like cuDNN's causal mask it is top-left aligned, so it is ours only when ``Sq == Sk``. Segment ids
go in as a boolean ``mask``, which jax turns into a dense bias (``__cudnn$fmhaScaleBiasSoftmax``);
cuDNN's packed-segment offsets are not reachable from ``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

from attention_impls._compile_target import compile_target
from attention_impls.base import RUNS, AttentionImpl, top_left_causal_reason, unsupported
from attention_impls.jax_xla import segment_mask
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

CUDNN_DTYPES = ("float16", "bfloat16")  # check_layout: fp16/bf16 (and fp8, not benchmarked here)
HEAD_DIM_MAX_PRE_HOPPER = 128  # check_is_flash_attention: H_max = 256 if sm >= 9.0 else 128
HEAD_DIM_MAX_HOPPER = 256


def gpu_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the first CUDA device (or of the ``compiling_for`` target); ``None``: none."""
    target = compile_target()
    if target is not None:
        return target.compute_capability
    import jax

    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return None
    capability = getattr(devices[0], "compute_capability", None) if devices else None
    if not capability:
        return None
    major, minor = (int(x) for x in str(capability).split(".")[:2])
    return major, minor


def head_dim_limit(capability: tuple[int, int] | None) -> int:
    """Largest head_dim cuDNN flash attention takes: 256 from Hopper (sm90) on, 128 before."""
    if capability is not None and capability >= (9, 0):
        return HEAD_DIM_MAX_HOPPER
    return HEAD_DIM_MAX_PRE_HOPPER


def cudnn_layout_reason(workload, platform: str) -> str | None:
    """Why cuDNN's fused attention cannot take ``workload``'s dtype or head dim (jax's ``check_layout``
    and ``check_is_flash_attention``), whoever calls it; ``None`` when it can."""
    if workload.dtype not in CUDNN_DTYPES:
        return (f"cuDNN fused attention takes float16/bfloat16 inputs only, not {workload.dtype} "
                "(jax check_layout)")
    capability = gpu_compute_capability() if platform == "gpu" else None
    limit = head_dim_limit(capability)
    if workload.head_dim % 8 or workload.head_dim > limit:
        where = f"sm{capability[0]}{capability[1]}" if capability else "this GPU"
        return (f"cuDNN flash attention needs head_dim a multiple of 8 and <= {limit} on {where} "
                f"(256 from Hopper sm90 on, 128 before); got {workload.head_dim} "
                "(jax check_is_flash_attention)")
    return None


@register
class JaxCudnn(AttentionImpl):
    name = "jax-cudnn"
    public_calls = {"jax.nn:dot_product_attention": ("mask", "scale", "implementation", "is_causal",
                                                     "local_window_size")}
    framework = "jax"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = "jax.nn.dot_product_attention(implementation='cudnn'): cuDNN fused flash attention"
    platform_support = {
        "cpu": unsupported("cuDNN needs an NVIDIA GPU (jax raises 'cuDNN is not detected.' on CPU)"),
        "gpu": RUNS,
        "tpu": unsupported("cuDNN needs an NVIDIA GPU; a TPU has no cuDNN"),
    }

    supports = frozenset({"window", "segment_ids"})
    call_name = "jax.nn.dot_product_attention"
    feature_notes = {"softcap": "the function has no soft-cap option, so its cuDNN path has none"}
    gqa = "native"  # k, v keep their own heads in the cuDNN call (check_layout), no repeat

    def shape_reason(self, workload, platform):
        if platform == "gpu":
            import jax

            if jax.default_backend() == "rocm":
                return "cuDNN is NVIDIA-only; this jax GPU backend is ROCm"
        layout = cudnn_layout_reason(workload, platform)
        if layout:
            return layout
        window = (", and its sliding window: sliding_window_length counts from the same 0"
                  if workload.window is not None else "")
        top_left = top_left_causal_reason(
            workload, f"jax is_causal -> cuDNN MaskType.CAUSAL{window}",
            "it would need a dense [Sq, Sk] bias instead of the kernel's own mask")
        if top_left:
            return top_left
        if workload.segmented and workload.mode == "fwd_bwd" and (workload.seq_q % 2 or workload.seq_k % 2):
            return ("segment ids reach cuDNN as a bias (jax combine_bias_and_mask), and training with a "
                    f"bias needs even sequence lengths, got {workload.seq_q} and {workload.seq_k} "
                    "(jax check_is_flash_attention)")
        return None

    def attention(self, q, k, v, *, causal, scale, window=None, q_segment_ids=None,
                  kv_segment_ids=None):
        import jax

        options = {}
        if window is not None:
            options["local_window_size"] = (window - 1, 0)  # jax: sliding_window_length = W - 1 + 1
        if q_segment_ids is not None:
            options["mask"] = segment_mask(q_segment_ids, kv_segment_ids)  # -> cuDNN bias
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                            implementation="cudnn", **options)
