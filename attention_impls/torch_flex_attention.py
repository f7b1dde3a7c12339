"""FlexAttention: ``torch.compile(flex_attention)`` with a block mask for bottom-right causal.

Inductor generates the kernel from a template: Triton on CUDA, a C++ template on CPU (since torch
2.6), both tiled online-softmax (flash-style) kernels, so it is native on either. Compiled with
``fullgraph=True`` and ``dynamic=False``: a graph break or the recompile limit raises instead of
falling back to the unfused eager path (``flex_attention`` called outside ``torch.compile``
materializes the full score matrix, with only a warning). Each (shapes, dtype, causal, grad mode)
gets its own compiled function, with its own code object, so a sweep over many shapes never
meets dynamo's per-function recompile limit (8), and its own block mask built once, outside the
timed call.
"""

from __future__ import annotations

import os
import shutil
import sys
import types

from attention_impls.base import RUNS, AttentionImpl, unsupported
from attention_impls.registry import register
from attnbench.backends.torch_backend import attention_ops


def _flex_call(q, k, v, block_mask, scale, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _own_copy(fn, name: str, defaults: tuple):
    """``fn`` with a code object of its own (dynamo keeps compiled graphs per code object) and its
    trailing arguments bound as defaults, which dynamo bakes into the graph as constants."""
    return types.FunctionType(fn.__code__.replace(co_name=name), fn.__globals__, name, defaults)


def causal_block_mask(seq_q: int, seq_k: int, device):
    """Bottom-right causal: query i sees keys j <= i + (seq_k - seq_q)."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = seq_k - seq_q

    def bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return create_block_mask(bottom_right, None, None, seq_q, seq_k, device=device)


def cpu_template_missing() -> str | None:
    """Why Inductor's CPU flex template cannot build here (flex_cpu.py ``check_cpu_supported``)."""
    import torch

    if sys.platform == "darwin" or not torch.cpu._is_avx2_supported() \
            or os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        return "Inductor's CPU FlexAttention template needs an x86 CPU with AVX2 (not macOS)"
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")):
        return "Inductor's CPU FlexAttention template needs a C++ compiler (g++/clang++), none found"
    return None


def flex_evidence(ops: dict[str, int]) -> str:
    """The fused kernel ran when the step was one compiled region with no ATen matmul inside.

    An unfused lowering would show its score matmuls (``aten::bmm``/``mm``, Inductor's extern
    kernels) or an ATen attention op. The template itself is invisible to this profiler: all it
    records of the attention is the compiled region.
    """
    regions = [name for name in ops if name.startswith("Torch-Compiled Region")]
    matmuls = ("aten::bmm", "aten::mm", "aten::baddbmm")
    unfused = attention_ops(ops) + [name for name in matmuls if name in ops]
    if not regions or unfused:
        return (f"not verified: profiler saw {len(regions)} compiled region(s) and "
                f"{', '.join(unfused) or 'no matmul or attention op'}")
    return ("profiler saw one Torch-Compiled Region and no ATen matmul or attention op: Inductor's "
            "fused flex template (C++ on CPU, Triton on CUDA), opaque to the op-level profiler")


@register
class TorchFlexAttention(AttentionImpl):
    name = "torch-flex-attention"
    framework = "torch"
    # Compiles: the torch backend meters dynamo and gives each runner a fresh instance (no
    # compiled functions yet, as a new serving loop).
    compiled_by = "torch.compile"
    designed_for = frozenset({"cpu", "gpu"})
    is_flash = True
    summary = "torch.compile(flex_attention) + block mask: Inductor flash-style kernel (Triton / C++)"
    evidence_from_ops = staticmethod(flex_evidence)
    platform_support = {
        "cpu": RUNS, "gpu": RUNS,
        "tpu": unsupported("FlexAttention takes CUDA, CPU, XPU, HPU and MPS tensors only "
                           "(flex_attention._validate_device); torch_xla has no lowering for it"),
    }

    def __init__(self):
        self._compiled = {}  # key -> (compiled function, block mask or None)

    def shape_reason(self, workload, platform):
        if platform == "cpu":
            if workload.mode == "fwd_bwd":  # flex_attention.py _validate_device
                return ("FlexAttention does not support backward on CPU: its C++ template is "
                        "inference-only (torch raises for inputs that require grad)")
            return cpu_template_missing()
        if platform == "gpu":
            if workload.head_dim < 16:  # _inductor/kernel/flex/flex_attention.py: tl.dot minimum
                return f"FlexAttention's Triton kernel needs head_dim >= 16, got {workload.head_dim}"
            import importlib.util

            if importlib.util.find_spec("triton") is None:
                return "FlexAttention on CUDA needs triton, which is not installed"
        return None

    def _entry(self, q, k, causal: bool, scale: float):
        import torch

        key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device, causal, scale, torch.is_grad_enabled())
        entry = self._compiled.get(key)
        if entry is None:
            fn = _own_copy(_flex_call, f"flex_attention_{len(self._compiled)}",
                           (scale, k.shape[1] != q.shape[1]))
            mask = causal_block_mask(q.shape[2], k.shape[2], q.device) if causal else None
            entry = self._compiled[key] = (torch.compile(fn, fullgraph=True, dynamic=False), mask)
        return entry

    def attention(self, q, k, v, *, causal, scale):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        fn, mask = self._entry(q, k, causal, scale)
        out = fn(q, k, v, mask)
        return out.transpose(1, 2)
