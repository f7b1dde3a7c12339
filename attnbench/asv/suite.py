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
    SuiteSize,
    accelerator_kind,
    case_length,
    compile_cache,
    left_out_kernels,
    suite_dtypes,
    suite_name,
    suite_size,
    this_env_frameworks,
    timer_here,
    user_round_settings,
    user_traffic,
)
from attnbench.backends import here
from attnbench.core import metrics, records
from attnbench.core.metrics import METRIC_VERSION, Metric  # noqa: F401  (the suite's names for them)
from attnbench.core.workload import CUSTOM, Workload
from attnbench.hardware.fingerprint import host_fingerprint
from attnbench.measure.engine import Case, case_key, case_record
from attnbench.measure.process_env import pin_threads
from attnbench.results import tuned
from attnbench.run import case_cache, plan, progress, sweep
from attnbench.run.case_cache import CaseCache
from attnbench.run.provenance import library_versions

DEADLINE_ENV = "ATTNBENCH_DEADLINE"  # time.time() after which no case starts (tools/device-run.sh)
CASE_TIMEOUT_S = 600.0


def provenance_settings(size: SuiteSize | None = None) -> dict:
    """The sidecar's settings: everything that changes what a number means. Flat and scalar, so each
    becomes a ``setting_<name>`` column and a change across a regression is named like a version."""
    size = suite_size() if size is None else size

    def seqs(values):
        return ",".join(map(str, values))

    def workers(fresh: bool) -> str:
        return "one per case" if fresh else "shared by static cases"

    return {"suite": suite_name(), "accelerator": accelerator_kind(), "compile_cache": compile_cache(),
            "dtypes": seqs(suite_dtypes(size)), "forward_seqs": seqs(size.forward_seqs),
            "training_seqs": seqs(size.training_seqs), "regime_steps": size.regime_steps,
            "static_stream_steps": size.static_stream_steps or size.regime_steps,
            "stream_windows": size.stream_windows, "stream_budget_s": size.stream_budget_s or "none",
            "traffic": user_traffic() or f"forward {size.forward_traffic}, prefill {size.prefill_traffic}, "
                                         f"decode {size.decode_traffic}",
            "model_presets": seqs(size.model_presets) or "none", "preset_size": size.preset_size,
            "model_phases": seqs(size.model_phases), "preset_workers": workers(size.preset_fresh),
            "regime_seqs": seqs(size.regime_seqs) if size.regime_seqs else "every length",
            "min_seconds": size.min_seconds, "max_extra_seconds": size.max_extra_seconds,
            "max_interpret_seq": size.max_interpret_seq or "no limit",
            "max_reference_seq": size.max_reference_seq or "no limit",
            "rounds": size.rounds, "max_rounds": size.max_rounds or size.rounds,
            "round_seconds": size.round_seconds, "timer": timer_here(size),
            "round_budget_s": _budget_text(size), "margin": _margin(size),
            "precision": user_round_settings()["precision"] or size.precision or "none",
            "controls": seqs(size.controls) or "none",
            "regime_dtypes": seqs(size.regime_dtypes or ()) or "every dtype",
            "workers": workers(size.fresh_process),
            "case_timeout_s": CASE_TIMEOUT_S, "impls": os.environ.get("ATTNBENCH_IMPLS") or "all",
            "threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            # what the metrics mean (metrics.DEFINITION_CHANGES): absent in older sidecars = "1"
            "definitions": metrics.DEFINITIONS}


def _budget_text(size: SuiteSize):
    budget = user_round_settings()["budget_s"] or size.round_budget_s
    return budget if budget is not None else "none"


def _margin(size: SuiteSize) -> float:
    return user_round_settings()["margin"] or size.margin


def round_plan(size: SuiteSize, planned: list[Case]):
    """The size's later rounds with the user's budget and margin, and the A/A controls among
    ``planned``: each control kernel's Forward case at the size's longest length."""
    longest = max(size.forward_seqs)
    controls = tuple(case.key for case in planned
                     if case.impl in size.controls and case.regime == "static"
                     and case.workload.name == CUSTOM
                     and case.workload.mode == "fwd" and case.workload.seq_q == longest
                     and case.workload.batch == 1)
    user = user_round_settings()
    return size.round_plan(budget_s=user["budget_s"], margin=user["margin"], precision=user["precision"],
                           controls=controls)


