"""Support checks of the jax kernels on this CPU machine: what runs, how, and each refusal rule.

The rules are the kernels' own (jax source); each refusal test names the rule it pins, and the
tests that call a kernel directly show that a refused case really is one the kernel rejects or
gets wrong, so the rule is not a guess.
"""

from __future__ import annotations

import numpy as np
import pytest

import attention_impls
from attention_impls.base import FORCED_FLASH, NATIVE, Unsupported
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.workload import Workload
from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")

CUDNN, TPU_FLASH, SPLASH, GPU_MHA, BLOCKWISE = (
    "jax-cudnn", "jax-pallas-tpu-flash", "jax-pallas-tpu-splash", "jax-pallas-gpu-mha",
    "jax-blockwise-flash")
OURS = (CUDNN, TPU_FLASH, SPLASH, GPU_MHA, BLOCKWISE)

BASE = Workload(batch=1, q_heads=2, seq_q=256, head_dim=64)


def impl(name):
    return attention_impls.get(name)


# -- what runs here, and how ------------------------------------------------------------------------
def test_this_machine_is_a_cpu_for_jax():
    assert all(here.platform(impl(n)) == "cpu" for n in OURS)


@pytest.mark.parametrize("name, status, execution", [
    (CUDNN, "unsupported", "compiled"),
    (TPU_FLASH, "interpret-only", "interpret"),
    (SPLASH, "interpret-only", "interpret"),
    (GPU_MHA, "interpret-only", "interpret"),
    (BLOCKWISE, "runs", "compiled"),
])
def test_cpu_support_and_execution(name, status, execution):
    assert impl(name).platform_support["cpu"].status == status
    assert impl(name).execution("cpu") == execution


@pytest.mark.parametrize("name", [TPU_FLASH, SPLASH, GPU_MHA, BLOCKWISE])
def test_runnable_kernels_accept_a_plain_workload_here(name):
    assert here.check(impl(name), BASE) is None
    assert here.check(impl(name), BASE.replace(mode="fwd_bwd", causal=True)) is None


def test_interpret_only_notes_say_which_interpreter():
    assert "force_tpu_interpret_mode" in impl(TPU_FLASH).platform_support["cpu"].note
    assert "interpret=True" in impl(SPLASH).platform_support["cpu"].note
    assert "interpret=True" in impl(GPU_MHA).platform_support["cpu"].note


@pytest.mark.parametrize("name, gpu, tpu", [
    (CUDNN, "runs", "unsupported"),
    (TPU_FLASH, "unsupported", "runs"),
    (SPLASH, "interpret-only", "runs"),
    (GPU_MHA, "runs", "interpret-only"),
    (BLOCKWISE, "runs", "runs"),
])
def test_accelerator_support_tables(name, gpu, tpu):
    support = impl(name).platform_support
    assert (support["gpu"].status, support["tpu"].status) == (gpu, tpu)
    for platform in ("gpu", "tpu"):
        if support[platform].status != "runs":
            assert support[platform].note, f"{name} on {platform} needs a reason"


@pytest.mark.parametrize("name, cpu, gpu, tpu", [
    (CUDNN, FORCED_FLASH, NATIVE, FORCED_FLASH),
    (TPU_FLASH, FORCED_FLASH, FORCED_FLASH, NATIVE),
    (SPLASH, FORCED_FLASH, FORCED_FLASH, NATIVE),
    (GPU_MHA, FORCED_FLASH, NATIVE, FORCED_FLASH),
    (BLOCKWISE, FORCED_FLASH, NATIVE, FORCED_FLASH),
])
def test_labels(name, cpu, gpu, tpu):
    assert (impl(name).label("cpu"), impl(name).label("gpu"), impl(name).label("tpu")) == (cpu, gpu, tpu)


def test_every_kernel_here_is_flash_and_says_where_it_was_designed():
    assert all(impl(n).is_flash for n in OURS)
    assert {n: impl(n).designed_for_text() for n in OURS} == {
        CUDNN: "gpu", TPU_FLASH: "tpu", SPLASH: "tpu", GPU_MHA: "gpu", BLOCKWISE: "gpu"}


# -- jax-cudnn ------------------------------------------------------------------------------------
CUDNN_CPU_REASON = "cuDNN needs an NVIDIA GPU (jax raises 'cuDNN is not detected.' on CPU)"


