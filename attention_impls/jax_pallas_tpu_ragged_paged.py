"""Pallas TPU ragged paged attention (``jax.experimental.pallas.ops.tpu.ragged_paged_attention``).

The kernel TPU serving stacks use for mixed prefill and decode, over a paged KV cache. Our cache
is one contiguous left-padded array, so ``attention`` first builds the kernel's inputs (a layout
copy, not part of the kernel), with head_dim zero-padded to a multiple of 128 as vLLM's TPU
backend does (the kernel broadcasts 128-lane softmax statistics onto head_dim).

No interpreter runs it on a CPU (``CPU_NOTE``), so it only compiles for TPU targets
(docs/compiled-for.md). ``tests/test_decode_kernels.py`` checks the layout against the library's
``ref_ragged_paged_attention``.
"""

from __future__ import annotations

import re

from attention_impls._compile_target import compile_target
from attention_impls.base import RUNS, AttentionImpl, unsupported
from attention_impls.jax_pallas_gpu_decode import DECODE_ONLY
from attention_impls.registry import register

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).

MODULE = "jax.experimental.pallas.ops.tpu.ragged_paged_attention"
LANES = 128  # head_dim is padded to a multiple of this
DEFAULT_BLOCKS = (128, 32)  # get_tuned_block_sizes' (kv pages, queries) per block off its table
V4_BLOCKS = (32, 32)  # ... and on a TPU v4 ("not tuned, only make sure there's no OOM in vmem")
# VMEM for the double-buffered kv block where the table has no entry: half of a v5e's 16 MiB scoped
# default, leaving room for the q/out blocks and the f32 accumulators.
KV_BLOCK_BUDGET = 8 * 2**20
# Why no CPU interpreter can run it (jax 0.10.2).
CPU_NOTE = ("no Pallas interpreter runs it: the TPU interpreter (force_tpu_interpret_mode) has no "
            "ref reshape (\"'ReshapeTransform' object has no attribute 'indices'\", at its DMA'd kv "
            "buffer), and the HLO interpreter (interpret=True) fails discharging its masked stores "
            "(\"'TypedInt' object has no attribute 'shape'\")")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def page_layout(seq_k: int) -> tuple[int, int]:
    """``(page_size, pages_per_seq)``: the library's ``get_min_page_size``, at most 16 pages."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes

    page_size = tuned_block_sizes.get_min_page_size(seq_k)
    return page_size, cdiv(seq_k, page_size)


def tpu_ragged_paged_shape_reason(workload, name: str = "jax-pallas-tpu-ragged-paged") -> str | None:
    """Why the Pallas TPU ragged paged attention kernel cannot run ``workload``."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel

    if workload.packs_documents:
        return ("segment ids of packed documents are not expressible: the kernel takes only each "
                "sequence's cache length (kv_lens), i.e. a ragged cache's padding")
    if workload.phase != "decode":
        return DECODE_ONLY.format(name=name, phase=workload.phase)
    if not workload.causal and workload.seq_q > 1:
        return (f"its mask is always causal (bottom-right per sequence): {workload.seq_q} queries "
                "without a causal mask are not what it computes")
    dtype = jnp.dtype(workload.dtype)
    try:
        kernel.get_min_heads_per_blk(workload.q_heads, 2 * workload.kv_heads, dtype, dtype)
    except ValueError as exc:
        return (f"{workload.kv_heads} kv heads ({2 * workload.kv_heads} interleaved k/v heads) cannot be "
                f"tiled in {workload.dtype} (get_min_heads_per_blk: {exc})")
    return None


def tpu_generation() -> int | None:
    """The TPU generation being compiled for (a compile target's name, ``tpu-v5e`` -> 5) or run on."""
    target = compile_target()
    if target is not None:
        found = re.search(r"v(\d+)", target.name)
        return int(found.group(1)) if found else None
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes

    version = tuned_block_sizes.get_tpu_version()  # from jax.devices()[0].device_kind; -1 off a TPU
    return version if version > 0 else None


