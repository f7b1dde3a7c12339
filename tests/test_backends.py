"""The framework backends: one protocol, and the figures they measure against hand-counted values."""

from __future__ import annotations

import pytest

from attnbench import backends
from tests.conftest import FRAMEWORKS

needs_torch = pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")
MiB = 2**20


def test_unknown_framework_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown framework 'mxnet'; expected one of \['numpy', 'jax'"):
        backends.get("mxnet")


@pytest.mark.parametrize("framework", backends.FRAMEWORKS)
def test_every_backend_implements_the_protocol(framework):
    backend = backends.get(framework)
    assert isinstance(backend, backends.Backend) and backend.framework == framework
    assert backends.get(framework) is backend  # one shared instance


@needs_torch
@pytest.mark.slow
def test_host_profiler_peak_is_the_peak_of_live_allocations_not_a_sum_over_nesting():
    import torch

    from attnbench.backends.torch_backend import torch_profiler_peak_bytes

    def run():
        a = torch.empty(10 * MiB, dtype=torch.uint8)
        b = torch.empty(20 * MiB, dtype=torch.uint8)
        del a  # live: 20 MiB, after a peak of 30 MiB
        c = torch.empty(5 * MiB, dtype=torch.uint8)
        del b, c

    assert torch_profiler_peak_bytes(run) == 30 * MiB


@needs_torch
def test_host_profiler_peak_of_a_nested_op_counts_each_allocation_once():
    import torch

    from attnbench.backends.torch_backend import torch_profiler_peak_bytes

    x = torch.ones(1024, 1024)  # 4 MiB, allocated before the probe: not counted

    def run():
        # softmax(x @ x) allocates the 4 MiB product, then the 4 MiB softmax while the product is
        # still referenced: 8 MiB live at most, whatever the ops' nesting.
        y = x @ x
        z = torch.softmax(y, dim=-1)
        del y, z

    assert torch_profiler_peak_bytes(run) == 8 * MiB


@needs_torch
def test_the_profiler_keeps_its_start_stop_lines_off_the_console(capfd):
    import sys

    import torch

    from attnbench.backends.torch_backend import profiled_ops

    def run():
        torch.ones(3) + 1
        print("a line of the step's own", file=sys.stderr)

    ops = profiled_ops(run)
    err = capfd.readouterr().err
    assert "aten::add" in ops
    assert "profiler_start" not in err and "USDT" not in err
    assert "a line of the step's own" in err


def test_a_device_timer_the_backend_lacks_is_refused_by_name():
    from attnbench.backends.base import Step

    step = Step(run=lambda: None, execution="eager")
    with pytest.raises(ValueError, match="timer 'cuda-events' is not available for numpy here"):
        backends.get("numpy").device_clock(step, timer="cuda-events")
    assert backends.get("numpy").device_clock(step, timer="device") is None  # the wall clock times it


@needs_torch
def test_cuda_events_are_refused_without_a_gpu():
    import torch

    from attnbench.backends.base import Step

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the events path runs instead")
    step = Step(run=lambda: None, execution="eager")
    with pytest.raises(ValueError, match="'cuda-events' needs torch on a CUDA device"):
        backends.get("torch").device_clock(step, timer="cuda-events")
    assert backends.get("torch").device_clock(step, timer="device") is None  # the wall clock times it


@needs_torch
def test_cuda_events_bracket_the_launch_alone_with_the_l2_flush_before_them(monkeypatch):
    """A fake CUDA device and clock: the timed interval holds the step's launch and nothing else (no
    host synchronisation between the events), and the L2 flush is enqueued before the start event.
    The old timer recorded its end event after ``step.run()``, whose own synchronize landed inside."""
    import torch

    from attnbench.backends.base import Step

    log = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            log.append(f"event {len(log)}")

        def synchronize(self):
            log.append("wait for end")

        def elapsed_time(self, other):
            return 2.5  # ms, as torch reports it

    class FakeFlush:
        def zero_(self):
            log.append("flush L2")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("synchronize"))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: FakeFlush())

    def run():  # what a torch step's run() does: launch, then wait for the device
        log.append("launch")
        torch.cuda.synchronize()

    step = Step(run=run, execution="eager", framework="torch", enqueue=lambda: log.append("launch"))
    clock = backends.get("torch").device_clock(step, timer="cuda-events")
    assert clock.timed_call() == pytest.approx(2.5e-3)
    events = [i for i, entry in enumerate(log) if entry.startswith("event")]
    assert len(events) == 2
    inside = log[events[0] + 1:events[1]]
    assert inside == ["launch"], inside  # the kernel alone: no synchronize between the events
    assert log.index("flush L2") < events[0] and log[-1] == "wait for end"


