"""Measure one case: implementation x workload x shape regime, on this process's device.

``measure_case`` returns one record (``attnbench.records``) with every metric and a status. It
never raises for a case that fails: unsupported, out-of-memory and numerics failures become the
record's status, anything else ``error`` with the message. Timeouts and hard crashes need a
separate process: ``attnbench.isolation`` runs this function in a worker it can kill.

Order of work for one case, so that each number has one source:
  1. ``make_step`` places inputs on the device (and, for jax, lowers + compiles ahead of time).
  2. ``time_step``: first call timed alone, then a warmed, blocked autorange (median, IQR).
  3. one more step under the memory probes (device peak, torch profiler, process RSS).
  4. the shape-regime stream through a Runner (compiles, stalls, padding waste, per-step trace).
  5. numerics against the float64 reference at this workload (or a smaller proxy).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import traceback

from attention_impls.base import Unsupported
from attnbench import records
from attnbench.compiler_caches import check_mode as check_compile_cache
from attnbench.compiler_caches import compiler_caches
from attnbench.numerics import compare
from attnbench.timing import time_step
from attnbench.workload import Workload

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
    profile: str | None = None  # hardware profile name overriding detection
    price_per_hour: float | None = None
    spot_price_per_hour: float | None = None
    trace_dir: str | None = None  # where per-step regime traces are written
    compile_cache: str = "cold"  # cold | warm: see attnbench/compiler_caches.py

    def __post_init__(self):
        check_compile_cache(self.compile_cache)


def new_record(workload: Workload, options: Options, **fields) -> dict:
    """An empty record with the case's workload and regime columns filled (and ``fields``)."""
    record = records.empty_record()
    record.update(_workload_columns(workload), regime=options.regime, bucket_policy=options.bucket_policy,
                  compile_cache=options.compile_cache, threads=thread_count())
    record.update(fields)
    return record


def resolve_impl(spec):
    """A registered name, an ``AttentionImpl`` instance, or ``"module:Class"`` (test stubs, plugins)."""
    import attention_impls

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


def measure_case(impl_spec, workload: Workload, options: Options = Options()) -> dict:
    """One record for one case; never raises for a failing case."""
    record = new_record(workload, options)
    try:
        impl = resolve_impl(impl_spec)
    except Exception as exc:  # unknown name, bad plugin path
        record.update(impl=str(impl_spec), status=records.ERROR, reason=f"{type(exc).__name__}: {exc}")
        return record
    record.update(impl=impl.name, framework=impl.framework)
    reason = impl.check(workload)
    if reason:
        record.update(status=records.UNSUPPORTED, reason=reason)
        return record
    platform = impl.platform()
    record.update(platform=platform, label=impl.label(platform), execution=impl.execution(platform))
    try:
        with compiler_caches(options.compile_cache):
            _measure(impl, workload, options, record)
    except Unsupported as exc:  # e.g. a length of the dynamic stream the kernel cannot take
        record.update(status=records.UNSUPPORTED, reason=exc.reason)
    except Exception as exc:
        record.update(status=classify_exception(exc),
                      reason=f"{type(exc).__name__}: {exc}"[:2000] or traceback.format_exc(limit=3))
    return record


def _measure(impl, workload: Workload, options: Options, record: dict) -> None:
    from attnbench import hardware

    device = hardware.detect_accelerator(impl.framework)
    record["device"] = device.name
    step = impl.make_step(workload, seed=options.seed)
    record["execution"] = step.execution
    for key, value in (step.compile_info or {}).items():
        if key in record:
            record[key] = value

    if options.regime == "static":
        timing = time_step(step.run, min_seconds=options.min_seconds, target_rel_iqr=0.05,
                           max_seconds=options.min_seconds + options.max_extra_seconds)
        record.update(first_call_s=timing.first_call_s, seconds_per_step=timing.median_s,
                      iqr_s=timing.iqr_s, samples=timing.samples, steps_per_sample=timing.steps_per_sample)
    record.update(measure_memory(impl, step))
    evidence = step.evidence()  # after timing: a profiled evidence run must not be the first call
    record.update(kernel_evidence=evidence, kernel_verified=not evidence.startswith("not verified"))
    regime_result = _run_regime(impl, workload, options, record)
    seconds = record["seconds_per_step"]
    pricing = _throughput_and_cost(device, workload, seconds, options, record) if seconds else None
    if options.trace_dir:
        record["trace_file"] = write_trace(regime_result, record, options.trace_dir, pricing)
    record["status"] = records.OK
    if options.numerics:
        record.update(check_numerics(impl, workload))
        if record["numerics_ok"] is False:
            record["status"] = records.NUMERICS_FAILED
            record["reason"] = (f"output differs from the float64 reference: "
                                f"max abs err {record['max_abs_err']}")


def _run_regime(impl, workload, options, record) -> None:
    from attnbench import regimes

    lengths = regimes.length_stream(workload.seq_q, options.regime_steps, options.seed)
    template = workload.replace(seq_k=workload.seq_q) if workload.seq_k == workload.seq_q else workload
    result = regimes.run_regime(impl, template, options.regime, lengths, options.bucket_policy)
    record.update(regime_steps=len(lengths), compiles=result.compiles,
                  compile_seconds_total=result.compile_seconds_total,
                  padding_waste=result.padding_waste, useful_tokens_per_s=result.useful_tokens_per_s,
                  seconds_per_step_with_compiles=result.total_seconds / max(1, len(result.trace)))
    if options.regime != "static":
        record["seconds_per_step"] = result.steady_seconds_per_step
        record["first_call_s"] = result.trace[0].seconds if result.trace else None
    return result


