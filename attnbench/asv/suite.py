"""What the asv suite measures and how it reads it: suite sizes, cases, metrics, provenance.

Each ``setup_cache`` in ``benchmarks/`` calls ``measure_suite`` once per environment and commit, and
each ``track_*`` reads one metric (``attnbench/core/metrics.py``) of it. Nothing here imports a
framework at import time: asv imports the suite in every benchmark process.

The asv process initialises no device (jax would preallocate 75% of a GPU, and a TPU admits one
process): support is asked of a spawned process (``plan_cases``), the machine name and dtypes come
from the environment or device files (the name: ``asv/machine.py``). Suite sizes and the sidecar:
docs/suite.md.
"""

from __future__ import annotations

import os
import sys

import attention_impls
from attnbench import hardware
from attnbench.asv import sidecar
from attnbench.asv.machine import asv_context, machine_name, trace_dir
from attnbench.asv.sizes import (
    SUITE_ENV,
    accelerator_kind,
    case_length,
    compile_cache,
    left_out_kernels,
    suite_dtypes,
    suite_name,
    suite_settings,
    this_env_frameworks,
)
from attnbench.core import metrics, records, statuses
from attnbench.core.metrics import METRIC_VERSION, Metric  # noqa: F401  (the suite's names for them)
from attnbench.core.workload import CUSTOM, PHASES, Workload
from attnbench.hardware.fingerprint import host_fingerprint
from attnbench.measure.engine import Options
from attnbench.measure.process_env import pin_threads
from attnbench.run import case_cache, sweep
from attnbench.run.case_cache import CaseCache
from attnbench.run.provenance import library_versions
from attnbench.run.worker import Worker

DEADLINE_ENV = "ATTNBENCH_DEADLINE"  # time.time() after which no case starts (tools/device-run.sh)
CASE_TIMEOUT_S = 600.0
CHECK_TIMEOUT_S = 600.0  # the spawned support check imports every framework and initialises its device


def provenance_settings(settings: dict | None = None) -> dict:
    """The sidecar's settings: everything that changes what a number means. Flat and scalar, so each
    becomes a ``setting_<name>`` column and a change across a regression is named like a version."""
    settings = suite_settings() if settings is None else settings

    def seqs(values):
        return ",".join(map(str, values))

    return {"suite": suite_name(), "accelerator": accelerator_kind(), "compile_cache": compile_cache(),
            "dtypes": seqs(suite_dtypes(settings)), "forward_seqs": seqs(settings["forward_seqs"]),
            "training_seqs": seqs(settings["training_seqs"]), "regime_steps": settings["regime_steps"],
            "model_presets": seqs(settings.get("model_presets") or ()) or "none",
            "preset_size": settings.get("preset_size", "default"),
            "model_phases": seqs(settings.get("model_phases", PHASES)),
            "preset_workers": ("one per case" if settings.get("preset_fresh_process",
                                                               settings.get("fresh_process", True))
                               else "shared by static cases"),
            "regime_seqs": seqs(settings["regime_seqs"]) if settings["regime_seqs"] else "every length",
            "min_seconds": settings["min_seconds"], "max_extra_seconds": settings["max_extra_seconds"],
            "max_interpret_seq": settings["max_interpret_seq"] or "no limit",
            "max_reference_seq": settings.get("max_reference_seq") or "no limit",
            "rounds": settings.get("rounds", 1), "round_seconds": settings.get("round_seconds"),
            "timer": settings.get("timer", "wall"),
            "regime_dtypes": seqs(settings.get("regime_dtypes") or ()) or "every dtype",
            "workers": "one per case" if settings.get("fresh_process", True) else "shared by static cases",
            "case_timeout_s": CASE_TIMEOUT_S, "impls": os.environ.get("ATTNBENCH_IMPLS") or "all",
            "threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            # what the metrics mean (metrics.DEFINITION_CHANGES): absent in older sidecars = "1"
            "definitions": metrics.DEFINITIONS}


