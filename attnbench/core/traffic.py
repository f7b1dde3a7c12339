"""Traffic: the request lengths a production stream is made of, read from a trace of real requests.

A trace is a CSV with one row per request, in arrival order: ``ContextTokens`` (the prompt, what a
prefill computes and a decode's cache starts from), and optionally ``GeneratedTokens`` (how many
decode steps the request takes) and ``TIMESTAMP``. ``length`` is accepted for ``ContextTokens``, so a
one-column file of lengths is a trace too. Two public traces ship with the project
(``attnbench/traces/``, CC-BY 4.0): the Azure LLM inference traces of the Splitwise paper (ISCA 2024),
conversation (``azure-conv``) and code (``azure-code``). ``uniform`` is the synthetic baseline: no
trace, lengths drawn uniformly from ``[L/2, L]`` (``regimes.length_stream``).

How a trace becomes a stream of steps (``trace_stream``; docs/workloads.md says it for users):
- **Scaled, then clipped.** Every token count is multiplied by ``min(1, L / p99)``, ``L`` the workload's
  longest length and ``p99`` the trace's 99th percentile of what the stream's lengths are made of
  (context for prefill, context + generated for decode), rounded up, at least 1. A workload as long as
  the trace's lengths runs them unscaled. What still exceeds ``L`` after scaling (about 1%) is clipped
  to ``L``, and counted.
- **Windows.** The stream is ``windows`` stretches of the trace, one in each equal part of it, each
  taken in arrival order: a server's stretch of traffic, several of them so the stream's lengths follow
  the whole trace's (their Kolmogorov-Smirnov distance is reported), and so the stream's cost has an
  interval over windows. Within its part, each window sits at the offset (of ``OFFSETS`` tried) whose
  lengths are closest to the whole trace's (``_placed``), chosen from lengths only, before anything runs.
- **Batches as a server forms them.** Prefill: each step takes the next ``batch`` requests. Decode:
  ``batch`` slots, each holding a request whose cache grows by one token per step from its context;
  a request leaves after its generated tokens and the next one in arrival order takes its slot
  (continuous batching). A step's lengths are its sequences' real lengths; the regime decides what it
  is padded to (``regimes.padded_length``).
"""

from __future__ import annotations

import csv
import functools
import math
import os
from dataclasses import dataclass

import numpy as np

from attnbench.core.errors import UnknownName

TRACE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces")
BUILTIN = {
    "azure-conv": ("AzureLLMInferenceTrace_conv.csv", "Azure LLM inference trace 2023, conversation"),
    "azure-code": ("AzureLLMInferenceTrace_code.csv", "Azure LLM inference trace 2023, code"),
}
UNIFORM = "uniform"  # the synthetic baseline: no trace
CONTEXT = ("contexttokens", "context_tokens", "length")
GENERATED = ("generatedtokens", "generated_tokens")
TIMESTAMP = ("timestamp",)
SCALE_QUANTILE = 99.0
DEFAULT_WINDOWS = 8
OFFSETS = 32  # window placements tried (``_placed``)


class TraceError(ValueError):
    """A trace file that cannot be read, naming the file and the line (1 is the header)."""

    def __init__(self, path: str, line: int, what: str):
        super().__init__(f"{path}:{line}: {what}")
        self.path, self.line, self.what = path, line, what


@dataclass(frozen=True)
class Trace:
    """One trace's requests in arrival order."""

    name: str  # a built-in's name, or the file's path
    path: str
    context: tuple[int, ...]
    generated: tuple[int, ...] | None  # None: the file has no GeneratedTokens column
    timestamps: tuple[str, ...] | None
    lines: tuple[int, ...]  # each request's line in the file, for errors that name it

    @property
    def label(self) -> str:
        return BUILTIN[self.name][1] if self.name in BUILTIN else f"user trace {self.name}"


def builtin_path(name: str) -> str:
    return os.path.join(TRACE_DIR, BUILTIN[name][0])


def is_trace(source: str | None) -> bool:
    """Whether ``source`` names a trace (a built-in or a file), not the uniform baseline."""
    return bool(source) and source != UNIFORM


