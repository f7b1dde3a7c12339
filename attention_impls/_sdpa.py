"""Shared by the ``torch_sdpa_*`` kernels: SDPA with one backend forced per kernel, and its rules.

Forcing one backend makes torch raise instead of silently falling back, so the name is the kernel
that ran. ``check()`` predicts the refusal: first rules written out from torch's gates
(``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` ``can_use_*_attention``; CPU:
``sdp_utils_cpp.cpp``), then ``torch._fused_sdp_choice`` on zero-stride views, which catches what
a torch or cuDNN version changed. Without a device, GPU rules are those of sm80+.

A window and segment ids go in as one boolean ``attn_mask`` built inside the timed call, as in a
model's attention layer, with bottom-right causal folded in (SDPA refuses ``attn_mask`` with
``is_causal``). CUDA FLASH takes no explicit mask (``check_for_attn_mask``).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings

from attention_impls._compile_target import compile_target
from attention_impls._torch_ops import attention_ops
from attention_impls.base import RUNS, AttentionImpl, unsupported
from attnbench.core.workload import Workload

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).

NO_TPU = unsupported("torch SDPA on a TPU goes through torch_xla (see torch-xla-sdpa) or TorchTPU "
                     "(torch-tpu 0.2.0, not installed here: it compiles only with a chip attached, "
                     "docs/compiled-for.md#torch-on-a-tpu)")
# sdp_utils_cpp.cpp select_sdp_backend_cpp: CPU tensors only ever get FLASH_ATTENTION or MATH.
CUDA_ONLY = ("{kernel} is a CUDA-only kernel: on CPU torch's SDPA dispatcher has only FLASH_ATTENTION "
             "and MATH, so sdpa_kernel([{backend}]) raises 'No viable backend for "
             "scaled_dot_product_attention was found'")
HALF = ("float16", "bfloat16")

NO_SOFTCAP = ("it takes attn_mask, is_causal, scale and enable_gqa, and a mask can only add to or mask "
              "the scores, not apply softcap * tanh(s / softcap)")


def keep_mask(seq_q: int, seq_k: int, device, *, causal: bool, window: int | None = None,
              q_segment_ids=None, kv_segment_ids=None):
    """Boolean ``[B or 1, 1, Sq, Sk]``: True where ``attnbench.core.masks`` keeps the pair.

    Built on ``device``; no Python value of the ids is read (that would sync).
    """
    import torch

    pos = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q)
    keys = torch.arange(seq_k, device=device)[None, :]
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal:
        keep = keep & (keys <= pos)
    if window is not None:
        keep = keep & (keys > pos - window)
    keep = keep[None, None]
    if q_segment_ids is not None:
        keep = keep & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    return keep


def sdpa(q, k, v, *, causal: bool, scale: float, backend=None, window: int | None = None,
         q_segment_ids=None, kv_segment_ids=None):
    """SDPA on [B, S, H, D] tensors (transposed to torch's [B, H, S, D]), bottom-right causal.

    Without a window or segment ids, causal goes in as ``is_causal`` (square) or torch's
    ``causal_lower_right`` bias; with them, as one boolean ``attn_mask`` (``keep_mask``).
    """
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    seq_q, seq_k = q.shape[1], k.shape[1]
    masked = window is not None or q_segment_ids is not None
    attn_mask = keep_mask(seq_q, seq_k, q.device, causal=causal, window=window, q_segment_ids=q_segment_ids,
                          kv_segment_ids=kv_segment_ids) if masked else None
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    kwargs = {"scale": scale, "enable_gqa": k.shape[1] != q.shape[1]}
    if masked:
        kwargs["attn_mask"] = attn_mask
    elif causal and seq_q != seq_k:
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
    """Torch's dispatcher's reason for refusing ``backend`` on ``workload``, or ``None``.

    Mirrors how ``sdpa`` calls it; a bottom-right causal bias reaches CUDA flash/efficient natively
    (``torch/nn/attention/bias.py`` ``CausalBias._dispatch``), others as a boolean mask.
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

    def bool_mask(*shape):  # a zero-stride view: the dispatcher reads shapes, never values
        return torch.ones((1,) * len(shape), dtype=torch.bool, device=device).expand(*shape)

    mask, is_causal = None, workload.causal
    if workload.window is not None or workload.segmented:
        is_causal = False
        mask = bool_mask(workload.batch if workload.segmented else 1, 1, workload.seq_q, workload.seq_k)
    elif workload.causal and workload.seq_q != workload.seq_k:
        is_causal = False
        if not (device.type == "cuda" and backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION")):
            mask = bool_mask(workload.seq_q, workload.seq_k)
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


class SdpaBackendKernel(AttentionImpl):
    """One SDPA backend forced; the four ``torch_sdpa_*.py`` kernels subclass this."""

    framework = "torch"
    executes = "eager"
    sdpa_backend: str  # name of the torch.nn.attention.SDPBackend member
    evidence_from_ops = staticmethod(sdpa_evidence)
    platform_support = {"cpu": RUNS, "gpu": RUNS, "tpu": NO_TPU}
    # A backend that cannot take an explicit mask somewhere refuses it in ``rules`` (CUDA FLASH).
    supports = frozenset({"window", "segment_ids"})
    call_name = "torch's F.scaled_dot_product_attention"
    feature_notes = {"softcap": NO_SOFTCAP}
    gqa = "native"  # enable_gqa: the fused kernels read the shared kv head; MATH overrides this

    @property
    def public_calls(self) -> dict[str, tuple[str, ...]]:
        return {"torch.nn.functional:scaled_dot_product_attention": ("attn_mask", "is_causal", "scale",
                                                                     "enable_gqa"),
                "torch.nn.attention:sdpa_kernel": (),
                f"torch.nn.attention:SDPBackend.{self.sdpa_backend}": (),
                "torch.nn.attention.bias:causal_lower_right": ()}

    def attention(self, q, k, v, *, causal, scale, **mask):
        from torch.nn.attention import SDPBackend

        return sdpa(q, k, v, causal=causal, scale=scale, backend=getattr(SDPBackend, self.sdpa_backend),
                    **mask)

    def rules(self, w: Workload, platform: str, sm: tuple[int, int] | None) -> str | None:
        """This backend's own constraints, written out from torch's checks; ``None`` when met."""
        return None

    def shape_reason(self, workload: Workload, platform: str) -> str | None:
        sm = cuda_capability() if platform == "gpu" else None
        reason = self.rules(workload, platform, sm)
        host = "gpu" if cuda_capability() is not None else "cpu"
        if reason or platform != host or compile_target() is not None:  # the dispatcher knows this host only
            return reason
        import torch

        return dispatch_refusal(self.sdpa_backend, workload, torch.device("cuda" if host == "gpu" else "cpu"))