def measure_suite(cases: list[tuple[str, Workload, str]], suite: str | None = None, *,
                  also: dict[str, list[tuple[str, Workload, str]]] | None = None,
                  cache: CaseCache | None = None, measure_missing=None) -> dict:
    """The records of a benchmark class's cases, each measured once; ``{case key: record}``.

    ``cache``: records it holds are not measured again. ``also``: ``{class: cases}`` of other
    classes; with a cache, those it lacks join this sweep and reach their class through the cache
    (without one nothing could hand them on, so they are left to their class).
    """
    measure_missing = sweep_cases if measure_missing is None else measure_missing
    carried = carried_records()
    if carried is not None:  # records measured on another machine, filed here: nothing is measured
        keys = [case_key(*case) for case in cases]
        return {key: carried[key] for key in keys if key in carried}
    if cache is None:
        return measure_missing(cases, suite=suite)
    keys = [case_key(*case) for case in cases]
    done = cache.load(keys)
    missing = [case for case, key in zip(cases, keys, strict=True) if key not in done]
    others = {}
    for other_suite, other_cases in (also or {}).items():
        other_keys = [case_key(*case) for case in other_cases]
        have = cache.load(other_keys)
        lacking = [case for case, key in zip(other_cases, other_keys, strict=True) if key not in have]
        if lacking:
            others[other_suite] = lacking
    if missing or others:
        together = "".join(f", with {len(c)} {s} cases" for s, c in others.items())
        print(f"attnbench: case cache {cache.folder}: {len(done)} of {len(cases)} {suite or ''} cases "
              f"already measured, measuring {len(missing)}{together}", file=sys.stderr)
        written = set()

        def persist(key, record):  # as each case ends, before the next one starts
            cache.put(key, record)
            written.add(key)

        measured = measure_missing(missing, suite=suite, on_record=persist, also=others)
        for key, record in measured.items():  # the cases decided without a worker too
            if key not in written:
                cache.put(key, record)
        done.update((key, measured[key]) for key in keys if key in measured)
    if done and len(missing) < len(cases):  # the sidecar names every case, also those measured earlier
        write_sidecar({suite: cases}, done)
    return {key: done[key] for key in keys if key in done}


CARRIED_ENV = "ATTNBENCH_CARRIED"  # a folder of case records measured elsewhere (attnbench/asv/carried.py)


def carried_records() -> dict | None:
    """``{case key: record}`` of the ``ATTNBENCH_CARRIED`` folder; ``None`` when unset."""
    folder = os.environ.get(CARRIED_ENV)
    if not folder:
        return None
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{CARRIED_ENV}={folder} is not a folder of case records")
    return {record.pop("case_key"): record for record in case_cache.read_folder(folder)}


def run_case_cache() -> CaseCache | None:
    """This asv run's ``ATTNBENCH_CASE_CACHE``; ``None`` when unset or outside asv."""
    context = asv_context() if os.environ.get(case_cache.CACHE_ENV) else None
    return case_cache.from_env(provenance_settings(), context) if context else None


def sweep_cases(cases: list[tuple[str, Workload, str]], suite: str | None = None, on_record=None,
                also: dict[str, list[tuple[str, Workload, str]]] | None = None) -> dict:
    """Measure each (impl, workload, regime) in one sweep, with ``also``'s other classes' cases;
    returns {case key: record}. ``on_record(key, record)``: as each case ends.
    """
    groups = {suite: list(cases), **(also or {})}
    every = list({case_key(*case): case for group in groups.values() for case in group}.values())
    threads = len(os.sched_getaffinity(0))
    pin_threads(threads)
    settings = suite_settings()
    out, to_run = plan_cases(every, settings)
    to_run = run_order(to_run, settings)
    traces = trace_dir()

    def options_for(regime):
        return Options(regime=regime, regime_steps=settings["regime_steps"],
                       min_seconds=settings["min_seconds"],
                       max_extra_seconds=settings["max_extra_seconds"], trace_dir=traces,
                       compile_cache=compile_cache(), round_seconds=settings.get("round_seconds", 0.1),
                       timer=settings.get("timer", "wall"), support_checked=True)

    def measured(i, record):
        on_record(case_key(*to_run[i]), record)

    with sweep.run_probe_dir():  # the run's CPU GEMM probe, kept until the sidecar's fingerprint reads it
        rows = sweep.run_sweep(to_run, options_for, timeout_s=CASE_TIMEOUT_S, threads=threads,
                               progress=False, on_record=measured if on_record else None,
                               rounds=settings.get("rounds", 1), fresh_process=fresh_process_of(settings),
                               deadline=deadline())
        for (name, workload, regime), row in zip(to_run, rows, strict=True):
            out[case_key(name, workload, regime)] = row
        write_sidecar(groups, out, settings)
    return out


