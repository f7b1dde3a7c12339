"""torch_xla implementations: platform detection, support rules and refusal reasons, labels, and
evidence that XLA really compiled and executed the timed step. Runs in .venv-xla (PJRT_DEVICE=CPU)."""

from __future__ import annotations

import pytest

from attnbench.backends import here
from attnbench.core.workload import Workload
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
        assert i.framework == "torch_xla" and here.framework_missing(i) is None
        assert here.backend_of(i).device().type == "xla"
        assert xm.xla_device_hw(here.backend_of(i).device()) == "CPU"
        assert here.platform(i) == "cpu"


@pytest.mark.parametrize("device_type, platform", [("CPU", "cpu"), ("TPU", "tpu"), ("CUDA", "gpu"),
                                                   ("GPU", "gpu")])
def test_pjrt_device_type_maps_to_platform(on_platform, device_type, platform):
    on_platform(device_type)
    assert here.platform(impl(SDPA)) == platform


def test_unknown_pjrt_device_is_an_error_not_a_guess(on_platform):
    on_platform("NEURON")
    with pytest.raises(RuntimeError, match="NEURON"):
        here.platform(impl(SDPA))


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
    assert here.check(i, workload) is None
    assert i.execution(here.platform(i)) == "compiled"


def test_pallas_refuses_cpu_with_the_measured_reason():
    reason = here.check(impl(PALLAS), SMALL)
    assert reason is not None
    for fact in ("tpu_custom_call", "Only interpret mode is supported on CPU backend",
                 "no interpret mode", "for Host"):
        assert fact in reason


def test_pallas_refuses_gpu_and_runs_tpu(on_platform):
    on_platform("CUDA")
    assert "tpu_custom_call" in here.check(impl(PALLAS), SMALL)
    on_platform("TPU")
    assert here.check(impl(PALLAS), SMALL) is None
    assert here.check(impl(PALLAS), SMALL.replace(seq_q=1024, seq_k=2048, mode="fwd_bwd")) is None


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
    reason = here.check(impl(PALLAS), workload)
    assert reason is not None and words in reason


def test_pallas_forward_pads_what_its_backward_cannot(on_platform):
    on_platform("TPU")
    odd = SMALL.replace(seq_k=640, causal=True, seq_q=640)  # causal masks the zero padding
    assert here.check(impl(PALLAS), odd) is None
    assert "backward" in here.check(impl(PALLAS), odd.replace(mode="fwd_bwd"))


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
    step = here.make_step(impl(name), workload)
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

    from attnbench.core.inputs import make_inputs

    workload = SMALL.replace(seq_q=144, dtype=dtype)
    x = make_inputs(workload, seed=0)
    met.clear_all()
    out = here.run_numpy(impl(SDPA), x.q, x.k, x.v, causal=False)
    assert np.isfinite(out).all() and met.metric_data("ExecuteTime")[0] == 1
    met.clear_all()
    grads = here.grad_numpy(impl(SDPA), x.q, x.k, x.v, x.do, causal=False)
    assert all(np.isfinite(g).all() for g in grads)
    assert met.metric_data("ExecuteTime")[0] == 1


# -- one runner across lengths: a new graph per new shape, cached for repeats ---------------------
def test_runner_compiles_once_per_distinct_length_and_not_on_repeats():
    """Shapes no other test compiles (3 heads, head_dim 24): XLA's compile cache is process-wide,
    so a shape compiled earlier in the session would rightly count as no compile here."""
    import torch_xla.debug.metrics as met

    runner = here.make_runner(impl(SDPA), Workload(batch=1, q_heads=3, seq_q=96, head_dim=24, causal=True))
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


# -- mask features: what each torch_xla kernel takes, and its refusals ----------------------------
WINDOWED = SMALL.replace(causal=True, window=32)
DOCUMENTS = SMALL.replace(causal=True, documents=3)
SOFTCAPPED = SMALL.replace(causal=True, softcap=30.0)


def test_sdpa_takes_window_and_segment_ids_and_refuses_softcap_by_name():
    i = impl(SDPA)
    assert i.supports == {"window", "segment_ids"} and i.gqa == "repeated"
    for workload in (WINDOWED, DOCUMENTS, WINDOWED.replace(documents=2, q_heads=4, kv_heads=2)):
        assert here.check(i, workload) is None
    reason = here.check(i, SOFTCAPPED)
    assert "soft-capping" in reason and "scaled_dot_product_attention" in reason


def test_sdpa_mask_is_one_traced_graph_with_no_custom_call():
    """The window and segment ids are SDPA's attn_mask inside the graph: one XLA execution per call,
    and still no custom call (XLA's own ops), whatever the segment ids' values."""
    import numpy as np
    import torch_xla.debug.metrics as met

    from attnbench.core.inputs import make_inputs

    workload = SMALL.replace(seq_q=152, seq_k=152, causal=True, window=40, documents=3)  # a fresh shape
    x = make_inputs(workload, seed=0)
    met.clear_all()
    out = here.run_numpy(impl(SDPA), x.q, x.k, x.v, causal=True, window=40, q_segment_ids=x.q_segment_ids,
                               kv_segment_ids=x.kv_segment_ids)
    assert np.isfinite(out).all() and met.metric_data("ExecuteTime")[0] == 1
    step = here.make_step(impl(SDPA), workload)
    assert step.kernel_evidence == "forward HLO has no custom-call: XLA's own ops"


def test_pallas_takes_segment_ids_and_refuses_window_and_softcap_by_name(on_platform):
    on_platform("TPU")
    i = impl(PALLAS)
    assert i.supports == {"segment_ids"}
    assert here.check(i, DOCUMENTS) is None
    assert here.check(i, DOCUMENTS.replace(mode="fwd_bwd")) is None
    for workload, word in ((WINDOWED, "sliding window"), (SOFTCAPPED, "soft-capping")):
        reason = here.check(i, workload)
        assert word in reason and "flash_attention" in reason