def measure_suite(cases: list[tuple[str, Workload, str]], benchmark: str | None = None, *,
                  also: dict[str, list[tuple[str, Workload, str]]] | None = None,
                  cache: CaseCache | None = None) -> dict:
    """The records of benchmark class ``benchmark``'s ``(impl, workload, regime)`` cases, each measured
    once; ``{case key: record}``.

    ``cache``: records it holds are not measured again, and each case is filed there as it ends.
    ``also``: ``{class: cases}`` of other classes; with a cache, those it lacks join this sweep and
    reach their class through the cache (without one nothing could hand them on, so they are left to
    their class). The sidecar names each case under its class.
    """
    carried = carried_records()
    keys = [case_key(*case) for case in cases]
    if carried is not None:  # records measured on another machine, filed here: nothing is measured
        return {key: carried[key] for key in keys if key in carried}
    cached = cache is not None
    done = cache.load(keys) if cached else {}
    # a case whose rounds an interrupted run had not finished goes on from them (run/adaptive.py)
    done = {key: record for key, record in done.items() if not unfinished_rounds(record)}
    groups = {benchmark: [case for case, key in zip(cases, keys, strict=True) if key not in done]}
    if cached:
        groups.update(not_cached(cache, also or {}))
    every = list({case_key(*case): case for group in groups.values() for case in group}.values())
    loaded = cache.load([case_key(*c) for c in every]) if cached else {}
    unfinished = {key: record for key, record in loaded.items() if unfinished_rounds(record)}
    if cached and every:
        together = "".join(f", with {len(c)} {s} cases" for s, c in groups.items() if s != benchmark)
        going_on = f" ({len(unfinished)} of them going on from the rounds they kept)" if unfinished else ""
        print(f"attnbench: case cache {cache.folder}: {len(done)} of {len(cases)} {benchmark or ''} cases "
              f"already measured, measuring {len(groups[benchmark])}{going_on}{together}", file=sys.stderr)
    if every or not cached:  # without a cache the sidecar is written even for a class with no case
        size, threads = suite_size(), len(os.sched_getaffinity(0))
        pin_threads(threads)
        measured, planned = plan_cases(every, size)
        with sweep.run_probe_dir():  # the run's CPU GEMM probe, kept until the sidecar's fingerprint reads it
            prior = {i: unfinished[case.key] for i, case in enumerate(planned) if case.key in unfinished}
            spent: dict[str, float] = {}
            rounds = round_plan(size, planned)
            where = progress.Progress(benchmark or "suite", len(planned), rounds and rounds.budget_s,
                                      done=set(prior), cases=planned, records=dict(prior))

            def on_record(i: int, record: dict) -> None:
                if cached:
                    cache.put(planned[i].key, record)
                where.recorded(i, record)

            with progress.stopping_on_sigterm(), progress.heartbeat(where):
                records = sweep.measure_cases(
                    planned, timeout_s=CASE_TIMEOUT_S, threads=threads, progress=False, rounds=rounds,
                    deadline=deadline(), prior=prior, spent=spent, on_record=on_record)
            measured.update((case.key, record) for case, record in zip(planned, records, strict=True))
            print(f"attnbench: {benchmark} sweep of {len(planned)} cases: {sweep.time_spent(spent)}",
                  file=sys.stderr)
            write_sidecar(groups, measured, size, time_spent={benchmark or "": spent})
        if cached:  # the cases decided without a worker: each measured one was filed as it ended
            filed = {case.key for case in planned}
            for key, record in measured.items():
                if key not in filed:
                    cache.put(key, record)
        done.update((key, measured[key]) for key in keys if key in measured)
    if cached and done and len(groups[benchmark]) < len(cases):  # the sidecar names the earlier ones too
        write_sidecar({benchmark: cases}, done)
    return {key: done[key] for key in keys if key in done}


def unfinished_rounds(record: dict) -> bool:
    """Whether a cached record's later rounds were cut short (an interrupted run): its case rejoins
    the sweep and its rounds go on from the ones it kept."""
    return record.get("rounds_complete") is False