@needs_torch
def test_a_torch_step_launches_without_waiting_and_runs_blocking(monkeypatch):
    """``Step.enqueue`` is the step without the device wait that ``Step.run`` ends with: one
    synchronize per run, none per enqueue."""
    import attention_impls
    from attnbench.core.workload import Workload

    backend = backends.get("torch")
    step = backend.make_step(attention_impls.get("torch-sdpa-math"),
                             Workload(batch=1, q_heads=2, seq_q=16, seq_k=16, head_dim=8, causal=True))
    waits = []
    monkeypatch.setattr(backend, "synchronize", lambda: waits.append(1))
    step.run()
    assert len(waits) == 1
    step.enqueue()
    assert len(waits) == 1


needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")


def _event(start_ns, end_ns, name="fusion", **stats):
    from types import SimpleNamespace

    return SimpleNamespace(name=name, start_ns=start_ns, end_ns=end_ns, stats=list(stats.items()))


def _profile(*planes):
    """A fake ``jax.profiler.ProfileData``: ``(plane name, {line name: [events]})`` each."""
    from types import SimpleNamespace

    return SimpleNamespace(planes=[SimpleNamespace(name=name, lines=[SimpleNamespace(name=line, events=events)
                                                                     for line, events in lines.items()])
                                   for name, lines in planes])


def test_device_busy_time_is_the_union_of_the_device_planes_xla_events():
    """Overlapping streams count once, idle gaps not at all, the host's events and the flush's
    executable never; a plane without op events falls back to its XLA Modules line."""
    from attnbench.backends.profiles import ProfileUnreadable, device_busy_seconds

    gpu = ("/device:GPU:0", {
        "Stream #13": [_event(1_000, 4_000, hlo_op="fusion.1", hlo_module="jit_forward"),
                       _event(10_000, 11_000, hlo_op="fusion", hlo_module="jit_l2_flush")],
        "Stream #14": [_event(3_000, 6_000, hlo_op="custom-call", hlo_module="jit_forward")],
        "XLA Modules": [_event(900, 6_100, name="jit_forward(3)")],
    })
    host = ("/host:CPU", {"python": [_event(0, 50_000, hlo_op="thunk", hlo_module="jit_forward")]})
    assert device_busy_seconds(_profile(gpu, host), skip_module="jit_l2_flush") == pytest.approx(5e-6)
    tpu = ("/device:TPU:0", {"XLA Modules": [_event(0, 2_000, name="jit_forward(1)"),
                                             _event(5_000, 6_000, name="jit_l2_flush(2)")]})
    assert device_busy_seconds(_profile(tpu), skip_module="jit_l2_flush") == pytest.approx(2e-6)
    with pytest.raises(ProfileUnreadable, match="no XLA event on a plane named /device:GPU:"):
        device_busy_seconds(_profile(host))


