"""The decode kernels: ``jax-pallas-gpu-decode`` and ``jax-pallas-tpu-ragged-paged``.

Both take only the decode phase (a few queries against a KV cache) and refuse the rest by name.
The GPU decode kernel runs here in Pallas' HLO interpreter and must agree with the float64
reference. The ragged paged kernel has no interpreter that runs it on a CPU (its ``CPU_NOTE``), so
here its refusals are checked, and the layout ``attention`` builds for it (pages, rolled left
padding, kv_lens, packed queries, padded head_dim) is fed to the library's own
``ref_ragged_paged_attention``, which shares the kernel's mask (``row - sliding_window >= col``
masked, ``soft_cap * tanh(s / soft_cap)`` before it): that checks our conventions against
``attnbench.core.masks``. Small shapes: kv 256, 4 heads.
"""

from __future__ import annotations

import numpy as np
import pytest

import attention_impls
from attention_impls.base import Unsupported
from attention_impls.reference_float64 import attention_fwd
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.numerics import compare
from attnbench.core.workload import Workload
from tests.conftest import FRAMEWORKS, mask_of

pytestmark = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax is not under test in this run")

GPU_DECODE = "jax-pallas-gpu-decode"
RAGGED_PAGED = "jax-pallas-tpu-ragged-paged"
DECODE = dict(q_heads=4, seq_k=256, head_dim=64, causal=True)
GPU_CASES = {
    "mha": Workload(batch=2, seq_q=1, **DECODE),
    "mha-not-causal": Workload(batch=2, seq_q=1, **{**DECODE, "causal": False}),
    "gqa-ragged": Workload(batch=3, seq_q=1, kv_heads=2, ragged=True, **DECODE),
    "mqa-ragged-window": Workload(batch=3, seq_q=1, kv_heads=1, ragged=True, window=100, **DECODE),
    "gqa-window-bf16": Workload(batch=2, seq_q=1, kv_heads=2, window=128, dtype="bfloat16", **DECODE),
}
PAGED_CASES = {
    **GPU_CASES,
    "few-ragged": Workload(batch=2, seq_q=4, kv_heads=2, ragged=True, **DECODE),
    "few-ragged-window-softcap": Workload(batch=3, seq_q=4, kv_heads=2, ragged=True, window=50,
                                          softcap=2.0, **DECODE),
    "few-window-short-cache": Workload(batch=2, seq_q=3, kv_heads=2, window=60,
                                       **{**DECODE, "seq_k": 200}),  # 200 keys: a partial last page
    "softcap-bf16": Workload(batch=2, seq_q=1, kv_heads=1, softcap=5.0, dtype="bfloat16", **DECODE),
}
PREFILL = Workload(batch=1, q_heads=4, seq_q=256, head_dim=64, causal=True)
REFUSED = {
    "prefill": (PREFILL, "decode kernel"),
    "training": (Workload(batch=1, q_heads=4, seq_q=1, seq_k=256, head_dim=64, mode="fwd_bwd"),
                 "decode kernel"),
    "documents": (PREFILL.replace(documents=2), "segment ids"),
}


# -- jax-pallas-gpu-decode ------------------------------------------------------------------------
@pytest.mark.parametrize("case", GPU_CASES)
def test_gpu_decode_matches_the_reference(case):
    impl, workload = attention_impls.get(GPU_DECODE), GPU_CASES[case]
    assert here.check(impl, workload) is None
    x = make_inputs(workload, seed=5)
    mask = mask_of(workload, x)
    out = here.run_numpy(impl, x.q, x.k, x.v, causal=workload.causal, **mask)
    result = compare(out, attention_fwd(x.q, x.k, x.v, causal=workload.causal, **mask), workload.dtype)
    assert result.finite and result.ok, f"{case}: {result.describe()}"