def load(source: str) -> Trace:
    """The built-in trace named ``source``, else the CSV file at that path (``read_trace``)."""
    if source in BUILTIN:
        return _builtin(source)
    if source == UNIFORM:
        raise ValueError("'uniform' is the synthetic baseline, not a trace file")
    if not os.path.isfile(source):
        known = ", ".join([*BUILTIN, UNIFORM])
        raise UnknownName(f"no trace {source!r}: neither a file nor one of {known}")
    return read_trace(source)


@functools.lru_cache(maxsize=len(BUILTIN))
def _builtin(name: str) -> Trace:
    """A built-in trace, read once per process: it ships with the package and never changes, and a
    report reads each several times (a Trace is frozen)."""
    return read_trace(builtin_path(name), name=name)


def _column(header: list[str], names: tuple[str, ...]) -> int | None:
    wanted = [h.strip().lower() for h in header]
    return next((wanted.index(n) for n in names if n in wanted), None)


def _count(path: str, line: int, column: str, raw: str, least: int) -> int:
    text = raw.strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(path, line, f"{column} must be a whole number of tokens, got {raw!r}") from None
    if value < least:
        what = "negative" if value < 0 else "zero"
        raise TraceError(path, line, f"{column} is {what} ({value}); it must be at least {least}")
    return value


def read_trace(path: str, name: str | None = None) -> Trace:
    """The requests of the CSV at ``path``. ``TraceError`` (a ``ValueError``: the CLI's exit 2) names
    the file and line of the first problem: an empty file, no ContextTokens (or ``length``) column, a
    row without it, a count that is not a whole number, a negative count, or a context of zero."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except OSError as error:
        raise TraceError(path, 0, f"cannot read the file ({error.strerror or error})") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise TraceError(path, 1, f"not a CSV text file ({error})") from None
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise TraceError(path, 1, "empty file: expected a header with ContextTokens "
                                  "(or length), optionally GeneratedTokens and TIMESTAMP")
    header = rows[0]
    c_col, g_col, t_col = (_column(header, names) for names in (CONTEXT, GENERATED, TIMESTAMP))
    if c_col is None:
        raise TraceError(path, 1, f"no ContextTokens (or length) column; the header is {','.join(header)!r}")
    context, generated, stamps, lines = [], [], [], []
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # a blank line (a trailing newline)
        if c_col >= len(row) or (g_col is not None and g_col >= len(row)):
            raise TraceError(path, number, f"the row has {len(row)} fields; the header has {len(header)}")
        context.append(_count(path, number, header[c_col].strip(), row[c_col], 1))
        if g_col is not None:
            generated.append(_count(path, number, header[g_col].strip(), row[g_col], 0))
        if t_col is not None and t_col < len(row):
            stamps.append(row[t_col].strip())
        lines.append(number)
    if not context:
        raise TraceError(path, 2, "no requests: the file has a header and nothing else")
    return Trace(name=name or path, path=path, context=tuple(context),
                 generated=tuple(generated) if g_col is not None else None,
                 timestamps=tuple(stamps) if t_col is not None and len(stamps) == len(context) else None,
                 lines=tuple(lines))


def requests_per_hour(trace: Trace) -> float | None:
    """The trace's own request rate: its requests after the first over the hours from its first
    ``TIMESTAMP`` to its last (a production horizon in hours is priced at it); None where the trace has
    no timestamps, fewer than two requests, or its stamps span no time. ``TraceError`` names the line of
    a stamp that is not an ISO 8601 date and time."""
    from datetime import datetime

    if trace.timestamps is None or len(trace.timestamps) < 2:
        return None
    ends = []
    for index in (0, -1):
        try:
            ends.append(datetime.fromisoformat(trace.timestamps[index]))
        except ValueError:
            raise TraceError(trace.path, trace.lines[index], f"TIMESTAMP {trace.timestamps[index]!r} is not "
                             "an ISO 8601 date and time (2023-11-16 18:15:46.68)") from None
    hours = (ends[1] - ends[0]).total_seconds() / 3600
    return (len(trace.timestamps) - 1) / hours if hours > 0 else None


def check_context(trace: Trace, context: int, phase: str) -> None:
    """``TraceError`` at the first request longer than the model's ``context`` (decode: its context
    plus its generated tokens, the cache it ends with)."""
    ends = _ends(trace, phase)
    over = np.flatnonzero(ends > context)
    if len(over):
        i = int(over[0])
        raise TraceError(trace.path, trace.lines[i],
                         f"a request of {int(ends[i]):,} tokens exceeds the model's context of {context:,} "
                         f"({len(over)} such request{'s' if len(over) > 1 else ''} in the trace)")


def _ends(trace: Trace, phase: str) -> np.ndarray:
    context = np.asarray(trace.context, dtype=np.int64)
    if phase == "decode":
        if trace.generated is None:
            raise TraceError(trace.path, 1, "a decode stream needs a GeneratedTokens column")
        return context + np.asarray(trace.generated, dtype=np.int64)
    return context


def scale_factor(trace: Trace, phase: str, max_len: int) -> float:
    """``min(1, max_len / p99)`` of the lengths the stream is made of (module doc)."""
    p99 = float(np.percentile(_ends(trace, phase), SCALE_QUANTILE))
    return min(1.0, max_len / p99) if p99 > 0 else 1.0


def _scaled(count: int, factor: float) -> int:
    return max(1, math.ceil(count * factor - 1e-9))


@dataclass(frozen=True)
class TrafficStream:
    """A stream of steps from a trace: each step's real lengths (one per sequence of the batch)."""

    source: str  # the trace's name
    label: str
    phase: str
    max_len: int
    batch: int
    factor: float  # the scale (module doc)
    steps: tuple[tuple[int, ...], ...]  # each step's real lengths, clipped to max_len
    unclipped: tuple[tuple[int, ...], ...]  # the same before clipping
    window_of: tuple[int, ...]  # each step's window
    requests: int  # requests the stream took (prefill) or admitted (decode)
    population: tuple[int, ...] | None  # the whole trace's lengths under the same rule, unclipped
    # (None: the uniform baseline, drawn from no trace)

    @property
    def clipped(self) -> int:
        """How many sequence lengths of the stream were clipped to ``max_len``."""
        return sum(n > self.max_len for step in self.unclipped for n in step)

    def ks_distance(self) -> float:
        """The Kolmogorov-Smirnov distance of the stream's lengths (before clipping) from the trace's."""
        return ks_distance([n for step in self.unclipped for n in step], self.population)


