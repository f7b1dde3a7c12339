"""Pallas TPU splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``).

``make_splash_mha_single_device`` with, by default, the largest of 512/256/128 tiles dividing each
length (jax's default is 128, "TODO: select better parameters"); its ``BlockSizes`` are the tuner's
knobs (``SEARCH_SPACE``: a knob is the tile where it divides the length, halved down to 128 until it
does otherwise, so the 512 defaults are that rule), one kernel per (mask, shape, soft cap, tiles),
``vmap``-ed over the batch as jax's own tests do. No softmax-scale argument, so q is scaled first.

Causal and the window are ``CausalMask`` / ``LocalMask`` with ``offset=seq_k - seq_q``: exactly our
bottom-right alignment, and the block-sparse mask info skips tiles outside the band. Off a TPU it
runs with ``interpret=True``. Shape rules are from ``_splash_attention_forward`` and
``splash_attention_mask_info._process_mask``.
"""

from __future__ import annotations

import functools

from attention_impls._compile_target import jax_platform
from attention_impls.base import RUNS, AttentionImpl, SearchSpace, interpret_only
from attention_impls.jax_pallas_tpu_flash import divides_reason, fitted_tiles
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

BLOCK = 128  # BlockSizes.get_default(): block_q = block_kv = block_kv_compute = 128 (and backward)
INTERPRETER = "Pallas HLO interpreter (interpret=True): the kernel body as plain XLA ops per grid step"


# The tuner's knobs: the forward's query tile, kv tile (the block a grid step loads) and kv compute
# tile (the block each matmul takes, dividing the kv tile), and the backward's query and kv tiles
# (dkv and dq alike; its compute tile is the kv tile). Defaults: 512 everywhere, today's tiles.
KNOBS = ("block_q", "block_kv", "block_kv_compute", "block_q_bwd", "block_kv_bwd")
SEARCH_SPACE = SearchSpace(
    defaults=tuple(zip(KNOBS, (512, 512, 512, 512, 512), strict=True)),
    candidates=tuple(tuple(zip(KNOBS, values, strict=True)) for values in (
        (128, 128, 128, 128, 128), (256, 256, 256, 256, 256), (512, 512, 512, 512, 512),
        (512, 1024, 512, 512, 512), (1024, 1024, 1024, 512, 512), (1024, 2048, 1024, 512, 512),
        (2048, 2048, 2048, 512, 512))))

KERNEL = "jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel"
MASKS = "jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask"

def splash_shape_reason(workload) -> str | None:
    """Why splash attention with default 128 tiles cannot run ``workload``."""
    for what, length in (("query", workload.seq_q), ("kv", workload.seq_k)):
        if length % BLOCK:
            return (f"{what} length must be a multiple of the {BLOCK} block (got {length}; "
                    "_process_mask: block size should divide the sequence length)")
    return None


def head_mask(seq_q: int, seq_k: int, causal: bool, window: int | None = None):
    """Splash's mask for one head; ``LocalMask`` left ``W - 1``, right 0 is the last W keys."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    offset = seq_k - seq_q
    if window is not None:  # causal only (Workload checks it): right = 0 is the causal edge
        return masks.LocalMask((seq_q, seq_k), window_size=(window - 1, 0), offset=offset)
    if causal:
        return masks.CausalMask((seq_q, seq_k), offset=offset)
    return masks.FullMask((seq_q, seq_k))


@functools.lru_cache(maxsize=64)
def _kernel(seq_q: int, seq_k: int, q_heads: int, causal: bool, window: int | None,
            softcap: float | None, interpret: bool, config=SEARCH_SPACE.defaults):
    """One splash kernel per mask and shape (building the mask info is host work: cache it).

    Built under ``ensure_compile_time_eval``: a cached kernel holding tracers would leak them.
    """
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha_single_device(
            masks.MultiHeadMask([head_mask(seq_q, seq_k, causal, window)] * q_heads),
            block_sizes=block_sizes(seq_q, seq_k, config), attn_logits_soft_cap=softcap, interpret=interpret)


def tiles(config, seq_q: int, seq_k: int) -> dict:
    """Each knob's tile at these lengths (``config``: every knob, ``AttentionImpl.config_now``)."""
    return fitted_tiles(config, {"block_q": seq_q, "block_kv": seq_k, "block_q_bwd": seq_q,
                                 "block_kv_bwd": seq_k}, within={"block_kv_compute": "block_kv"})


