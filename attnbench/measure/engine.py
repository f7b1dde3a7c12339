"""Measure one case: implementation x workload x shape regime, on this process's device.

``measure_case`` never raises for a failing case: the failure becomes the record's status. Timeouts
and hard crashes need ``attnbench.run.worker``, which can kill the process.

Order of work, so that each number has one source: the regime stream first (nothing in the process
has run its shapes, so its compiles are cold), the timed step, one warm step under the memory probes,
kernel evidence (profiled after every timing, so it warms nothing timed), throughput and cost, then
numerics of the timed step's own output.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import io
import json
import os
import traceback

import attention_impls
from attention_impls.base import Unsupported, mask_call, static_mask
from attention_impls.reference_float64 import attention_fwd, attention_grads
from attnbench import hardware
from attnbench.core import records, regimes
from attnbench.core.atomic import atomic_write_text
from attnbench.core.inputs import make_inputs
from attnbench.core.numerics import GRAD_SLACK, compare
from attnbench.core.workload import CUSTOM, Workload
from attnbench.measure import cost, stats
from attnbench.measure.compiler_caches import check_mode as check_compile_cache
from attnbench.measure.compiler_caches import compiler_caches
from attnbench.measure.contention import ContentionMonitor

# The float64 reference materialises B*H*Sq*Sk doubles; above this it runs on a proxy workload.
REFERENCE_MAX_SCORE_ELEMENTS = 2**25  # 256 MiB of float64 scores
PROXY_SEQ = 512

OOM_MARKERS = ("out of memory", "resource_exhausted", "cannot allocate memory", "bad_alloc",
               "can't allocate memory", "memoryerror")


@dataclasses.dataclass(frozen=True)
class Options:
    """How to measure; the defaults are the CLI's."""

    regime: str = "static"  # static | dynamic | bucketed
    bucket_policy: str = "multiple-128"
    regime_steps: int = 8
    seed: int = 0
    min_seconds: float = 0.3  # steady-state timing budget
    max_extra_seconds: float = 3.0  # beyond it, sampling on while the IQR exceeds 5% of the median
    numerics: bool = True
    hardware_profile: str | None = None  # hardware profile name overriding detection
    price_per_hour: float | None = None
    spot_price_per_hour: float | None = None
    trace_dir: str | None = None  # where per-step regime traces are written
    compile_cache: str = "cold"  # cold | warm: see attnbench/measure/compiler_caches.py
    timer: str = "wall"  # wall | cuda-events (torch on CUDA: events around each call, L2 flushed)
    contention_retries: int = 2  # re-time a window other processes shared, at most this often
    later_round: bool = False  # a later timing round of a static case: its step timed, nothing else
    # Short and never extended: rounds, not longer windows, average out noise between processes.
    round_seconds: float = 0.1

    def __post_init__(self):
        check_compile_cache(self.compile_cache)


def case_key(impl: str, workload: Workload, regime: str) -> str:
    """A case's name in caches, sidecars and resumed sweeps."""
    return f"{impl}|{workload.describe()}|{regime}"


@dataclasses.dataclass(frozen=True)
class Case:
    """One case as it crosses to the worker: the kernel (a registered name, or ``"module:Class"``),
    the workload, how to measure it (``options``, with its regime) and whether it needs a worker of
    its own. A case is one only once its kernel accepted the workload here (``run/plan.py``)."""

    impl: str
    workload: Workload
    options: Options = Options()
    own_process: bool = True

    @property
    def regime(self) -> str:
        return self.options.regime

    @property
    def key(self) -> str:
        return case_key(self.impl, self.workload, self.regime)

    def later_round(self) -> Case:
        """The same case as a later timing round: the steady step only, in a short window never
        extended, its compiles warm (jax's persistent cache of the sweep's rounds), no traces."""
        options = dataclasses.replace(self.options, later_round=True, compile_cache="warm", trace_dir=None,
                                      min_seconds=self.options.round_seconds, max_extra_seconds=0.0)
        return dataclasses.replace(self, options=options, own_process=False)


