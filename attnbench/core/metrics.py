"""Every metric, once: one row per metric, read by the records, the asv suite, the analysis and the report.

Record units, the ``track_<name>`` benchmarks, directions, companions and the report's plots all
derive from this table (docs/suite.md). Renaming a row or changing its unit starts a new asv history
for that benchmark.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.core.errors import UnknownName
from attnbench.core.stats import CONFIDENCE, min_values
from attnbench.core.statuses import STATUS_CODES

# Bump only when a metric's meaning changes: asv drops the older history of every benchmark then.
METRIC_VERSION = "1"

DIRECTIONS = ("lower", "higher", None)  # what is better; None: neither (not analysed for regressions)
# What a metric is about. Reports and the cost-spike attribution select rows by group.
GROUPS = {
    "timing": "steady-state seconds per step",
    "throughput": "tokens per second and its twins",
    "compute": "FLOP rate and utilisation against the device's peak",
    "compile": "first call, compiles and compile seconds",
    "shapes": "what the shape regime costs: padding, useful tokens per second",
    "memory": "bytes, one metric per memory source",
    "cost": "USD at the on-demand price",
    "numerics": "error against the float64 reference",
    "status": "how the case ended",
}


# How a step in a metric's series is judged (results/steps.py):
JUDGED = {
    "noise": "beyond the figures' combined uncertainty, never below the machine's noise floor for it",
    "exact": "deterministic (compiler output, counts): any step beyond the threshold is real",
    "allocator": "an allocator's figure: alerts only for a step that holds on both sides and exceeds "
                 "ALLOCATOR_MIN_STEP; otherwise a companion of other steps",
    "tolerance": "an error: alerts when it crosses its dtype's tolerance or rises by more than "
                 "TOLERANCE_FRACTION of it",
}
ALLOCATOR_MIN_STEP = 2**20  # bytes: the resident high-water mark moves in pages and allocator arenas
TOLERANCE_FRACTION = 0.25


@dataclass(frozen=True)
class Metric:
    """One metric: one asv ``track_<name>`` benchmark and one ``metric`` value of the tidy table."""

    name: str  # the asv benchmark is track_<name>; the tidy table's ``metric`` column
    column: str  # the record column it reads
    unit: str  # the asv unit
    direction: str | None  # "lower" / "higher" is better (asv itself only knows lower-is-better)
    group: str  # a key of GROUPS
    twin: str | None = None  # higher-is-better only: the row of the same quantity, lower-is-better
    derive: Callable[[dict], float] | None = None  # None: reads ``column`` as is
    record_unit: str | None = None  # the record column's unit, where it differs from ``unit``
    companion: bool = False  # listed beside a cost spike when it moved across the same commits
    # Power of the timed step's seconds it follows (+1, -1, 0); nonzero: asv gets the scaled samples.
    time_exponent: int = 0
    # Depends on elapsed time, so a contended measurement (``records`` ``contended``) is unreliable.
    timed: bool = True
    # Power of the whole run's speed shift it follows (None: ``time_exponent``), samples or not.
    run_exponent: int | None = None
    # Already divided by a same-run peak (a CPU's GEMM probe): not divided by the run's shift again.
    per_run_peak: bool = False
    # One reading per run, no samples: judged by its series' run-to-run scatter.
    one_reading: bool = False
    # How a step of it is judged (JUDGED): against the noise, exactly, as an allocator's figure, or
    # against its dtype's tolerance.
    judged: str = "noise"

    @property
    def shift_exponent(self) -> int:
        """``run_exponent``, else ``time_exponent``: the power of the run's shift this figure follows."""
        return self.time_exponent if self.run_exponent is None else self.run_exponent

    def value(self, record: dict) -> float:
        """The metric of one engine record (NaN where the record has no value for it)."""
        if self.derive is not None:
            return self.derive(record)
        return _num(record.get(self.column))

    def asv_value(self, record: dict):
        """What the asv ``track_`` benchmark returns: the value, or, for a timed-step metric measured
        in enough rounds to carry asv's 99% interval (``stats.min_values``), ``{"samples": [...],
        "number": 1}`` so asv computes the median and that interval itself (``asv_runner.statistics``).
        Samples are the rounds' medians, scaled by ``time_exponent`` so that asv's median is the
        record's figure. With fewer rounds (or one window's samples, which are not independent) asv
        gets the value alone: its fallback for a few samples, a Laplace posterior, reaches below zero."""
        value = self.value(record)
        raw = record.get("round_medians_s") if (record.get("rounds") or 1) > 1 else None
        if (not self.time_exponent or not raw or not math.isfinite(value)
                or not record.get("seconds_per_step")):
            return value
        samples = _kept(raw, record.get("round_ids"), record.get("contended_rounds"))
        if len(samples) < min_values(CONFIDENCE):
            return value
        median = record["seconds_per_step"]
        return {"samples": [value * (s / median) ** self.time_exponent for s in samples if s > 0],
                "number": 1}

    @property
    def column_unit(self) -> str | None:
        """The unit of the record column, for a row that reads its column as is; None otherwise."""
        if self.derive is not None:
            return None
        return self.unit if self.record_unit is None else self.record_unit