def block_sizes(seq_q: int, seq_k: int, config=SEARCH_SPACE.defaults):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    t = tiles(config, seq_q, seq_k)
    tq, tk = t["block_q_bwd"], t["block_kv_bwd"]
    return splash.BlockSizes(block_q=t["block_q"], block_kv=t["block_kv"],
                             block_kv_compute=t["block_kv_compute"], block_q_dkv=tq, block_kv_dkv=tk,
                             block_kv_dkv_compute=tk, block_q_dq=tq, block_kv_dq=tk)


@register
class JaxPallasTpuSplash(AttentionImpl):
    name = "jax-pallas-tpu-splash"
    framework = "jax"
    designed_for = frozenset({"tpu"})
    is_flash = True
    requires_modules = ("jax.experimental.pallas.ops.tpu.splash_attention",)
    public_calls = {
        f"{KERNEL}:make_splash_mha_single_device": (
            "block_sizes", "attn_logits_soft_cap", "interpret"),
        f"{KERNEL}:BlockSizes": (
            "block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute",
            "block_q_dq", "block_kv_dq"),
        f"{KERNEL}:SegmentIds": ("q", "kv"),
        f"{MASKS}:MultiHeadMask": (),
        f"{MASKS}:CausalMask": ("offset",),
        f"{MASKS}:LocalMask": ("window_size", "offset"),
        f"{MASKS}:FullMask": (),
    }
    summary = ("Pallas TPU splash attention (make_splash_mha_single_device, 512/256/128 tiles by "
               "default, BlockSizes tuned on the compile targets; block-sparse causal/local mask); "
               "Pallas interpreter off-TPU")
    search_space = SEARCH_SPACE
    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "native"  # kv head h // q_heads_per_kv_head in the kernel's index maps, no repeat
    platform_support = {
        "cpu": interpret_only(INTERPRETER),
        "gpu": interpret_only(f"{INTERPRETER}; the Mosaic TPU kernel has no GPU lowering "
                              "(not verified on a GPU here)"),
        "tpu": RUNS,
    }

    def shape_reason(self, workload, platform):
        return splash_shape_reason(workload)

    def config_reason(self, config, workload):
        lengths = {"block_q": ("queries", workload.seq_q), "block_kv": ("keys", workload.seq_k),
                   "block_kv_compute": ("keys", workload.seq_k)}
        if workload.mode == "fwd_bwd":
            lengths.update(block_q_bwd=("queries", workload.seq_q), block_kv_bwd=("keys", workload.seq_k))
        return divides_reason(config, lengths, within={"block_kv_compute": "block_kv"})

    def attention(self, q, k, v, *, causal, scale, window=None, softcap=None, q_segment_ids=None,
                  kv_segment_ids=None):
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

        seq_q, q_heads = q.shape[1], q.shape[2]
        kernel = _kernel(seq_q, k.shape[1], q_heads, causal, window, softcap, jax_platform() != "tpu",
                         self.config_now)
        # Splash takes [H, S, D] per example and has no scale argument: scale q (in float32).
        qs = (q.astype(jnp.float32) * scale).astype(q.dtype).transpose(0, 2, 1, 3)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        if q_segment_ids is None:
            out = jax.vmap(kernel)(qs, k, v)
        else:  # SegmentIds per example ([Sq], [Sk]): mapped over the batch with q, k, v
            out = jax.vmap(lambda q, k, v, q_ids, kv_ids: kernel(
                q, k, v, segment_ids=splash.SegmentIds(q=q_ids, kv=kv_ids)))(
                    qs, k, v, q_segment_ids, kv_segment_ids)
        return out.transpose(0, 2, 1, 3)
