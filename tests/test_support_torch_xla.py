"""torch_xla implementations: platform detection, support rules and refusal reasons, labels, and
evidence that XLA really compiled and executed the timed step. Runs in .venv-xla (PJRT_DEVICE=CPU)."""

from __future__ import annotations

import pytest

from attnbench.workload import Workload
from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.skipif("torch_xla" not in FRAMEWORKS, reason="torch_xla runs in .venv-xla")

SDPA, PALLAS, BLOCKWISE = "torch-xla-sdpa", "torch-xla-pallas-flash", "torch-xla-blockwise-flash"
XLA_IMPLS = (SDPA, PALLAS, BLOCKWISE)
SMALL = Workload(batch=1, q_heads=2, seq_q=128, head_dim=64)


def impl(name):
    import attention_impls

    return attention_impls.get(name)


@pytest.fixture
def on_platform(monkeypatch):
    """Pretend torch_xla's PJRT device is ``device_type`` (only the detection is faked)."""
    import torch_xla.runtime as xr

    def use(device_type):
        monkeypatch.setattr(xr, "device_type", lambda: device_type)

    return use


# -- platform detection ------------------------------------------------------------------------
def test_this_machine_is_the_xla_cpu_device():
    import torch_xla.core.xla_model as xm

    for name in XLA_IMPLS:
        i = impl(name)
        assert i.framework == "torch_xla" and i.framework_missing() is None
        assert i.backend().device().type == "xla"
        assert xm.xla_device_hw(i.backend().device()) == "CPU"
        assert i.platform() == "cpu"


@pytest.mark.parametrize("device_type, platform", [("CPU", "cpu"), ("TPU", "tpu"), ("CUDA", "gpu"),
                                                   ("GPU", "gpu")])
def test_pjrt_device_type_maps_to_platform(on_platform, device_type, platform):
    on_platform(device_type)
    assert impl(SDPA).platform() == platform


def test_unknown_pjrt_device_is_an_error_not_a_guess(on_platform):
    on_platform("NEURON")
    with pytest.raises(RuntimeError, match="NEURON"):
        impl(SDPA).platform()


# -- labels ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, labels", [
    (SDPA, {"cpu": "native", "gpu": "native", "tpu": "native"}),
    (BLOCKWISE, {"cpu": "forced-flash", "gpu": "native", "tpu": "forced-flash"}),
    (PALLAS, {"cpu": "forced-flash", "gpu": "forced-flash", "tpu": "native"}),
])
def test_labels(name, labels):
    assert {p: impl(name).label(p) for p in labels} == labels


# -- what runs here ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [SDPA, BLOCKWISE])
@pytest.mark.parametrize("workload", [
    SMALL, SMALL.replace(causal=True, seq_k=256), SMALL.replace(q_heads=4, kv_heads=2, causal=True),
    SMALL.replace(seq_q=200, head_dim=32, dtype="bfloat16", mode="fwd_bwd"),
], ids=lambda w: w.describe() if isinstance(w, Workload) else None)
def test_portable_impls_run_everything_here(name, workload):
    i = impl(name)
    assert i.check(workload) is None
    assert i.execution(i.platform()) == "compiled"


def test_pallas_refuses_cpu_with_the_measured_reason():
    reason = impl(PALLAS).check(SMALL)
    assert reason is not None
    for fact in ("tpu_custom_call", "Only interpret mode is supported on CPU backend",
                 "no interpret mode", "for Host"):
        assert fact in reason


def test_pallas_refuses_gpu_and_runs_tpu(on_platform):
    on_platform("CUDA")
    assert "tpu_custom_call" in impl(PALLAS).check(SMALL)
    on_platform("TPU")
    assert impl(PALLAS).check(SMALL) is None
    assert impl(PALLAS).check(SMALL.replace(seq_q=1024, seq_k=2048, mode="fwd_bwd")) is None


@pytest.mark.parametrize("workload, words", [
    (SMALL.replace(q_heads=4, kv_heads=2), "grouped-query"),
    (SMALL.replace(seq_k=256, causal=True), "top-left"),
    (SMALL.replace(seq_k=640), "padded keys"),
    (SMALL.replace(seq_k=384, mode="fwd_bwd"), "backward needs seq_k"),
    (SMALL.replace(seq_k=200, mode="fwd_bwd"), "backward needs seq_k"),
    (SMALL.replace(seq_q=1536, mode="fwd_bwd"), "backward needs seq_q"),
], ids=lambda x: x.describe() if isinstance(x, Workload) else None)
def test_pallas_shape_rules_on_tpu(on_platform, workload, words):
    on_platform("TPU")
    reason = impl(PALLAS).check(workload)
    assert reason is not None and words in reason


def test_pallas_forward_pads_what_its_backward_cannot(on_platform):
    on_platform("TPU")
    odd = SMALL.replace(seq_k=640, causal=True, seq_q=640)  # causal masks the zero padding
    assert impl(PALLAS).check(odd) is None
    assert "backward" in impl(PALLAS).check(odd.replace(mode="fwd_bwd"))


# -- the refusal is real: every CPU route of torch_xla's Pallas kernel fails ---------------------
# The three failing-kernel probes run in a fresh interpreter each: a graph that failed to execute
# stays pending in torch_xla and poisons this process's next sync() ("Check failed: tensor_data").
QKV = ("import torch, torch_xla\n"
       "q, k, v = [torch.randn(1, 2, 128, 64).to(torch_xla.device()) for _ in range(3)]\n")