def run_order(cases: list, settings: dict) -> list:
    """The order a sweep measures its cases in (stable): the cases ``first``'s rules match, in rule
    order; then ``length_first`` so a run cut by its deadline keeps its shorter lengths whole;
    ``static_first`` so consecutive static cases share one worker."""
    rules = settings.get("first") or ()

    def rank(case) -> int:
        return next((i for i, rule in enumerate(rules) if matches(rule, case)), len(rules))

    if settings.get("length_first"):
        return sorted(cases, key=lambda case: (rank(case), case[1].seq_q, case[1].mode, case[2] != "static"))
    if settings.get("static_first"):
        return sorted(cases, key=lambda case: (rank(case), case[2] != "static"))
    return sorted(cases, key=rank)


def matches(rule: dict, case) -> bool:
    """Whether ``(impl, workload, regime)`` has one of the rule's values in every field it names
    (``impl``, ``regime``, or a ``Workload`` field)."""
    impl, workload, regime = case
    fields = {"impl": impl, "regime": regime}
    return all((fields[f] if f in fields else getattr(workload, f)) in allowed for f, allowed in rule.items())


def fresh_process_of(settings: dict):
    """Whether a case gets a worker of its own (``fresh_process``; ``preset_fresh_process`` for a
    preset's case). Sharing is safe for timing: jax and Inductor key their caches by shape, so each
    case still compiles cold."""
    fresh = settings.get("fresh_process", True)
    preset = settings.get("preset_fresh_process", fresh)
    if preset == fresh:
        return fresh
    return lambda case: preset if case[1].name != CUSTOM else fresh