def block_sizes(q_heads: int, kv_heads: int, head_dim: int, dtype, page_size: int, tokens: int,
                pages_per_seq: int) -> tuple[int, int]:
    """``(num_kv_pages_per_block, num_queries_per_block)``, as ``get_tuned_block_sizes`` picks them.

    Looked up here because the library asks ``jax.devices()``, the host CPU when compiling ahead of
    time. Off the table the default kv block is capped at ``KV_BLOCK_BUDGET``: with our large pages
    it would exceed scoped VMEM (``CompileTimeScopedVmemOom``).
    """
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel, tuned_block_sizes

    generation = tpu_generation()
    heads_blk, combined_blk = kernel.get_min_heads_per_blk(q_heads, 2 * kv_heads, dtype, dtype)
    key = tuned_block_sizes.simplify_key(
        (dtype, dtype, heads_blk, combined_blk // 2, head_dim, page_size, tokens, pages_per_seq))
    table = tuned_block_sizes.TUNED_BLOCK_SIZES.get(f"TPU v{generation}", {})
    if generation != 4 and key in table:
        kv_pages, queries = table[key]
    else:
        kv_pages, queries = V4_BLOCKS if generation == 4 else DEFAULT_BLOCKS
        page_bytes = 2 * page_size * combined_blk * head_dim * jnp.dtype(dtype).itemsize  # 2 buffers
        kv_pages = max(1, min(kv_pages, KV_BLOCK_BUDGET // page_bytes))
    return min(pages_per_seq, kv_pages), min(tokens, queries)


def paged_inputs(q, k, v, kv_lens=None):
    """The kernel's arguments for our ``[B, S, H, D]`` arrays, head_dim padded to a multiple of 128.

    ``kv_lens`` (int32 ``[B]``, traced): valid keys per left-padded row, rolled to the front;
    ``None``: every row holds ``Sk`` keys.
    """
    import jax.numpy as jnp

    batch, seq_q, q_heads, head_dim = q.shape
    seq_k, kv_heads = k.shape[1], k.shape[2]
    page_size, pages_per_seq = page_layout(seq_k)
    length = page_size * pages_per_seq
    padded_dim = cdiv(head_dim, LANES) * LANES
    if kv_lens is None:
        kv_lens = jnp.full((batch,), seq_k, jnp.int32)
        if length != seq_k:
            k, v = (jnp.pad(x, ((0, 0), (0, length - seq_k), (0, 0), (0, 0))) for x in (k, v))
    else:
        # Row b's keys from its first valid one (position Sk - kv_lens[b]); beyond kv_lens they
        # wrap onto padding, which the kernel never attends to.
        source = (jnp.arange(length)[None, :] + (seq_k - kv_lens)[:, None]) % seq_k
        k, v = (jnp.take_along_axis(x, source[:, :, None, None], axis=1) for x in (k, v))
    if padded_dim != head_dim:
        widen = ((0, 0), (0, 0), (0, 0), (0, padded_dim - head_dim))
        q, k, v = jnp.pad(q, widen), jnp.pad(k, widen), jnp.pad(v, widen)
    # [B, L, Hkv, 2, D] -> pages [B * pages_per_seq, page_size, 2 * Hkv, D]: k at 0::2, v at 1::2.
    kv_pages = jnp.stack([k, v], axis=3).reshape(batch * pages_per_seq, page_size, 2 * kv_heads,
                                                 padded_dim)
    page_indices = jnp.arange(batch * pages_per_seq, dtype=jnp.int32).reshape(batch, pages_per_seq)
    cu_q_lens = jnp.arange(batch + 1, dtype=jnp.int32) * seq_q
    num_seqs = jnp.array([batch], jnp.int32)
    queries = q.reshape(batch * seq_q, q_heads, padded_dim)
    return queries, kv_pages, kv_lens.astype(jnp.int32), page_indices, cu_q_lens, num_seqs


def valid_lengths(q_segment_ids, kv_segment_ids):
    """Each row's valid cache length: its keys with the row's query id (traced arrays)."""
    import jax.numpy as jnp

    return jnp.sum(kv_segment_ids == q_segment_ids[:, :1], axis=1).astype(jnp.int32)


@register
class JaxPallasTpuRaggedPaged(AttentionImpl):
    name = "jax-pallas-tpu-ragged-paged"
    framework = "jax"
    designed_for = frozenset({"tpu"})
    is_flash = True
    requires_modules = (MODULE,)
    public_calls = {
        f"{MODULE}:ragged_paged_attention": (
            "sm_scale", "sliding_window", "soft_cap", "num_kv_pages_per_block", "num_queries_per_block"),
        f"{MODULE}.tuned_block_sizes:get_min_page_size": (),
    }
    # Mosaic's lowering of its integer division asks jax's default device which TPU it is
    # (tpu_info.get_tpu_info): compiling ahead of time, that must be the target's device.
    lowers_on_target_device = True
    summary = ("Pallas TPU ragged paged attention (jax.experimental.pallas.ops.tpu.ragged_paged_attention), "
               "decode against a paged KV cache built from ours (a layout copy); TPU only")
    platform_support = {
        "cpu": unsupported(CPU_NOTE),
        "gpu": unsupported(
            "Mosaic TPU kernel: pallas_call has no GPU lowering for it (Triton/Mosaic GPU cannot "
            "compile TPU VMEM/DMA code), and no Pallas interpreter runs it (as on a CPU)"),
        "tpu": RUNS,
    }
    supports = frozenset({"window", "softcap", "segment_ids"})
    gqa = "native"
    segment_kinds = frozenset({"ragged"})  # kv_lens per sequence: a cache's padding only

    def shape_reason(self, workload, platform):
        return tpu_ragged_paged_shape_reason(workload, self.name)

    def attention(self, q, k, v, *, causal, scale, window=None, softcap=None, q_segment_ids=None,
                  kv_segment_ids=None):
        from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

        del causal  # always causal; refused in shape_reason where that differs
        batch, seq_q, q_heads, head_dim = q.shape
        lengths = None if kv_segment_ids is None else valid_lengths(q_segment_ids, kv_segment_ids)
        args = paged_inputs(q, k, v, lengths)
        page_size, pages_per_seq = page_layout(k.shape[1])
        kv_blocks, q_blocks = block_sizes(q_heads, k.shape[2], args[0].shape[-1], q.dtype, page_size,
                                          batch * seq_q, pages_per_seq)
        out = ragged_paged_attention(*args, sm_scale=scale, sliding_window=window, soft_cap=softcap,
                                     num_kv_pages_per_block=kv_blocks, num_queries_per_block=q_blocks)
        return out.reshape(batch, seq_q, q_heads, -1)[..., :head_dim]
