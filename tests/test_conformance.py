"""The conformance entry point that tests and outside checkers use, for every registered name."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import attention_impls
from attention_impls.base import PLATFORMS, Unsupported
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.workload import Workload
from tests.conftest import impls_under_test

# The kernels this project shipped with: none may disappear. A new kernel needs no edit here.
SHIPPED = {
    "reference-float64", "jax-xla", "jax-cudnn", "jax-pallas-tpu-flash", "jax-pallas-tpu-splash",
    "jax-pallas-gpu-mha", "jax-blockwise-flash", "torch-sdpa-math", "torch-sdpa-flash",
    "torch-sdpa-efficient", "torch-sdpa-cudnn", "torch-flex-attention", "torch-blockwise-flash",
    "torch-xla-sdpa", "torch-xla-pallas-flash", "torch-xla-blockwise-flash",
}


def test_registry_holds_the_whole_set():
    assert SHIPPED <= set(attention_impls.names())


def test_every_kernel_file_is_discovered_and_registers_its_one_kernel():
    package = Path(attention_impls.__file__).parent
    files = {p.stem for p in package.glob("*.py")
             if not p.stem.startswith("_") and p.stem not in ("base", "registry")}
    assert files == {name.replace("-", "_") for name in attention_impls.names()}
    for name in attention_impls.names():
        assert type(attention_impls.get(name)).__module__ == "attention_impls." + name.replace("-", "_")


def test_a_kernel_outside_its_own_file_is_refused():
    from attention_impls.base import AttentionImpl
    from attention_impls.registry import register

    class Misplaced(AttentionImpl):
        name = "jax-somewhere-else"
        framework = "jax"

        def attention(self, q, k, v, *, causal, scale):
            return q

    Misplaced.__module__ = "attention_impls.jax_xla"
    expected = r"must live in attention_impls/jax_somewhere_else.py, not in jax_xla.py"
    with pytest.raises(ValueError, match=expected):
        register(Misplaced)
    assert "jax-somewhere-else" not in attention_impls.names()


def test_each_kernel_declares_how_its_framework_runs_it():
    """``executes`` is the kernel's own word; it must agree with its framework: numpy and torch run
    op by op unless torch.compile builds the kernel (``compiled_by``), jax and torch_xla compile."""
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        compiled = impl.framework in ("jax", "torch_xla") or getattr(impl, "compiled_by", None) is not None
        assert impl.executes == ("compiled" if compiled else "eager"), name
        for platform in PLATFORMS:
            interpreted = impl.platform_support[platform].status == "interpret-only"
            assert impl.execution(platform) == ("interpret" if interpreted else impl.executes)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown implementation 'flash-9000'; known: reference-float64, jax"):
        attention_impls.get("flash-9000")


@pytest.mark.parametrize("name", attention_impls.names())
def test_declarations_are_complete(name):
    impl = attention_impls.get(name)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", impl.name)
    assert impl.framework in ("numpy", "jax", "torch", "torch_xla")
    assert impl.designed_for <= set(PLATFORMS)
    assert impl.summary, "every implementation says what it is"
    assert set(impl.platform_support) == set(PLATFORMS)
    for platform, support in impl.platform_support.items():
        assert support.status in ("runs", "interpret-only", "unsupported")
        if support.status != "runs":
            assert len(support.note) > 10, f"{name} on {platform}: a refusal needs a human reason"
    # forced-flash only ever labels a flash kernel off the hardware it was designed for
    for platform in PLATFORMS:
        forced = impl.label(platform) == attention_impls.FORCED_FLASH
        assert forced == (impl.is_flash and bool(impl.designed_for) and platform not in impl.designed_for)


@pytest.mark.parametrize("name", impls_under_test())
def test_run_numpy_returns_float64_or_raises_unsupported(name):
    impl = attention_impls.get(name)
    w = Workload(batch=1, q_heads=2, seq_q=128, head_dim=64, causal=True)
    x = make_inputs(w, seed=0)
    reason = here.check(impl, w)
    if reason:
        with pytest.raises(Unsupported) as info:
            here.run_numpy(impl, x.q, x.k, x.v, causal=True)
        assert info.value.reason == reason and info.value.impl == name
        assert isinstance(info.value, NotImplementedError)
    else:
        out = here.run_numpy(impl, x.q, x.k, x.v, causal=True)
        assert out.dtype == np.float64 and out.shape == (1, 128, 2, 64)
        assert np.isfinite(out).all()


def test_framework_missing_is_unsupported_with_the_reason():
    """In an environment without a framework, its implementations refuse with an install hint."""
    w = Workload(batch=1, q_heads=2, seq_q=128)
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        missing = here.framework_missing(impl)
        if missing:
            assert here.check(impl, w) == missing
            assert "not installed in this environment" in missing


@pytest.mark.parametrize("name", impls_under_test())
def test_bad_input_names_what_is_wrong(name):
    impl = attention_impls.get(name)
    q = np.zeros((1, 8, 2, 16), np.float32)
    with pytest.raises(ValueError, match="q, k, v must be"):
        here.run_numpy(impl, q[0], q, q, causal=False)
    with pytest.raises(ValueError, match="kv_heads must divide q_heads"):
        here.run_numpy(impl, np.zeros((1, 8, 3, 16), np.float32), q, q, causal=False)
    with pytest.raises(ValueError, match="share a dtype"):
        here.run_numpy(impl, q, q.astype(np.float16), q, causal=False)
    with pytest.raises(ValueError, match="dtype must be one of"):
        here.run_numpy(impl, q.astype(np.float64), q.astype(np.float64), q.astype(np.float64), causal=False)
