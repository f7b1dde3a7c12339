"""A sweep: many cases through killable workers, written as one tidy table with its provenance."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import sys
import tempfile
import time

from attnbench import hardware
from attnbench.core import records
from attnbench.core.atomic import atomic_write_bytes, atomic_write_text
from attnbench.measure.engine import Case, Options, case_record, measure_case
from attnbench.measure.figures import pool_rounds
from attnbench.measure.process_env import scoped_environ
from attnbench.run.plan import plan, preload
from attnbench.run.worker import Worker

# Imported where used: pandas (the torch_xla venv has no report libraries); tqdm (not in every venv).


def measure_cases(cases: list[Case], *, isolate: bool = True, timeout_s: float = 300.0,
                  memory_cap_bytes: int | None = None, threads: int | None = None, progress: bool = True,
                  on_record=None, rounds: int = 1, deadline: float | None = None) -> list[dict]:
    """The record of each case (a ``Case`` the plan admitted), in order; one failing case never
    stops the sweep.

    Each case runs in a killable worker (``isolate``); a case with ``own_process`` gets a fresh one,
    so no earlier case's compiles or caches are in it. ``on_record(i, record)``: as ``cases[i]``
    ends, and again with its pooled record.

    ``rounds`` > 1: each ``timed_in_rounds`` case is timed again in ``rounds - 1`` short later rounds
    spread over the run (plus up to ``EXTRA_ROUNDS_FOR_CONTENTION`` for contended ones) and its record
    pooled (``figures.pool_rounds``), so a burst of outside load hits one round, not the figure.

    ``deadline`` (``time.time()`` seconds): no case starts or runs past it; those left are recorded
    ``unsupported`` (asv: n/a), so a run out of time stops cleanly.
    """
    first: list[dict] = []  # each case's first record, in order
    later: dict[int, list[dict]] = {}  # the later timing rounds' records of each timed case
    with run_probe_dir(), contextlib.ExitStack() as rounds_only:
        for batch in _passes(cases, rounds, first, later, rounds_only):
            bar = _progress(len(batch), progress)
            worker = Worker(measure_case, threads=threads, memory_cap_bytes=memory_cap_bytes) \
                if isolate else None
            try:
                for i, case in batch:
                    if bar:
                        bar.set_description(f"{case.impl} S={case.workload.seq_q} {case.regime}")
                    left = None if deadline is None else deadline - time.time()
                    if left is not None and left <= 1.0:
                        record = case_record(case, status=records.UNSUPPORTED, reason=OUT_OF_TIME)
                    elif worker is None:
                        record = measure_case(case)
                    else:  # a Case in, a record out; a fresh process for own_process
                        if case.own_process:
                            worker.close()  # no earlier case's compiles or caches
                        record, failure = worker.call((case,), timeout_s, preload=preload(case.impl),
                                                      deadline=deadline)
                        if failure is not None:  # it timed out, ran out of memory or died
                            record = case_record(case, threads=worker.threads, status=failure.status,
                                                 reason=failure.reason)
                        if case.own_process:
                            worker.close()
                    if case.options.later_round:
                        later[i].append(record)  # pool_rounds uses the rounds that measured ok
                    else:
                        first.append(record)
                        if on_record:
                            on_record(i, record)
                    if bar:
                        bar.update(1)
            finally:
                if worker:
                    worker.close()
                if bar:
                    bar.close()
    for i in later:  # the pooled record replaces the first round's
        first[i] = pool_rounds(first[i], later[i])
        if on_record:
            on_record(i, first[i])
    return first


def _passes(cases: list[Case], rounds: int, first: list[dict], later: dict[int, list[dict]],
            rounds_only: contextlib.ExitStack):
    """The sweep's passes, each a list of ``(index, case)``: every case once; then, with ``rounds``
    > 1, the later timing rounds of the ``timed_in_rounds`` cases (``_round_orders``), under one jax
    compile cache that lives for the rounds (entered on ``rounds_only``). Which cases a round times
    depends on the records before it: it reads ``first`` and ``later`` as the sweep fills them."""
    yield list(enumerate(cases))
    timed = [i for i, (case, record) in enumerate(zip(cases, first, strict=True))
             if timed_in_rounds(case, record)]
    if rounds < 2 or not timed:
        return
    later.update((i, []) for i in timed)
    rounds_only.enter_context(round_compile_cache())
    for order in _round_orders(timed, rounds, first, later):
        yield [(i, cases[i].later_round()) for i in order]


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


def timed_in_rounds(case: Case, record: dict) -> bool:
    """Whether a case gets later timing rounds: static, ok, and not interpreted (an interpreter's
    speed decides nothing, and rounds would pay its slow trace again)."""
    return (case.regime == "static" and record.get("status") == records.OK
            and bool(record.get("timing_samples_s")) and record.get("execution") != "interpret")


def _round_orders(timed: list[int], rounds: int, first: list[dict], later: dict[int, list[dict]]):
    """The cases of each later round, in order: every other round backwards, so no case is always
    timed at the same moment; then up to ``EXTRA_ROUNDS_FOR_CONTENTION`` rounds of the cases
    contended in every round so far (read from ``later`` as the rounds fill it)."""
    for r in range(rounds - 1):
        yield timed if r % 2 else timed[::-1]
    for _ in range(EXTRA_ROUNDS_FOR_CONTENTION):
        again = [i for i in timed if all(r.get("contended") for r in [first[i]] + later[i])]
        if not again:
            return
        yield again


@contextlib.contextmanager
def round_compile_cache():
    """A jax persistent compilation cache for one sweep's timing rounds (passed to spawned workers by
    environment). Rounds time only the steady step, so it changes no figure; the first pass stays
    cold."""
    with tempfile.TemporaryDirectory(prefix="attnbench-round-jax-cache-") as folder, \
            scoped_environ(JAX_COMPILATION_CACHE_DIR=folder, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"):
        yield folder


OUT_OF_TIME = "not measured: the run's time budget ran out before this case (ATTNBENCH_DEADLINE)"


def max_feasible_lengths(impl_names, template, lengths, options, **sweep_kwargs) -> list[dict]:
    """Largest sequence length each implementation ran at, walking up ``lengths`` until it fails
    (or its kernel refuses the length here)."""
    lengths = sorted(lengths)
    cases = [Case(name, template.at_length(length), options) for name in impl_names for length in lengths]
    refused, _ = plan(cases, in_process=not sweep_kwargs.get("isolate", True))
    rows = []
    for n, name in enumerate(impl_names):
        best, stopped_by, reason = None, None, None
        for i, length in enumerate(lengths, start=n * len(lengths)):
            [record] = [refused[i]] if i in refused else measure_cases([cases[i]], progress=False,
                                                                      **sweep_kwargs)
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


__all__ = ["Case", "Options", "max_feasible_lengths", "measure_cases", "write_table"]
