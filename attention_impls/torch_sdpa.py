"""``torch.nn.functional.scaled_dot_product_attention`` with one backend forced per name.

Each name runs SDPA under ``sdpa_kernel([that backend])``: if the backend cannot take the inputs
torch raises instead of silently falling back, so the name is the kernel that ran.

``check()`` predicts torch's refusal so that a sweep records "unsupported: <reason>", not an error:
first the backend's rules written out from torch's own gates (``aten/src/ATen/native/transformers/
cuda/sdp_utils.cpp`` ``can_use_{flash,mem_efficient,cudnn}_attention``; on CPU
``sdp_utils_cpp.cpp`` ``use_flash_attention_cpp``), then torch's dispatcher itself
(``torch._fused_sdp_choice`` on zero-stride views of the real shapes: nothing is allocated), which
catches what a torch or cuDNN version changed. GPU rules read the device's compute capability
when there is one, and are those of sm80+ (A100/H100/H200) when reasoning from a host without one.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings

from attention_impls._torch import TorchImpl, attention_ops
from attention_impls.base import RUNS, unsupported
from attention_impls.registry import register
from attnbench.workload import Workload

NO_TPU = unsupported("torch SDPA on a TPU goes through torch_xla: see torch-xla-sdpa")
# sdp_utils_cpp.cpp select_sdp_backend_cpp: CPU tensors only ever get FLASH_ATTENTION or MATH.
CUDA_ONLY = ("{kernel} is a CUDA-only kernel: on CPU torch's SDPA dispatcher has only FLASH_ATTENTION "
             "and MATH, so sdpa_kernel([{backend}]) raises 'No viable backend for "
             "scaled_dot_product_attention was found'")
HALF = ("float16", "bfloat16")


def sdpa(q, k, v, *, causal: bool, scale: float, backend=None):
    """SDPA on [B, S, H, D] tensors (transposed to torch's [B, H, S, D]), bottom-right causal."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    kwargs = {"scale": scale, "enable_gqa": k.shape[1] != q.shape[1]}
    seq_q, seq_k = q.shape[2], k.shape[2]
    if causal and seq_q != seq_k:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(seq_q, seq_k)  # is_causal is top-left aligned
    else:
        kwargs["is_causal"] = causal
    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return out.transpose(1, 2)


def cuda_capability() -> tuple[int, int] | None:
    import torch

    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None


# What select_sdp_backend (sdp_utils.cpp) warns before each backend's reasons when none can run.
_DISPATCH_HEADERS = {"FLASH_ATTENTION": "Flash attention kernel not used because:",
                     "EFFICIENT_ATTENTION": "Memory efficient kernel not used because:",
                     "CUDNN_ATTENTION": "cuDNN attention kernel not used because:"}


def dispatcher_reason(backend: str, messages: list[str], error: str) -> str:
    """The part of torch's dispatch warnings that is about ``backend``; else the error's first line."""
    messages = [m.split(" (Triggered internally at")[0].strip() for m in messages]
    header = _DISPATCH_HEADERS.get(backend)
    if header in messages:
        tail = messages[messages.index(header) + 1:]
        own = list(itertools.takewhile(lambda m: not m.endswith("not used because:"), tail))
        if own:
            return " ".join(own)
    return error.strip().splitlines()[0] if error.strip() else "no reason given"


def dispatch_refusal(backend: str, workload: Workload, device) -> str | None:
    """Ask torch's SDPA dispatcher whether ``backend`` takes ``workload`` the way ``sdpa`` calls it.

    Mirrors ``sdpa``: a bottom-right causal bias reaches CUDA flash/efficient natively
    (``torch/nn/attention/bias.py`` ``CausalBias._dispatch``), every other backend as a
    materialized boolean mask. Returns ``None`` when torch would run it.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:  # private API; without it the written-out rules stand alone
        return None
    dtype, grad = getattr(torch, workload.dtype), workload.mode == "fwd_bwd"

    def view(heads, seq):
        base = torch.zeros(1, 1, 1, workload.head_dim, dtype=dtype, device=device, requires_grad=grad)
        return base.expand(workload.batch, heads, seq, workload.head_dim)

    mask, is_causal = None, workload.causal
    if workload.causal and workload.seq_q != workload.seq_k:
        is_causal = False
        if not (device.type == "cuda" and backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION")):
            mask = torch.ones(1, 1, dtype=torch.bool, device=device).expand(workload.seq_q, workload.seq_k)
    with warnings.catch_warnings(record=True) as caught, torch.set_grad_enabled(grad), \
            sdpa_kernel([getattr(SDPBackend, backend)]):
        warnings.simplefilter("always")
        q, k = view(workload.q_heads, workload.seq_q), view(workload.kv_heads, workload.seq_k)
        try:
            choose(q, k, k, mask, 0.0, is_causal, scale=None, enable_gqa=workload.is_gqa)
            return None
        except RuntimeError as exc:
            why = dispatcher_reason(backend, [str(w.message) for w in caught], str(exc))
            return f"torch's SDPA dispatcher refuses {backend} here: {why}"


def sdpa_evidence(ops: dict[str, int]) -> str:
    """The ATen attention ops one profiled step executed under the single forced backend."""
    seen = attention_ops(ops)
    return f"profiler saw {', '.join(seen)}" if seen else "profiler saw no fused or math attention op"


class _SdpaBackend(TorchImpl):
    backend: str  # name of the torch.nn.attention.SDPBackend member
    evidence_from_ops = staticmethod(sdpa_evidence)
    platform_support = {"cpu": RUNS, "gpu": RUNS, "tpu": NO_TPU}

    def attention(self, q, k, v, *, causal, scale):
        from torch.nn.attention import SDPBackend

        return sdpa(q, k, v, causal=causal, scale=scale, backend=getattr(SDPBackend, self.backend))

    def rules(self, w: Workload, platform: str, sm: tuple[int, int] | None) -> str | None:
        """This backend's own constraints, written out from torch's checks; ``None`` when met."""
        return None

    def shape_reason(self, workload: Workload, platform: str) -> str | None:
        sm = cuda_capability() if platform == "gpu" else None
        reason = self.rules(workload, platform, sm)
        if reason or platform != self.platform():  # the dispatcher can only be asked about this host
            return reason
        return dispatch_refusal(self.backend, workload, self.device())


@register
class TorchSdpaMath(_SdpaBackend):
    name = "torch-sdpa-math"
    backend = "MATH"
    summary = "SDPA forced to the MATH backend: materialized softmax in ATen ops"


@register
class TorchSdpaFlash(_SdpaBackend):
    name = "torch-sdpa-flash"
    backend = "FLASH_ATTENTION"
    designed_for = frozenset({"cpu", "gpu"})  # FA2 on CUDA; ATen's own CPU FlashAttentionKernel.cpp
    is_flash = True
    summary = "SDPA forced to FLASH_ATTENTION: FlashAttention-2 on CUDA, ATen's tiled CPU flash kernel"

    def rules(self, w, platform, sm):
        if platform != "gpu":  # CPU kernel: fp32/fp64/bf16/fp16, any head_dim, masks, GQA
            return None
        if w.dtype not in HALF:  # check_dtypes_flash_attention
            return f"FLASH_ATTENTION on CUDA takes float16/bfloat16 only, not {w.dtype}"
        if sm and not (8, 0) <= sm <= (12, 1):  # check_flash_attention_hardware_support
            return f"FlashAttention-2 needs a GPU in sm80..sm121; this one is sm{sm[0]}{sm[1]}"
        if w.head_dim > 256:  # check_head_dim_size_flash
            return f"FLASH_ATTENTION on CUDA needs head_dim <= 256, got {w.head_dim}"
        consumer = sm and ((8, 6) <= sm <= (8, 9) or (12, 0) <= sm <= (12, 1))
        if w.mode == "fwd_bwd" and consumer and 192 < w.head_dim <= 224:
            # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120
            return f"FlashAttention-2 has no backward for head_dim in (192, 224] on sm{sm[0]}{sm[1]}"
        return None


@register
class TorchSdpaEfficient(_SdpaBackend):
    name = "torch-sdpa-efficient"
    backend = "EFFICIENT_ATTENTION"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = "SDPA forced to EFFICIENT_ATTENTION: xformers' CUTLASS memory-efficient kernel (CUDA)"
    platform_support = {"cpu": unsupported(CUDA_ONLY.format(kernel="EFFICIENT_ATTENTION (xformers/CUTLASS)",
                                                            backend="EFFICIENT_ATTENTION")),
                        "gpu": RUNS, "tpu": NO_TPU}

    def rules(self, w, platform, sm):
        if platform != "gpu":
            return None
        if sm and sm < (5, 0):  # check_mem_efficient_hardware_support
            return f"EFFICIENT_ATTENTION needs sm50 or newer; this GPU is sm{sm[0]}{sm[1]}"
        if w.dtype == "bfloat16" and sm and sm < (8, 0):  # dtype list below sm80: half, float
            return f"EFFICIENT_ATTENTION takes bfloat16 only on sm80+; this GPU is sm{sm[0]}{sm[1]}"
        # check_head_dim_size_mem_efficient with minimum_gemm_alignment: 128-bit tensor-core rows.
        if sm and sm < (8, 0):
            align = 8 if w.dtype in HALF and sm >= (7, 0) else 1
        else:
            align = 8 if w.dtype in HALF else 4
        if w.head_dim % align:
            return f"EFFICIENT_ATTENTION needs head_dim divisible by {align} for {w.dtype}, got {w.head_dim}"
        return None  # GQA depends on the torch version: the dispatcher is asked (shape_reason)


@register
class TorchSdpaCudnn(_SdpaBackend):
    name = "torch-sdpa-cudnn"
    backend = "CUDNN_ATTENTION"
    designed_for = frozenset({"gpu"})
    is_flash = True
    summary = "SDPA forced to CUDNN_ATTENTION: cuDNN's fused flash attention (CUDA)"
    platform_support = {"cpu": unsupported(CUDA_ONLY.format(kernel="CUDNN_ATTENTION (cuDNN fused attention)",
                                                            backend="CUDNN_ATTENTION")),
                        "gpu": RUNS, "tpu": NO_TPU}

    @staticmethod
    def head_dim_limit(sm) -> int:
        """check_cudnn_tensor_shapes: 256 on sm90/sm10x with cuDNN > 9.22, else 128."""
        import torch

        new_cudnn = (torch.backends.cudnn.version() or 0) > 92200
        return 256 if sm and (sm == (9, 0) or sm[0] == 10) and new_cudnn else 128

    def rules(self, w, platform, sm):
        if platform != "gpu":
            return None
        if w.dtype not in HALF:  # check_dtypes_low_precision
            return f"CUDNN_ATTENTION takes float16/bfloat16 only, not {w.dtype}"
        if sm and not (8, 0) <= sm <= (12, 1):  # check_cudnn_hardware_support
            return f"cuDNN attention needs a GPU in sm80..sm121; this one is sm{sm[0]}{sm[1]}"
        if w.head_dim % 8:  # check_cudnn_tensor_shapes
            return f"CUDNN_ATTENTION needs head_dim divisible by 8, got {w.head_dim}"
        limit = self.head_dim_limit(sm)
        if w.head_dim > limit:
            return f"CUDNN_ATTENTION needs head_dim <= {limit} on this GPU and cuDNN, got {w.head_dim}"
        if w.mode == "fwd_bwd" and 128 < w.head_dim < 256:  # check_cudnn_d256_bprop_head_dim
            return f"cuDNN attention has a backward only for head_dim <= 128 or 256, got {w.head_dim}"
        if w.seq_k == 1:
            return "cuDNN attention does not take a key/value sequence of length 1"
        if max(w.batch, w.q_heads) > 65535:
            return "cuDNN attention takes at most 65535 batch entries and heads"
        return None
