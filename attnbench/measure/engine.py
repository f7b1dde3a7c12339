"""Measure one case: implementation x workload x shape regime, on this process's device.

``measure_case`` never raises for a failing case: the failure becomes the record's status. Timeouts
and hard crashes need ``attnbench.run.worker``, which can kill the process.

Order of work, so that each number has one source: the regime stream first (nothing in the process
has run its shapes, so its compiles are cold), the timed step, one warm step under the memory probes,
kernel evidence (profiled after every timing, so it warms nothing timed), throughput and cost
(``figures.py``, with the regime's trace: ``traces.py``), then numerics of the timed step's own
output (``reference_check.py``). This module is the recipe; those are its steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import time
import traceback

import attention_impls
from attention_impls.base import Unsupported, config_text
from attnbench import hardware
from attnbench.backends import here
from attnbench.core import records, regimes, stats
from attnbench.core.workload import Workload
from attnbench.measure import figures, reference_check, traces
from attnbench.measure.compiler_caches import check_mode as check_compile_cache
from attnbench.measure.compiler_caches import compiler_caches
from attnbench.measure.contention import ContentionMonitor
from attnbench.measure.timing import time_calls, time_step

OOM_MARKERS = ("out of memory", "resource_exhausted", "cannot allocate memory", "bad_alloc",
               "can't allocate memory", "memoryerror")


@dataclasses.dataclass(frozen=True)
class Options:
    """How to measure; the defaults are the CLI's."""

    regime: str = "static"  # static | dynamic | bucketed
    bucket_policy: str = "multiple-128"
    regime_steps: int = 8
    # the stream's lengths: a trace (a built-in's name or a CSV path, core/traffic.py) or "uniform"
    traffic: str = "uniform"
    stream_windows: int = 8  # the stream's trace windows: its interval is over them
    stream_budget_s: float | None = None  # the stream stops after the step that spends it
    # A stream of another regime stops, too, once its steps after the first have cost a quarter more
    # than the same kernel's whole static stream's did (the sweep sets it from that case: CEILING):
    # from there it cannot be the kernel's cheapest way through the same requests
    stream_ceiling_s: float | None = None
    # A static stream's steps run (None: all): one shape, so the others are the same call (regimes.py)
    static_stream_steps: int | None = None
    seed: int = 0
    min_seconds: float = 0.3  # steady-state timing budget
    max_extra_seconds: float = 3.0  # beyond it, sampling on while the IQR exceeds 5% of the median
    numerics: bool = True
    hardware_profile: str | None = None  # hardware profile name overriding detection
    price_per_hour: float | None = None
    spot_price_per_hour: float | None = None
    price_kind: str | None = None  # what the user's prices buy: "instance" | "accelerator"
    trace_dir: str | None = None  # where per-step regime traces are written
    compile_cache: str = "cold"  # cold | warm: see attnbench/measure/compiler_caches.py
    timer: str = "wall"  # wall | cuda-events (torch on CUDA: events around each call, L2 flushed)
    contention_retries: int = 2  # re-time a window other processes shared, at most this often
    # Kernel evidence and numerics of the step (False: a regime's case whose static case, in the same
    # sweep, checks the very same step; its record says so)
    step_checks: bool = True

    def __post_init__(self):
        check_compile_cache(self.compile_cache)


CHECKED_BY_STATIC = ("not checked in this regime's case: the static case of the same kernel and workload, "
                     "in the same sweep, checks the very same step")


def case_key(impl: str, workload: Workload, regime: str) -> str:
    """A case's name in caches, sidecars and resumed sweeps."""
    return f"{impl}|{workload.describe()}|{regime}"


@dataclasses.dataclass(frozen=True)
class Case:
    """One case as it crosses to the worker: the kernel (a registered name, or ``"module:Class"``),
    the workload, how to measure it (``options``, with its regime) and whether it needs a worker of
    its own. A case is one only once its kernel accepted the workload here (``run/plan.py``).
    ``config``: the kernel's tile knobs (``()``: its defaults), ``config_source`` where they came
    from (``tuned``: results/tuning/); ``with_defaults``: its later rounds also time the kernel at its
    defaults, beside the config (``defaults_round_medians_s``), so that a verdict can say what tuning
    changed, paired by round. ``variant``: a name that tells this case from others of the same kernel,
    workload and regime in one process (the tuner's candidates); it ends the key."""

    impl: str
    workload: Workload
    options: Options = Options()
    own_process: bool = True
    config: tuple = ()
    config_source: str = "defaults"
    with_defaults: bool = False
    variant: str = ""

    @property
    def regime(self) -> str:
        return self.options.regime

    @property
    def key(self) -> str:
        return case_key(self.impl, self.workload, self.regime) + (f"|{self.variant}" if self.variant else "")


