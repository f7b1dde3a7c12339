"""A later timing round in this process: the steps of one comparison group, built once per process
and kept warm, timed together, their blocks interleaved.

The sweep (``run/adaptive.py``) hands one comparison group per call: the kernels a verdict row weighs
against each other. Their blocks take turns, tens of milliseconds apart, in the same process and the
same state of the machine, so the per-round ratio of two kernels cancels what moved the machine in
that round; they go round in a balanced cycle (``balanced_cycle``), each kernel's block after
every other kernel's equally often, so that no figure depends on which kernel it was timed after. A
worker process serves many rounds; the sweep replaces it every few rounds, so that no figure rests on
one process (docs/metrics.md, "Rounds").

A production stream's way (a case of another regime that a verdict row prices: ``run/adaptive.py``)
is timed the same way through its sample of steps (``StreamSample``): its value is the mean step.

Steps are kept for the process' life: building one (placing inputs, compiling) costs far more than a
window, and a window only times the steady step, which the cases before it in the process do not
change (a warm-up call comes first; results/LOG.md shows the check).
"""

from __future__ import annotations

import json
import time

from attnbench.backends import here
from attnbench.core import records, regimes
from attnbench.measure.compiler_caches import compiler_caches
from attnbench.measure.contention import ContentionMonitor
from attnbench.measure.engine import Case, classify_exception, resolve_impl
from attnbench.measure.timing import Timing, summary

_steps: dict[str, object] = {}  # this process' built steps, by case key


def time_round(jobs: list[tuple[Case, int]], window_s: float, min_samples: int = 5,
               controls: tuple[str, ...] = (), control_first: bool = False) -> list[dict]:
    """One round of a group: ``(case, calls per block)`` each, interleaved; per case ``{"key",
    "status", "median_s", "samples", "contended", "contention_reason", "reason", "build_s",
    "window_s"}``. A case in ``controls`` (keys) is timed as two members of the cycle, never one right
    after the other (``control_median_s``: the second, or the first with ``control_first``, which the
    sweep alternates by round): an A/A pair whose ratio must come out equal. A case
    ``with_defaults`` (a tuned config) has the kernel at its defaults timed beside it, the two in the
    same alternating order (``defaults_median_s``): what tuning changed, paired by round. A case whose
    step cannot be built answers its status and reason; the others are timed without it."""
    out, timed = [], []
    for case, number in jobs:
        answer = {"key": case.key, "status": records.OK, "reason": None, "build_s": 0.0, "window_s": 0.0}
        began = time.perf_counter()
        try:
            clock = defaults_clock = None
            if case.regime == "static":
                step, per = warm_step(case), 1
                defaults = warm_step(case, defaults=True) if case.with_defaults else None
                clock = warm_clock(case)  # the first window's timer: a device's where it has one
                defaults_clock = warm_clock(case, defaults=True) if case.with_defaults else None
            else:  # a production stream's way: its sample of steps, one pass per block
                step, defaults, number = warm_stream(case), None, 1
                per = step.steps  # a block's seconds over these: the sample's mean step
            timed.append((answer, step, max(1, int(number)), case.key in controls, defaults, per,
                          clock, defaults_clock))
        except Exception as exc:  # noqa: BLE001 - one case failing never stops the round
            _steps.pop(case.key, None)
            _steps.pop(case.key + "|clock", None)
            answer.update(status=classify_exception(exc), reason=f"{type(exc).__name__}: {exc}"[:500])
        answer["build_s"] = time.perf_counter() - began
        out.append(answer)
    if not timed:
        return out
    runs, numbers, clocks, owners, keep, apart = [], [], [], [], [], set()
    for answer, step, number, control, defaults, per, clock, defaults_clock in timed:
        second = "control" if control else "defaults" if defaults is not None else None
        slots = ((second, None) if control_first else (None, second)) if second else (None,)
        if control:  # the same step twice: never one window's block right after the other's
            apart.add(frozenset((len(runs), len(runs) + 1)))
        for slot in slots:
            runs.append((defaults if slot == "defaults" else step).run)
            clocks.append(defaults_clock if slot == "defaults" else clock)
            numbers.append(clocks[-1].calls_per_sample if clocks[-1] else number)
            owners.append((answer, slot, per))
            keep.append(per == 1)  # a stream sample's pass: its one block is the round's value
    began = time.perf_counter()
    try:
        with ContentionMonitor() as monitor:
            timings = time_interleaved(runs, numbers=numbers, min_seconds=window_s, min_samples=min_samples,
                                       keep_timing=keep, apart=frozenset(apart), clocks=clocks)
    except Exception as exc:  # noqa: BLE001 - a step that fails mid-window fails the group's round
        for answer, *_ in timed:
            answer.update(status=classify_exception(exc), reason=f"{type(exc).__name__}: {exc}"[:500])
        return out
    contention = monitor.result.columns()
    spent = (time.perf_counter() - began) / len(timed)
    for (answer, slot, per), timing in zip(owners, timings, strict=True):
        if slot:
            answer[f"{slot}_median_s"] = timing.median_s
            continue
        answer.update(median_s=timing.median_s / per,
                      samples=json.dumps([x / per for x in timing.samples_s]), window_s=spent,
                      contended=bool(contention.get("contended")),
                      contention_reason=contention.get("contention_reason"))
    return out