def not_cached(cache: CaseCache, classes: dict[str, list[tuple[str, Workload, str]]]) -> dict:
    """``{class: cases}`` of ``classes``' cases the cache does not hold yet."""
    out = {}
    for name, cases in classes.items():
        keys = [case_key(*case) for case in cases]
        have = cache.load(keys)
        lacking = [case for case, key in zip(cases, keys, strict=True)
                   if key not in have or unfinished_rounds(have[key])]
        if lacking:
            out[name] = lacking
    return out


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


def run_order(cases: list[Case], size: SuiteSize) -> list[Case]:
    """The order a sweep measures its cases in (stable): the cases ``first``'s rules match, in rule
    order; then ``length_first`` so a run cut by its deadline keeps its shorter lengths whole;
    ``static_first`` so consecutive static cases share one worker."""
    rules = size.first

    def rank(case: Case) -> int:
        return next((i for i, rule in enumerate(rules) if matches(rule, case)), len(rules))

    if size.length_first:
        return sorted(cases, key=lambda case: (rank(case), case.workload.seq_q, case.workload.mode,
                                               case.regime != "static"))
    if size.static_first:
        return sorted(cases, key=lambda case: (rank(case), case.regime != "static"))
    return sorted(cases, key=rank)


def matches(rule: dict, case: Case) -> bool:
    """Whether a case has one of the rule's values in every field it names (``impl``, ``regime``,
    or a ``Workload`` field)."""
    fields = {"impl": case.impl, "regime": case.regime}
    return all((fields[f] if f in fields else getattr(case.workload, f)) in allowed
               for f, allowed in rule.items())


