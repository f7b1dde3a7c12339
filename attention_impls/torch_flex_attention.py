"""FlexAttention: ``torch.compile(flex_attention)`` with a block mask for bottom-right causal.

Inductor generates a tiled online-softmax kernel from a template (Triton on CUDA, C++ on CPU).
``fullgraph=True, dynamic=False``: a graph break raises instead of falling back to the unfused
eager path, which materializes the score matrix with only a warning. Each (shapes, dtype, mask,
grad mode) gets its own code object, so a sweep never meets dynamo's per-function recompile limit.

Causal, window and segment ids are one ``mask_mod`` for ``create_block_mask``, so fully masked
blocks are skipped; the block mask depends on the ids' values and is rebuilt for new id tensors.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import types

from attention_impls._torch_ops import attention_ops
from attention_impls.base import RUNS, AttentionImpl, SearchSpace, larger_than_length, unsupported
from attention_impls.registry import register

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).


BLOCK_SIZE = 128  # create_block_mask's default (flex_attention._DEFAULT_SPARSE_BLOCK_SIZE)
# The tuner's candidates (docs/tuning.md): the block mask's block, which sets the sparsity grain (a
# block the mask hides wholly is skipped) and, on CUDA, the kernel's tiles.
SEARCH_SPACE = SearchSpace(defaults=(("block_size", BLOCK_SIZE),),
                           candidates=tuple((("block_size", b),) for b in (64, BLOCK_SIZE, 256, 512)))


def _flex_call(q, k, v, block_mask, scale, enable_gqa, score_mod):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                          enable_gqa=enable_gqa)


def _own_copy(fn, name: str, defaults: tuple):
    """``fn`` with its own code object (dynamo caches per code object), trailing args as defaults."""
    return types.FunctionType(fn.__code__.replace(co_name=name), fn.__globals__, name, defaults)


def keep_mod(seq_q: int, seq_k: int, *, causal: bool, window: int | None = None,
             q_segment_ids=None, kv_segment_ids=None):
    """The ``mask_mod`` of ``attnbench.core.masks``: bottom-right causal, window, segment ids (captured)."""
    offset = seq_k - seq_q

    def keep(b, h, q_idx, kv_idx):
        pos = q_idx + offset
        ok = kv_idx <= pos if causal else kv_idx >= 0
        if window is not None:
            ok = ok & (kv_idx > pos - window)
        if q_segment_ids is not None:
            ok = ok & (q_segment_ids[b, q_idx] == kv_segment_ids[b, kv_idx])
        return ok

    return keep


def causal_block_mask(seq_q: int, seq_k: int, device):
    """Bottom-right causal: query i sees keys j <= i + (seq_k - seq_q)."""
    return keep_block_mask(seq_q, seq_k, device, causal=True)


def keep_block_mask(seq_q: int, seq_k: int, device, *, causal: bool, window: int | None = None,
                    q_segment_ids=None, kv_segment_ids=None, block_size: int = BLOCK_SIZE):
    """``create_block_mask`` of ``keep_mod``: per batch row when there are segment ids, else shared."""
    from torch.nn.attention.flex_attention import create_block_mask

    mod = keep_mod(seq_q, seq_k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                   kv_segment_ids=kv_segment_ids)
    batch = q_segment_ids.shape[0] if q_segment_ids is not None else None
    return create_block_mask(mod, batch, None, seq_q, seq_k, device=device, BLOCK_SIZE=block_size)


def softcap_mod(softcap: float):
    """The ``score_mod`` of logit soft-capping: ``softcap * tanh(score / softcap)``."""
    import torch

    def capped(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    return capped


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

    The template itself is invisible to this profiler; an unfused lowering shows its matmuls.
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
    public_calls = {
        "torch.nn.attention.flex_attention:flex_attention": ("score_mod", "block_mask", "scale",
                                                             "enable_gqa"),
        "torch.nn.attention.flex_attention:create_block_mask": ("device",), "torch:compile": ()}
    framework = "torch"
    # The torch backend meters dynamo and gives each runner a fresh instance, as a new serving loop.
    compiled_by = "torch.compile"
    designed_for = frozenset({"cpu", "gpu"})
    is_flash = True
    summary = "torch.compile(flex_attention) + block mask: Inductor flash-style kernel (Triton / C++)"
    evidence_from_ops = staticmethod(flex_evidence)
    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "native"
    search_space = SEARCH_SPACE
    platform_support = {
        "cpu": RUNS, "gpu": RUNS,
        "tpu": unsupported("FlexAttention takes CUDA, CPU, XPU, HPU and MPS tensors only "
                           "(flex_attention._validate_device); torch_xla has no lowering for it"),
    }

    def __init__(self):
        self._compiled = {}  # key -> (compiled function, block mask or None, segment ids or None)

    def shape_reason(self, workload, platform):
        if platform == "cpu":
            if workload.mode == "fwd_bwd":  # flex_attention.py _validate_device
                return ("FlexAttention does not support backward on CPU: its C++ template is "
                        "inference-only (torch raises for inputs that require grad)")
            return cpu_template_missing()
        if platform == "gpu":
            if workload.head_dim < 16:  # _inductor/kernel/flex/flex_attention.py: tl.dot minimum
                return f"FlexAttention's Triton kernel needs head_dim >= 16, got {workload.head_dim}"

            if importlib.util.find_spec("triton") is None:
                return "FlexAttention on CUDA needs triton, which is not installed"
        return None

    def config_reason(self, config, workload):
        return larger_than_length(config, SEARCH_SPACE.defaults, {"block_size": workload.seq_k})

    def _entry(self, q, k, causal: bool, scale: float, window=None, softcap=None, q_segment_ids=None,
               kv_segment_ids=None):
        """``(compiled function, block mask or None, segment ids it was built from)`` for this call.

        Keyed on what the graph bakes in; new id tensors rebuild only the block mask.
        """
        import torch

        key = (tuple(q.shape), tuple(k.shape), q.dtype, q.device, causal, scale, torch.is_grad_enabled(),
               window, softcap, q_segment_ids is not None, self.config_now)
        segments = (q_segment_ids, kv_segment_ids) if q_segment_ids is not None else None
        entry = self._compiled.get(key)
        same_ids = segments is None or (entry is not None and all(
            mine is theirs for mine, theirs in zip(entry[2], segments, strict=True)))
        if entry is not None and same_ids:
            return entry
        if entry is None:
            score_mod = softcap_mod(softcap) if softcap is not None else None
            fn = torch.compile(_own_copy(_flex_call, f"flex_attention_{len(self._compiled)}",
                                         (scale, k.shape[1] != q.shape[1], score_mod)),
                               fullgraph=True, dynamic=False)
        else:
            fn = entry[0]
        masked = causal or window is not None or segments is not None
        mask = keep_block_mask(q.shape[2], k.shape[2], q.device, causal=causal, window=window,
                               q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                               block_size=self.knob("block_size")) if masked else None
        entry = self._compiled[key] = (fn, mask, segments)
        return entry

    def attention(self, q, k, v, *, causal, scale, **mask):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
        fn, block_mask, _ = self._entry(q, k, causal, scale, **mask)
        out = fn(q, k, v, block_mask)
        return out.transpose(1, 2)