def case_record(case: Case, **fields) -> dict:
    """The record of ``case`` before it is measured: its kernel's name, workload and options filled
    (and ``fields``)."""
    options = case.options
    return records.new_record(case.workload, **{
        "impl": case.impl if isinstance(case.impl, str) else case.impl.name, "regime": options.regime,
        "bucket_policy": options.bucket_policy, "compile_cache": options.compile_cache,
        "threads": thread_count(), **fields})


def resolve_impl(spec, config: tuple = ()):
    """A registered name, an ``AttentionImpl`` instance, or ``"module:Class"`` (test stubs, plugins),
    at ``config`` (``()``: as it is)."""
    if not isinstance(spec, str):
        impl = spec
    elif ":" in spec:
        module, cls = spec.split(":", 1)
        impl = getattr(importlib.import_module(module), cls)()
    else:
        impl = attention_impls.get(spec)
    return impl.with_config(config) if config else impl


def config_columns(case: Case, impl) -> dict:
    """The record's ``config`` (every knob the step runs at) and ``config_source``."""
    if impl.search_space is None:
        return {"config": "", "config_source": ""}
    return {"config": config_text(impl.config_now), "config_source": case.config_source}


def classify_exception(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return records.OOM
    text = f"{type(exc).__name__}: {exc}".lower()
    return records.OOM if any(m in text for m in OOM_MARKERS) else records.ERROR


def measure_case(case: Case) -> dict:
    """The record of one case the plan admitted (its kernel's ``check`` is not asked again);
    never raises for a failing case."""
    workload, options = case.workload, case.options
    record, spent = case_record(case), Phases()
    try:
        impl = resolve_impl(case.impl, case.config)
    except Exception as exc:  # unknown name, bad plugin path, a config the kernel does not take
        record.update(status=records.ERROR, reason=f"{type(exc).__name__}: {exc}")
        return record
    record.update(impl=impl.name, framework=impl.framework, gqa=impl.gqa_mode(workload),
                  **config_columns(case, impl))
    try:
        platform = here.platform(impl)
        record.update(platform=platform, label=impl.label(platform), execution=impl.execution(platform))
        with compiler_caches(options.compile_cache):
            device, regime_result, step = _before_timing(impl, workload, options, record, spent)
            with spent("timing"):
                if options.regime == "static":
                    time_static(impl, step, options, record)
                else:
                    step.run()  # warm: the memory probes measure a steady step, never a compiling one
            with spent("after timing"):
                _after_timing(impl, workload, options, record, device, regime_result, step)
    except Unsupported as exc:  # e.g. a length of the dynamic stream the kernel cannot take
        record.update(status=records.UNSUPPORTED, reason=exc.reason)
    except Exception as exc:
        record.update(status=classify_exception(exc),
                      reason=f"{type(exc).__name__}: {exc}"[:2000] or traceback.format_exc(limit=3))
    record["phase_seconds"] = json.dumps({k: round(v, 3) for k, v in spent.seconds.items()})
    return record


class Phases:
    """Seconds the recipe spent in each of its steps (the record's ``phase_seconds``): where a run's
    minutes go (results/LOG.md)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _before_timing(impl, workload: Workload, options: Options, record: dict, spent: Phases):
    """The device, then the regime's stream (cold: nothing in the process has run its shapes), then
    the step to time (placed and compiled); returns ``(device, regime_result, step)``."""
    with spent("regime stream"):
        device = hardware.detect_accelerator(impl.framework)
        record["device"] = device.name
        regime_result = _run_regime(impl, workload, options, record)
    with spent("build"):
        step = here.make_step(impl, workload, seed=options.seed)
    record["execution"] = step.execution
    for key, value in (step.compile_info or {}).items():
        if key in record:
            record[key] = value
    return device, regime_result, step


def _after_timing(impl, workload: Workload, options: Options, record: dict, device, regime_result,
                  step) -> None:
    """One warm step under the memory probes, kernel evidence, throughput and cost, the regime's
    trace, then numerics of the timed step's own output."""
    record.update(here.backend_of(impl).measure_memory(step))
    if options.step_checks:
        evidence = step.evidence()
        record.update(kernel_evidence=evidence, kernel_verified=not evidence.startswith("not verified"))
    else:
        record.update(kernel_evidence=CHECKED_BY_STATIC, numerics_workload=CHECKED_BY_STATIC)
    seconds = record["seconds_per_step"]
    pricing = figures.price_and_derive(device, workload, options, record, regime_result) if seconds else None
    if options.trace_dir:
        record["trace_file"] = traces.write_trace(regime_result, record, options.trace_dir, pricing)
    record["status"] = records.OK
    if options.numerics and options.step_checks:
        record.update(reference_check.check_numerics(impl, workload, step, options.seed))
        if record["numerics_ok"] is False:
            record["status"] = records.NUMERICS_FAILED
            record["reason"] = (f"output differs from the float64 reference: "
                                f"max abs err {record['max_abs_err']}")


def time_static(impl, step, options: Options, record: dict) -> None:
    """Time the static step in one window, re-timed (at most ``options.contention_retries`` times)
    while another process shared it; the last window is recorded, flagged if still contended."""
    clock = here.backend_of(impl).device_clock(step, options.timer)  # None: the wall clock
    budget = dict(min_seconds=options.min_seconds, target_rel_iqr=0.05,
                  max_seconds=options.min_seconds + options.max_extra_seconds)
    retries = 0
    while True:
        with ContentionMonitor() as monitor:
            timing = time_calls(clock, **budget) if clock else time_step(step.run, **budget)
        if not monitor.result.contended or retries >= options.contention_retries:
            break
        retries += 1
    window = stats.estimate([timing.samples_s])
    record.update(seconds_per_step=timing.median_s, iqr_s=timing.iqr_s, samples=timing.samples,
                  steps_per_sample=timing.steps_per_sample, timer=timing.timer,
                  ci_low_s=window.ci_low, ci_high_s=window.ci_high, ci_basis=window.basis,
                  ci_coverage=window.coverage, ci_confidence=window.confidence, ci_method=window.method,
                  rounds=1, rounds_dropped=0, timing_samples_s=json.dumps(list(timing.samples_s)),
                  round_medians_s=json.dumps([timing.median_s]), round_ids=json.dumps([0]),
                  contention_retries=retries,
                  **monitor.result.columns())


def _run_regime(impl, workload, options, record):
    """The regime's stream; its first step is the case's first call (trace + compile + run)."""
    template, stream = regimes.stream_of(workload, options.regime_steps, options.seed, options.traffic,
                                         options.stream_windows)
    subset = options.regime == "static" and options.static_stream_steps
    run_only = regimes.spread_steps(stream.window_of, options.static_stream_steps) if subset else None
    runner = here.make_runner(impl, regimes.runner_template(template, options.regime), options.seed)
    ceiling = None if options.regime == "static" else options.stream_ceiling_s
    result = regimes.run_regime(impl.name, runner, template,
                                options.regime, stream.steps, options.bucket_policy, stream.window_of,
                                options.stream_budget_s, run_only, ceiling)
    first = result.trace[0] if result.trace else None
    if result.planned_steps is not None and len(result.trace) < result.planned_steps:
        spent = sum(t.seconds for t in result.trace)
        by_budget = options.stream_budget_s is not None and spent >= options.stream_budget_s
        record["stream_cut"] = (f"the stream budget ({options.stream_budget_s:g} s)" if by_budget else
                                f"recompiling, its steps after the first passed the ceiling its pad-to-max "
                                f"stream set ({ceiling:.3g} s) after {len(result.trace)} steps: not its "
                                "cheapest way")
    record.update(regime_steps=len(result.trace), compiles=result.compiles,
                  compile_seconds_total=result.compile_seconds_total,
                  compile_cache_hits=result.compile_cache_hits, first_call_s=first.seconds if first else None,
                  first_call_compile_s=first.compile_seconds if first else None,
                  padding_waste=result.padding_waste, useful_tokens_per_s=result.useful_tokens_per_s,
                  seconds_per_step_with_compiles=result.total_seconds / max(1, len(result.trace)),
                  **stream_columns(stream, result))
    if options.regime != "static":
        record["seconds_per_step"] = result.steady_seconds_per_step
    return result


def stream_columns(stream, result) -> dict:
    """What a server sees of the stream, and where its lengths came from (docs/metrics.md)."""
    windows = result.windows()
    ran = bool(result.trace)
    return {
        "traffic": stream.source, "traffic_label": stream.label,
        "traffic_ks": stream.ks_distance() if stream.population else None,
        "traffic_scale": stream.factor, "traffic_clipped": stream.clipped,
        "traffic_requests": stream.requests, "stream_steps_planned": result.planned_steps,
        "stream_steps_timed": sum(t.timed for t in result.trace),
        "distinct_shapes": len(result.shapes),
        "latency_p50_s": result.latency(50) if ran else None,
        "latency_p95_s": result.latency(95) if ran else None,
        "latency_p99_s": result.latency(99) if ran else None,
        "longest_stall_s": result.longest_stall_seconds,
        "window_seconds": json.dumps([round(w["seconds"], 9) for w in windows]),
        "window_useful_tokens": json.dumps([w["useful_tokens"] for w in windows]),
        "window_steady_seconds": json.dumps([round(x, 9) for x in result.window_steady_seconds()]),
        "stream_steady_s": result.steady_seconds_per_step,
    }


def thread_count() -> int | None:
    value = os.environ.get("ATTNBENCH_THREADS")
    return int(value) if value else None
