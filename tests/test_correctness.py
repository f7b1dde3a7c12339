"""Every implementation against the float64 reference: forward and gradients, per dtype tolerance.

A case an implementation cannot run on this machine is skipped with the implementation's own
reason (its support check is tested in test_support.py); everything it can run must match.
"""

from __future__ import annotations

import numpy as np
import pytest

import attention_impls
from attention_impls.reference_float64 import attention_fwd, attention_grads
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.numerics import GRAD_SLACK, compare
from attnbench.core.workload import Workload
from tests.conftest import impls_under_test

# Small shapes: Pallas TPU kernels run here in an interpreter that is ~100x slower than native.
CASES = {
    "plain": Workload(batch=2, q_heads=2, seq_q=128, head_dim=64),
    "causal": Workload(batch=1, q_heads=2, seq_q=256, head_dim=64, causal=True),
    "gqa": Workload(batch=1, q_heads=4, kv_heads=2, seq_q=128, head_dim=64, causal=True),
    "cross-len-causal": Workload(batch=1, q_heads=2, seq_q=128, seq_k=256, head_dim=64, causal=True),
    "cross-len": Workload(batch=1, q_heads=2, seq_q=256, seq_k=128, head_dim=64),
    "odd-len": Workload(batch=1, q_heads=2, seq_q=200, head_dim=32, causal=True),
    "bf16": Workload(batch=1, q_heads=2, seq_q=128, head_dim=64, dtype="bfloat16", causal=True),
}


def _run_or_skip(impl, workload):
    reason = here.check(impl, workload)
    if reason:
        pytest.skip(f"{impl.name} cannot run {workload.describe()} here: {reason}")


def _assert_close(name, actual, expected, dtype, slack=1.0):
    result = compare(actual, expected, dtype, slack=slack)
    assert result.finite, f"{name}: {result.describe()}"
    assert result.ok, f"{name}: {result.describe()} exceeds the {dtype} tolerance"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", impls_under_test())
def test_forward_matches_reference(name, case):
    impl, workload = attention_impls.get(name), CASES[case]
    _run_or_skip(impl, workload)
    x = make_inputs(workload, seed=1)
    out = here.run_numpy(impl, x.q, x.k, x.v, causal=workload.causal)
    assert out.dtype == np.float64 and out.shape == workload.q_shape
    _assert_close(name, out, attention_fwd(x.q, x.k, x.v, causal=workload.causal), workload.dtype)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", impls_under_test())
@pytest.mark.slow
def test_gradients_match_reference(name, case):
    impl, workload = attention_impls.get(name), CASES[case].replace(mode="fwd_bwd")
    _run_or_skip(impl, workload)
    x = make_inputs(workload, seed=2)
    grads = here.grad_numpy(impl, x.q, x.k, x.v, x.do, causal=workload.causal)
    expected = attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal)
    for label, got, want, shape in zip("qkv", grads, expected,
                                       (workload.q_shape, workload.kv_shape, workload.kv_shape), strict=True):
        assert got.shape == shape, f"d{label} has shape {got.shape}, expected {shape}"
        _assert_close(f"{name} d{label}", got, want, workload.dtype, slack=GRAD_SLACK)


@pytest.mark.parametrize("name", impls_under_test())
@pytest.mark.slow
def test_step_runs_each_mode(name):
    """The timed path (make_step) runs the same kernel as the conformance path."""
    impl = attention_impls.get(name)
    for mode in ("fwd", "fwd_bwd"):
        workload = CASES["plain"].replace(mode=mode, batch=1)
        _run_or_skip(impl, workload)
        step = here.make_step(impl, workload, seed=0)
        step.run()
        step.run()
        assert step.execution in ("compiled", "eager", "interpret")