def time_interleaved(runs: list, *, numbers: list[int], min_seconds: float, min_samples: int = 5,
                     enough_seconds: float = 0.05, least_samples: int = 1,
                     keep_timing: list[bool] | None = None,
                     apart: frozenset[frozenset[int]] = frozenset(),
                     clocks: list | None = None) -> list[Timing]:
    """Several steps already warm in this process, timed together: one warm-up call each, then
    blocks (``numbers[i]`` calls of ``runs[i]``) in a **balanced cycle** (``balanced_cycle``), round
    and round, whole cycles, until every step has ``min_samples`` blocks (or, a slow step,
    ``least_samples`` blocks lasting ``enough_seconds``: one block of a step of 50 ms or more) and
    ``min_seconds`` per step have passed. Short blocks, milliseconds apart, see the same machine: the
    ratio of two steps' medians cancels what moved it over the window, and a burst of the host's
    other tenants (tens of milliseconds here) spoils a block or two, not the median (the paired
    ratios this gives: results/LOG.md, "Paired, adaptive rounds").

    Why a balanced cycle: a block reads what ran just before it. Here jax-xla's 1024-token step read
    16% slower right after itself than after another kernel, and jax-xla-chunked 16% slower after
    jax-xla than after jax-blockwise-flash (results/LOG.md, "Balanced rounds"): in a fixed order each
    step always follows the same neighbour, and a round's ratio flips with the order. In the cycle
    every step follows every other equally often and never itself, so its median does not depend on
    the order it was handed in. ``apart``: pairs of indices that never follow each other (the two
    windows of an A/A control: the same step, which after itself would read its slow case).

    ``keep_timing[i]`` False: run ``i`` is timed first in each pass only until done, outside the
    cycle (a stream sample's pass, a second or less of 32 different steps, whose one block is the
    round's value: docs/metrics.md).

    ``clocks[i]``: a device's timer of run ``i`` (``DeviceClock``; its ``calls_per_sample`` is
    ``numbers[i]``): its block is one ``timed_call()``, the device's own seconds per call, so a GPU's or
    TPU's rounds read the clock its first window read. None: the wall clock times the block."""
    clock = time.perf_counter
    clocks = list(clocks) if clocks is not None else [None] * len(runs)
    for run in runs:
        run()
    samples: list[list[float]] = [[] for _ in runs]
    keep = list(keep_timing) if keep_timing is not None else [True] * len(runs)
    once = [i for i, kept in enumerate(keep) if not kept]
    cycle = balanced_cycle([i for i, kept in enumerate(keep) if kept], apart)

    def block(i: int) -> None:
        if clocks[i] is not None:
            samples[i].append(clocks[i].timed_call())
            return
        start = clock()
        for _ in range(numbers[i]):
            runs[i]()
        samples[i].append((clock() - start) / numbers[i])

    def done(i: int) -> bool:
        mine = [x * numbers[i] for x in samples[i]]
        return len(mine) >= min_samples or (len(mine) >= least_samples and sum(mine) >= enough_seconds)

    begin = clock()
    while not all(done(i) for i in range(len(runs))) or clock() - begin < min_seconds * len(runs):
        waiting = [i for i in once if not done(i)]
        if not waiting and not cycle:  # every run done and none kept timing: nothing to fill the window
            break
        for i in waiting + cycle:
            block(i)
    return [summary(float("nan"), mine, number, device.name if device else "wall")
            for mine, number, device in zip(samples, numbers, clocks, strict=True)]