def test_cudnn_refuses_cpu_with_its_reason():
    w = BASE.replace(dtype="bfloat16")
    assert here.check(impl(CUDNN), w) == CUDNN_CPU_REASON
    x = make_inputs(w, 0)
    with pytest.raises(Unsupported) as err:
        here.run_numpy(impl(CUDNN), x.q, x.k, x.v, causal=False)
    assert err.value.reason == CUDNN_CPU_REASON and err.value.impl == CUDNN
    with pytest.raises(Unsupported):
        here.make_step(impl(CUDNN), w)


def test_cudnn_reason_matches_what_jax_raises_on_cpu():
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    with pytest.raises(RuntimeError, match="cuDNN is not detected"):
        jax.nn.dot_product_attention(x, x, x, implementation="cudnn")


def test_cudnn_refuses_tpu():
    assert "NVIDIA GPU" in impl(CUDNN).platform_support["tpu"].note


@pytest.mark.parametrize("dtype, ok", [("float32", False), ("bfloat16", True), ("float16", True)])
def test_cudnn_dtype_rule(dtype, ok):
    reason = impl(CUDNN).shape_reason(BASE.replace(dtype=dtype), "gpu")
    assert (reason is None) == ok
    if not ok:
        assert "float16/bfloat16" in reason and dtype in reason


@pytest.mark.parametrize("head_dim, ok", [(64, True), (128, True), (12, False), (192, False)])
def test_cudnn_head_dim_rule_without_hopper(head_dim, ok):
    # No GPU here: the pre-Hopper limit (128) applies.
    reason = impl(CUDNN).shape_reason(BASE.replace(dtype="bfloat16", head_dim=head_dim), "gpu")
    assert (reason is None) == ok
    if not ok:
        assert "multiple of 8 and <= 128" in reason


def test_cudnn_head_dim_limit_follows_compute_capability():
    from attention_impls.jax_cudnn import head_dim_limit

    assert head_dim_limit(None) == 128
    assert head_dim_limit((8, 0)) == 128
    assert head_dim_limit((9, 0)) == 256
    assert head_dim_limit((10, 0)) == 256


def test_cudnn_causal_alignment_rule():
    w = BASE.replace(dtype="bfloat16", seq_q=128, seq_k=256)
    assert impl(CUDNN).shape_reason(w, "gpu") is None  # no mask: any lengths
    reason = impl(CUDNN).shape_reason(w.replace(causal=True), "gpu")
    assert reason is not None and "top-left" in reason
    assert impl(CUDNN).shape_reason(w.replace(causal=True, seq_q=256), "gpu") is None


def test_cudnn_takes_gqa():
    assert impl(CUDNN).shape_reason(BASE.replace(dtype="bfloat16", q_heads=8, kv_heads=2), "gpu") is None


# -- jax-pallas-tpu-flash -------------------------------------------------------------------------
@pytest.mark.parametrize("change, fragment", [
    (dict(seq_q=200, seq_k=200), "multiple of the 128-key block"),
    (dict(seq_q=64, seq_k=128), "at least the 128-row block"),
    (dict(seq_q=128, seq_k=256, causal=True), "top-left"),
    (dict(seq_q=200, seq_k=256, mode="fwd_bwd"), "backward kernels"),
    (dict(head_dim=192), "multiple of 128"),
])
def test_tpu_flash_refusals(change, fragment):
    reason = here.check(impl(TPU_FLASH), BASE.replace(**change))
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("change", [
    dict(seq_q=200, seq_k=256),  # forward: a ragged last query block is allowed (block_q need not divide)
    dict(seq_q=128, seq_k=256),  # cross-length without a mask
    dict(seq_q=384, seq_k=256, mode="fwd_bwd"),
    dict(head_dim=192, seq_q=128, seq_k=128),  # one kv block: the single-step kernel has no head_dim rule
    dict(head_dim=256, causal=True, mode="fwd_bwd"),
])
def test_tpu_flash_accepts(change):
    assert here.check(impl(TPU_FLASH), BASE.replace(**change)) is None


def test_tpu_flash_runs_only_inside_the_tpu_interpreter_here():
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    x = jnp.zeros((1, 1, 128, 64), jnp.float32)
    with pytest.raises(ValueError, match="Only interpret mode is supported on CPU"):
        jax.jit(flash_attention)(x, x, x)
    with impl(TPU_FLASH).trace_context("cpu"):
        assert jax.jit(flash_attention)(x, x, x).shape == x.shape