def ks_distance(sample, population) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    a, b = np.sort(np.asarray(sample, dtype=float)), np.asarray(population, dtype=float)
    if not len(a) or not len(b):
        raise ValueError("ks_distance needs two non-empty samples")
    values, counts = np.unique(b, return_counts=True)  # sorted distinct values: a trace's lengths repeat
    return _ks_against(a, values, np.cumsum(counts) / len(b))


def _ks_against(a: np.ndarray, values: np.ndarray, cdf: np.ndarray) -> float:
    """KS of the sorted sample ``a`` against a population given as its distinct ``values`` and their
    cumulative shares ``cdf``; the CDFs only step at the two samples' values."""
    grid = np.union1d(values, a)
    sample_cdf = np.searchsorted(a, grid, side="right") / len(a)
    below = np.searchsorted(values, grid, side="right") - 1
    population_cdf = np.where(below >= 0, cdf[np.clip(below, 0, None)], 0.0)
    return float(np.max(np.abs(sample_cdf - population_cdf)))


def _starts(total: int, per_window: int, windows: int, offset: int) -> list[int]:
    """``windows`` window starts, one per equal stretch of ``total`` steps, ``offset`` into each."""
    stride = total // windows
    return [w * stride + min(offset, max(0, stride - per_window)) for w in range(windows)]


