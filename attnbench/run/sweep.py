"""A sweep: many cases through killable workers, written as one tidy table with its provenance."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import os
import sys
import tempfile
import time

import attention_impls
from attnbench import hardware
from attnbench.core import records
from attnbench.core.atomic import atomic_write_bytes, atomic_write_text
from attnbench.measure.engine import Options, measure_case, new_record, pool_rounds
from attnbench.measure.process_env import scoped_environ
from attnbench.run.worker import Worker

# Imported where used: pandas (the torch_xla venv has no report libraries); tqdm (not in every venv).


def run_sweep(cases, options_for, *, isolate: bool = True, timeout_s: float = 300.0,
              memory_cap_bytes: int | None = None, threads: int | None = None, progress: bool = True,
              fresh_process: bool = True, on_record=None, rounds: int = 1, deadline: float | None = None):
    """Measure each (impl, workload, regime) case; one failing case never stops the sweep.

    ``on_record(i, record)``: as ``cases[i]`` ends, and again with its pooled record.

    ``rounds`` > 1: each ``timed_in_rounds`` case is timed again in ``rounds - 1`` short rounds spread
    over the run (plus up to ``EXTRA_ROUNDS_FOR_CONTENTION`` for contended ones) and its record pooled
    (``engine.pool_rounds``), so a burst of outside load hits one round, not the figure.

    ``fresh_process`` (or a callable per case): a new worker per case. Compile caches live per process
    (torch_xla's cannot be cleared), so a regime case always gets its own, for an honest compile count.

    ``deadline`` (``time.time()`` seconds): no case starts or runs past it; those left are recorded
    ``unsupported`` (asv: n/a), so a run out of time stops cleanly.
    """
    with run_probe_dir():
        rows = _run_cases(cases, options_for, isolate=isolate, timeout_s=timeout_s,
                          memory_cap_bytes=memory_cap_bytes, threads=threads, progress=progress,
                          fresh_process=fresh_process, on_record=on_record, deadline=deadline)
        if rounds > 1:
            rows = _timing_rounds(cases, rows, options_for, rounds, isolate=isolate, timeout_s=timeout_s,
                                  memory_cap_bytes=memory_cap_bytes, threads=threads, progress=progress,
                                  on_record=on_record, deadline=deadline)
        return rows


@contextlib.contextmanager
def run_probe_dir():
    """One CPU GEMM probe per run, shared by its workers (``hardware.PROBE_DIR_ENV``): the run's own
    folder for as long as the block lasts, unless an enclosing run set one."""
    with contextlib.ExitStack() as stack:
        if not os.environ.get(hardware.PROBE_DIR_ENV):
            probes = stack.enter_context(tempfile.TemporaryDirectory(prefix="attnbench-probes-"))
            stack.enter_context(scoped_environ(**{hardware.PROBE_DIR_ENV: probes}))
        yield os.environ[hardware.PROBE_DIR_ENV]


EXTRA_ROUNDS_FOR_CONTENTION = 2


def timed_in_rounds(case, row: dict) -> bool:
    """Whether a case gets later timing rounds: static, ok, and not interpreted (an interpreter's
    speed decides nothing, and rounds would pay its slow trace again)."""
    _, _, regime = case
    return (regime == "static" and row.get("status") == records.OK and bool(row.get("timing_samples_s"))
            and row.get("execution") != "interpret")


@contextlib.contextmanager
def round_compile_cache():
    """A jax persistent compilation cache for one sweep's timing rounds (passed to spawned workers by
    environment). Rounds time only the steady step, so it changes no figure; the first pass stays
    cold."""
    with tempfile.TemporaryDirectory(prefix="attnbench-round-jax-cache-") as folder, \
            scoped_environ(JAX_COMPILATION_CACHE_DIR=folder, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"):
        yield folder


def _timing_rounds(cases, rows, options_for, rounds, *, on_record, progress, **sweep_kwargs):
    """Later timing rounds of the static cases that measured ok; returns the pooled rows."""
    timed = [i for i, (case, row) in enumerate(zip(cases, rows, strict=True)) if timed_in_rounds(case, row)]
    later: dict[int, list[dict]] = {i: [] for i in timed}

    def round_options(regime):
        options = options_for(regime)
        return dataclasses.replace(options, timing_only=True, compile_cache="warm", trace_dir=None,
                                   min_seconds=options.round_seconds, max_extra_seconds=0.0)

    def one_round(indices):
        out = _run_cases([cases[i] for i in indices], round_options, fresh_process=False, on_record=None,
                         progress=progress, **sweep_kwargs)
        for i, row in zip(indices, out, strict=True):
            later[i].append(row)  # pool_rounds uses the rounds that measured ok

    with round_compile_cache():
        for r in range(rounds - 1):  # every other round backwards: no case always at the same moment
            one_round(timed if r % 2 else timed[::-1])
        for _ in range(EXTRA_ROUNDS_FOR_CONTENTION):  # bounded re-measurement of contended cases
            again = [i for i in timed if all(r.get("contended") for r in [rows[i]] + later[i])]
            if not again:
                break
            one_round(again)
    rows = list(rows)
    for i in timed:
        rows[i] = pool_rounds(rows[i], later[i])
        if on_record:  # the pooled record replaces the first round's
            on_record(i, rows[i])
    return rows


OUT_OF_TIME = "not measured: the run's time budget ran out before this case (ATTNBENCH_DEADLINE)"


def _run_cases(cases, options_for, *, isolate, timeout_s, memory_cap_bytes, threads, progress,
               fresh_process, on_record, deadline=None):
    bar = _progress(len(cases), progress)
    rows = []
    worker = Worker(measure_case, threads=threads, memory_cap_bytes=memory_cap_bytes) if isolate else None
    try:
        for i, (impl, workload, regime) in enumerate(cases):
            options = options_for(regime)
            if bar:
                bar.set_description(f"{impl} S={workload.seq_q} {regime}")
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 1.0:
                record = new_record(workload, options, impl=impl if isinstance(impl, str) else impl.name,
                                    status=records.UNSUPPORTED, reason=OUT_OF_TIME)
            elif worker:
                fresh = fresh_process((impl, workload, regime)) if callable(fresh_process) else fresh_process
                own_process = fresh or regime != "static"
                if own_process:
                    worker.close()  # a fresh process: no earlier case's compiles or caches
                record = measure_in_worker(worker, impl, workload, options, timeout_s, deadline)
                if own_process:
                    worker.close()
            else:
                record = measure_case(impl, workload, options)
            rows.append(record)
            if on_record:
                on_record(i, record)
            if bar:
                bar.update(1)
    finally:
        if worker:
            worker.close()
        if bar:
            bar.close()
    return rows


def measure_in_worker(worker: Worker, impl, workload, options: Options, timeout_s: float,
                      deadline: float | None = None) -> dict:
    """``measure_case`` in ``worker``: its record, or a record of how the worker failed. A fresh
    worker imports the case's framework before ``timeout_s`` starts; neither runs past ``deadline``."""
    record, failure = worker.call((impl, workload, options), timeout_s, preload=_framework(impl),
                                  deadline=deadline)
    if failure is None:
        return record
    return new_record(workload, options, impl=impl if isinstance(impl, str) else impl.name,
                      threads=worker.threads, status=failure.status, reason=failure.reason)