def _kept(medians, ids, contended) -> list[float]:
    """The round medians a figure is the median of: those of rounds no other process shared."""
    load = (lambda raw: json.loads(raw) if isinstance(raw, str) else list(raw or []))
    medians, ids, busy = load(medians), load(ids), set(load(contended))
    if not busy or len(ids) != len(medians):
        return medians
    return [m for i, m in zip(ids, medians, strict=True) if i not in busy]


def _num(value) -> float:
    return math.nan if value is None else float(value)


def _status_code(record: dict) -> float:
    return float(STATUS_CODES[record["status"]])


def _mfu_shortfall(record: dict) -> float:
    return _num(1.0 - record["mfu"]) if record.get("mfu") is not None else math.nan


def _seconds_per_gb(record: dict) -> float:
    return 1e9 / record["bytes_per_s"] if record.get("bytes_per_s") else math.nan


def _seconds_per_pflop(record: dict) -> float:
    return 1e-3 / record["tflops"] if record.get("tflops") else math.nan


def _seconds_per_million_useful_tokens(record: dict) -> float:
    rate = record.get("useful_tokens_per_s")
    return 1e6 / rate if rate else math.nan


L, H = "lower", "higher"
# Row order is the order of the asv benchmarks' definition and of every table derived from this one.
METRICS: list[Metric] = [
    Metric("seconds_per_step", "seconds_per_step", "seconds", L, "timing", record_unit="s", companion=True,
           time_exponent=1),
    Metric("tokens_per_s", "tokens_per_s", "tokens/s", H, "throughput", twin="seconds_per_million_tokens",
           companion=True, time_exponent=-1),
    Metric("seconds_per_million_tokens", "seconds_per_million_tokens", "seconds", L, "throughput",
           record_unit="s", time_exponent=1),
    Metric("tflops", "tflops", "TFLOP/s", H, "compute", twin="seconds_per_pflop", time_exponent=-1),
    Metric("seconds_per_pflop", "tflops", "seconds", L, "compute", derive=_seconds_per_pflop,
           time_exponent=1),
    Metric("mfu", "mfu", "fraction", H, "compute", twin="mfu_shortfall", time_exponent=-1, per_run_peak=True),
    Metric("mfu_shortfall", "mfu", "fraction", L, "compute", derive=_mfu_shortfall, per_run_peak=True),
    # The workload's minimum bytes per second: what bounds decode.
    Metric("bytes_per_s", "bytes_per_s", "bytes/s", H, "compute", twin="seconds_per_gb", time_exponent=-1),
    Metric("seconds_per_gb", "bytes_per_s", "seconds", L, "compute", derive=_seconds_per_gb, time_exponent=1),
    Metric("first_call_seconds", "first_call_s", "seconds", L, "compile", record_unit="s", companion=True,
           run_exponent=1, one_reading=True),
    Metric("compile_seconds", "compile_seconds_total", "seconds", L, "compile", record_unit="s",
           companion=True, run_exponent=1, one_reading=True),
    Metric("first_call_compile_seconds", "first_call_compile_s", "seconds", L, "compile", record_unit="s",
           run_exponent=1, one_reading=True),
    Metric("compiles", "compiles", "count", L, "compile", companion=True, timed=False, judged="exact"),
    Metric("padding_waste", "padding_waste", "fraction", L, "shapes", companion=True, timed=False,
           judged="exact"),
    Metric("useful_tokens_per_s", "useful_tokens_per_s", "tokens/s", H, "shapes",
           twin="seconds_per_million_useful_tokens", run_exponent=-1),
    Metric("seconds_per_million_useful_tokens", "useful_tokens_per_s", "seconds", L, "shapes",
           derive=_seconds_per_million_useful_tokens, run_exponent=1),
    # What a server sees of the stream: its 99th-percentile step, compile stalls included, and its
    # longest compile stall (one reading: the stream runs once per run)
    Metric("latency_p99_seconds", "latency_p99_s", "seconds", L, "shapes", record_unit="s", companion=True,
           run_exponent=1, one_reading=True),
    Metric("longest_stall_seconds", "longest_stall_s", "seconds", L, "compile", record_unit="s",
           companion=True, run_exponent=1, one_reading=True),
    Metric("device_peak_bytes", "device_peak_bytes", "bytes", L, "memory", companion=True, timed=False,
           judged="allocator"),
    Metric("compiler_temp_bytes", "compiler_temp_bytes", "bytes", L, "memory", companion=True,
           timed=False, judged="exact"),
    Metric("compiler_peak_bytes", "compiler_peak_bytes", "bytes", L, "memory", companion=True,
           timed=False, judged="exact"),
    # a training step's: what autograd keeps for the backward (torch, torch_xla; jax's is compiled)
    Metric("saved_for_backward_bytes", "saved_for_backward_bytes", "bytes", L, "memory", companion=True,
           timed=False, judged="exact"),
    Metric("host_profiler_peak_bytes", "host_profiler_peak_bytes", "bytes", L, "memory", companion=True,
           timed=False, one_reading=True, judged="allocator"),
    Metric("host_rss_growth_bytes", "host_rss_growth_bytes", "bytes", L, "memory", companion=True,
           timed=False, one_reading=True, judged="allocator"),
    Metric("usd_per_step", "usd_per_step_on_demand", "USD", L, "cost", time_exponent=1),
    Metric("usd_per_step_with_compiles", "usd_per_step_with_compiles_on_demand", "USD", L, "cost",
           run_exponent=1),
    Metric("usd_per_million_tokens", "usd_per_million_tokens_on_demand", "USD", L, "cost", time_exponent=1),
    # The figure to compare across shape regimes: padding and compile stalls both cost here.
    Metric("usd_per_million_useful_tokens_with_compiles",
           "usd_per_million_useful_tokens_with_compiles_on_demand", "USD", L, "cost", run_exponent=1),
    Metric("max_abs_error", "max_abs_err", "abs error", L, "numerics", record_unit="", timed=False,
           judged="tolerance"),
    # 0 ok, then rising trouble (records.STATUS_CODES): lower is better, and a rise is a regression.
    Metric("status", "status", "code", L, "status", derive=_status_code, timed=False, judged="exact"),
]
del L, H