def balanced_cycle(nodes: list[int], apart: frozenset[frozenset[int]] = frozenset()) -> list[int]:
    """An order of ``nodes`` to repeat in which each node follows every other node once (the last
    wraps round to the first) and never itself, nor a node it is ``apart`` from: an Eulerian circuit
    of the complete directed graph on ``nodes`` without those edges (Hierholzer's algorithm; taking
    both edges of a pair keeps every node's in-degree equal to its out-degree). Each node appears
    ``len(nodes) - 1`` times, less one per node it is apart from. Fewer than 3 nodes, or a graph the
    apart pairs leave without one circuit through every node: ``nodes`` once."""
    succ = {i: [j for j in nodes if j != i and frozenset((i, j)) not in apart] for i in nodes}
    if len(nodes) < 3 or not all(succ.values()):
        return list(nodes)
    stack, circuit = [nodes[0]], []
    while stack:
        here = stack[-1]
        if succ[here]:
            stack.append(succ[here].pop(0))
        else:
            circuit.append(stack.pop())
    circuit.reverse()
    lap = circuit[:-1]  # the circuit ends where it began
    return lap if set(lap) == set(nodes) else list(nodes)  # apart pairs that cut the graph in two


def warm_step(case: Case, defaults: bool = False):
    """The case's step built in this process (or its kernel at its defaults), run once; kept."""
    key = case.key + ("|defaults" if defaults else "")
    if key not in _steps:
        impl = resolve_impl(case.impl, () if defaults else case.config)
        step = here.make_step(impl, case.workload, seed=case.options.seed)
        step.run()  # compiles (from the round's caches) and runs once, outside any window
        _steps[key] = step
    return _steps[key]


def warm_clock(case: Case, defaults: bool = False):
    """The device's timer of the case's warm step (``Backend.device_clock`` with the case's timer), or
    None where the wall clock times it; kept with the step."""
    key = case.key + ("|defaults" if defaults else "") + "|clock"
    if key not in _steps:
        impl = resolve_impl(case.impl, () if defaults else case.config)
        _steps[key] = here.backend_of(impl).device_clock(warm_step(case, defaults), case.options.timer)
    return _steps[key]


class StreamSample:
    """A production stream's way as a later round replays it (``regimes.stream_sample``): one runner,
    the sample's inputs placed and every shape compiled (from the rounds' caches) before any window;
    ``run()`` runs each sampled step once, so a window's block is one pass and its mean step,
    ``seconds / steps``, stands for the stream's mean steady step."""

    def __init__(self, case: Case):
        options = case.options
        impl = resolve_impl(case.impl, case.config)
        template, stream = regimes.stream_of(case.workload, options.regime_steps, options.seed,
                                             options.traffic, options.stream_windows)
        self.sample = regimes.stream_sample(template, options.regime, stream.steps, options.bucket_policy,
                                            stream.window_of)
        if not self.sample:
            raise ValueError(f"{case.key}: a stream of {len(stream.steps)} step(s) has no steady step "
                             "to time")
        self.runner = here.make_runner(impl, regimes.runner_template(template, options.regime), options.seed)
        for s in self.sample:
            self.runner.prepare(s.run_len, s.packed)
        self.run()  # compiles each shape (from the round's caches) and runs once, outside any window
        self.steps = len(self.sample)

    def run(self) -> None:
        for s in self.sample:
            self.runner.step(s.run_len, s.packed)


def warm_stream(case: Case) -> StreamSample:
    """The case's stream sample built in this process, run once; kept."""
    key = case.key + "|stream"
    if key not in _steps:
        _steps[key] = StreamSample(case)
    return _steps[key]


def first_calls(cases: list[Case]) -> list[dict]:
    """A round's stall probe, in a fresh process (``run/adaptive.py``): each static case's first call
    again (trace + compile + first run of its stream's one shape, on a fresh runner, with the cold
    compiler caches of its first pass), after one call of its kernel at another shape (batch + 1),
    so that what a kernel pays once per process (its module's first trace) is not charged to its
    shape's compile, as in the first pass, where a kernel's other lengths ran before it. Per case
    ``{"key", "status", "reason", "first_call_s"}``; one failing case never stops the others."""
    out, warmed = [], set()
    for case in cases:
        answer = {"key": case.key, "status": records.OK, "reason": None, "first_call_s": None}
        try:
            impl = resolve_impl(case.impl, case.config)
            template = regimes.stream_template(case.workload)
            length = template.stream_length
            with compiler_caches(case.options.compile_cache):
                if (case.impl, case.config) not in warmed:
                    other = here.make_runner(impl, template.replace(batch=template.batch + 1),
                                             case.options.seed)
                    other.prepare(length)
                    other.step(length)
                    warmed.add((case.impl, case.config))
                runner = here.make_runner(impl, template, case.options.seed)
                runner.prepare(length)
                start = time.perf_counter()
                runner.step(length)
                answer["first_call_s"] = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - one case failing never stops the probe
            answer.update(status=classify_exception(exc), reason=f"{type(exc).__name__}: {exc}"[:500])
        out.append(answer)
    return out


def forget() -> None:
    """Drop this process' built steps (tests)."""
    _steps.clear()
