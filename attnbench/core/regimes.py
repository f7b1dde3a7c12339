"""Shape regimes: what a stream of varying sequence lengths costs a compiled backend.

A compiled backend specializes its code to shapes, so a loop meeting new lengths must choose:
``static`` pads to ``max_len`` (one compile), ``dynamic`` runs exact lengths (one compile each),
``bucketed`` pads up to a bucket (one compile per bucket), ``packed`` (packed varlen) lays the
stream's requests end to end in rows of ``max_len`` and tells them apart by segment ids (one shape,
for a kernel that takes segment ids; ``pack``). ``stream_sample`` picks the steps a later timing
round replays of a stream. ``run_regime`` runs one seeded stream
through one ``Runner``, as a real loop keeps it, and records per step whether it compiled and how
long it took, so compile stalls land in the throughput instead of being warmed away.

Padding is right-padding: under a causal mask real outputs are unchanged, and either way the timing
measures the padded compute, which is what padding costs. Inputs are placed before each timed step.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnbench.core.traffic import DEFAULT_WINDOWS, UNIFORM, TrafficStream, is_trace, load, trace_stream
from attnbench.core.workload import Workload

REGIMES = ("static", "dynamic", "bucketed", "packed")
PACKED = "packed"
PACKED_PHASES = ("prefill", "training")  # a decode step's queries are one token per cache: nothing to pack
POLICY_FORMS = ("multiple-128", "pow2", "multiple-N (any N >= 1, e.g. multiple-64)")
_MULTIPLE = re.compile(r"^multiple-([0-9]+)$")


def length_stream(max_len: int, steps: int, seed: int, low_frac: float = 0.5) -> list[int]:
    """``steps`` lengths drawn uniformly from ``length_range``; seeded, so every regime and
    implementation gets the same stream."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}")
    lengths = length_range(max_len, low_frac)
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(lengths.start, max_len, size=steps, endpoint=True)]


def length_range(max_len: int, low_frac: float = 0.5) -> range:
    """The lengths ``length_stream`` draws from: ``[ceil(low_frac*max_len), max_len]``."""
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    if not 0.0 <= low_frac <= 1.0:
        raise ValueError(f"low_frac must be in [0, 1], got {low_frac!r}")
    return range(min(max_len, max(1, math.ceil(low_frac * max_len))), max_len + 1)