def test_gpu_decode_padding_is_the_keys_outside_the_query_segment():
    """start_idx counts the leading keys whose id is not the query's, whatever the ids are."""
    impl = attention_impls.get(GPU_DECODE)
    x = make_inputs(Workload(batch=2, seq_q=1, kv_heads=2, **DECODE), seed=6)
    q_ids = np.full((2, 1), 5, np.int32)
    kv_ids = np.full((2, 256), 5, np.int32)
    kv_ids[0, :40], kv_ids[1, :200] = 7, 7
    out = here.run_numpy(impl, x.q, x.k, x.v, causal=True, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    want = attention_fwd(x.q, x.k, x.v, causal=True, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    assert compare(out, want, "float32").ok


@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("name", [GPU_DECODE, RAGGED_PAGED])
def test_decode_kernels_refuse_other_phases_and_documents(name, case):
    workload, words = REFUSED[case]
    reason = attention_impls.get(name).shape_reason(workload, "tpu" if name == RAGGED_PAGED else "gpu")
    assert reason and words in reason, reason


def test_gpu_decode_refuses_what_it_cannot_take_by_name():
    impl = attention_impls.get(GPU_DECODE)
    reasons = {
        "seq_q": Workload(batch=1, seq_q=4, **DECODE),
        "soft": Workload(batch=1, seq_q=1, softcap=5.0, **DECODE),
        "k_splits": Workload(batch=1, seq_q=1, **{**DECODE, "seq_k": 200}),
        "head_dim": Workload(batch=1, seq_q=1, **{**DECODE, "head_dim": 48}),
    }
    for word, workload in reasons.items():
        reason = here.check(impl, workload)
        assert reason and word in reason, (word, reason)
        x = make_inputs(workload)
        with pytest.raises(Unsupported):
            here.run_numpy(impl, x.q, x.k, x.v, causal=True, **mask_of(workload, x))
    assert impl.gqa == "native" and impl.supports == {"window", "segment_ids"}


@pytest.mark.slow
def test_gpu_decode_timed_step_is_ok_and_checked():
    from attnbench.measure.engine import Options
    from tests.cases import measure

    workload = GPU_CASES["gqa-ragged"]
    record = measure(GPU_DECODE, workload, Options(min_seconds=0.01, max_extra_seconds=0.0))
    assert record["status"] == "ok", record["reason"]
    assert record["numerics_ok"] is True
    assert record["phase"] == "decode" and record["gqa"] == "native"
    assert record["execution"] == "interpret"


# -- jax-pallas-tpu-ragged-paged --------------------------------------------------------------------
@pytest.mark.parametrize("case", PAGED_CASES)
@pytest.mark.slow
def test_ragged_paged_layout_through_the_library_reference(case):
    """Our pages, kv_lens and packed queries, run by ``ref_ragged_paged_attention``, give the
    float64 reference's answer under attnbench.core.masks' window, soft cap and ragged padding."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

    from attention_impls.jax_pallas_tpu_ragged_paged import paged_inputs, valid_lengths

    workload = PAGED_CASES[case]
    if not workload.causal and workload.seq_q > 1:
        pytest.skip("the kernel is always causal")
    assert attention_impls.get(RAGGED_PAGED).shape_reason(workload, "tpu") is None
    x = make_inputs(workload, seed=7)
    mask = mask_of(workload, x)
    lengths = None
    if workload.segmented:
        lengths = valid_lengths(jnp.asarray(x.q_segment_ids), jnp.asarray(x.kv_segment_ids))
        assert list(np.asarray(lengths)) == list(workload.cache_lengths())
    args = paged_inputs(jnp.asarray(x.q), jnp.asarray(x.k), jnp.asarray(x.v), lengths)
    assert args[0].shape[-1] % 128 == 0 and args[1].shape[-2] == 2 * workload.kv_heads
    out = ref_ragged_paged_attention(*args, sm_scale=workload.head_dim ** -0.5,
                                     sliding_window=workload.window, soft_cap=workload.softcap)
    out = np.asarray(out.reshape(workload.q_shape[:3] + (-1,))[..., :workload.head_dim], np.float64)
    result = compare(out, attention_fwd(x.q, x.k, x.v, causal=workload.causal, **mask), workload.dtype)
    assert result.finite and result.ok, f"{case}: {result.describe()}"


def test_ragged_paged_refusals_name_what():
    from attention_impls.jax_pallas_tpu_ragged_paged import CPU_NOTE

    impl = attention_impls.get(RAGGED_PAGED)
    assert impl.shape_reason(Workload(batch=1, seq_q=4, **{**DECODE, "causal": False}), "tpu") \
        .startswith("its mask is always causal")
    odd_heads = Workload(batch=1, seq_q=1, **{**DECODE, "q_heads": 3, "kv_heads": 3})
    assert "cannot be tiled" in impl.shape_reason(odd_heads, "tpu")
    assert impl.gqa == "native" and impl.supports == {"window", "softcap", "segment_ids"}
    if here.platform(impl) == "cpu":  # no interpreter runs it: refused, with why
        workload = PAGED_CASES["few-ragged"]
        assert here.check(impl, workload) == CPU_NOTE
        x = make_inputs(workload)
        with pytest.raises(Unsupported, match="no Pallas interpreter runs it"):
            here.run_numpy(impl, x.q, x.k, x.v, causal=True, **mask_of(workload, x))


def test_ragged_paged_tiles_follow_the_tuned_table_else_fit_vmem(monkeypatch):
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes

    from attention_impls._compile_target import compiling_for
    from attention_impls.jax_pallas_tpu_ragged_paged import KV_BLOCK_BUDGET, block_sizes

    # 32 q heads over 8 kv heads in bf16, D128, pages of 256 keys (a 4096-key cache), 8 tokens:
    # a double-buffered page of 16 interleaved heads is 2 MiB, so the budget takes 4 pages.
    shape = dict(q_heads=32, kv_heads=8, head_dim=128, dtype=jnp.bfloat16, page_size=256, tokens=8,
                 pages_per_seq=16)
    with compiling_for("tpu", name="tpu-v5e"):
        assert block_sizes(**shape) == (KV_BLOCK_BUDGET // (2 * 256 * 16 * 128 * 2), 8) == (4, 8)
        key = tuned_block_sizes.simplify_key((jnp.bfloat16, jnp.bfloat16, 32, 8, 128, 256, 8, 16))
        monkeypatch.setitem(tuned_block_sizes.TUNED_BLOCK_SIZES, "TPU v5", {key: (16, 64)})
        assert block_sizes(**shape) == (16, 8)  # a tuned entry is taken as is (clipped to the shape)
    with compiling_for("tpu", name="tpu-v6e"):
        assert block_sizes(**shape) == (4, 8)


def test_ragged_paged_timed_path_where_it_runs():
    from attnbench.measure.engine import Options
    from tests.cases import measure

    workload = PAGED_CASES["few-ragged"]
    reason = here.check(attention_impls.get(RAGGED_PAGED), workload)
    if reason:
        pytest.skip(f"{RAGGED_PAGED} does not run here: {reason}")
    record = measure(RAGGED_PAGED, workload, Options(min_seconds=0.01, max_extra_seconds=0.0))
    assert record["status"] == "ok", record["reason"]
    assert record["numerics_ok"] is True
