"""A small, explicit timing loop in the spirit of ``torch.utils.benchmark``'s blocked autorange.

One first call (compile + run, timed on its own), warm-up, then blocks of calls lasting at least
``block_seconds`` so timer overhead is negligible. ``Step.run`` blocks until the device is done, so
a block's wall time is device time plus launch overhead.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    first_call_s: float  # compile (if any) + one run
    median_s: float  # per step
    iqr_s: float  # interquartile range of per-step times across blocks
    samples: int  # blocks measured
    steps_per_sample: int
    samples_s: tuple[float, ...] = ()  # every sample's seconds per step, in measurement order
    timer: str = "wall"  # "wall": perf_counter around blocking calls; "cuda-events": device events

    @property
    def relative_iqr(self) -> float:
        return self.iqr_s / self.median_s if self.median_s else float("inf")


def time_step(run, *, warmup: int = 1, block_seconds: float = 0.02, min_seconds: float = 0.3,
              min_samples: int = 5, max_samples: int = 200, max_seconds: float = 30.0,
              target_rel_iqr: float | None = None) -> Timing:
    """Time ``run()`` (which must block until its work is done); stops as ``_sample`` says."""
    clock = time.perf_counter
    start = clock()
    run()
    first_call = clock() - start
    for _ in range(warmup):
        run()

    # Grow the block until one block lasts block_seconds (or one call already does).
    number = 1
    while True:
        start = clock()
        for _ in range(number):
            run()
        elapsed = clock() - start
        if elapsed >= block_seconds or number >= 1 << 16:
            break
        number *= 2 if elapsed <= 0 else max(2, min(10, int(block_seconds / elapsed) + 1))

    def block() -> float:
        start = clock()
        for _ in range(number):
            run()
        return (clock() - start) / number

    samples = _sample(block, [elapsed / number], min_seconds=min_seconds, min_samples=min_samples,
                      max_samples=max_samples, max_seconds=max_seconds, target_rel_iqr=target_rel_iqr)
    return summary(first_call, samples, number, "wall")


def _sample(take, samples: list[float], *, min_seconds, min_samples, max_samples, max_seconds,
            target_rel_iqr) -> list[float]:
    """Append ``take()`` to ``samples`` until ``min_seconds``, ``min_samples`` and (if set) the
    relative IQR target are met, or ``max_seconds``/``max_samples`` run out."""
    clock = time.perf_counter
    begin = clock()
    while len(samples) < max_samples:
        spent = clock() - begin
        if len(samples) >= min_samples and spent >= min_seconds and _settled(samples, target_rel_iqr):
            break
        if spent >= max_seconds:
            break
        samples.append(take())
    return samples


def summary(first_call: float, samples: list[float], number: int, timer: str) -> Timing:
    """The ``Timing`` of these samples (seconds per step, in measurement order)."""
    quartiles = _quartiles(samples)
    return Timing(first_call_s=first_call, median_s=statistics.median(samples),
                  iqr_s=quartiles[2] - quartiles[0], samples=len(samples), steps_per_sample=number,
                  samples_s=tuple(samples), timer=timer)


def time_window(run, *, number: int, min_seconds: float, min_samples: int = 3) -> Timing:
    """One short window of a step already warm in this process (a later timing round): one warm-up
    call, then blocks of ``number`` calls (the block size the case's first window grew to) until
    ``min_seconds`` and ``min_samples`` are both met. No first call and no block
    growth: rounds are many and short, so what each one pays besides timing is kept to one call."""
    clock = time.perf_counter
    run()

    def block() -> float:
        start = clock()
        for _ in range(number):
            run()
        return (clock() - start) / number

    samples = _sample(block, [], min_seconds=min_seconds, min_samples=min_samples,
                      max_samples=1 << 16, max_seconds=math.inf, target_rel_iqr=None)
    return summary(float("nan"), samples, number, "wall")


@dataclass(frozen=True)
class DeviceClock:
    """A device's own timer of one call, as a backend hands it out (``Backend.device_clock``):
    ``timed_call()`` runs the step once and returns its seconds (CUDA events: L2 flushed first, as
    ``triton.testing.do_bench``)."""

    name: str  # the record's ``timer``: "cuda-events", "xla-device-events"
    timed_call: Callable[[], float]  # seconds per call, of ``calls_per_sample`` calls
    calls_per_sample: int = 1


def time_calls(clock: DeviceClock, *, warmup: int = 1, min_seconds: float = 0.3, min_samples: int = 5,
               max_samples: int = 1000, max_seconds: float = 30.0,
               target_rel_iqr: float | None = None) -> Timing:
    """Time samples with a timer that measures the calls themselves (device events): each sample is
    ``clock.calls_per_sample`` calls, in seconds per call."""
    first_call = clock.timed_call()
    for _ in range(warmup):
        clock.timed_call()
    samples = _sample(clock.timed_call, [], min_seconds=min_seconds, min_samples=min_samples,
                      max_samples=max_samples, max_seconds=max_seconds, target_rel_iqr=target_rel_iqr)
    return summary(first_call, samples, clock.calls_per_sample, clock.name)


def _quartiles(samples: list[float]) -> list[float]:
    return statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3


def _settled(samples: list[float], target_rel_iqr: float | None) -> bool:
    if target_rel_iqr is None:
        return True
    q1, median, q3 = _quartiles(samples)
    return median > 0 and (q3 - q1) / median <= target_rel_iqr