def test_tpu_flash_top_left_causal_is_not_ours():
    """The refused case really differs: its causal mask at seq_q < seq_k is not bottom-right."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    from attention_impls.reference_float64 import attention_fwd

    w = Workload(batch=1, q_heads=1, seq_q=128, seq_k=256, head_dim=64, causal=True)
    x = make_inputs(w, 0)
    with impl(TPU_FLASH).trace_context("cpu"):
        out = flash_attention(*(jnp.asarray(a).transpose(0, 2, 1, 3) for a in (x.q, x.k, x.v)),
                              causal=True, sm_scale=0.125)
    err = np.abs(np.asarray(out).transpose(0, 2, 1, 3) - attention_fwd(x.q, x.k, x.v, causal=True)).max()
    assert err > 0.1


# -- jax-pallas-tpu-splash ------------------------------------------------------------------------
@pytest.mark.parametrize("change, fragment", [
    (dict(seq_q=200, seq_k=256), "query length must be a multiple of the 128 block"),
    (dict(seq_q=256, seq_k=200), "kv length must be a multiple of the 128 block"),
    (dict(seq_q=64, seq_k=64), "query length must be a multiple of the 128 block"),
])
def test_splash_refusals(change, fragment):
    reason = here.check(impl(SPLASH), BASE.replace(**change))
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("change", [
    dict(q_heads=4, kv_heads=2, causal=True),  # GQA is native (q_heads_per_kv_head)
    dict(q_heads=4, kv_heads=1, mode="fwd_bwd"),
    dict(seq_q=128, seq_k=384, causal=True),  # CausalMask offset gives bottom-right alignment
    dict(seq_q=256, seq_k=128),
])
def test_splash_accepts(change):
    assert here.check(impl(SPLASH), BASE.replace(**change)) is None


@pytest.mark.parametrize("seq_q, seq_k", [(128, 128), (128, 384), (256, 512)])
def test_splash_causal_mask_is_bottom_right(seq_q, seq_k):
    from attention_impls.jax_pallas_tpu_splash import head_mask
    from attention_impls.reference_float64 import causal_mask

    np.testing.assert_array_equal(np.asarray(head_mask(seq_q, seq_k, True)[:, :]),
                                  causal_mask(seq_q, seq_k))
    assert np.asarray(head_mask(seq_q, seq_k, False)[:, :]).all()


# -- jax-pallas-gpu-mha ---------------------------------------------------------------------------
@pytest.mark.parametrize("change, fragment", [
    (dict(q_heads=4, kv_heads=2), "no GQA"),
    (dict(seq_q=200, seq_k=200), "multiple of the 128 block"),
    (dict(seq_q=256, seq_k=384 + 64), "kv length must be a multiple of the 128 block"),
    (dict(seq_q=100, seq_k=100), "power of two"),
    (dict(seq_q=8, seq_k=8), "power of two >= 16"),
    (dict(seq_q=128, seq_k=256, causal=True), "top-left"),
    (dict(seq_q=128, seq_k=256, mode="fwd_bwd"), "equal lengths"),
    (dict(head_dim=8), ">= 16"),
])
def test_gpu_mha_refusals(change, fragment):
    reason = here.check(impl(GPU_MHA), BASE.replace(**change))
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("change", [
    dict(seq_q=64, seq_k=64, causal=True, mode="fwd_bwd"),  # a short power-of-two sequence: one block
    dict(seq_q=128, seq_k=256),  # forward cross-length without a mask
    dict(head_dim=96, causal=True, mode="fwd_bwd"),  # head_dim padded to a power of two in-kernel
])
def test_gpu_mha_accepts(change):
    assert here.check(impl(GPU_MHA), BASE.replace(**change)) is None


def test_gpu_mha_gqa_would_be_silently_wrong():
    """Why GQA is refused: the kernel does not raise, it reads the wrong kv heads."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    from attention_impls.reference_float64 import attention_fwd

    w = Workload(batch=1, q_heads=4, kv_heads=2, seq_q=128, head_dim=64)
    x = make_inputs(w, 0)
    out = mha(jnp.asarray(x.q), jnp.asarray(x.k), jnp.asarray(x.v), None, sm_scale=0.125, interpret=True)
    err = np.abs(np.asarray(out) - attention_fwd(x.q, x.k, x.v, causal=False)).max()
    assert err > 0.1


def test_gpu_mha_backward_length_rule_is_the_kernels():
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    q, kv = jnp.ones((1, 128, 1, 64)), jnp.ones((1, 256, 1, 64))
    assert mha(q, kv, kv, None, interpret=True).shape == q.shape  # forward is fine
    with pytest.raises(ValueError, match="same number of blocks"):
        jax.grad(lambda q: mha(q, kv, kv, None, interpret=True).sum())(q)