@needs_jax
def test_jax_device_time_on_a_gpu_is_the_profilers_device_events_not_the_wall_clock(monkeypatch):
    """A fake GPU and profile: the clock's figure is the device's busy time per call in the session
    (the host's 20 ms of dispatch and waiting are not in it), each call after an L2 flush, the first
    flush before the session. The old backend timed jax on a GPU with the wall clock (no clock)."""
    import time

    import jax

    from attnbench.backends import jax_backend
    from attnbench.backends.base import Step

    log = []
    backend = backends.get("jax")
    monkeypatch.setattr(backend, "platform", lambda: "gpu")
    monkeypatch.setattr(jax_backend, "l2_flusher", lambda: lambda: log.append("flush"))
    monkeypatch.setattr(jax.profiler, "start_trace", lambda d: log.append("start"))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: log.append("stop"))
    calls = []

    def run():
        time.sleep(0.02)  # slower than 10 ms: one call per sample
        calls.append(len(calls))
        log.append("step")

    def profile(_log_dir):  # what the session saw: 3 us of kernels on two streams for its one call
        streams = {"Stream #1": [_event(0, 2_000, hlo_op="a", hlo_module="jit_f")],
                   "Stream #2": [_event(1_000, 3_000, hlo_op="b", hlo_module="jit_f")]}
        return _profile(("/device:GPU:0", streams),
                        ("/host:CPU", {"python": [_event(0, 20_000_000, hlo_op="dispatch")]}))

    monkeypatch.setattr(jax_backend, "read_xplane", profile)
    clock = backend.device_clock(Step(run=run, execution="compiled", framework="jax"), timer="device")
    assert clock is not None and clock.name == "xla-device-events" and clock.calls_per_sample == 1
    log.clear()
    assert clock.timed_call() == pytest.approx(3e-6)
    assert log == ["flush", "start", "step", "stop"]


@needs_jax
def test_jax_device_clock_reads_a_real_profile_and_leaves_the_flush_out(monkeypatch):
    """The clock on a real jax profile (this CPU's events stand in for a device plane): several calls a
    session, a real flush between them far slower than the step, and the figure is the step's."""
    import time

    import jax
    import jax.numpy as jnp

    from attnbench.backends import jax_backend, profiles
    from attnbench.backends.base import Step

    backend = backends.get("jax")
    monkeypatch.setattr(backend, "platform", lambda: "gpu")
    monkeypatch.setattr(profiles, "DEVICE_PLANES", ("/host:CPU",))
    monkeypatch.setattr(jax_backend, "L2_FLUSH_BYTES", 64 * MiB)
    f = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((64, 64))
    clock = backend.device_clock(Step(run=lambda: f(x).block_until_ready(), execution="compiled",
                                      framework="jax"), timer="xla-device-events")
    assert clock.calls_per_sample > 1  # flushes inside the session
    flush = jax_backend.l2_flusher()
    flush()
    began = time.perf_counter()
    flush()
    flush_s = time.perf_counter() - began
    figure = clock.timed_call()
    assert 0 < figure < flush_s / 4, (figure, flush_s)


@needs_jax
def test_xla_device_events_are_refused_on_a_cpu():
    from attnbench.backends.base import Step

    step = Step(run=lambda: None, execution="compiled", framework="jax")
    with pytest.raises(ValueError, match="'xla-device-events' jax on a GPU or TPU"):
        backends.get("jax").device_clock(step, timer="xla-device-events")
    assert backends.get("jax").device_clock(step, timer="device") is None  # the wall clock times it


@needs_torch
def test_a_torch_training_step_measures_the_bytes_saved_for_backward():
    """q, k, v, the output and one float32 per row for a flash kernel; a forward step measures none."""
    import attention_impls
    from attnbench.core.workload import Workload

    backend = backends.get("torch")
    workload = Workload(batch=1, q_heads=2, seq_q=256, head_dim=32, causal=True, mode="fwd_bwd")
    step = backend.make_step(attention_impls.get("torch-blockwise-flash"), workload)
    assert step.trains
    tensor = 256 * 2 * 32 * 4
    assert backend.measure_memory(step)["saved_for_backward_bytes"] == 4 * tensor + 256 * 2 * 4
    forward = backend.make_step(attention_impls.get("torch-blockwise-flash"), workload.replace(mode="fwd"))
    assert "saved_for_backward_bytes" not in backend.measure_memory(forward)