def write_trace(result, record: dict, trace_dir: str, pricing=None) -> str | None:
    """The per-step trace of a regime run as CSV (spikes are per step); returns the path.

    Each step's ``usd`` is its wall time at the on-demand price (None when unpriced).
    """
    import csv
    import io

    from attnbench import cost, regimes
    from attnbench.atomic import atomic_write_text

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
    path = os.path.join(trace_dir, "{impl}__{regime}__S{seq_q}__{mode}__{dtype}.csv".format(**record))
    atomic_write_text(path, buffer.getvalue())
    return path


def _throughput_and_cost(device, workload, seconds, options, record):
    """Throughput, MFU and cost columns of ``record``; returns the ``Pricing`` used."""
    from attnbench import cost, hardware

    record.update(tokens_per_s=workload.tokens / seconds, tflops=workload.flops / seconds / 1e12,
                  seconds_per_million_tokens=seconds / workload.tokens * 1e6)
    profile = hardware.get_profile(options.profile) if options.profile else hardware.match_profile(device)
    peak = hardware.peak_tflops(device, profile, workload.dtype, framework=record["framework"])
    record.update(peak_tflops=peak.tflops, peak_source=peak.source)
    if peak.tflops:
        record["mfu"] = record["tflops"] / peak.tflops
    pricing = cost.pricing_for(device, profile_name=options.profile, price_per_hour=options.price_per_hour,
                               spot_price_per_hour=options.spot_price_per_hour, cores=record["threads"])
    costs = cost.cost_per_step(seconds, pricing, tokens_per_step=workload.tokens)
    record.update({k: v for k, v in costs.items() if k in record})
    # What a step of the regime's stream costs, compile stalls included.
    stream = cost.cost_per_step(record["seconds_per_step_with_compiles"], pricing)
    for market in ("on_demand", "spot"):
        record[f"usd_per_step_with_compiles_{market}"] = stream[f"usd_per_step_{market}"]
    return pricing


def measure_memory(impl, step) -> dict:
    """Peak memory of one more step, by source; a source this device lacks stays None."""
    out = {}
    if impl.framework == "jax":
        import jax

        stats = jax.devices()[0].memory_stats()  # None on CPU
        if stats and "peak_bytes_in_use" in stats:
            step.run()
            out["device_peak_bytes"] = jax.devices()[0].memory_stats()["peak_bytes_in_use"]
    elif impl.framework == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            step.run()
            out["device_peak_bytes"] = torch.cuda.max_memory_allocated()
        else:
            out["host_profiler_peak_bytes"] = torch_profiler_peak_bytes(step.run)
    elif impl.framework == "torch_xla":
        out["device_peak_bytes"] = _xla_peak_bytes(impl)
    out["host_rss_growth_bytes"] = rss_growth_bytes(step.run)
    return out


def torch_profiler_peak_bytes(run) -> int:
    """Peak of live host allocations that torch's profiler saw during ``run()``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for event in events:
        live += event.cpu_memory_usage
        peak = max(peak, live)
    return peak


def _xla_peak_bytes(impl):
    try:
        import torch_xla.core.xla_model as xm

        info = xm.get_memory_info(impl.device())
        return info.get("peak_bytes_used") or info.get("bytes_used")
    except Exception:  # the CPU PJRT client reports no memory info
        return None


def rss_growth_bytes(run) -> int | None:
    """How far this process's resident high-water mark rises above its current RSS during ``run()``.

    Linux only: writing 5 to /proc/self/clear_refs resets VmHWM, so the figure is per step even in
    a long-lived worker. Host memory, so on a GPU/TPU it is the host side of the step only.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _proc_status_kib("VmRSS")
        run()
        return (_proc_status_kib("VmHWM") - before) * 1024
    except OSError:
        return None


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def numerics_workload(workload: Workload) -> Workload:
    """The workload itself, or a smaller proxy when the float64 reference would not fit."""
    fwd = workload.replace(mode="fwd")
    if fwd.batch * fwd.q_heads * fwd.seq_q * fwd.seq_k <= REFERENCE_MAX_SCORE_ELEMENTS:
        return fwd
    return fwd.replace(batch=1, seq_q=PROXY_SEQ, seq_k=PROXY_SEQ)


def check_numerics(impl, workload: Workload) -> dict:
    from attention_impls.reference import attention_fwd
    from attnbench.inputs import make_inputs

    proxy = numerics_workload(workload)
    out = {"numerics_workload": proxy.describe()}
    if impl.check(proxy):
        return {**out, "numerics_ok": None}
    x = make_inputs(proxy, seed=7)
    result = compare(impl.run_numpy(x.q, x.k, x.v, causal=proxy.causal),
                     attention_fwd(x.q, x.k, x.v, causal=proxy.causal), proxy.dtype)
    return {**out, "max_abs_err": result.max_abs, "max_rel_err": result.max_rel, "numerics_ok": result.ok}


def _workload_columns(w: Workload) -> dict:
    return {**dataclasses.asdict(w), "flops": w.flops, "min_bytes": w.min_bytes, "tokens": w.tokens}


def thread_count() -> int | None:
    value = os.environ.get("ATTNBENCH_THREADS")
    return int(value) if value else None