def deadline() -> float | None:
    """``ATTNBENCH_DEADLINE`` (seconds since the epoch) as a float; ``None`` when unset."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{DEADLINE_ENV} must be seconds since the epoch (date +%s), got {raw!r}") from None


def plan_cases(cases: list[tuple[str, Workload, str]], size: SuiteSize) -> tuple[dict, list[Case]]:
    """``({case key: record} of the cases not measured here, [the others as ``Case`` values, in
    run order])``.

    Support is asked of one spawned worker (``check_cases``), gone before any measuring worker
    starts, so this process initialises no device. A failed check makes ``error`` records.
    """
    traces, cache_mode = trace_dir(), compile_cache()
    configs = tuned_configs()
    out, pending = {}, []
    for name, workload, regime in cases:
        case = Case(name, workload, size.options(regime, trace_dir=traces, compile_cache=cache_mode,
                                                 workload=workload),
                    own_process=size.own_process(workload, regime))
        case = tuned.tuned_case(case, configs)
        framework = attention_impls.get(name).framework
        if framework in this_env_frameworks():
            pending.append(case)
        else:
            out[case.key] = case_record(case, framework=framework, status=records.UNSUPPORTED,
                                        reason=f"{framework} is measured in the other asv environment")
    answers = plan.ask_in_worker(check_cases, pending, size) if pending else []
    admitted = []
    for case, answer in zip(pending, answers, strict=True):
        record = plan.refused(case, answer)
        if record is None:
            admitted.append(case)
        else:
            out[case.key] = record
    return out, run_order(admitted, size)


def tuned_configs() -> dict:
    """The kept configs of this machine (``results/tuning/<machine>.tuning``, written by ``make tune``);
    ``{}`` outside asv or where nothing was tuned: every kernel at its defaults."""
    ctx = asv_context()
    return tuned.read(ctx["results_dir"], ctx["machine"]) if ctx else {}


def check_cases(cases: list[Case], size: SuiteSize) -> list[dict]:
    """Per case, ``run.plan.support``'s answer, with the suite's own reasons a case is not measured
    here (``off_machine``, ``outside_suite``). Initialises devices: ``plan_cases`` runs it in a
    spawned worker."""
    try:
        machine, machine_platform = machine_name(), accelerator_kind()
    except Exception as exc:  # a bad ATTNBENCH_MACHINE or ACCEL: every case says so
        return [{"error": f"the support check could not name this machine: {type(exc).__name__}: {exc}"}] \
            * len(cases)
    answers = []
    for case in cases:
        answer = plan.support(case)
        if not answer.get("error") and not answer.get("reason"):
            impl, platform = attention_impls.get(case.impl), answer.get("platform")
            try:
                answer["reason"] = (
                    (off_machine(impl, platform, machine, machine_platform) if platform else None)
                    or outside_suite(impl, case.workload, case.regime, size,
                                     interpreted=answer["execution"] == "interpret" if platform else None))
            except Exception as exc:  # a framework that cannot say where it runs
                answer = plan.check_failed(case, exc)
        answers.append(answer)
    return answers


def off_machine(impl, platform: str, machine: str, machine_platform: str) -> str | None:
    """Why a case must not be filed under ``machine``: its framework runs on the CPU of an
    accelerator host (torch_xla on PJRT CPU on a GPU host). The float64 reference is exempt."""
    if platform == "cpu" and machine_platform != "cpu" and impl.framework != "numpy":
        return (f"{impl.framework} runs on the CPU in this environment, and this machine ({machine}) is a "
                f"{machine_platform.upper()} host: CPU figures are never filed under an accelerator's name")
    return None


def outside_suite(impl, workload: Workload, regime: str, size: SuiteSize,
                  interpreted: bool | None = None) -> str | None:
    """Why the suite size leaves out a case the implementation could run (n/a with this reason).

    Without ``interpreted`` it asks ``impl``'s platform: then never call it in the asv process.
    """
    limit, regime_seqs, preset = size.max_interpret_seq, size.regime_seqs, workload.name != CUSTOM
    if interpreted is None:
        interpreted = impl.execution(here.platform(impl)) == "interpret"
    if preset and interpreted and not size.preset_interpret:
        return (f"runs only in an interpreter here; the {suite_name()} suite measures model presets with "
                f"kernels that run natively ({SUITE_ENV}=full runs it)")
    if limit and workload.seq_q > limit and interpreted:
        return (f"runs only in an interpreter here; the {suite_name()} suite stops interpreted "
                f"kernels at {limit} tokens ({SUITE_ENV}=full runs it)")
    if preset and impl.framework == "numpy" and not size.preset_reference:
        return (f"the float64 reference is the yardstick for correctness, not a contender; the "
                f"{suite_name()} suite times it on the B1 H8 D64 workload only ({SUITE_ENV}=full runs it)")
    reference_limit = size.max_reference_seq
    if reference_limit and workload.seq_q > reference_limit and impl.framework == "numpy":
        return (f"the float64 reference is the yardstick for correctness, not a contender; the "
                f"{suite_name()} suite times it up to {reference_limit} tokens ({SUITE_ENV}=full runs it)")
    regime_presets, preset_regimes = size.regime_presets, size.preset_regimes
    if regime != "static" and preset and regime_presets is not None \
            and not {workload.name, f"{workload.name}:{workload.phase}"} & set(regime_presets):
        return (f"the {suite_name()} suite runs the {regime} regime of {', '.join(regime_presets) or 'no'} "
                f"preset only ({SUITE_ENV}=full runs every one)")
    if preset and preset_regimes and regime not in preset_regimes:
        return (f"the {suite_name()} suite runs the presets' {' and '.join(preset_regimes)} regimes only "
                f"({SUITE_ENV}=full runs every one)")
    if regime != "static" and preset and impl.name in size.preset_stream_left_out:
        return (f"the {suite_name()} suite prices {impl.name}'s preset rows from their static stream: it "
                f"compiles each new shape afresh, as the Forward class's {regime} stream measures "
                f"({SUITE_ENV}=full runs it)")
    if regime != "static" and regime_seqs and not preset and workload.seq_q not in regime_seqs:
        return (f"the {suite_name()} suite runs the {regime} regime at "
                f"{', '.join(map(str, regime_seqs))} tokens only ({SUITE_ENV}=full runs every length)")
    regime_dtypes = size.regime_dtypes
    if regime != "static" and regime_dtypes and workload.dtype not in regime_dtypes:
        return (f"the {suite_name()} suite runs the {regime} regime in {', '.join(regime_dtypes)} only "
                f"({SUITE_ENV}=full runs every dtype)")
    return None


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
                  size: SuiteSize | None = None, time_spent: dict | None = None) -> str | None:
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
                         settings=provenance_settings(size), cases=entries,
                         host=host_fingerprint(os.environ.get(hardware.PROBE_DIR_ENV)),
                         left_out=left_out_kernels(size), time_spent=time_spent)