def case_record(case: Case, **fields) -> dict:
    """The record of ``case`` before it is measured: its kernel's name, workload and options filled
    (and ``fields``)."""
    options = case.options
    return records.new_record(case.workload, **{
        "impl": case.impl if isinstance(case.impl, str) else case.impl.name, "regime": options.regime,
        "bucket_policy": options.bucket_policy, "compile_cache": options.compile_cache,
        "threads": thread_count(), **fields})


def resolve_impl(spec):
    """A registered name, an ``AttentionImpl`` instance, or ``"module:Class"`` (test stubs, plugins)."""
    if not isinstance(spec, str):
        return spec
    if ":" in spec:
        module, cls = spec.split(":", 1)
        return getattr(importlib.import_module(module), cls)()
    return attention_impls.get(spec)


def classify_exception(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return records.OOM
    text = f"{type(exc).__name__}: {exc}".lower()
    return records.OOM if any(m in text for m in OOM_MARKERS) else records.ERROR


def measure_case(case: Case) -> dict:
    """The record of one case the plan admitted (its kernel's ``check`` is not asked again);
    never raises for a failing case."""
    workload, options = case.workload, case.options
    record = case_record(case)
    try:
        impl = resolve_impl(case.impl)
    except Exception as exc:  # unknown name, bad plugin path
        record.update(status=records.ERROR, reason=f"{type(exc).__name__}: {exc}")
        return record
    record.update(impl=impl.name, framework=impl.framework, gqa=impl.gqa_mode(workload))
    try:
        platform = impl.platform()
        record.update(platform=platform, label=impl.label(platform), execution=impl.execution(platform))
        with compiler_caches(options.compile_cache):
            (_later_round if options.later_round else _every_metric)(impl, workload, options, record)
    except Unsupported as exc:  # e.g. a length of the dynamic stream the kernel cannot take
        record.update(status=records.UNSUPPORTED, reason=exc.reason)
    except Exception as exc:
        record.update(status=classify_exception(exc),
                      reason=f"{type(exc).__name__}: {exc}"[:2000] or traceback.format_exc(limit=3))
    return record


def _every_metric(impl, workload: Workload, options: Options, record: dict) -> None:
    device = hardware.detect_accelerator(impl.framework)
    record["device"] = device.name
    regime_result = _run_regime(impl, workload, options, record)
    step = impl.make_step(workload, seed=options.seed)
    record["execution"] = step.execution
    for key, value in (step.compile_info or {}).items():
        if key in record:
            record[key] = value
    if options.regime == "static":
        time_static(impl, step, options, record)
    else:
        step.run()  # warm: the memory probes below measure a steady step, never a compiling one
    record.update(impl.backend().measure_memory(step))
    evidence = step.evidence()
    record.update(kernel_evidence=evidence, kernel_verified=not evidence.startswith("not verified"))
    seconds = record["seconds_per_step"]
    pricing = _throughput_and_cost(device, workload, options, record, regime_result) if seconds else None
    if options.trace_dir:
        record["trace_file"] = write_trace(regime_result, record, options.trace_dir, pricing)
    record["status"] = records.OK
    if options.numerics:
        record.update(check_numerics(impl, workload, step, options.seed))
        if record["numerics_ok"] is False:
            record["status"] = records.NUMERICS_FAILED
            record["reason"] = (f"output differs from the float64 reference: "
                                f"max abs err {record['max_abs_err']}")


def time_static(impl, step, options: Options, record: dict) -> None:
    """Time the static step in one window, re-timed (at most ``options.contention_retries`` times)
    while another process shared it; the last window is recorded, flagged if still contended."""
    retries = 0
    while True:
        with ContentionMonitor() as monitor:
            timing = impl.backend().time(step, timer=options.timer, min_seconds=options.min_seconds,
                                         target_rel_iqr=0.05,
                                         max_seconds=options.min_seconds + options.max_extra_seconds)
        if not monitor.result.contended or retries >= options.contention_retries:
            break
        retries += 1
    window = stats.estimate([timing.samples_s])
    record.update(seconds_per_step=timing.median_s, iqr_s=timing.iqr_s, samples=timing.samples,
                  steps_per_sample=timing.steps_per_sample, timer=timing.timer,
                  ci_low_s=window.ci_low, ci_high_s=window.ci_high, ci_basis=window.basis,
                  ci_coverage=window.coverage, rounds=1, rounds_dropped=0,
                  timing_samples_s=json.dumps(list(timing.samples_s)),
                  round_medians_s=json.dumps([timing.median_s]), contention_retries=retries,
                  **monitor.result.columns())


def _later_round(impl, workload: Workload, options: Options, record: dict) -> None:
    """A later timing round of a static case: its step timed, nothing else (see ``pool_rounds``)."""
    step = impl.make_step(workload, seed=options.seed)
    record["execution"] = step.execution
    time_static(impl, step, options, record)
    record["status"] = records.OK


def _run_regime(impl, workload, options, record):
    """The regime's stream; its first step is the case's first call (trace + compile + run)."""
    lengths = regimes.length_stream(workload.stream_length, options.regime_steps, options.seed)
    template = workload.replace(seq_k=workload.seq_q) if workload.seq_k == workload.seq_q else workload
    result = regimes.run_regime(impl, template, options.regime, lengths, options.bucket_policy)
    first = result.trace[0] if result.trace else None
    record.update(regime_steps=len(lengths), compiles=result.compiles,
                  compile_seconds_total=result.compile_seconds_total,
                  compile_cache_hits=result.compile_cache_hits, first_call_s=first.seconds if first else None,
                  first_call_compile_s=first.compile_seconds if first else None,
                  padding_waste=result.padding_waste, useful_tokens_per_s=result.useful_tokens_per_s,
                  seconds_per_step_with_compiles=result.total_seconds / max(1, len(result.trace)))
    if options.regime != "static":
        record["seconds_per_step"] = result.steady_seconds_per_step
    return result


def write_trace(result, record: dict, trace_dir: str, pricing=None) -> str | None:
    """The per-step trace of a regime run as CSV, each step's ``usd`` at the on-demand price (None
    when unpriced); returns the path."""

    rows = regimes.trace_to_rows(result)
    if not rows:
        return None
    for row in rows:
        usd = cost.cost_per_step(row["seconds"], pricing) if pricing is not None else {}
        row["usd"] = usd.get("usd_per_step_on_demand")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    name = "{impl}__{regime}__S{seq_q}__{mode}__{dtype}".format(**record)
    if record.get("workload") not in (None, CUSTOM):  # a preset's (two presets' decodes share S1)
        name += f"__{record['workload']}-{record['phase']}"
    path = os.path.join(trace_dir, f"{name}.csv")
    atomic_write_text(path, buffer.getvalue())
    return path


def throughput(workload: Workload, regime: str, seconds_per_step: float,
               regime_result) -> tuple[float | None, float | None]:
    """(tokens/s, FLOP/s) the timed steps really computed, padding included.

    Regimes use the stream's steady steps at their own lengths: the full length's tokens over the
    median step would credit steps with tokens they never ran.
    """
    if regime == "static":
        return workload.tokens / seconds_per_step, workload.flops / seconds_per_step
    return regime_result.steady_tokens_per_s, regime_result.steady_flops_per_s


def _throughput_and_cost(device, workload, options, record, regime_result):
    """Throughput, MFU and cost columns of ``record``; returns the ``Pricing`` used."""
    profile = (hardware.get_hardware_profile(options.hardware_profile) if options.hardware_profile
               else hardware.match_hardware_profile(device))
    peak = hardware.peak_tflops(device, profile, workload.dtype)
    pricing = cost.pricing_for(device, hardware_profile=options.hardware_profile,
                               price_per_hour=options.price_per_hour,
                               spot_price_per_hour=options.spot_price_per_hour, cores=record["threads"])
    record.update(peak_tflops=peak.tflops, peak_source=peak.source)
    if profile is not None and profile.hbm_tb_s is not None:  # decode is memory-bound: bytes/s against it
        record.update(peak_bytes_per_s=profile.hbm_tb_s.value * 1e12,
                      bandwidth_source=f"{profile.name}: {profile.hbm_tb_s.source}")
    tokens_per_s, flops_per_s = throughput(workload, options.regime, record["seconds_per_step"],
                                           regime_result)
    derive_figures(record, pricing, tokens_per_s, flops_per_s)
    return pricing


def derive_figures(record: dict, pricing, tokens_per_s: float | None, flops_per_s: float | None) -> None:
    """Every figure that follows from the step time; one formula for the first figure and for pooled
    rounds."""
    seconds = record["seconds_per_step"]
    record.update(tokens_per_s=tokens_per_s, tflops=flops_per_s / 1e12 if flops_per_s else None,
                  seconds_per_million_tokens=1e6 / tokens_per_s if tokens_per_s else None)
    if record.get("peak_tflops") and record["tflops"]:
        record["mfu"] = record["tflops"] / record["peak_tflops"]
    # Static only: a regime's steps differ in size.
    if record.get("min_bytes") and seconds and record.get("regime", "static") == "static":
        record["bytes_per_s"] = record["min_bytes"] / seconds
        if record.get("peak_bytes_per_s"):
            record["bandwidth_utilisation"] = record["bytes_per_s"] / record["peak_bytes_per_s"]
    tokens_per_step = tokens_per_s * seconds if tokens_per_s else None
    costs = cost.cost_per_step(seconds, pricing, tokens_per_step=tokens_per_step)
    record.update({k: v for k, v in costs.items() if k in record})
    # Compile stalls included, per useful (unpadded) token: the figure to compare across regimes.
    stream = cost.cost_per_step(record["seconds_per_step_with_compiles"], pricing)
    useful_per_step = (record["useful_tokens_per_s"] or 0) * (record["seconds_per_step_with_compiles"] or 0)
    useful = cost.cost_per_step(record["seconds_per_step_with_compiles"], pricing,
                                tokens_per_step=useful_per_step or None)
    for market in ("on_demand", "spot"):
        record[f"usd_per_step_with_compiles_{market}"] = stream[f"usd_per_step_{market}"]
        record[f"usd_per_million_useful_tokens_with_compiles_{market}"] = \
            useful[f"usd_per_million_tokens_{market}"]


def pricing_of(record: dict):
    """The ``Pricing`` a record was costed at (its hourly prices and their source)."""
    return cost.Pricing(device_name=record.get("device") or "", hardware_profile=None, units=None, unit=None,
                        on_demand_usd_per_hour=record.get("usd_per_hour_on_demand"),
                        spot_usd_per_hour=record.get("usd_per_hour_spot"),
                        source=record.get("price_source") or "", note=record.get("cost_note"))


def pool_rounds(first: dict, later: list[dict]) -> dict:
    """``first`` (a static case's full record) with its step time estimated over every timing round.

    Contended rounds are dropped while an uncontended one exists; if all were contended, all are
    kept and flagged. Step-time figures are derived again; compile and memory figures stay the first's.
    """
    rounds = [first] + [r for r in later if r.get("status") == records.OK and r.get("timing_samples_s")]
    clean = [r for r in rounds if not r.get("contended")]
    used = clean or rounds
    pooled = stats.estimate([json.loads(r["timing_samples_s"]) for r in used])
    record = dict(first)
    record.update(seconds_per_step=pooled.median, ci_low_s=pooled.ci_low, ci_high_s=pooled.ci_high,
                  ci_basis=pooled.basis, ci_coverage=pooled.coverage,
                  iqr_s=pooled.q75 - pooled.q25, samples=len(pooled.samples), rounds=pooled.rounds,
                  rounds_dropped=len(rounds) - len(used),
                  round_medians_s=json.dumps(list(pooled.round_medians)),
                  timing_samples_s=json.dumps(list(pooled.samples)), contended=not clean,
                  contention_reason=_rounds_reason(rounds) if not clean else None)
    if record.get("tokens") and record.get("flops"):
        derive_figures(record, pricing_of(record), record["tokens"] / pooled.median,
                       record["flops"] / pooled.median)
    return record


def _rounds_reason(rounds: list[dict]) -> str:
    """Why every round was contended, short: how many, and the first round's reason."""
    reasons = [r["contention_reason"] for r in rounds if r.get("contention_reason")]
    return f"contended in all {len(rounds)} timing rounds" + (f", e.g. {reasons[0]}" if reasons else "")


def numerics_workload(workload: Workload) -> Workload:
    """The workload itself, or a smaller proxy when the float64 reference would not fit: one
    sequence of ``PROXY_SEQ`` keys (a decode keeps its queries; a window shrinks with the length)."""
    fwd = workload.replace(mode="fwd")
    if fwd.batch * fwd.q_heads * fwd.seq_q * fwd.seq_k <= REFERENCE_MAX_SCORE_ELEMENTS:
        return fwd
    seq_q = min(fwd.seq_q, PROXY_SEQ) if fwd.seq_q < fwd.seq_k else PROXY_SEQ
    window = None if fwd.window is None else max(1, fwd.window * PROXY_SEQ // fwd.seq_k)
    documents = None if fwd.documents is None else min(fwd.documents, seq_q)
    return fwd.replace(batch=1 if not fwd.ragged else min(fwd.batch, 2), seq_q=seq_q, seq_k=PROXY_SEQ,
                       window=window, documents=documents)


def reference_mask(workload: Workload, x) -> dict:
    """The mask keywords of ``workload`` with its inputs' segment ids, for the float64 reference."""
    return mask_call(static_mask(workload), x.mask_arrays())


def check_numerics(impl, workload: Workload, step, seed: int) -> dict:
    """Errors of the timed step's own output (and gradients) against the float64 reference, from
    one more run of the same compiled function. Where the reference would not fit, a smaller proxy
    is checked through the conformance entry point instead, and the record says so.
    """
    checked = numerics_workload(workload)
    if checked.replace(mode=workload.mode) == workload:
        x = make_inputs(workload, seed)
        mask = reference_mask(workload, x)
        actual = impl.backend().host_arrays(step.run())
        expected = [attention_fwd(x.q, x.k, x.v, causal=workload.causal, **mask)]
        if workload.mode == "fwd_bwd":
            expected += attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
        if len(actual) != len(expected):
            raise ValueError(f"the timed step returned {len(actual)} arrays; expected {len(expected)} "
                             f"(output{', dq, dk, dv' if workload.mode == 'fwd_bwd' else ''})")
        results = [compare(a, e, workload.dtype, slack=1.0 if i == 0 else GRAD_SLACK)
                   for i, (a, e) in enumerate(zip(actual, expected, strict=True))]
        label = f"the timed step ({'output and gradients' if len(results) > 1 else 'output'})"
    else:
        if impl.check(checked):
            return {"numerics_workload": f"proxy {checked.describe()}", "numerics_ok": None}
        x = make_inputs(checked, seed=7)
        mask = reference_mask(checked, x)
        results = [compare(impl.run_numpy(x.q, x.k, x.v, causal=checked.causal, **mask),
                           attention_fwd(x.q, x.k, x.v, causal=checked.causal, **mask), checked.dtype)]
        label = (f"proxy {checked.describe()} (the reference at {workload.describe()} would exceed "
                 f"{REFERENCE_MAX_SCORE_ELEMENTS} score elements)")
    broken = [r for r in results if not r.finite]  # NaN/inf: reported as such, never as a small error
    worst = broken[0] if broken else max(results, key=lambda r: r.max_abs)
    return {"numerics_workload": label, "max_abs_err": worst.max_abs, "max_rel_err": worst.max_rel,
            "numerics_ok": all(r.ok for r in results)}


def thread_count() -> int | None:
    value = os.environ.get("ATTNBENCH_THREADS")
    return int(value) if value else None