# -- definition changes ----------------------------------------------------------------------------
# A figure's meaning can change while its name, unit and asv history stay (``METRIC_VERSION`` would
# drop the history). Each change is a numbered row; the suite writes ``DEFINITIONS`` into every
# sidecar (a commit cannot name its own hash), and a step across versions that a change covers is
# shown as "definition changed", never as a regression.
DEFINITIONS = "7"
UNRECORDED_DEFINITIONS = "1"  # results written before the sidecar recorded a definitions version


@dataclass(frozen=True)
class DefinitionChange:
    """One change of what some metrics mean, from definitions version ``version`` on."""

    version: str  # the first definitions version (sidecar setting ``definitions``) it applies to
    date: str  # ISO date of the release that made it
    metrics: tuple[str, ...]
    reason: str
    regimes: tuple[str, ...] | None = None  # only these shape regimes (None: every regime)
    platforms: tuple[str, ...] | None = None  # only figures measured on these platforms (None: any)
    impls: tuple[str, ...] | None = None  # only these kernels' figures (None: every kernel)
    benchmarks: tuple[str, ...] | None = None  # only these benchmark classes (None: every class)

    def covers(self, metric: str, regime: str | None = None, platform: str | None = None,
               impl: str | None = None, benchmark: str | None = None) -> bool:
        return (metric in self.metrics
                and (self.regimes is None or (regime or "static") in self.regimes)
                and (self.platforms is None or platform in self.platforms)
                and (self.impls is None or impl in self.impls)
                and (self.benchmarks is None or benchmark in self.benchmarks))


