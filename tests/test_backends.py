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
