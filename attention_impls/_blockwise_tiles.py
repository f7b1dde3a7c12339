"""The tile knobs of the blockwise FlashAttention ports (``jax-blockwise-flash``,
``torch-blockwise-flash``, ``torch-xla-blockwise-flash``): one search space, as the three are one
algorithm (docs/tuning.md)."""

from __future__ import annotations

from typing import NamedTuple

from attention_impls.base import SearchSpace, larger_than_length

BLOCK_Q = 128  # FlashAttention-2's forward for head_dim 64 (``run_mha_fwd_hdim64``)
BLOCK_K = 128

# The tuner's candidates: FA2's default, smaller and larger square tiles, and longer key tiles (fewer
# online-softmax rescales per query tile).
SEARCH_SPACE = SearchSpace(
    defaults=(("block_q", BLOCK_Q), ("block_k", BLOCK_K)),
    candidates=tuple((("block_q", q), ("block_k", k)) for q, k in
                     ((64, 64), (BLOCK_Q, BLOCK_K), (128, 256), (256, 256), (256, 512))))


def tile_reason(config, workload) -> str | None:
    """A tile longer than the length it tiles only pads: refused (``larger_than_length``)."""
    return larger_than_length(config, SEARCH_SPACE.defaults,
                              {"block_q": workload.seq_q, "block_k": workload.seq_k})


class Tiling(NamedTuple):
    """What one call of a port's loops is built from: static, so hashable (jax's ``custom_vjp`` takes
    it as a non-differentiable argument, torch's ``autograd.Function`` keeps it for the backward)."""

    causal: bool
    scale: float
    window: int | None
    softcap: float | None
    block_q: int
    block_k: int
    # torch eager only: skip tiles whose documents cannot meet, from a host-side table (not under XLA)
    skip_segments: bool = False