def run_probe(body: str) -> str:
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", QKV + body], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    assert proc.returncode != 0, "the probe was expected to fail"
    return proc.stdout + proc.stderr


def test_pallas_kernel_really_fails_on_cpu():
    out = run_probe("from torch_xla.experimental.custom_kernel import flash_attention\n"
                    "flash_attention(q, k, v, causal=True, sm_scale=0.125)\ntorch_xla.sync()\n")
    assert "ValueError: Only interpret mode is supported on CPU backend" in out


def test_pallas_kernel_has_no_interpret_path_through_torch_xla():
    out = run_probe("from jax.experimental.pallas import tpu as pltpu\n"
                    "from torch_xla.experimental.custom_kernel import flash_attention\n"
                    "with pltpu.force_tpu_interpret_mode():\n"
                    "    flash_attention(q, k, v, causal=True, sm_scale=0.125)\n    torch_xla.sync()\n")
    assert "AttributeError" in out and "has no attribute 'body'" in out


def test_xla_cpu_cannot_execute_a_tpu_lowered_kernel():
    out = run_probe(
        "import jax\n"
        "from jax.experimental.pallas.ops.tpu.flash_attention import _flash_attention_impl\n"
        "from torch_xla.experimental import custom_kernel as ck\n"
        "shapes = [ck.to_jax_shape_dtype_struct(t) for t in (q, k, v)]\n"
        "lowered = jax.jit(_flash_attention_impl, static_argnums=range(5, 13)).trace(\n"
        "    *shapes, None, None, False, True, 0.125, 1, 128, 128, 128, False)\n"
        "lowered = lowered.lower(lowering_platforms=('tpu',))\n"
        "payload = ck._extract_backend_config(lowered.compiler_ir())\n"
        "assert payload, 'the Mosaic kernel should lower for TPU'\n"
        "print('PAYLOAD', len(payload))\n"
        "out = torch_xla._XLAC._xla_tpu_custom_call([q, k, v], payload, [q.shape], [q.dtype])\n"
        "torch_xla.sync()\nout[0].cpu()\n")
    assert "PAYLOAD" in out  # the Mosaic kernel exists; only its runtime is missing
    assert "custom call to tpu_custom_call for Host" in out


# -- XLA really compiles and executes the timed step ---------------------------------------------
@pytest.mark.parametrize("name", [SDPA, BLOCKWISE])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_step_compiles_once_and_executes_every_run(name, mode):
    import torch_xla.debug.metrics as met

    workload = SMALL.replace(seq_q=136, mode=mode)  # a length no other test compiles
    step = impl(name).make_step(workload)
    assert step.execution == "compiled"
    assert step.kernel_evidence == "forward HLO has no custom-call: XLA's own ops"
    met.clear_all()
    step.run()
    compiles, executes = met.metric_data("CompileTime")[0], met.metric_data("ExecuteTime")[0]
    assert compiles >= 1 and executes >= 1
    step.run()
    step.run()
    assert met.metric_data("CompileTime")[0] == compiles  # cached: same graph, no recompilation
    assert met.metric_data("ExecuteTime")[0] == executes + 2 * executes  # executed on every run()
    assert met.counter_value("CachedCompile") >= 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conformance_path_runs_one_graph_per_call(dtype):
    """Results are synced together and widened on the host: no extra graph per read-back tensor."""
    import numpy as np
    import torch_xla.debug.metrics as met

    from attnbench.inputs import make_inputs

    workload = SMALL.replace(seq_q=144, dtype=dtype)
    x = make_inputs(workload, seed=0)
    met.clear_all()
    out = impl(SDPA).run_numpy(x.q, x.k, x.v, causal=False)
    assert np.isfinite(out).all() and met.metric_data("ExecuteTime")[0] == 1
    met.clear_all()
    grads = impl(SDPA).grad_numpy(x.q, x.k, x.v, x.do, causal=False)
    assert all(np.isfinite(g).all() for g in grads)
    assert met.metric_data("ExecuteTime")[0] == 1


# -- one runner across lengths: a new graph per new shape, cached for repeats ---------------------
def test_runner_compiles_once_per_distinct_length_and_not_on_repeats():
    """Shapes no other test compiles (3 heads, head_dim 24): XLA's compile cache is process-wide,
    so a shape compiled earlier in the session would rightly count as no compile here."""
    import torch_xla.debug.metrics as met

    runner = impl(SDPA).make_runner(Workload(batch=1, q_heads=3, seq_q=96, head_dim=24, causal=True))
    assert runner.execution == "compiled"
    lengths = [40, 56, 40, 72, 56, 40, 72]
    counts = []
    for length in lengths:
        runner.prepare(length)  # inputs on the device before the step, outside its count
        uncached = met.counter_value("UncachedCompile") or 0
        runner.step(length)
        counts.append(runner.compiles())
        new = length not in lengths[:len(counts) - 1]
        assert (met.counter_value("UncachedCompile") or 0) - uncached == (1 if new else 0)
    assert counts == [1, 2, 2, 3, 3, 3, 3]
    assert runner.compile_seconds() > 0
