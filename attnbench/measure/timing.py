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
    return _timing(first_call, samples, number, "wall")


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


def _timing(first_call: float, samples: list[float], number: int, timer: str) -> Timing:
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
    return _timing(float("nan"), samples, number, "wall")


def time_interleaved(runs: list, *, numbers: list[int], min_seconds: float, min_samples: int = 5,
                     enough_seconds: float = 0.05, least_samples: int = 1,
                     keep_timing: list[bool] | None = None) -> list[Timing]:
    """Several steps already warm in this process, timed together: one warm-up call each, then one
    block of each in turn (``numbers[i]`` calls of ``runs[i]``), round and round, until every step has
    ``min_samples`` blocks (or, a slow step, ``least_samples`` blocks lasting ``enough_seconds``: one
    block of a step of 50 ms or more) and
    ``min_seconds`` per step have passed. Short blocks, milliseconds apart, see the same machine: the
    ratio of two steps' medians cancels what drifted over the window, and a burst of the host's other
    tenants (tens of milliseconds here) spoils a block or two, not the median of five (the paired
    ratios this gives: results/LOG.md, "Paired, adaptive rounds"). ``keep_timing[i]`` False: once
    done, run ``i`` is no longer timed while the others finish (a stream sample's pass, a second or
    less of 32 different steps, whose one block is the round's value: docs/metrics.md)."""
    clock = time.perf_counter
    for run in runs:
        run()
    samples: list[list[float]] = [[] for _ in runs]

    def done(mine: list[float]) -> bool:
        return len(mine) >= min_samples or (len(mine) >= least_samples and sum(mine) >= enough_seconds)

    keep = list(keep_timing) if keep_timing is not None else [True] * len(runs)
    begin = clock()
    while not all(done([x * n for x in mine]) for mine, n in zip(samples, numbers, strict=True)) \
            or clock() - begin < min_seconds * len(runs):
        ran = False
        for run, number, mine, again in zip(runs, numbers, samples, keep, strict=True):
            if not again and mine and done([x * number for x in mine]):
                continue
            ran = True
            start = clock()
            for _ in range(number):
                run()
            mine.append((clock() - start) / number)
        if not ran:  # every run done and none kept timing: nothing left to spread over the window
            break
    return [_timing(float("nan"), mine, number, "wall")
            for mine, number in zip(samples, numbers, strict=True)]


@dataclass(frozen=True)
class DeviceClock:
    """A device's own timer of one call, as a backend hands it out (``Backend.device_clock``):
    ``timed_call()`` runs the step once and returns its seconds (CUDA events: L2 flushed first, as
    ``triton.testing.do_bench``)."""

    name: str  # the record's ``timer``: "cuda-events"
    timed_call: Callable[[], float]


def time_calls(clock: DeviceClock, *, warmup: int = 1, min_seconds: float = 0.3, min_samples: int = 5,
               max_samples: int = 1000, max_seconds: float = 30.0,
               target_rel_iqr: float | None = None) -> Timing:
    """Time one call per sample with a timer that measures the call itself (device events)."""
    first_call = clock.timed_call()
    for _ in range(warmup):
        clock.timed_call()
    samples = _sample(clock.timed_call, [], min_seconds=min_seconds, min_samples=min_samples,
                      max_samples=max_samples, max_seconds=max_seconds, target_rel_iqr=target_rel_iqr)
    return _timing(first_call, samples, 1, clock.name)


def _quartiles(samples: list[float]) -> list[float]:
    return statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3


def _settled(samples: list[float], target_rel_iqr: float | None) -> bool:
    if target_rel_iqr is None:
        return True
    q1, median, q3 = _quartiles(samples)
    return median > 0 and (q3 - q1) / median <= target_rel_iqr