_THROUGHPUT = ("tokens_per_s", "seconds_per_million_tokens", "tflops", "seconds_per_pflop", "mfu",
               "mfu_shortfall", "usd_per_million_tokens")
_STEADY = ("seconds_per_step", *_THROUGHPUT, "bytes_per_s", "seconds_per_gb", "usd_per_step")
DEFINITION_CHANGES: list[DefinitionChange] = [
    DefinitionChange("2", "2026-11-30", _THROUGHPUT,
                     "dynamic and bucketed regimes: throughput, MFU and cost per token count the tokens "
                     "their steps ran (was the maximum length's tokens over the median step)",
                     regimes=("dynamic", "bucketed")),
    DefinitionChange("2", "2026-11-30",
                     ("first_call_seconds", "first_call_compile_seconds", "compile_seconds", "compiles",
                      "usd_per_step_with_compiles", "useful_tokens_per_s",
                      "seconds_per_million_useful_tokens", "usd_per_million_useful_tokens_with_compiles"),
                     "cold compiles of a fresh runner: the regime's stream runs first, in a process "
                     "that has run none of its shapes (before, a static stream found the timed step's "
                     "compiled code: 0 compiles, no stall)"),
    DefinitionChange("2", "2026-11-30", _STEADY,
                     "the float64 reference's training step runs the forward pass and the gradients, as "
                     "every framework's fwd_bwd step does (was the gradients only: b313600, "
                     "attnbench/backends/numpy_backend.py)", impls=("reference-float64",),
                     benchmarks=("Training",)),
    DefinitionChange("2", "2026-11-30", ("max_abs_error",),
                     "the error of the timed step's own output (and gradients for fwd_bwd) at the case's "
                     "workload and seed (was the forward of a separate call, seed 7)"),
    DefinitionChange("2", "2026-11-30", ("host_profiler_peak_bytes",),
                     "the peak of live allocations from the profiler's allocation records (was a sum "
                     "over nested op events, ~3x too high)"),
    DefinitionChange("2", "2026-11-30", ("device_peak_bytes", "compiler_temp_bytes", "compiler_peak_bytes",
                                         "host_profiler_peak_bytes", "host_rss_growth_bytes"),
                     "memory of a warm steady step in every regime (outside static it was not)",
                     regimes=("dynamic", "bucketed")),
    DefinitionChange("2", "2026-11-30", ("mfu", "mfu_shortfall"),
                     "MFU on a CPU divides by one torch GEMM peak per run, whatever the framework (was a "
                     "per-framework probe)", platforms=("cpu",)),
    DefinitionChange("3", "2026-12-01", ("tflops", "seconds_per_pflop", "mfu", "mfu_shortfall"),
                     "FLOPs count exactly the (query, key) pairs the mask keeps: a causal square step "
                     "counts S(S+1)/2 pairs per head (was flash-attention's S^2/2; +0.4% at 256 tokens)"),
    DefinitionChange("4", "2026-12-01", ("first_call_seconds", "first_call_compile_seconds",
                                         "compile_seconds", "host_rss_growth_bytes",
                                         "host_profiler_peak_bytes"),
                     "the default suite's static cases share one worker process (was one per case): each "
                     "still compiles its own shapes cold, but its first call finds the runtime warm and "
                     "its host memory can reuse what earlier cases freed", regimes=("static",)),
    DefinitionChange("5", "2026-12-02", ("bytes_per_s", "seconds_per_gb"),
                     "the minimum bytes read only the keys and values some query sees (was every key of "
                     "the cache: a windowed decode counted its whole cache)"),
    DefinitionChange("5", "2026-12-02", ("tflops", "seconds_per_pflop", "mfu", "mfu_shortfall",
                                         "bytes_per_s", "seconds_per_gb"),
                     "model presets follow their model cards: the window holds at any length, training "
                     "is one whole sequence (was packed documents), bert-base attends bidirectionally "
                     "over all its tokens", benchmarks=("Models",)),
    DefinitionChange("6", "2026-12-03", ("first_call_seconds", "first_call_compile_seconds",
                                         "compile_seconds", "compiles", "padding_waste",
                                         "usd_per_step_with_compiles",
                                         "useful_tokens_per_s", "seconds_per_million_useful_tokens",
                                         "usd_per_million_useful_tokens_with_compiles", "latency_p99_seconds",
                                         "longest_stall_seconds"),
                     "a stream's lengths come from a trace of real requests (the Azure LLM inference "
                     "traces; core/traffic.py), 200 steps in 8 windows in the default suite, batched as a "
                     "server batches them (was 6 steps of uniform lengths in [L/2, L]); a stream's steady "
                     "step is the mean of its non-compiling steps after the first call (was their median)"),
    DefinitionChange("6", "2026-12-03", _THROUGHPUT,
                     "dynamic and bucketed regimes: the steady steps of a trace's stream",
                     regimes=("dynamic", "bucketed")),
    DefinitionChange("7", "2026-12-07", (*_STEADY, "first_call_seconds", "first_call_compile_seconds",
                                         "compile_seconds", "device_peak_bytes", "compiler_temp_bytes",
                                         "compiler_peak_bytes", "host_profiler_peak_bytes",
                                         "host_rss_growth_bytes"),
                     "the blockwise FlashAttention ports' backward is FlashAttention-2's (the forward "
                     "keeps q, k, v, the output and the log-sum-exp; the backward recomputes each tile), "
                     "was autodiff through the forward's loops, which kept every tile",
                     impls=("jax-blockwise-flash", "torch-blockwise-flash", "torch-xla-blockwise-flash"),
                     benchmarks=("Training",)),
]


