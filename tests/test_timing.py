"""The timing loop's mechanics, with a deterministic fake step (no speed is asserted here)."""

from __future__ import annotations

import time

from attnbench.measure.timing import DeviceClock, time_calls, time_step


class FakeStep:
    def __init__(self, first_s: float, steady_s: float):
        self.calls, self.first_s, self.steady_s = 0, first_s, steady_s

    def __call__(self):
        self.calls += 1
        time.sleep(self.first_s if self.calls == 1 else self.steady_s)


def test_first_call_is_timed_apart_from_steady_state():
    step = FakeStep(first_s=0.2, steady_s=0.002)
    t = time_step(step, min_seconds=0.1, block_seconds=0.01)
    assert t.first_call_s >= 0.2
    assert t.median_s < 0.02, "the compile-like first call must not leak into the median"
    assert t.steps_per_sample >= 2, "a fast step is batched into blocks"
    assert t.samples >= 5
    assert step.calls >= 1 + 1 + t.samples * t.steps_per_sample


def test_slow_step_is_one_call_per_block_and_bounded_by_max_seconds():
    step = FakeStep(first_s=0.0, steady_s=0.05)
    start = time.perf_counter()
    t = time_step(step, min_seconds=0.01, block_seconds=0.01, min_samples=3, max_seconds=0.3)
    assert t.steps_per_sample == 1
    assert t.samples >= 3
    assert time.perf_counter() - start < 2.0
    assert 0.04 < t.median_s < 0.5


def test_a_device_clock_times_one_call_per_sample_by_its_own_seconds():
    # The device's seconds, not the wall's: a clock that reports 1 ms while the call takes none.
    calls = []
    clock = DeviceClock("cuda-events", lambda: calls.append(1) or (0.010 if len(calls) == 1 else 0.001))
    t = time_calls(clock, min_seconds=0.01, min_samples=5, max_samples=50)
    assert t.timer == "cuda-events" and t.steps_per_sample == 1
    assert t.first_call_s == 0.010 and t.median_s == 0.001
    assert t.samples == len(t.samples_s) >= 5 and len(calls) == 1 + 1 + t.samples