def deadline() -> float | None:
    """``ATTNBENCH_DEADLINE`` (seconds since the epoch) as a float; ``None`` when unset."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{DEADLINE_ENV} must be seconds since the epoch (date +%s), got {raw!r}") from None


def plan_cases(cases: list[tuple[str, Workload, str]], settings: dict | None = None,
               check=None) -> tuple[dict, list]:
    """``({case key: record} of the cases that need no worker, [cases to measure])``.

    Support is answered by ``check`` (default ``check_in_subprocess``, gone before any measuring
    worker starts), so this process initialises no device. A failed check makes ``error`` records.
    """

    settings = suite_settings() if settings is None else settings
    check = check_in_subprocess if check is None else check
    out, pending = {}, []
    for name, workload, regime in cases:
        impl = attention_impls.get(name)
        if impl.framework not in this_env_frameworks():
            out[case_key(name, workload, regime)] = _record(
                name, workload, regime, records.UNSUPPORTED,
                f"{impl.framework} is measured in the other asv environment")
            continue
        pending.append((name, workload, regime))
    answers = check(pending, settings) if pending else []
    if isinstance(answers, BaseException):
        answers = [{"error": f"the support check failed: {type(answers).__name__}: {answers}"}] * len(pending)
    to_run = []
    for (name, workload, regime), answer in zip(pending, answers, strict=True):
        key = case_key(name, workload, regime)
        if answer.get("error"):
            out[key] = _record(name, workload, regime, records.ERROR, answer["error"])
        elif answer.get("reason"):
            out[key] = _record(name, workload, regime, records.UNSUPPORTED, answer["reason"],
                               platform=answer.get("platform"))
        else:
            to_run.append((name, workload, regime))
    return out, to_run


def _record(name, workload, regime, status, reason, **fields) -> dict:
    record = records.empty_record()
    record.update(impl=name, regime=regime, seq_q=workload.seq_q, dtype=workload.dtype, mode=workload.mode,
                  status=status, reason=reason, **fields)
    return record


def check_cases(cases: list[tuple[str, Workload, str]], settings: dict) -> list[dict]:
    """Per case: ``reason`` it is not measured here, and the ``platform``, ``label`` and ``execution``
    it would run with. Initialises devices: run it in its own process (``check_in_subprocess``)."""

    machine, machine_platform = machine_name(), accelerator_kind()
    answers = []
    for name, workload, regime in cases:
        impl = attention_impls.get(name)
        try:
            reason = impl.check(workload)
            answer = {"reason": reason}
            if not impl.framework_missing():
                platform = impl.platform()
                answer.update(platform=platform, label=impl.label(platform),
                              execution=impl.execution(platform))
                reason = reason or off_machine(impl, platform, machine, machine_platform)
                answer["reason"] = reason
            if not reason:
                answer["reason"] = outside_suite(impl, workload, regime, settings)
        except Exception as exc:  # a framework that cannot even say where it runs
            answer = {"error": f"support check of {name} failed: {type(exc).__name__}: {exc}"[:2000]}
        answers.append(answer)
    return answers


def _check_task(cases, settings):
    try:
        return check_cases(cases, settings)
    except Exception as exc:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def check_in_subprocess(cases, settings, timeout_s: float = CHECK_TIMEOUT_S):
    """``check_cases`` in one spawned worker, which exits (releasing any device it initialised)
    before this returns; an exception (returned, not raised) when it gave no answer."""
    with Worker(_check_task) as worker:
        answer, failure = worker.call((cases, settings), timeout_s)
    if failure is None:
        return answer
    if failure.status == statuses.TIMEOUT:
        return TimeoutError(f"no answer within {timeout_s:g} s")
    return RuntimeError(f"the check process died: {failure.reason}")


def off_machine(impl, platform: str, machine: str, machine_platform: str) -> str | None:
    """Why a case must not be filed under ``machine``: its framework runs on the CPU of an
    accelerator host (torch_xla on PJRT CPU on a GPU host). The float64 reference is exempt."""
    if platform == "cpu" and machine_platform != "cpu" and impl.framework != "numpy":
        return (f"{impl.framework} runs on the CPU in this environment, and this machine ({machine}) is a "
                f"{machine_platform.upper()} host: CPU figures are never filed under an accelerator's name")
    return None


def outside_suite(impl, workload: Workload, regime: str, settings: dict,
                  interpreted: bool | None = None) -> str | None:
    """Why the suite size leaves out a case the implementation could run (n/a with this reason).

    Without ``interpreted`` it asks ``impl``'s platform: then never call it in the asv process.
    """
    limit, regime_seqs = settings["max_interpret_seq"], settings["regime_seqs"]
    if interpreted is None:
        interpreted = impl.execution(impl.platform()) == "interpret"
    if workload.name != CUSTOM and interpreted and not settings.get("preset_interpret", True):
        return (f"runs only in an interpreter here; the {suite_name()} suite measures model presets with "
                f"kernels that run natively ({SUITE_ENV}=full runs it)")
    if limit and workload.seq_q > limit and interpreted:
        return (f"runs only in an interpreter here; the {suite_name()} suite stops interpreted "
                f"kernels at {limit} tokens ({SUITE_ENV}=full runs it)")
    if workload.name != CUSTOM and impl.framework == "numpy" and not settings.get("preset_reference", True):
        return (f"the float64 reference is the yardstick for correctness, not a contender; the "
                f"{suite_name()} suite times it on the B1 H8 D64 workload only ({SUITE_ENV}=full runs it)")
    reference_limit = settings.get("max_reference_seq")
    if reference_limit and workload.seq_q > reference_limit and impl.framework == "numpy":
        return (f"the float64 reference is the yardstick for correctness, not a contender; the "
                f"{suite_name()} suite times it up to {reference_limit} tokens ({SUITE_ENV}=full runs it)")
    regime_presets, preset_regimes = settings.get("regime_presets"), settings.get("preset_regimes")
    if regime != "static" and workload.name != CUSTOM and regime_presets is not None \
            and not {workload.name, f"{workload.name}:{workload.phase}"} & set(regime_presets):
        return (f"the {suite_name()} suite runs the {regime} regime of {', '.join(regime_presets) or 'no'} "
                f"preset only ({SUITE_ENV}=full runs every one)")
    if workload.name != CUSTOM and preset_regimes and regime not in preset_regimes:
        return (f"the {suite_name()} suite runs the presets' {' and '.join(preset_regimes)} regimes only "
                f"({SUITE_ENV}=full runs every one)")
    stream_left_out = settings.get("preset_stream_left_out", ())
    if regime != "static" and workload.name != CUSTOM and impl.name in stream_left_out:
        return (f"the {suite_name()} suite prices {impl.name}'s preset rows from their static stream: it "
                f"compiles each new shape afresh, as the Forward class's {regime} stream measures "
                f"({SUITE_ENV}=full runs it)")
    if regime != "static" and regime_seqs and workload.name == CUSTOM and workload.seq_q not in regime_seqs:
        return (f"the {suite_name()} suite runs the {regime} regime at "
                f"{', '.join(map(str, regime_seqs))} tokens only ({SUITE_ENV}=full runs every length)")
    regime_dtypes = settings.get("regime_dtypes")
    if regime != "static" and regime_dtypes and workload.dtype not in regime_dtypes:
        return (f"the {suite_name()} suite runs the {regime} regime in {', '.join(regime_dtypes)} only "
                f"({SUITE_ENV}=full runs every dtype)")
    return None


def case_key(name: str, workload: Workload, regime: str) -> str:
    return f"{name}|{workload.describe()}|{regime}"


# -- metrics --------------------------------------------------------------------------------------
STATUS_CODES = records.STATUS_CODES


def tracked_metrics() -> list[Metric]:
    """The metrics every class gets a ``track_<name>`` for (the metric table is their one source)."""
    return list(metrics.METRICS)


METRICS = tracked_metrics()


def record_for(cache: dict, key: str) -> dict:
    """The case's record, or ``NotImplementedError`` (asv: n/a) when it could not run here."""
    record = cache.get(key)
    if record is None:
        raise NotImplementedError(f"{key} is not in this suite's measurements")
    if record["status"] == records.UNSUPPORTED:
        raise NotImplementedError(record["reason"])
    return record


def write_sidecar(groups: dict[str | None, list[tuple[str, Workload, str]]], measured: dict,
                  settings: dict | None = None) -> str | None:
    """Write this environment and commit's sidecar, each case of ``groups`` (``{class: cases}``)
    filed under its class; returns its path, ``None`` outside asv."""

    ctx = asv_context()
    if ctx is None:
        return None
    entries = {}
    for suite, cases in groups.items():
        for name, workload, regime in cases:
            record = measured.get(case_key(name, workload, regime))
            if record is not None:
                entries[sidecar.case_id(suite, name, case_length(workload), regime, workload.dtype)] = \
                    sidecar.case_entry(record)
    versions = {k.removeprefix("version_"): v for k, v in library_versions().items() if v}
    return sidecar.write(ctx["results_dir"], ctx["machine"], ctx["commit"], ctx["env"], versions=versions,
                         settings=provenance_settings(settings), cases=entries,
                         host=host_fingerprint(os.environ.get(hardware.PROBE_DIR_ENV)),
                         left_out=left_out_kernels(settings))
