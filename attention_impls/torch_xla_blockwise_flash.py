"""FlashAttention's online softmax in torch ops (``torch_blockwise``) traced by torch_xla.

The Python loops over its tiles (128x128 by default) unroll into one XLA graph per shape: the GPU-shaped flash
algorithm as XLA schedules it, not a hand-written kernel.
"""

from __future__ import annotations

from attention_impls.base import AttentionImpl
from attention_impls.registry import register
from attention_impls.torch_blockwise_flash import TorchBlockwise, blockwise_attention, tile_reason


@register
class TorchXlaBlockwise(AttentionImpl):
    name = "torch-xla-blockwise-flash"
    framework = "torch_xla"
    designed_for = frozenset({"gpu"})
    is_flash = True
    reimplements = TorchBlockwise.reimplements
    summary = ("FlashAttention-2 online softmax in torch ops with GPU tile sizes (128x128 by default), "
               "XLA-compiled")
    # The shared loop's declarations: this kernel is that loop under XLA.
    supports = TorchBlockwise.supports
    feature_notes = TorchBlockwise.feature_notes
    gqa = TorchBlockwise.gqa
    search_space = TorchBlockwise.search_space

    def config_reason(self, config, workload):
        return tile_reason(config, workload)

    def attention(self, q, k, v, *, causal, scale, **mask):
        return blockwise_attention(q, k, v, causal=causal, scale=scale, block_q=self.knob("block_q"),
                                   block_k=self.knob("block_k"), **mask)
