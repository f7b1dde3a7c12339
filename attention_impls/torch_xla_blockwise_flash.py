"""FlashAttention's online softmax in torch ops (``torch_blockwise``) traced by torch_xla.

The Python loops over 128x128 tiles unroll into one XLA graph per shape: the GPU-shaped flash
algorithm as XLA schedules it, not a hand-written kernel.
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register
from attention_impls.torch_blockwise_flash import TorchBlockwise, blockwise_attention


@register
class TorchXlaBlockwise(AttentionImpl):
    name = "torch-xla-blockwise-flash"
    framework = "torch_xla"
    designed_for = frozenset({"gpu"})
    is_flash = True
    reimplements = TorchBlockwise.reimplements
    summary = "FlashAttention-2 online softmax in torch ops with GPU tile sizes (128x128), XLA-compiled"
    # The shared loop's declarations: this kernel is that loop under XLA.
    supports = TorchBlockwise.supports
    feature_notes = TorchBlockwise.feature_notes
    gqa = TorchBlockwise.gqa

    def attention(self, q, k, v, *, causal, scale, **mask):
        return blockwise_attention(q, k, v, causal=causal, scale=scale, **mask)
