"""Pallas TPU splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``).

``make_splash_mha_single_device`` with the largest of 512/256/128 tiles dividing each length (jax's
``BlockSizes.get_default()`` is 128 everywhere, "TODO: select better parameters"; the same choice
as ``jax-pallas-tpu-flash``), one kernel per (mask, shape, soft cap), ``vmap``-ed over the batch as
jax's own tests do. Splash has no softmax-scale argument, so q is scaled before the call.

Mask features, all the kernel's own (``splash_attention_kernel`` / ``splash_attention_mask``):

- causal: ``CausalMask(offset=seq_k - seq_q)`` (its rule is ``q + offset >= kv``: exactly our
  bottom-right alignment), else ``FullMask``;
- sliding window: ``LocalMask(window_size=(W - 1, 0), offset=seq_k - seq_q)``, which keeps
  ``q + offset - left <= kv <= q + offset + right``, i.e. ``p - W < j <= p`` with ``p`` the
  bottom-right aligned position (its block-sparse mask info skips the tiles outside the band);
- segment ids: the kernel call's ``segment_ids=SegmentIds(q=[Sq], kv=[Sk])``, per example (the
  batch ``vmap`` maps them with q, k, v), traced arrays; the mask object stays static;
- logit soft-capping: ``attn_logits_soft_cap`` (``tanh(logits / cap) * cap`` on the logits, which
  are the scaled scores since q is pre-scaled), in the forward and both backward kernels.

GQA is native: the multi-head form takes k, v with fewer heads and its index maps read kv head
``h // q_heads_per_kv_head`` for query head ``h`` (the backward dkv kernel accumulates over the
group); no repeat. (``make_splash_mqa`` is the one-kv-head special case of the same kernel.)

Off a TPU it runs with ``interpret=True``: Pallas's HLO interpreter turns the kernel body into plain
XLA ops looped over the grid (``pallas_call_hlo_interpret``), a lowering that exists on every
backend; so it is interpret-only on CPU and GPU. Shape rules are from ``_splash_attention_forward``
/ ``_splash_attention_bwd_dkv`` and ``splash_attention_mask_info._process_mask``.
"""

from __future__ import annotations

import functools

from attention_impls.base import RUNS, AttentionImpl, interpret_only
from attention_impls.jax_pallas_tpu_flash import tile
from attention_impls.registry import register

BLOCK = 128  # BlockSizes.get_default(): block_q = block_kv = block_kv_compute = 128 (and backward)
INTERPRETER = "Pallas HLO interpreter (interpret=True): the kernel body as plain XLA ops per grid step"


def splash_shape_reason(workload) -> str | None:
    """Why splash attention with default 128 tiles cannot run ``workload``."""
    for what, length in (("query", workload.seq_q), ("kv", workload.seq_k)):
        if length % BLOCK:
            return (f"{what} length must be a multiple of the {BLOCK} block (got {length}; "
                    "_process_mask: block size should divide the sequence length)")
    return None


def head_mask(seq_q: int, seq_k: int, causal: bool, window: int | None = None):
    """Splash's mask for one head: ``CausalMask`` keeps ``q + offset >= kv``, so the offset
    ``seq_k - seq_q`` gives our bottom-right alignment (query i sees keys j <= i + seq_k - seq_q);
    ``LocalMask`` keeps ``q + offset - left <= kv <= q + offset + right``: left ``W - 1``, right 0
    is the last W keys up to and including the query's position."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    offset = seq_k - seq_q
    if window is not None:  # causal only (Workload checks it): right = 0 is the causal edge
        return masks.LocalMask((seq_q, seq_k), window_size=(window - 1, 0), offset=offset)
    if causal:
        return masks.CausalMask((seq_q, seq_k), offset=offset)
    return masks.FullMask((seq_q, seq_k))


@functools.lru_cache(maxsize=64)
def _kernel(seq_q: int, seq_k: int, q_heads: int, causal: bool, window: int | None,
            softcap: float | None, interpret: bool):
    """One splash kernel per mask and shape (building the mask info is host work: cache it).

    Built under ``ensure_compile_time_eval`` so that its mask-info arrays are concrete even when
    the first call happens inside a trace; a cached kernel holding tracers would leak them.
    """
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha_single_device(
            masks.MultiHeadMask([head_mask(seq_q, seq_k, causal, window)] * q_heads),
            block_sizes=block_sizes(seq_q, seq_k), attn_logits_soft_cap=softcap, interpret=interpret)


def block_sizes(seq_q: int, seq_k: int):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    tq, tk = tile(seq_q), tile(seq_k)
    return splash.BlockSizes(block_q=tq, block_kv=tk, block_kv_compute=tk, block_q_dkv=tq,
                             block_kv_dkv=tk, block_kv_dkv_compute=tk, block_q_dq=tq, block_kv_dq=tk)


@register
class JaxPallasTpuSplash(AttentionImpl):
    name = "jax-pallas-tpu-splash"
    framework = "jax"
    designed_for = frozenset({"tpu"})
    is_flash = True
    requires_modules = ("jax.experimental.pallas.ops.tpu.splash_attention",)
    summary = ("Pallas TPU splash attention (make_splash_mha_single_device, 512/256/128 tiles, "
               "block-sparse causal/local mask); Pallas interpreter off-TPU")
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

    def attention(self, q, k, v, *, causal, scale, window=None, softcap=None, q_segment_ids=None,
                  kv_segment_ids=None):
        import jax
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

        seq_q, q_heads = q.shape[1], q.shape[2]
        kernel = _kernel(seq_q, k.shape[1], q_heads, causal, window, softcap, self.platform() != "tpu")
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