def _framework(impl) -> tuple[str, ...]:
    # A registry lookup only: a "module:Class" spec is not imported here, in the parent, but by the
    # worker's case; an unknown name gets no preload, and its record says what is wrong.
    try:
        return (attention_impls.get(impl).framework if isinstance(impl, str) else impl.framework,)
    except KeyError:
        return ()


def max_feasible_lengths(impl_names, template, lengths, options, **sweep_kwargs) -> list[dict]:
    """Largest sequence length each implementation ran at, walking up ``lengths`` until it fails."""
    rows = []
    for name in impl_names:
        best, stopped_by, reason = None, None, None
        for length in sorted(lengths):
            workload = template.at_length(length)
            [record] = run_sweep([(name, workload, "static")], lambda _regime: options,
                                 progress=False, **sweep_kwargs)
            if record["status"] == records.OK:
                best = length
                continue
            stopped_by, reason = record["status"], record["reason"]
            break
        rows.append({"impl": name, "max_feasible_seq": best, "tried_up_to": max(lengths),
                     "stopped_by": stopped_by or "none (all lengths ran)", "reason": reason,
                     "workload": template.describe()})
    return rows


def write_table(rows: list[dict], path: str, metadata: dict | None = None) -> str:
    """Write rows (plus metadata columns) as CSV or Parquet by extension, atomically."""
    full = [{**(metadata or {}), **row} for row in rows]
    columns = list(dict.fromkeys(k for row in full for k in row))
    if path.endswith(".parquet"):
        import pandas as pd

        buffer = io.BytesIO()
        pd.DataFrame(full, columns=columns).to_parquet(buffer, index=False)
        atomic_write_bytes(path, buffer.getvalue())
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns)
        writer.writeheader()
        writer.writerows(full)
        atomic_write_text(path, buffer.getvalue())
    return path


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="case", dynamic_ncols=True)


__all__ = ["Options", "max_feasible_lengths", "run_sweep", "write_table"]