def _definitions_key(version) -> tuple:
    text = str(version)
    return tuple(int(p) if p.isdigit() else p for p in text.split("."))


def definitions_version(value) -> str:
    """A row's definitions version: the sidecar's setting, ``UNRECORDED_DEFINITIONS`` where none."""
    if value is None or value != value or value == "":
        return UNRECORDED_DEFINITIONS
    return str(value)


def definition_changes(metric: str, before, after, *, regime: str | None = None,
                       platform: str | None = None, impl: str | None = None, benchmark: str | None = None,
                       table: list[DefinitionChange] | None = None) -> list[DefinitionChange]:
    """The changes covering ``metric`` (in ``regime``, on ``platform``, of kernel ``impl`` in class
    ``benchmark``) between the definitions versions ``before`` and ``after`` (either order;
    unrecorded = ``UNRECORDED_DEFINITIONS``)."""
    low, high = sorted((definitions_version(before), definitions_version(after)), key=_definitions_key)
    if low == high:
        return []
    return [c for c in (DEFINITION_CHANGES if table is None else table)
            if _definitions_key(low) < _definitions_key(c.version) <= _definitions_key(high)
            and c.covers(metric, regime, platform, impl, benchmark)]


# -- the settings a figure depends on -------------------------------------------------------------
# A step across a change of one of these (sidecar settings, or results/conditions.csv for runs whose
# sidecar did not record it) is reported as that change, never as a regression. In the dynamic and
# bucketed regimes every timed figure is a stream's, whose steps compile: the compile cache matters.
_COMPILE = ("first_call_seconds", "compile_seconds", "first_call_compile_seconds", "compiles",
            "usd_per_step_with_compiles", "useful_tokens_per_s", "seconds_per_million_useful_tokens",
            "usd_per_million_useful_tokens_with_compiles")
SETTINGS_THAT_MATTER = {
    "compile_cache": _COMPILE,  # a warm compiler cache turns a compile into a load
    # one process per case, or one shared by static cases (threads, allocator and runtime state)
    "workers": (*_STEADY, *_COMPILE, "host_rss_growth_bytes", "host_profiler_peak_bytes"),
    "threads": tuple(name for name in (*_STEADY, *_COMPILE) if name != "compiles"),
    "timer": _STEADY,  # wall clock or device events
    "rounds": _STEADY,  # how many timing windows the figure is the median of
}


