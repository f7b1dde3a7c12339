"""Every kernel under every mask: it agrees with the float64 reference or refuses with the reason.

The masks (``attnbench.core.masks``): sliding windows, packed documents (segment ids), logit
soft-capping, their combination, and decode against a ragged KV cache, with grouped-query heads.
A kernel either matches the reference within its dtype's tolerance through the conformance entry
point (``run_numpy`` / ``grad_numpy`` with ``window``, ``q_segment_ids``, ``kv_segment_ids``,
``softcap``) or raises ``Unsupported``; a feature it does not take is refused by a reason that
names the feature.
"""

from __future__ import annotations

import numpy as np
import pytest

import attention_impls
from attention_impls.base import MASK_FEATURES, Unsupported
from attention_impls.reference_float64 import attention_fwd, attention_grads
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.numerics import GRAD_SLACK, compare
from attnbench.core.workload import Workload
from tests.conftest import impls_under_test, mask_of

# Small shapes: Pallas TPU kernels run here in an interpreter. A cap of 2 bends most scores.
MASKED = {
    "window": Workload(batch=1, q_heads=2, seq_q=256, head_dim=64, causal=True, window=64),
    "documents": Workload(batch=2, q_heads=2, seq_q=256, head_dim=64, causal=True, documents=3),
    "softcap": Workload(batch=1, q_heads=2, seq_q=128, head_dim=64, causal=True, softcap=2.0),
    "encoder-documents": Workload(batch=1, q_heads=2, seq_q=256, head_dim=64, documents=2),
    "gqa-window-documents-softcap": Workload(batch=1, q_heads=4, kv_heads=2, seq_q=256, head_dim=64,
                                             causal=True, window=96, documents=2, softcap=2.0),
    "decode-ragged": Workload(batch=3, q_heads=4, kv_heads=1, seq_q=1, seq_k=256, head_dim=64,
                              causal=True, ragged=True),
    "decode-few-ragged": Workload(batch=2, q_heads=4, kv_heads=2, seq_q=4, seq_k=256, head_dim=64,
                                  causal=True, ragged=True),
    "decode-window-bf16": Workload(batch=2, q_heads=4, kv_heads=2, seq_q=1, seq_k=256, head_dim=64,
                                   causal=True, window=128, dtype="bfloat16"),
}
# What a refusal must mention, per feature it is about.
FEATURE_WORDS = {"window": "window", "softcap": "soft", "segment_ids": "segment"}


def _run_or_skip(impl, workload):
    reason = here.check(impl, workload)
    if reason:
        pytest.skip(f"{impl.name} cannot run {workload.describe()} here: {reason}")


@pytest.mark.parametrize("case", MASKED)
@pytest.mark.parametrize("name", impls_under_test())
def test_masked_forward_matches_reference_or_is_refused(name, case):
    impl, workload = attention_impls.get(name), MASKED[case]
    x = make_inputs(workload, seed=3)
    mask = mask_of(workload, x)
    if here.check(impl, workload):
        with pytest.raises(Unsupported):
            here.run_numpy(impl, x.q, x.k, x.v, causal=workload.causal, **mask)
        pytest.skip(f"{name} refuses {workload.describe()} here: {here.check(impl, workload)}")
    out = here.run_numpy(impl, x.q, x.k, x.v, causal=workload.causal, **mask)
    assert out.shape == workload.q_shape
    result = compare(out, attention_fwd(x.q, x.k, x.v, causal=workload.causal, **mask), workload.dtype)
    assert result.finite and result.ok, f"{name} {case}: {result.describe()}"


@pytest.mark.parametrize("case", ["window", "documents", "gqa-window-documents-softcap"])
@pytest.mark.parametrize("name", impls_under_test())
@pytest.mark.slow
def test_masked_gradients_match_reference(name, case):
    impl, workload = attention_impls.get(name), MASKED[case].replace(mode="fwd_bwd")
    _run_or_skip(impl, workload)
    x = make_inputs(workload, seed=4)
    mask = mask_of(workload, x)
    grads = here.grad_numpy(impl, x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
    expected = attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
    for label, got, want in zip("qkv", grads, expected, strict=True):
        result = compare(got, want, workload.dtype, slack=GRAD_SLACK)
        assert result.finite and result.ok, f"{name} {case} d{label}: {result.describe()}"


@pytest.mark.parametrize("name", attention_impls.names())
def test_declared_features_and_refusals_name_the_feature(name):
    impl = attention_impls.get(name)
    assert impl.supports <= set(MASK_FEATURES), f"{name} declares unknown features"
    assert impl.gqa in ("native", "repeated", "refused")
    one_feature = {"window": Workload(seq_q=256, causal=True, window=32),
                   "softcap": Workload(seq_q=256, causal=True, softcap=30.0),
                   "segment_ids": Workload(seq_q=256, causal=True, documents=2)}
    for feature, workload in one_feature.items():
        reason = impl.feature_reason(workload)
        if feature in impl.supports:
            assert reason is None
        else:
            assert reason and FEATURE_WORDS[feature] in reason.lower(), f"{name}: {reason!r}"


@pytest.mark.parametrize("name", impls_under_test())
@pytest.mark.slow
def test_the_timed_step_takes_the_mask(name):
    """make_step runs the masked workload the conformance path checked, and its record says so."""
    from attnbench.measure.engine import Options
    from tests.cases import measure

    workload = MASKED["decode-ragged"]
    impl = attention_impls.get(name)
    _run_or_skip(impl, workload)
    record = measure(name, workload, Options(min_seconds=0.01, max_extra_seconds=0.0))
    assert record["status"] == "ok", record["reason"]
    assert record["numerics_ok"] is True
    assert record["phase"] == "decode" and record["mask"] == "causal+ragged-cache"
    assert record["gqa"] == impl.gqa
    assert record["flops"] == 4 * 64 * 4 * sum(workload.cache_lengths())


def test_a_mask_with_an_empty_row_is_refused_by_name():
    x = make_inputs(Workload(batch=1, q_heads=1, seq_q=8, head_dim=8, causal=True))
    q_ids = np.zeros((1, 8), dtype=np.int32)
    kv_ids = np.ones((1, 8), dtype=np.int32)
    with pytest.raises(ValueError, match="no visible key"):
        here.run_numpy(attention_impls.get("reference-float64"), x.q, x.k, x.v, causal=True,
                                                           q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    with pytest.raises(ValueError, match="both or neither"):
        here.run_numpy(attention_impls.get("reference-float64"), x.q, x.k, x.v, causal=True,
                       q_segment_ids=q_ids)
    with pytest.raises(ValueError, match="window needs causal"):
        here.run_numpy(attention_impls.get("reference-float64"), x.q, x.k, x.v, causal=False, window=4)
    with pytest.raises(ValueError, match="softcap must be a positive"):
        here.run_numpy(attention_impls.get("reference-float64"), x.q, x.k, x.v, causal=True, softcap=0.0)