# -- jax-blockwise-flash --------------------------------------------------------------------------
@pytest.mark.parametrize("change", [
    dict(q_heads=6, kv_heads=2, causal=True, mode="fwd_bwd"),
    dict(seq_q=77, seq_k=300, causal=True),
    dict(seq_q=300, seq_k=70, head_dim=48),
    dict(seq_q=1, seq_k=1, dtype="float16"),
])
def test_blockwise_takes_any_shape(change):
    assert here.check(impl(BLOCKWISE), BASE.replace(**change)) is None


def test_blockwise_uses_gpu_tiles_and_never_holds_the_score_matrix():
    import jax
    import jax.numpy as jnp

    from attention_impls import torch_blockwise_flash as torch_blockwise
    from attention_impls.jax_blockwise_flash import BLOCK_K, BLOCK_Q, blockwise_attention

    # FlashAttention-2's hdim-64 forward tiles, the same as torch-blockwise-flash
    assert (BLOCK_Q, BLOCK_K) == (128, 128) == (torch_blockwise.BLOCK_Q, torch_blockwise.BLOCK_K)
    seq, heads = 4096, 2
    x = jnp.zeros((1, seq, heads, 64), jnp.float32)
    compiled = jax.jit(lambda q, k, v: blockwise_attention(q, k, v, causal=True, scale=0.125)).lower(
        x, x, x).compile()
    score_bytes = heads * seq * seq * 4
    assert compiled.memory_analysis().temp_size_in_bytes < score_bytes / 8


# -- mask features of the Pallas kernels ------------------------------------------------------------
MGPU = "jax-pallas-mgpu-attention"


