"""Pallas TPU FlashAttention (``jax.experimental.pallas.ops.tpu.flash_attention``).

jax's default tiles (128) are too small for a v5e by its maintainers' account (jax-ml/jax issue
24633), so by default we use the largest of 512, 256, 128 dividing each length, as torch_xla's
wrapper does. Its ``BlockSizes`` are the tuner's knobs (``SEARCH_SPACE``): a knob is the tile where
it divides the length, and is halved down to 128 until it does otherwise (so the defaults, 512,
are that rule exactly; a candidate that does not divide is refused, ``config_reason``).
On a CPU it runs only in jax's TPU interpreter (``pltpu.force_tpu_interpret_mode``).

Shape rules come from the kernel source (``_verify_block`` and friends); what it cannot do is
refused, never emulated.
"""

from __future__ import annotations

import contextlib

from attention_impls.base import (
    RUNS,
    AttentionImpl,
    SearchSpace,
    interpret_only,
    top_left_causal_reason,
    unsupported,
)
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

BLOCK = 128  # the smallest tile, BlockSizes.get_default()'s: every length must be a multiple of it
TILES = (512, 256, 128)


MODULE = "jax.experimental.pallas.ops.tpu.flash_attention"

def fit_tile(knob: int, length: int) -> int:
    """The tile a knob gives at ``length``: ``knob`` where it divides ``length``, else halved until it
    does, never below ``BLOCK`` (128 for a ragged length). ``fit_tile(512, n)`` is ``tile(n)``."""
    t = knob
    while t > BLOCK and length % t:
        t //= 2
    return t


def tile(length: int) -> int:
    """The largest tile in ``TILES`` dividing ``length`` (128 for a ragged length): the default knobs'."""
    return next((t for t in TILES if length % t == 0), BLOCK)


# The tuner's knobs: the forward's query tile, key tile (major: the kv block a grid step loads; minor:
# the block each matmul takes, dividing the major) and the backward's query and key tiles (every
# backward block, dkv and dq alike). Defaults: 512 everywhere, today's tiles.
KNOBS = ("block_q", "block_k_major", "block_k", "block_q_bwd", "block_k_bwd")
SEARCH_SPACE = SearchSpace(
    defaults=tuple(zip(KNOBS, (512, 512, 512, 512, 512), strict=True)),
    candidates=tuple(tuple(zip(KNOBS, values, strict=True)) for values in (
        (128, 128, 128, 128, 128), (256, 256, 256, 256, 256), (512, 512, 512, 512, 512),
        (512, 1024, 512, 512, 512), (1024, 1024, 1024, 512, 512), (1024, 2048, 512, 512, 512))))


def fitted_tiles(config, lengths: dict[str, int], within: dict[str, str]) -> dict:
    """Each knob's tile (``fit_tile``): a knob of ``lengths`` at its length, a minor knob of ``within``
    (minor -> major) at most its major tile and dividing it. ``config``: every knob (``config_now``)."""
    knobs = dict(config)
    out = {name: fit_tile(knobs[name], length) for name, length in lengths.items()}
    for minor, major in within.items():
        out[minor] = fit_tile(min(knobs[minor], out[major]), out[major])
    return out


def tiles(config, seq_q: int, seq_k: int) -> dict:
    """Each knob's tile at these lengths (``config``: every knob, ``AttentionImpl.config_now``)."""
    return fitted_tiles(config, {"block_q": seq_q, "block_k_major": seq_k, "block_q_bwd": seq_q,
                                 "block_k_bwd": seq_k}, within={"block_k": "block_k_major"})


def block_sizes(seq_q: int, seq_k: int, config=SEARCH_SPACE.defaults):
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes

    t = tiles(config, seq_q, seq_k)
    tq, tk = t["block_q_bwd"], t["block_k_bwd"]
    return BlockSizes(block_q=t["block_q"], block_k_major=t["block_k_major"], block_k=t["block_k"], block_b=1,
                      block_q_major_dkv=tq, block_k_major_dkv=tk, block_k_dkv=tk, block_q_dkv=tq,
                      block_k_major_dq=tk, block_k_dq=tk, block_q_dq=tq)


def divides_reason(config, lengths: dict[str, tuple[str, int]], *, multiple: int = BLOCK,
                   within: dict[str, str] | None = None) -> str | None:
    """Why a candidate's tiles do not fit a workload: a tile not a multiple of ``multiple``, longer
    than, or not dividing the length it tiles (``lengths``: knob -> (what, length)), or a minor tile
    not dividing its major one (``within``: minor knob -> major knob)."""
    knobs = dict(config)
    for name, value in config:
        if value % multiple:
            return f"{name}={value} is not a multiple of {multiple} (the kernel's lane-aligned block)"
        if name in lengths:
            what, length = lengths[name]
            if value > length:
                return f"{name}={value} is longer than the {length} {what} it tiles"
            if length % value:
                return f"{name}={value} does not divide the {length} {what} (the kernel's blocks must)"
    for minor, major in (within or {}).items():
        if knobs[major] % knobs[minor]:
            return f"{minor}={knobs[minor]} does not divide {major}={knobs[major]}"
    return None


