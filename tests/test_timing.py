"""The timing loop's mechanics, with a deterministic fake step (no speed is asserted here)."""

from __future__ import annotations

import time

import pytest

from attnbench.measure.round_timing import balanced_cycle, time_interleaved
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


# -- the later rounds' balanced cycle ---------------------------------------------------------------
def _follows(order: list[int]) -> list[tuple[int, int]]:
    """(before, after) for each neighbour in ``order`` repeated: the last wraps round to the first."""
    return [(order[k - 1], order[k]) for k in range(len(order))]


@pytest.mark.parametrize("n", [3, 4, 5, 7])
def test_a_balanced_cycle_puts_each_step_after_every_other_once_and_never_after_itself(n):
    order = balanced_cycle(list(range(n)))
    assert sorted(_follows(order)) == sorted((i, j) for i in range(n) for j in range(n) if i != j)


def test_an_apart_pair_never_follows_each_other_and_both_follow_the_same_steps():
    """An A/A control's two windows (2 and 3 here): each after each other step once, never after its twin."""
    order = balanced_cycle([0, 1, 2, 3], frozenset({frozenset((2, 3))}))
    follows = _follows(order)
    assert (2, 3) not in follows and (3, 2) not in follows
    assert sorted(a for a, b in follows if b == 2) == sorted(a for a, b in follows if b == 3) == [0, 1]
    # two kernels and a control: the other kernel between the twins, [0, 1, 0, 2]
    assert _follows(balanced_cycle([0, 1, 2], frozenset({frozenset((1, 2))}))).count((0, 1)) == 1
    assert balanced_cycle([0, 1], frozenset({frozenset((0, 1))})) == [0, 1]  # nothing else to put between


def test_interleaved_blocks_go_round_the_balanced_cycle_and_a_pass_once_comes_first():
    calls: list[str] = []

    def run(name):
        def call():
            calls.append(name)
            if name == "once":  # a stream sample's pass: one block of 50 ms or more is its value
                time.sleep(0.06)
        return call

    names = ["a", "b", "c", "c2", "once"]
    time_interleaved([run(x) for x in names], numbers=[1] * 5, min_seconds=0.0, min_samples=3,
                     keep_timing=[True, True, True, True, False], apart=frozenset({frozenset((2, 3))}))
    timed = calls[len(names):]  # after one warm-up call each
    lap = [names[i] for i in balanced_cycle([0, 1, 2, 3], frozenset({frozenset((2, 3))}))]
    assert timed[0] == "once" and timed.count("once") == 1  # the stream's pass: once, outside the cycle
    assert timed[1:] == lap * (len(timed[1:]) // len(lap)) and len(timed[1:]) % len(lap) == 0  # whole laps
    assert all(timed[1:].count(x) >= 3 for x in "abc")


def test_a_rounds_block_reads_the_device_clock_its_first_window_read():
    """A step with a device timer (a GPU's or TPU's) is timed in the rounds by that timer, a block per
    ``timed_call``, beside a wall-clock step in the same cycle: its figure is the device's, though the
    host spends 5 ms a call on it. Before, every round was timed by the wall clock."""
    device_calls = []

    def timed_call():
        time.sleep(0.005)
        device_calls.append(1)
        return 1e-6  # the device's seconds per call

    clock = DeviceClock("xla-device-events", timed_call, calls_per_sample=4)
    device, host = time_interleaved([lambda: time.sleep(0.005), lambda: None], numbers=[4, 1],
                                    min_seconds=0.0, min_samples=3, clocks=[clock, None])
    assert device.timer == "xla-device-events" and device.median_s == 1e-6 and device.steps_per_sample == 4
    assert len(device_calls) == device.samples >= 3
    assert host.timer == "wall" and host.median_s < 1e-3


def test_the_gpu_size_times_paired_rounds_with_the_device_timer():
    from attnbench.asv.sizes import SIZES

    for size in SIZES.values():
        assert size.timer == "device"  # a CPU's device timer is its wall clock
    plan = SIZES["gpu"].round_plan(controls=("jax-xla",))
    assert plan is not None and plan.min_rounds >= 4 and plan.budget_s <= 240
