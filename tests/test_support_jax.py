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
from attnbench.inputs import make_inputs
from attnbench.workload import Workload
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
    assert all(impl(n).platform() == "cpu" for n in OURS)


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
    assert impl(name).check(BASE) is None
    assert impl(name).check(BASE.replace(mode="fwd_bwd", causal=True)) is None


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
    assert impl(CUDNN).check(w) == CUDNN_CPU_REASON
    x = make_inputs(w, 0)
    with pytest.raises(Unsupported) as err:
        impl(CUDNN).run_numpy(x.q, x.k, x.v, causal=False)
    assert err.value.reason == CUDNN_CPU_REASON and err.value.impl == CUDNN
    with pytest.raises(Unsupported):
        impl(CUDNN).make_step(w)


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
    (dict(q_heads=4, kv_heads=2), "no GQA"),
    (dict(seq_q=200, seq_k=200), "multiple of the 128-key block"),
    (dict(seq_q=64, seq_k=128), "at least the 128-row block"),
    (dict(seq_q=128, seq_k=256, causal=True), "top-left"),
    (dict(seq_q=200, seq_k=256, mode="fwd_bwd"), "backward kernels"),
    (dict(head_dim=192), "multiple of 128"),
])
def test_tpu_flash_refusals(change, fragment):
    reason = impl(TPU_FLASH).check(BASE.replace(**change))
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("change", [
    dict(seq_q=200, seq_k=256),  # forward: a ragged last query block is allowed (block_q need not divide)
    dict(seq_q=128, seq_k=256),  # cross-length without a mask
    dict(seq_q=384, seq_k=256, mode="fwd_bwd"),
    dict(head_dim=192, seq_q=128, seq_k=128),  # one kv block: the single-step kernel has no head_dim rule
    dict(head_dim=256, causal=True, mode="fwd_bwd"),
])
def test_tpu_flash_accepts(change):
    assert impl(TPU_FLASH).check(BASE.replace(**change)) is None


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
    reason = impl(SPLASH).check(BASE.replace(**change))
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("change", [
    dict(q_heads=4, kv_heads=2, causal=True),  # GQA is native (q_heads_per_kv_head)
    dict(q_heads=4, kv_heads=1, mode="fwd_bwd"),
    dict(seq_q=128, seq_k=384, causal=True),  # CausalMask offset gives bottom-right alignment
    dict(seq_q=256, seq_k=128),
])
def test_splash_accepts(change):
    assert impl(SPLASH).check(BASE.replace(**change)) is None


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
    reason = impl(GPU_MHA).check(BASE.replace(**change))
    assert reason is not None and fragment in reason


@pytest.mark.parametrize("change", [
    dict(seq_q=64, seq_k=64, causal=True, mode="fwd_bwd"),  # a short power-of-two sequence: one block
    dict(seq_q=128, seq_k=256),  # forward cross-length without a mask
    dict(head_dim=96, causal=True, mode="fwd_bwd"),  # head_dim padded to a power of two in-kernel
])
def test_gpu_mha_accepts(change):
    assert impl(GPU_MHA).check(BASE.replace(**change)) is None


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
    assert impl(BLOCKWISE).check(BASE.replace(**change)) is None


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