def tpu_flash_shape_reason(workload) -> str | None:
    """Why the Pallas TPU flash kernel with default 128 tiles cannot run ``workload``."""
    if workload.seq_k % BLOCK:
        return (f"kv length must be a multiple of the {BLOCK}-key block (got {workload.seq_k}; "
                "_verify_block: kv_seq_len divisible by block_k_major)")
    if workload.seq_q < BLOCK:
        return f"query length must be at least the {BLOCK}-row block (got {workload.seq_q})"
    if workload.mode == "fwd_bwd" and workload.seq_q % BLOCK:
        return (f"the backward kernels need the query length to be a multiple of {BLOCK} "
                f"(got {workload.seq_q}; _verify_block in _flash_attention_bwd_dkv)")
    if workload.head_dim > BLOCK and workload.head_dim % BLOCK and workload.seq_k > BLOCK:
        return (f"head_dim above {BLOCK} must be a multiple of {BLOCK} (got {workload.head_dim}; "
                "_flash_attention_kernel_single_batch)")
    return top_left_causal_reason(workload, "col <= row", "not expressible without an explicit bias")


@register
class JaxPallasTpuFlash(AttentionImpl):
    name = "jax-pallas-tpu-flash"
    framework = "jax"
    designed_for = frozenset({"tpu"})
    is_flash = True
    requires_modules = (MODULE,)
    public_calls = {
        f"{MODULE}:flash_attention": ("segment_ids", "causal", "sm_scale", "block_sizes"),
        f"{MODULE}:BlockSizes": ("block_q", "block_k_major", "block_k", "block_b", "block_q_major_dkv",
                                    "block_k_major_dkv", "block_k_dkv", "block_q_dkv", "block_k_major_dq",
                                    "block_k_dq", "block_q_dq"),
        f"{MODULE}:SegmentIds": ("q", "kv"),
    }
    interpreter_calls = {"jax.experimental.pallas.tpu:force_tpu_interpret_mode": ()}
    summary = ("Pallas TPU flash_attention (jax.experimental.pallas.ops.tpu), 512/256/128 tiles by "
               "default (BlockSizes tuned on the compile targets); TPU interpreter off-TPU")
    search_space = SEARCH_SPACE
    supports = frozenset({"segment_ids"})
    call_name = "Pallas TPU flash_attention"
    feature_notes = {
        "window": "its only masks are causal (top-left) and segment_ids",
        "softcap": "it has no soft-cap option (ab, segment_ids, causal, sm_scale, block_sizes only)",
    }
    gqa = "repeated"  # equal head counts only ('Head count mismatch'): kv heads jnp.repeat-ed first
    platform_support = {
        "cpu": interpret_only("TPU interpreter (pltpu.force_tpu_interpret_mode), ~100x slower"),
        "gpu": unsupported(
            "Mosaic TPU kernel: pallas_call has no GPU lowering for it (Triton/Mosaic GPU cannot "
            "compile TPU VMEM/grid code); jax's TPU interpreter keeps kernel memory on the host "
            "through io_callbacks and is not verified on GPUs, so it is not run there"),
        "tpu": RUNS,
    }

    def shape_reason(self, workload, platform):
        return tpu_flash_shape_reason(workload)

    def config_reason(self, config, workload):
        backward = workload.mode == "fwd_bwd"
        lengths = {"block_q": ("queries", workload.seq_q), "block_k_major": ("keys", workload.seq_k),
                   "block_k": ("keys", workload.seq_k)}
        if backward:
            lengths.update(block_q_bwd=("queries", workload.seq_q), block_k_bwd=("keys", workload.seq_k))
        return divides_reason(config, lengths, within={"block_k": "block_k_major"})

    def trace_context(self, platform):
        if platform == "cpu":
            from jax.experimental.pallas import tpu as pltpu

            return pltpu.force_tpu_interpret_mode()
        return contextlib.nullcontext()

    def attention(self, q, k, v, *, causal, scale, q_segment_ids=None, kv_segment_ids=None):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.flash_attention import SegmentIds, flash_attention

        groups = q.shape[2] // k.shape[2]
        if groups > 1:  # the kernel reads kv head h for query head h: repeat each kv head per group
            k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
        segment_ids = None
        if q_segment_ids is not None:
            segment_ids = SegmentIds(q=q_segment_ids, kv=kv_segment_ids)
        out = flash_attention(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
            segment_ids=segment_ids, causal=causal, sm_scale=scale,
            block_sizes=block_sizes(q.shape[1], k.shape[1], self.config_now))
        return out.transpose(0, 2, 1, 3)