def _masked_check(name, workload, seed=0, grads=False):
    """Run ``workload`` through the conformance entry point and compare with the float64 reference."""
    from attention_impls.reference_float64 import attention_fwd, attention_grads
    from attnbench.core.numerics import GRAD_SLACK, compare

    x = make_inputs(workload, seed)
    mask = {k: v for k, v in (("window", workload.window), ("softcap", workload.softcap)) if v is not None}
    if workload.segmented:
        mask.update(q_segment_ids=x.q_segment_ids, kv_segment_ids=x.kv_segment_ids)
    kernel = impl(name)
    assert here.check(kernel, workload) is None, here.check(kernel, workload)
    out = here.run_numpy(kernel, x.q, x.k, x.v, causal=workload.causal, **mask)
    result = compare(out, attention_fwd(x.q, x.k, x.v, causal=workload.causal, **mask), workload.dtype)
    assert result.finite and result.ok, result.describe()
    if grads:
        got = here.grad_numpy(kernel, x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
        want = attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
        for label, g, w in zip("qkv", got, want, strict=True):
            result = compare(g, w, workload.dtype, slack=GRAD_SLACK)
            assert result.finite and result.ok, f"d{label}: {result.describe()}"


@pytest.mark.parametrize("name, supports, gqa", [
    (TPU_FLASH, {"segment_ids"}, "repeated"),
    (SPLASH, {"window", "softcap", "segment_ids"}, "native"),
    (GPU_MHA, {"segment_ids"}, "refused"),
    (MGPU, set(), "native"),
])
def test_pallas_mask_declarations(name, supports, gqa):
    assert impl(name).supports == supports
    assert impl(name).gqa == gqa


@pytest.mark.parametrize("name, workload, words", [
    (TPU_FLASH, BASE.replace(causal=True, window=64), ("window", "flash_attention")),
    (TPU_FLASH, BASE.replace(causal=True, softcap=30.0), ("soft-cap", "flash_attention")),
    (GPU_MHA, BASE.replace(causal=True, window=64), ("window", "mha")),
    (GPU_MHA, BASE.replace(causal=True, softcap=30.0), ("soft-cap", "mha")),
    (MGPU, BASE.replace(causal=True, window=64), ("window", "attention_mgpu")),
    (MGPU, BASE.replace(causal=True, softcap=30.0), ("soft-cap", "attention_mgpu")),
    (MGPU, BASE.replace(causal=True, documents=2), ("segment ids", "attention_mgpu")),
])
def test_pallas_feature_refusals_name_the_feature_and_the_api(name, workload, words):
    reason = impl(name).feature_reason(workload)
    assert reason is not None and all(w in reason for w in words), reason


@pytest.mark.slow
def test_tpu_flash_gqa_runs_with_repeated_kv_heads():
    """Equal head counts only ('Head count mismatch'), so kv heads are repeated before the call."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    q, kv = jnp.zeros((1, 4, 128, 64)), jnp.zeros((1, 2, 128, 64))
    with impl(TPU_FLASH).trace_context("cpu"), pytest.raises(ValueError, match="Head count mismatch"):
        flash_attention(q, kv, kv)
    _masked_check(TPU_FLASH, Workload(batch=1, q_heads=4, kv_heads=2, seq_q=256, head_dim=64, causal=True,
                                      documents=3, mode="fwd_bwd"), grads=True)


@pytest.mark.slow
def test_tpu_flash_segment_ids_across_kv_blocks():
    """Three 128-key blocks (384 is no multiple of 256): ids masked per tile, forward and backward."""
    from attention_impls.jax_pallas_tpu_flash import tile

    assert tile(384) == 128
    _masked_check(TPU_FLASH, Workload(batch=2, q_heads=2, seq_q=384, head_dim=64, causal=True, documents=4,
                                      mode="fwd_bwd"), grads=True)


def test_tpu_flash_ragged_cache_runs_without_causal_and_is_refused_with_it():
    ragged = Workload(batch=2, q_heads=2, seq_q=128, seq_k=256, head_dim=64, ragged=True)
    _masked_check(TPU_FLASH, ragged)
    assert "top-left" in here.check(impl(TPU_FLASH), ragged.replace(causal=True))


@pytest.mark.parametrize("seq_q, seq_k, window", [(128, 128, 1), (128, 384, 100), (256, 256, 300),
                                                  (256, 512, 64)])
def test_splash_local_mask_is_our_bottom_right_window(seq_q, seq_k, window):
    from attention_impls.jax_pallas_tpu_splash import head_mask
    from attnbench.core.masks import dense_mask

    np.testing.assert_array_equal(np.asarray(head_mask(seq_q, seq_k, True, window)[:, :]),
                                  dense_mask(seq_q, seq_k, causal=True, window=window)[0])


@pytest.mark.parametrize("workload", [
    # cross-length window over three 128-key tiles, grouped heads (block-sparse tiles skipped)
    Workload(batch=1, q_heads=4, kv_heads=2, seq_q=128, seq_k=384, head_dim=64, causal=True, window=100),
    # a ragged cache against 128 queries: CausalMask offset and SegmentIds together
    Workload(batch=2, q_heads=2, kv_heads=1, seq_q=128, seq_k=384, head_dim=64, causal=True, ragged=True),
    Workload(batch=2, q_heads=2, seq_q=128, seq_k=256, head_dim=64, ragged=True),
], ids=["cross-window-gqa", "ragged-causal", "ragged-encoder"])
def test_splash_masks_beyond_one_tile(workload):
    _masked_check(SPLASH, workload)


@pytest.mark.slow
def test_splash_window_documents_softcap_gradients_over_several_tiles():
    _masked_check(SPLASH, Workload(batch=1, q_heads=4, kv_heads=1, seq_q=384, head_dim=64, causal=True,
                                   window=64, documents=3, softcap=2.0, mode="fwd_bwd"), grads=True)


def test_splash_softcap_is_the_kernels_own_option():
    from attention_impls.jax_pallas_tpu_splash import _kernel

    assert _kernel(128, 128, 2, True, None, 2.0, True).kwargs["attn_logits_soft_cap"] == 2.0
    assert _kernel(128, 128, 2, True, None, None, True).kwargs["attn_logits_soft_cap"] is None


def test_gpu_mha_refuses_a_ragged_cache_naming_segment_ids():
    for w in (Workload(batch=2, q_heads=2, seq_q=128, seq_k=256, head_dim=64, ragged=True),
              Workload(batch=2, q_heads=2, seq_q=1, seq_k=256, head_dim=64, causal=True, ragged=True)):
        reason = here.check(impl(GPU_MHA), w)
        assert reason is not None and "segment ids" in reason


def test_gpu_mha_one_segment_array_cannot_express_a_ragged_cache():
    """Why it is refused: mha reads its one segment_ids array at the query positions too, so a
    left-padded cache's ids give the first queries the padding's id."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    from attention_impls.reference_float64 import attention_fwd

    w = Workload(batch=1, q_heads=1, seq_q=128, seq_k=256, head_dim=64)
    x = make_inputs(w, 0)
    q_ids = np.zeros((1, 128), np.int32)
    kv_ids = np.r_[np.full(64, -1), np.zeros(192)].astype(np.int32)[None]
    out = mha(jnp.asarray(x.q), jnp.asarray(x.k), jnp.asarray(x.v), jnp.asarray(kv_ids), sm_scale=0.125,
              interpret=True)
    want = attention_fwd(x.q, x.k, x.v, causal=False, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    assert np.abs(np.asarray(out) - want).max() > 0.1


@pytest.mark.slow
def test_gpu_mha_documents_over_two_blocks_forward_and_backward():
    _masked_check(GPU_MHA, Workload(batch=2, q_heads=2, seq_q=256, head_dim=32, causal=True, documents=4,
                                    mode="fwd_bwd"), grads=True)


# -- mask features of the portable kernels (jax-xla, jax-xla-chunked, jax-blockwise-flash) ----------
XLA, CHUNKED = "jax-xla", "jax-xla-chunked"

# Lengths that no tile divides, so padded query rows and padded keys are in play; small tiles, so
# every mask crosses several of them.
SMALL_TILE_MASKS = {
    "decode-window": (Workload(batch=1, q_heads=4, kv_heads=2, seq_q=37, seq_k=150, head_dim=16,
                               causal=True, window=20), {}),
    "documents-causal": (Workload(batch=2, q_heads=2, seq_q=130, head_dim=16, causal=True, documents=4), {}),
    "documents-encoder": (Workload(batch=2, q_heads=2, seq_q=130, head_dim=16, documents=3), {}),
    "ragged-decode": (Workload(batch=3, q_heads=4, kv_heads=1, seq_q=5, seq_k=150, head_dim=16,
                               causal=True, ragged=True), {}),
    "gqa-window-documents-softcap": (Workload(batch=1, q_heads=4, kv_heads=2, seq_q=150, head_dim=16,
                                              causal=True, window=33, documents=3, softcap=1.5), {}),
}


def _small_tile_kernel(name):
    from attention_impls.jax_blockwise_flash import blockwise_attention
    from attention_impls.jax_xla_chunked import chunked_attention

    if name == CHUNKED:
        return lambda q, k, v, **kw: chunked_attention(q, k, v, query_chunk=48, key_chunk=40, **kw)
    return lambda q, k, v, **kw: blockwise_attention(q, k, v, block_q=32, block_k=48, **kw)


def _mask_of(workload, x):
    mask = {key: value for key, value in (("window", workload.window), ("softcap", workload.softcap))
            if value is not None}
    if workload.segmented:
        mask.update(q_segment_ids=x.q_segment_ids, kv_segment_ids=x.kv_segment_ids)
    return mask


@pytest.mark.parametrize("case", SMALL_TILE_MASKS)
@pytest.mark.parametrize("name", [CHUNKED, BLOCKWISE])
@pytest.mark.slow
def test_tiled_kernels_match_the_reference_under_every_mask_across_many_tiles(name, case):
    """Forward and gradients, with tiles far smaller than the sequences: window lower bounds,
    document boundaries and a left-padded cache fall inside and across tiles."""
    import jax
    import jax.numpy as jnp

    from attention_impls.reference_float64 import attention_fwd, attention_grads

    workload = SMALL_TILE_MASKS[case][0]
    x = make_inputs(workload, seed=5)
    mask = _mask_of(workload, x)
    traced = {key: jnp.asarray(value) if key.endswith("segment_ids") else value
              for key, value in mask.items()}
    kernel = _small_tile_kernel(name)

    def run(q, k, v):
        return kernel(q, k, v, causal=workload.causal, scale=0.25, **traced)

    out, vjp = jax.vjp(jax.jit(run), *(jnp.asarray(a) for a in (x.q, x.k, x.v)))
    grads = vjp(jnp.asarray(x.do))
    np.testing.assert_allclose(np.asarray(out), attention_fwd(x.q, x.k, x.v, causal=workload.causal,
                                                              scale=0.25, **mask), atol=2e-5)
    expected = attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal, scale=0.25, **mask)
    for label, got, want in zip("qkv", grads, expected, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, err_msg=f"d{label}")


def _poisoned_value_rows(workload, x, keys):
    """v with NaN at ``keys``: any tile that reads them poisons every row it touches (0 * NaN), so
    a row that stays finite proves the tiles holding those keys were skipped, not masked."""
    v = x.v.copy()
    v[:, keys] = np.nan
    return v


@pytest.mark.parametrize("change, skipped_keys, masked_but_read, rows", [
    # window 64 at S=512, tiles 128: key block 0 is before the window of query blocks 2 and 3;
    # key 130 is outside their rows' windows too, but in block 1, which query block 2 reads.
    (dict(seq_q=512, seq_k=512, window=64), slice(0, 128), 130, slice(256, 512)),
    # decode against a long cache: only the key blocks holding the last 100 keys are read; key 900
    # is outside the window, in the block (896..1023) that is read.
    (dict(seq_q=4, seq_k=1024, window=100), slice(0, 768), 900, slice(0, 4)),
])
@pytest.mark.slow
def test_blockwise_skips_key_blocks_outside_the_window(change, skipped_keys, masked_but_read, rows):
    import jax.numpy as jnp

    from attention_impls.jax_blockwise_flash import blockwise_attention

    w = Workload(batch=1, q_heads=2, head_dim=16, causal=True, **change)
    x = make_inputs(w, 0)

    def out(v):
        return np.asarray(blockwise_attention(jnp.asarray(x.q), jnp.asarray(x.k), jnp.asarray(v),
                                              causal=True, scale=0.25, window=w.window))[:, rows]

    v = _poisoned_value_rows(w, x, skipped_keys)
    assert np.isfinite(out(v)).all()  # those blocks were never read...
    v[:, masked_but_read] = np.nan
    assert not np.isfinite(out(v)).all()  # ...while a masked key in a block that is read poisons


@pytest.mark.slow
def test_blockwise_skips_key_blocks_of_other_documents_and_of_cache_padding():
    import jax.numpy as jnp

    from attention_impls.jax_blockwise_flash import blockwise_attention

    # Two documents cut at a tile boundary (256): the second document's query blocks never read the
    # first document's key blocks, though causal alone would read them.
    w = Workload(batch=1, q_heads=2, seq_q=512, head_dim=16, causal=True)
    x = make_inputs(w, 0)
    ids = np.repeat(np.array([[0, 1]], np.int32), 256, axis=1)
    v = _poisoned_value_rows(w, x, slice(0, 256))
    out = np.asarray(blockwise_attention(jnp.asarray(x.q), jnp.asarray(x.k), jnp.asarray(v), causal=True,
                                         scale=0.25, q_segment_ids=jnp.asarray(ids),
                                         kv_segment_ids=jnp.asarray(ids)))
    assert np.isfinite(out[:, 256:]).all() and not np.isfinite(out[:, :256]).all()

    # A left-padded ragged cache: the padding's key blocks (id -1) meet no query (id 0).
    w = Workload(batch=2, q_heads=2, seq_q=1, seq_k=512, head_dim=16, causal=True)
    x = make_inputs(w, 0)
    kv_ids = np.zeros((2, 512), np.int32)
    kv_ids[:, :384] = -1  # both caches hold the last 128 keys
    v = _poisoned_value_rows(w, x, slice(0, 384))
    out = np.asarray(blockwise_attention(jnp.asarray(x.q), jnp.asarray(x.k), jnp.asarray(v), causal=True,
                                         scale=0.25, q_segment_ids=jnp.zeros((2, 1), jnp.int32),
                                         kv_segment_ids=jnp.asarray(kv_ids)))
    assert np.isfinite(out).all()


def _largest_intermediate(jaxpr) -> int:
    """Elements of the largest value any equation makes, sub-jaxprs (scan, map, cond, custom_vjp)
    included."""
    import jax
    import jax.extend  # not imported by ``import jax``

    def walk(j):
        size = 0
        for eqn in j.eqns:
            for var in eqn.outvars:
                size = max(size, int(np.prod(getattr(var.aval, "shape", ()))))
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        size = max(size, walk(sub.jaxpr))
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        size = max(size, walk(sub))
        return size

    return walk(jaxpr.jaxpr)


@pytest.mark.parametrize("name", [XLA, CHUNKED, BLOCKWISE])
def test_native_gqa_kernels_never_build_kv_with_the_query_heads(name):
    """gqa == "native": no value as large as k repeated to q_heads exists in the traced program."""
    import jax
    import jax.numpy as jnp

    assert impl(name).gqa == "native"
    batch, seq_q, seq_k, q_heads, head_dim = 1, 4, 512, 8, 64
    q = jnp.zeros((batch, seq_q, q_heads, head_dim), jnp.float32)
    kv = jnp.zeros((batch, seq_k, 1, head_dim), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda q, k, v: impl(name).attention(q, k, v, causal=True, scale=0.125))(q, kv, kv)
    assert _largest_intermediate(jaxpr) < batch * seq_k * q_heads * head_dim


def test_xla_takes_window_and_segment_ids_and_refuses_softcap_by_name():
    xla = impl(XLA)
    assert xla.supports == {"window", "segment_ids"}
    assert here.check(xla, BASE.replace(causal=True, window=32, documents=3)) is None
    assert here.check(xla, BASE.replace(seq_q=1, seq_k=256, causal=True, window=32, ragged=True)) is None
    reason = here.check(xla, BASE.replace(causal=True, softcap=30.0))
    assert "soft-cap" in reason and "dot_product_attention" in reason


@pytest.mark.slow
def test_xla_local_window_size_is_top_left_so_decode_takes_the_mask():
    """jax's local_window_size (and is_causal) count query and key positions from 0: at Sq == Sk
    ``(W - 1, 0)`` is our window, at Sq < Sk it is not, which is why decode goes through ``mask``."""
    import jax
    import jax.numpy as jnp

    from attention_impls.reference_float64 import attention_fwd

    for seq_q, seq_k, same in ((64, 64, True), (4, 64, False)):
        w = Workload(batch=1, q_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=16, causal=seq_q == seq_k)
        x = make_inputs(w, 0)
        q, k, v = (jnp.asarray(a) for a in (x.q, x.k, x.v))
        option = jax.nn.dot_product_attention(q, k, v, is_causal=seq_q == seq_k, local_window_size=(7, 0),
                                              scale=0.25, implementation="xla")
        ours = attention_fwd(x.q, x.k, x.v, causal=True, window=8, scale=0.25)
        assert np.allclose(np.asarray(option), ours, atol=1e-5) == same
        kernel = impl(XLA).attention(q, k, v, causal=True, scale=0.25, window=8)
        np.testing.assert_allclose(np.asarray(kernel), ours, atol=1e-5)


@pytest.mark.parametrize("name", [CHUNKED, BLOCKWISE])
def test_tiled_kernels_take_every_feature(name):
    assert impl(name).supports == {"window", "softcap", "segment_ids"}
    assert here.check(impl(name), BASE.replace(q_heads=4, kv_heads=2, causal=True, window=32, documents=3,
                                         softcap=30.0, mode="fwd_bwd")) is None


# -- jax-cudnn's mask features ------------------------------------------------------------------------
GPU_BF16 = BASE.replace(dtype="bfloat16")


def test_cudnn_declares_window_and_segment_ids_and_refuses_softcap_by_name():
    cudnn = impl(CUDNN)
    assert cudnn.supports == {"window", "segment_ids"} and cudnn.gqa == "native"
    reason = cudnn.feature_reason(GPU_BF16.replace(causal=True, softcap=30.0))
    assert "soft-capping" in reason and "jax.nn.dot_product_attention" in reason
    assert cudnn.feature_reason(GPU_BF16.replace(causal=True, window=64, documents=2)) is None


@pytest.mark.parametrize("change, ok, fragments", [
    (dict(causal=True, window=64), True, ()),
    (dict(causal=True, documents=3, mode="fwd_bwd"), True, ()),
    (dict(documents=2), True, ()),
    (dict(seq_q=1, seq_k=256, ragged=True), True, ()),  # non-causal decode: the mask carries it
    (dict(seq_q=1, seq_k=256, causal=True, window=64), False, ("window", "top-left")),
    (dict(seq_q=1, seq_k=256, causal=True, ragged=True), False, ("top-left",)),
    (dict(seq_q=255, seq_k=255, causal=True, documents=3, mode="fwd_bwd"), False, ("segment", "even")),
])
def test_cudnn_mask_rules_on_gpu(change, ok, fragments):
    reason = impl(CUDNN).shape_reason(GPU_BF16.replace(**change), "gpu")
    assert (reason is None) == ok, reason
    for fragment in fragments:
        assert fragment in reason


def test_cudnn_masked_call_is_refused_on_cpu_before_jax_is_called(monkeypatch):
    """On CPU the platform refusal comes first: the cuDNN call is never traced or lowered."""
    cudnn = impl(CUDNN)

    def never(*args, **kwargs):
        raise AssertionError("jax-cudnn's attention was traced on CPU")

    monkeypatch.setattr(type(cudnn), "attention", never)
    w = GPU_BF16.replace(causal=True, window=64, documents=2)
    x = make_inputs(w, 0)
    with pytest.raises(Unsupported) as err:
        here.run_numpy(cudnn, x.q, x.k, x.v, causal=True, window=64, q_segment_ids=x.q_segment_ids,
                        kv_segment_ids=x.kv_segment_ids)
    assert err.value.reason == CUDNN_CPU_REASON
    with pytest.raises(Unsupported):
        here.make_step(cudnn, w)