STREAM_SETTINGS = {"compile_cache": _STEADY}  # more, in the dynamic and bucketed regimes


def settings_for(metric: str, regime: str | None = None) -> tuple[str, ...]:
    """The settings ``metric``'s figures (in ``regime``) depend on (``SETTINGS_THAT_MATTER``)."""
    stream = (regime or "static") != "static"
    return tuple(name for name, covered in SETTINGS_THAT_MATTER.items()
                 if metric in covered or (stream and metric in STREAM_SETTINGS.get(name, ())))


# -- views of the table (each reads METRICS when called) -----------------------------------------
def by_name(table: list[Metric] | None = None) -> dict[str, Metric]:
    return {m.name: m for m in (METRICS if table is None else table)}


def get(name: str) -> Metric:
    try:
        return by_name()[name]
    except KeyError:
        raise UnknownName(f"unknown metric {name!r} (known: {', '.join(m.name for m in METRICS)})") from None


def names(group: str | None = None) -> tuple[str, ...]:
    """Every metric's name in table order, or those of one group."""
    if group is not None and group not in GROUPS:
        raise UnknownName(f"unknown metric group {group!r} (known: {', '.join(GROUPS)})")
    return tuple(m.name for m in METRICS if group is None or m.group == group)


def directions() -> dict[str, str | None]:
    return {m.name: m.direction for m in METRICS}


def timed() -> tuple[str, ...]:
    """The metrics that depend on how long something took (contention can move them)."""
    return tuple(m.name for m in METRICS if m.timed)


def companions() -> tuple[str, ...]:
    """The metrics a cost spike is attributed to, in table order."""
    return tuple(m.name for m in METRICS if m.companion)


def column_units(table: list[Metric] | None = None) -> dict[str, str]:
    """Record column -> unit, for every column a metric reads as is (table order)."""
    out: dict[str, str] = {}
    for metric in METRICS if table is None else table:
        unit = metric.column_unit
        if unit is None:
            continue
        if out.get(metric.column, unit) != unit:
            raise ValueError(f"metric {metric.name!r} gives column {metric.column!r} the unit {unit!r}, "
                             f"another row gives it {out[metric.column]!r}")
        out[metric.column] = unit
    return out


def check(table: list[Metric] | None = None) -> None:
    """Raise ``ValueError`` on a malformed table (run at import and by the tests)."""
    table = METRICS if table is None else table
    seen = set()
    for metric in table:
        if metric.name in seen:
            raise ValueError(f"metric {metric.name!r} appears twice")
        seen.add(metric.name)
        if not metric.unit:
            raise ValueError(f"metric {metric.name!r} has no unit (asv shows it beside every value)")
        if metric.direction not in DIRECTIONS:
            raise ValueError(f"metric {metric.name!r}: direction must be one of {DIRECTIONS}")
        if metric.group not in GROUPS:
            raise ValueError(f"metric {metric.name!r}: group {metric.group!r} is not one of {list(GROUPS)}")
        if metric.judged not in JUDGED:
            raise ValueError(f"metric {metric.name!r}: judged {metric.judged!r} is not one of {list(JUDGED)}")
    rows = by_name(table)
    for metric in table:
        if metric.direction == "higher":
            twin = rows.get(metric.twin) if metric.twin else None
            if twin is None or twin.direction != "lower":
                raise ValueError(f"metric {metric.name!r} is higher-is-better: it needs a lower-is-better "
                                 f"twin row for asv (twin={metric.twin!r})")
        elif metric.twin is not None:
            raise ValueError(f"metric {metric.name!r}: only a higher-is-better metric has a twin")
    column_units(table)
    if table is METRICS:
        for change in DEFINITION_CHANGES:
            unknown = [m for m in change.metrics if m not in rows]
            if unknown:
                raise ValueError(f"definition change {change.version} ({change.date}) names unknown "
                                 f"metrics {unknown}")
            if _definitions_key(change.version) > _definitions_key(DEFINITIONS):
                raise ValueError(f"definition change {change.version} is newer than DEFINITIONS "
                                 f"{DEFINITIONS!r}: bump DEFINITIONS")


check()