def _round_up(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def _next_pow2(length: int) -> int:
    return 1 << (length - 1).bit_length()


def bucket_policy(name: str) -> Callable[[int], int]:
    """The rounding rule named ``name``: ``multiple-N`` rounds up to a multiple of N, ``pow2`` to
    the next power of two. An unknown name raises ``ValueError`` naming it and the valid forms."""
    if name == "pow2":
        return _next_pow2
    match = _MULTIPLE.match(name) if isinstance(name, str) else None
    if match and int(match.group(1)) >= 1:
        multiple = int(match.group(1))
        return lambda length: _round_up(length, multiple)
    raise ValueError(f"unknown bucket policy {name!r}; valid forms: {', '.join(POLICY_FORMS)}")


def bucket(length: int, policy: str, max_len: int) -> int:
    """``length`` rounded up by ``policy``, capped at ``max_len`` (the static shape) so bucketing never
    pads more than static; kernels that need aligned lengths need an aligned ``max_len``."""
    if not 1 <= length <= max_len:
        raise ValueError(f"length {length} is outside [1, max_len={max_len}]")
    return min(bucket_policy(policy)(length), max_len)


def padded_length(length: int, regime: str, max_len: int, policy: str = "multiple-128") -> int:
    """The length a step of ``length`` really runs at under ``regime``."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    if not 1 <= length <= max_len:
        raise ValueError(f"length {length} is outside [1, max_len={max_len}]")
    if regime in ("static", PACKED):
        return max_len
    if regime == "dynamic":
        return length
    return bucket(length, policy, max_len)


@dataclass(frozen=True)
class StepTrace:
    step: int
    length: int  # real tokens per sequence: the step's longest (packed: its longest document)
    padded_length: int  # what ran
    compiled: bool | None  # the runner's compile count rose in this step (None: not reported)
    seconds: float  # wall time of the step, blocking, compile included
    compile_seconds: float | None = None  # what the framework says this step spent compiling
    real_tokens: int | None = None  # the batch's real lengths summed (None: batch x length)
    useful_tokens: int | None = None  # tokens the step served (decode: its busy slots' queries)
    window: int = 0  # the trace window the step belongs to (core/traffic.py)
    real_flops: float | None = None  # each sequence's FLOPs at its real length (None: at length)
    # False: a static stream's step not run, the same call on the same inputs as the timed ones,
    # counted at their steady mean (``run_regime``'s ``run_only``)
    timed: bool = True


@dataclass(frozen=True)
class RegimeResult:
    """One regime over one stream. Token and time totals include compile stalls."""

    impl: str
    regime: str
    policy: str | None  # bucket policy (bucketed only)
    max_len: int
    workload: str  # the template, described
    batch: int
    execution: str
    compiles: int | None  # compiles during the stream (None: the framework does not say)
    compile_seconds_total: float | None  # as the framework reports it (see the Runner)
    compile_cache_hits: int | None  # compiles a compiler cache served: 0 means every compile was cold
    # mean of the steps after the first (the cold first call) that did not compile: a stream's lengths
    # vary, so its steps' cost is their mean (a median would move the long steps' cost into "stalls")
    steady_seconds_per_step: float | None
    # Tokens and FLOPs the steady steps computed (padding included) per second; None: none steady.
    steady_tokens_per_s: float | None
    steady_flops_per_s: float | None
    total_seconds: float  # sum of every step's wall time, compiles included
    useful_tokens_per_s: float  # sum(batch * length) / total_seconds: padding and stalls cost
    padding_waste: float  # 1 - sum(length) / sum(padded_length): share of query tokens that pad
    padding_flops_waste: float  # the same over attention FLOPs (quadratic in length)
    shapes: tuple[int, ...]  # distinct padded lengths run, in order of first use
    trace: list[StepTrace] = field(default_factory=list)
    planned_steps: int | None = None  # the stream's steps; more than ran when its budget cut it

    def latency(self, percentile: float) -> float:
        """The step latency at ``percentile`` over every step run, compile stalls included."""
        return float(np.percentile([t.seconds for t in self.trace], percentile))

    @property
    def longest_stall_seconds(self) -> float | None:
        """The longest compiling step beyond a steady step: what one request waited on a compile."""
        if self.steady_seconds_per_step is None:
            return None
        slow = [t.seconds - self.steady_seconds_per_step for t in self.trace if t.compiled]
        return max(0.0, max(slow)) if slow else 0.0

    def windows(self) -> list[dict]:
        """Per trace window: its steps, seconds (stalls included) and useful tokens."""
        out: dict[int, dict] = {}
        for t in self.trace:
            w = out.setdefault(t.window, {"window": t.window, "steps": 0, "seconds": 0.0, "useful_tokens": 0})
            w["steps"] += 1
            w["seconds"] += t.seconds
            w["useful_tokens"] += _useful(t, self.batch)
        return [out[k] for k in sorted(out)]

    def window_steady_seconds(self) -> list[float]:
        """Per trace window, its seconds with each stalled step (the first call, a step that compiled,
        or where compiles go uncounted a shape's first step) at the steady step instead: what the
        window's traffic costs warm, the stalls left to the stall figures."""
        steady = self.steady_seconds_per_step
        out: dict[int, float] = {}
        seen: set[int] = set()
        for t in self.trace:
            stalled = (t.step == 0 or t.compiled is True
                       or (t.compiled is None and t.padded_length not in seen))
            seen.add(t.padded_length)
            value = steady if stalled and steady is not None else t.seconds
            out[t.window] = out.get(t.window, 0.0) + value
        return [out[k] for k in sorted(out)]

    @property
    def stall_seconds(self) -> float | None:
        """Time the compiling steps took beyond a steady step each: what recompiles cost in wall
        time, whatever the framework says its compile took (tracing and lowering included)."""
        if self.steady_seconds_per_step is None:
            return None
        slow = [t.seconds for t in self.trace if t.compiled]
        return sum(max(0.0, s - self.steady_seconds_per_step) for s in slow)


def stream_template(workload: Workload) -> Workload:
    """The runner's template of a case's stream: the workload, square when the case is."""
    return workload.replace(seq_k=workload.seq_q) if workload.seq_k == workload.seq_q else workload


def stream_of(workload: Workload, steps: int, seed: int, traffic: str = UNIFORM,
              windows: int = DEFAULT_WINDOWS) -> tuple[Workload, TrafficStream]:
    """A case's stream: the runner's template (square when the case is) and its steps, each step's
    real lengths one per sequence: from a trace (``core/traffic.py``: a built-in's name or a CSV path),
    or the synthetic ``uniform`` baseline (``length_stream``, every sequence of a step alike)."""
    template = stream_template(workload)
    max_len = workload.stream_length
    if is_trace(traffic):
        return template, trace_stream(load(traffic), workload.phase, max_len, workload.batch, steps, windows)
    lengths = length_stream(max_len, steps, seed)
    windows = max(1, min(windows, steps))
    per_window = -(-steps // windows) if steps else 1
    rows = tuple((n,) * workload.batch for n in lengths)
    return template, TrafficStream(source=UNIFORM, label="synthetic: uniform lengths in [L/2, L]",
                                   phase=workload.phase, max_len=max_len, batch=workload.batch, factor=1.0,
                                   steps=rows, unclipped=rows,
                                   window_of=tuple(i // per_window for i in range(steps)),
                                   requests=steps * workload.batch, population=None)


def step_sizes(step: int | Sequence[int], batch: int) -> tuple[int, ...]:
    """A step's real lengths, one per sequence: a bare length is every sequence of the batch alike."""
    return (int(step),) * batch if isinstance(step, (int, np.integer)) else tuple(int(n) for n in step)


def step_length(step: int | Sequence[int]) -> int:
    """A step's longest real length: what the regime pads from."""
    return max(step_sizes(step, 1))


def _real_flops(template: Workload, sizes: Sequence[int]) -> float:
    """A step's FLOPs at its sequences' real lengths: each sequence a batch's share at its length."""
    per_length = {n: template.at_length(n).flops / template.batch for n in set(sizes) if n}
    return float(sum(per_length[n] for n in sizes))


def _useful(t: StepTrace, batch: int) -> int:
    return t.useful_tokens if t.useful_tokens is not None else batch * t.length


@dataclass(frozen=True)
class PackedStep:
    """One step of a packed stream: per batch row, the documents (requests) laid in it, in order."""

    rows: tuple[tuple[int, ...], ...]
    window: int

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(n for row in self.rows for n in row)


def pack(steps: Sequence, window_of: Sequence[int], batch: int, max_len: int) -> list[PackedStep]:
    """The stream's requests packed as a varlen server packs them: in arrival order, each window on
    its own, each request laid after the last in the current row while it fits, else in the next
    row; a step is ``batch`` rows. The window's last step may have rows left empty (all padding).
    A request longer than ``max_len`` cannot arrive here: a stream's lengths are clipped to it."""
    out: list[PackedStep] = []
    by_window: dict[int, list[int]] = {}
    for step, w in zip(steps, window_of, strict=True):
        by_window.setdefault(int(w), []).extend(step_sizes(step, batch))
    for w, requests in by_window.items():
        rows: list[list[int]] = [[]]
        for n in requests:
            if not 1 <= n <= max_len:
                raise ValueError(f"a request of {n} tokens cannot be packed in rows of {max_len}")
            if sum(rows[-1]) + n > max_len:
                if len(rows) == batch:
                    out.append(PackedStep(tuple(tuple(r) for r in rows), w))
                    rows = []
                rows.append([])
            rows[-1].append(n)
        rows += [[] for _ in range(batch - len(rows))]
        out.append(PackedStep(tuple(tuple(r) for r in rows), w))
    return out


def regime_reason(workload: Workload, regime: str) -> str | None:
    """Why ``regime``'s stream cannot be made of ``workload`` (``None``: it can). Only ``packed``
    refuses: it packs prefill and training sequences, and it sets the segment ids itself."""
    if regime != PACKED:
        return None
    if workload.phase not in PACKED_PHASES:
        return (f"the packed regime packs prefill and training sequences; a {workload.phase} step's "
                "queries are one token per cache (its ragged caches are the dynamic regime's)")
    if workload.segmented:
        return f"the packed regime sets the segment ids itself; the workload has its own ({workload.mask})"
    return None


def runner_template(workload: Workload, regime: str) -> Workload:
    """The workload a stream's runner is built (and its kernel asked) for: ``workload`` itself, or for
    ``packed`` every row one document of ``max_len``, so that the kernel takes segment ids."""
    if regime != PACKED:
        return workload
    reason = regime_reason(workload, regime)
    if reason:
        raise ValueError(reason)
    return workload.replace(packed=((workload.stream_length,),) * workload.batch)


def run_regime(name: str, runner, template: Workload, regime: str, lengths: Sequence,
               policy: str = "multiple-128", windows: Sequence[int] | None = None,
               budget_s: float | None = None, run_only: Sequence[int] | None = None,
               ceiling_s: float | None = None) -> RegimeResult:
    """Run ``lengths`` through ``runner`` (kernel ``name``'s, fresh: ``here.make_runner``) under
    ``regime``: each step one length (every sequence alike) or one real length per sequence (a
    trace's batch), padded as the regime pads the step's longest.

    ``max_len`` is ``template.stream_length``: the sequence's length, or decode's cache, whose length
    the stream varies (a serving loop's caches grow and differ; the new queries stay fixed).
    Steady time is the mean of the non-compiling steps after the first (compiles unreported: of
    repeated padded lengths). ``windows``: each step's trace window. ``budget_s``: the stream stops
    after the step that spends it (``planned_steps`` says how many it had); ``ceiling_s`` likewise
    for a recompiling stream's steps after the first (``_over_ceiling``). ``run_only`` (static
    only): the steps run, whatever the budget; every other step is the same call on the same inputs
    (one shape, inputs placed once), counted at the run steps' steady mean, marked untimed.
    ``Unsupported`` (a length the kernel refuses) propagates.
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    if run_only is not None and regime != "static":
        raise ValueError("run_only is for a static stream, whose every step is one call on one shape")
    bucket_policy(policy)  # a bad name fails before anything runs, whatever the regime
    if regime == PACKED:
        return _run_packed(name, runner, template, lengths, windows, budget_s, ceiling_s)
    max_len = template.stream_length
    longest = [step_length(n) for n in lengths]
    padded = [padded_length(n, regime, max_len, policy) for n in longest]
    windows = list(windows) if windows is not None else [0] * len(padded)
    chosen = set(range(len(padded)) if run_only is None else run_only)
    decode = template.phase == "decode"

    clock = time.perf_counter
    trace: list[StepTrace] = []
    spent = 0.0
    for i, (step, length, run_len) in enumerate(zip(lengths, longest, padded, strict=True)):
        sizes = step_sizes(step, template.batch)
        facts = dict(step=i, length=length, padded_length=run_len, real_tokens=int(sum(sizes)),
                     useful_tokens=len(sizes) * template.seq_q if decode else int(sum(sizes)),
                     window=int(windows[i]), real_flops=_real_flops(template, sizes))
        if i not in chosen:
            trace.append(StepTrace(compiled=False, seconds=float("nan"), timed=False, **facts))
            continue
        runner.prepare(run_len)
        before, compile_before = runner.compiles(), runner.compile_seconds()
        start = clock()
        runner.step(run_len)
        seconds = clock() - start
        after, compile_after = runner.compiles(), runner.compile_seconds()
        compiled = None if before is None or after is None else after > before
        took = None if compile_before is None or compile_after is None else compile_after - compile_before
        trace.append(StepTrace(compiled=compiled, seconds=seconds, compile_seconds=took, **facts))
        spent += seconds
        if run_only is None and ((budget_s is not None and spent >= budget_s) or (  # a static one times few
                _over_ceiling(trace, spent, ceiling_s))):
            break
    if run_only is not None:  # the untimed steps at the timed ones' steady mean
        ran = [t for t in trace if t.timed]
        warm = [t.seconds for t in ran[1:] if not t.compiled] or [t.seconds for t in ran]
        steady = statistics.fmean(warm)
        trace = [t if t.timed else dataclasses.replace(t, seconds=steady) for t in trace]

    # Every step compiled (all lengths new): replay each shape warm, outside the trace, for a steady time.
    replay = []
    if all(t.compiled for t in trace):
        for run_len in dict.fromkeys(t.padded_length for t in trace):
            start = clock()
            runner.step(run_len)
            replay.append((run_len, clock() - start))
    return _summarize(name, regime, policy, template, runner, trace, replay, planned_steps=len(padded))


def _run_packed(name: str, runner, template: Workload, lengths: Sequence, windows: Sequence[int] | None,
                budget_s: float | None, ceiling_s: float | None = None) -> RegimeResult:
    """``run_regime`` for ``packed``: the stream's requests ``pack``ed, every step at ``max_len`` with
    its layout's segment ids. A step's padding is its rows' unfilled tails; its real FLOPs are each
    document's own causal square, the cross-document pairs a dense kernel computes and masks being
    waste like padding's."""
    base = template.replace(packed=None)
    max_len = base.stream_length
    windows = list(windows) if windows is not None else [0] * len(lengths)
    steps = pack(lengths, windows, base.batch, max_len)
    clock = time.perf_counter
    trace: list[StepTrace] = []
    spent = 0.0
    for i, step in enumerate(steps):
        sizes = step.sizes
        runner.prepare(max_len, step.rows)
        before, compile_before = runner.compiles(), runner.compile_seconds()
        start = clock()
        runner.step(max_len, step.rows)
        seconds = clock() - start
        after, compile_after = runner.compiles(), runner.compile_seconds()
        trace.append(StepTrace(
            step=i, length=max(sizes, default=0), padded_length=max_len,
            compiled=None if before is None or after is None else after > before, seconds=seconds,
            compile_seconds=(None if compile_before is None or compile_after is None
                             else compile_after - compile_before),
            real_tokens=sum(sizes), useful_tokens=sum(sizes), window=step.window,
            real_flops=_real_flops(base, sizes)))
        spent += seconds
        if (budget_s is not None and spent >= budget_s) or _over_ceiling(trace, spent, ceiling_s):
            break
    return _summarize(name, PACKED, "", base, runner, trace, planned_steps=len(steps))


def _over_ceiling(trace: list[StepTrace], spent: float, ceiling_s: float | None) -> bool:
    """Whether a recompiling stream (a step after the first compiled) has spent ``ceiling_s`` on its
    steps after the first. A stream that compiles no more is never cut by it: its steps are cheap
    to finish, and a fresh process's first steps run slow whatever the way."""
    return (ceiling_s is not None and len(trace) > 1 and spent - trace[0].seconds >= ceiling_s
            and any(t.compiled for t in trace[1:]))


STREAM_SAMPLE_STEPS = 32  # a production stream's steps a later round times (``stream_sample``)


@dataclass(frozen=True)
class SampleStep:
    """One step of a stream as a later round replays it: the length it runs at, and a packed step's
    layout (None otherwise)."""

    run_len: int
    packed: tuple[tuple[int, ...], ...] | None = None


def stream_sample(template: Workload, regime: str, lengths: Sequence, policy: str = "multiple-128",
                  windows: Sequence[int] | None = None,
                  count: int = STREAM_SAMPLE_STEPS) -> tuple[SampleStep, ...]:
    """The steps of a stream that a later timing round replays warm, so that a way through the stream
    is measured again round by round, paired, instead of once (docs/metrics.md, "Rounds"): ``count``
    of its steps after the first (the cold first call is its stall's), spread evenly over them
    sorted by the length they run at (a systematic sample: one from each of ``count`` equal-count
    slices of the stream's lengths, so the sample's mean step stands for the stream's mean steady
    step). The same steps every round, for every kernel of the stream. ``lengths`` and ``windows``
    as ``run_regime`` takes them."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    max_len = template.stream_length
    if regime == PACKED:
        base = template.replace(packed=None)
        packed = pack(lengths, list(windows) if windows is not None else [0] * len(lengths), base.batch,
                      base.stream_length)
        steps = [SampleStep(base.stream_length, p.rows) for p in packed]
        order = [(sum(p.sizes), i) for i, p in enumerate(packed)]  # the real tokens a step carries
    else:
        steps = [SampleStep(padded_length(step_length(n), regime, max_len, policy)) for n in lengths]
        order = [(s.run_len, i) for i, s in enumerate(steps)]
    ranked = [i for _, i in sorted(order[1:])]
    if not ranked:
        return ()
    take = min(count, len(ranked))
    return tuple(steps[ranked[int((j + 0.5) * len(ranked) / take)]] for j in range(take))


def spread_steps(window_of: Sequence[int], count: int) -> list[int]:
    """``count`` steps spread over the windows: the first ``count / windows`` (at least 2: the first
    call and a warm one) of each window, in order."""
    by_window: dict[int, list[int]] = {}
    for i, w in enumerate(window_of):
        by_window.setdefault(w, []).append(i)
    each = max(2, -(-count // max(1, len(by_window))))
    return sorted(i for steps in by_window.values() for i in steps[:each])


def _summarize(name: str, regime: str, policy: str, template: Workload, runner,
               trace: list[StepTrace], replay: Sequence[tuple[int, float]] = (),
               planned_steps: int | None = None) -> RegimeResult:
    """The stream's figures. ``replay``: (padded length, seconds) of warm re-runs, used as the
    steady steps when every step of the stream compiled. The first step is the cold first call in
    every framework: never steady."""
    if any(t.compiled is None for t in trace):
        seen: set[int] = set()
        steady = []
        for t in trace:
            if t.padded_length in seen and t.timed and t.step > 0:
                steady.append((t.padded_length, t.seconds))
            seen.add(t.padded_length)
    else:
        steady = [(t.padded_length, t.seconds) for t in trace if not t.compiled and t.timed and t.step > 0]
    steady = steady or list(replay)
    total = sum(t.seconds for t in trace)
    batch = template.batch
    real = sum(t.real_tokens if t.real_tokens is not None else batch * t.length for t in trace)
    computed = batch * sum(t.padded_length for t in trace)

    def flops(length: int) -> float:
        return template.at_length(length).flops

    steady_seconds = sum(seconds for _, seconds in steady)
    steady_rate = steady_seconds > 0

    real_flops = sum(t.real_flops if t.real_flops is not None else flops(t.length) for t in trace)
    computed_flops = sum(flops(t.padded_length) for t in trace)
    return RegimeResult(
        impl=name, regime=regime, policy=policy if regime == "bucketed" else None,
        max_len=template.stream_length, workload=template.describe(), batch=template.batch,
        execution=runner.execution, compiles=runner.compiles(),
        compile_seconds_total=runner.compile_seconds(),
        compile_cache_hits=runner.cache_hits(),
        steady_seconds_per_step=statistics.fmean(s for _, s in steady) if steady else None,
        steady_tokens_per_s=(template.batch * sum(template.at_length(n).seq_q for n, _ in steady)
                             / steady_seconds if steady_rate else None),
        steady_flops_per_s=sum(flops(n) for n, _ in steady) / steady_seconds if steady_rate else None,
        total_seconds=total,
        # decode: every step's useful tokens are its queries; its padding is the cache's
        useful_tokens_per_s=(sum(_useful(t, batch) for t in trace) / total if total > 0 else float("nan")),
        padding_waste=1.0 - real / computed if computed else 0.0,
        padding_flops_waste=1.0 - real_flops / computed_flops if computed_flops else 0.0,
        shapes=tuple(dict.fromkeys(t.padded_length for t in trace)),
        trace=trace, planned_steps=planned_steps,
    )


def trace_to_rows(result: RegimeResult) -> list[dict]:
    """One dict per step for a per-step trace file. ``usd`` is left ``None`` for the engine to
    fill in (cost of the step on a priced machine); ``tokens`` are real (unpadded) tokens."""
    return [{
        "impl": result.impl, "regime": result.regime, "policy": result.policy,
        "workload": result.workload, "step": t.step, "length": t.length,
        "padded_length": t.padded_length, "window": t.window, "tokens": _useful(t, result.batch),
        "compiled": t.compiled, "compile_seconds": t.compile_seconds, "seconds": t.seconds, "timed": t.timed,
        "usd": None,
    } for t in result.trace]