def _placed(timeline: list[tuple[int, ...]], per_window: int, windows: int) -> list[int]:
    """The window starts whose lengths are closest to the whole trace's (the smallest KS distance)
    among ``OFFSETS`` evenly spaced offsets into each stretch: lengths only, chosen before anything is
    measured and the same for every kernel, as SimPoint picks a program's representative slices."""
    values, counts = np.unique(np.fromiter((n for step in timeline for n in step), dtype=float),
                               return_counts=True)
    cdf = np.cumsum(counts) / counts.sum()
    stride = len(timeline) // windows
    room = max(0, stride - per_window)
    best = None
    for offset in sorted({room * k // OFFSETS for k in range(OFFSETS)}):
        starts = _starts(len(timeline), per_window, windows, offset)
        sample = [n for s in starts for step in timeline[s: s + per_window] for n in step]
        distance = _ks_against(np.sort(np.asarray(sample, dtype=float)), values, cdf)
        if best is None or distance < best[0]:
            best = (distance, starts)
    return best[1]


def trace_stream(trace: Trace, phase: str, max_len: int, batch: int, steps: int,
                 windows: int = DEFAULT_WINDOWS) -> TrafficStream:
    """``steps`` steps of ``batch`` sequences from ``trace`` (module doc), in ``windows`` windows of
    equal length (``steps`` is rounded up to a multiple of ``windows``)."""
    for name, value in (("max_len", max_len), ("batch", batch), ("steps", steps), ("windows", windows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    windows = min(windows, steps)
    per_window = -(-steps // windows)
    factor, timeline, admitted = _timeline(trace, phase, max_len, batch)
    if per_window * windows > len(timeline):
        raise ValueError(f"{windows} windows of {per_window} steps need {per_window * windows} steps; "
                         f"{trace.name} makes {len(timeline)} at batch {batch}")
    starts = _placed(timeline, per_window, windows)
    unclipped = [timeline[s + i] for s in starts for i in range(per_window)]
    # the requests a window sees: those in its first step's batch and those admitted during it
    seen = sum(len(timeline[s]) + admitted[s + per_window - 1] - admitted[s] for s in starts)
    return TrafficStream(
        source=trace.name, label=trace.label, phase=phase, max_len=max_len, batch=batch, factor=factor,
        steps=tuple(tuple(min(n, max_len) for n in step) for step in unclipped),
        unclipped=tuple(unclipped), window_of=tuple(w for w in range(windows) for _ in range(per_window)),
        requests=seen, population=tuple(n for step in timeline for n in step))


@functools.lru_cache(maxsize=8)
def _timeline(trace: Trace, phase: str, max_len: int, batch: int) -> tuple[float, list, list]:
    """The scale and the whole trace served at ``batch``: each step's lengths, unclipped, and the
    requests admitted up to each step (a process's cases share it: the decode timeline is long)."""
    factor = scale_factor(trace, phase, max_len)
    context = [_scaled(n, factor) for n in trace.context]
    if phase == "decode":
        ends = _ends(trace, phase)
        generated = [_scaled(int(e - c), factor) if e > c else 0
                     for e, c in zip(ends, trace.context, strict=True)]
        return (factor, *_decode_timeline(context, generated, batch))
    timeline = [tuple(context[i: i + batch]) for i in range(0, len(context) - batch + 1, batch)]
    return factor, timeline, [(i + 1) * batch for i in range(len(timeline))]


def _decode_timeline(context: list[int], generated: list[int],
                     batch: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """Continuous batching over the whole trace: each step's cache lengths (one per busy slot), and
    for each step the number of requests admitted before it."""
    slots: list[list[int]] = []  # [cache length, decode steps left]
    out: list[tuple[int, ...]] = []
    admitted_before: list[int] = []
    queue = [i for i in range(len(context)) if generated[i] > 0]
    taken = 0
    while True:
        while len(slots) < batch and taken < len(queue):
            slots.append([context[queue[taken]], generated[queue[taken]]])
            taken += 1
        if not slots:
            return out, admitted_before
        out.append(tuple(cache for cache, _ in slots))
        admitted_before.append(taken)
        for slot in slots:
            slot[0] += 1
            slot[1] -= 1
        slots = [slot for slot in slots if slot[1] > 0]