@pytest.mark.parametrize("workload", [
    SMALL.replace(seq_q=64, seq_k=64, documents=2),                  # kv block of 64: not 128 lanes
    SMALL.replace(seq_q=200, seq_k=200, causal=True, documents=2),   # kv block of 200
    SMALL.replace(seq_q=640, seq_k=640, causal=True, documents=2),   # K/V padded to 1024, ids not
], ids=lambda w: w.describe())
def test_pallas_segment_id_shape_rules_on_tpu(on_platform, workload):
    on_platform("TPU")
    assert here.check(impl(PALLAS), workload.replace(documents=None)) is None  # fine without segment ids
    reason = here.check(impl(PALLAS), workload)
    assert reason is not None and "segment ids" in reason


def test_pallas_segment_id_rules_are_what_the_wrapper_does_traced_for_tpu():
    """torch_xla's wrapper with jax's kernel lowered for TPU (trace only: nothing can execute it
    here) accepts segment ids where ``shape_reason`` does and fails where it refuses. A fresh
    interpreter: the patched tracer and the pending tpu_custom_calls stay out of this process."""
    import os
    import subprocess
    import sys

    body = '''
import jax, torch, torch_xla
from torch_xla.experimental import custom_kernel as ck
from attnbench.backends import here

def tpu_trace_pallas(kernel, *args, static_argnums=None, static_argnames=None, use_cache=False, **kw):
    shapes = [ck.to_jax_shape_dtype_struct(a) if torch.is_tensor(a) else a for a in args]
    ir = jax.jit(kernel, static_argnums=static_argnums, static_argnames=static_argnames).trace(
        *shapes, **kw).lower(lowering_platforms=("tpu",)).compiler_ir()
    return ck._extract_backend_config(ir), [a for a in args if torch.is_tensor(a)]

ck.trace_pallas = tpu_trace_pallas
dev = torch_xla.device()
for sq, sk, causal, bwd in [(256, 256, True, True), (1, 256, False, True), (128, 1024, False, False),
                            (64, 64, True, False), (200, 200, True, False), (640, 640, True, False)]:
    q, k, v = (torch.randn(1, 2, s, 64).to(dev).requires_grad_(bwd) for s in (sq, sk, sk))
    ids = [torch.zeros(1, s, dtype=torch.int32).to(dev) for s in (sq, sk)]
    try:
        out = ck.flash_attention(q, k, v, causal, *ids, 0.125)
        if bwd:
            out.sum().backward()
        print("TRACED", sq, sk, int(causal), int(bwd))
    except Exception as exc:
        print("FAILED", sq, sk, int(causal), int(bwd), type(exc).__name__, str(exc).splitlines()[0][:120])
'''
    proc = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PJRT_DEVICE": "CPU"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("TRACED", "FAILED"))]
    assert len(lines) == 6, proc.stdout + proc.stderr
    for line in lines:
        sq, sk, causal, bwd = (int(x) for x in line.split()[1:5])
        workload = Workload(batch=1, q_heads=2, seq_q=sq, seq_k=sk, head_dim=64, causal=bool(causal),
                            mode="fwd_bwd" if bwd else "fwd", ragged=sq != sk,
                            documents=2 if sq == sk else None)
        assert line.startswith("FAILED") == (impl(PALLAS).shape_reason(workload, "tpu") is not None), line
    assert "kv block size must be a multiple of 128" in proc.stdout
    assert "broadcast_in_dim" in proc.stdout


def test_sdpa_gqa_is_repeated_in_the_hlo():
    """SDPA's math path on XLA repeats the kv heads: its score matmul is batched over the q heads."""
    import re

    import torch
    import torch_xla

    dev = torch_xla.device()
    q = torch.randn(1, 128, 4, 64).to(dev)
    k, v = (torch.randn(1, 128, 2, 64).to(dev) for _ in range(2))
    out = impl(SDPA).attention(q, k, v, causal=True, scale=0.125)
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([out])
    dots = re.findall(r"dot\(f32\[(\d+),128,64\]", hlo)
    assert dots and set(dots) == {"4"}, dots  # batch Hq=4, the 2 kv heads repeated


def test_blockwise_takes_every_mask_feature_of_the_shared_loop():
    from attention_impls.torch_blockwise_flash import TorchBlockwise

    i = impl(BLOCKWISE)
    assert i.supports == TorchBlockwise.supports == {"window", "softcap", "segment_ids"}
    assert i.gqa == TorchBlockwise.gqa
    for workload in (WINDOWED, DOCUMENTS, SOFTCAPPED, WINDOWED.replace(documents=2, softcap=2.0)):
        assert here.check(i, workload) is None


def test_blockwise_mask_is_one_traced_graph():
    """Under XLA the loop reads no segment-id value on the host (no tile skipping by ids): the
    masked call is one graph, executed once."""
    import numpy as np
    import torch_xla.debug.metrics as met

    from attnbench.core.inputs import make_inputs

    workload = SMALL.replace(seq_q=168, seq_k=168, causal=True, window=40, documents=3, softcap=5.0)
    x = make_inputs(workload, seed=0)
    met.clear_all()
    out = here.run_numpy(impl(BLOCKWISE), x.q, x.k, x.v, causal=True, window=40, softcap=5.0,
                                    q_segment_ids=x.q_segment_ids, kv_segment_ids=x.kv_segment_ids)
    assert np.isfinite(out).all() and met.metric_data("ExecuteTime")[0] == 1
