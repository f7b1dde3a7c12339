"""A sweep: many cases through killable workers, written as one tidy table with its provenance."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import glob
import io
import json
import os
import shutil
import sys
import tempfile
import time

from attnbench import hardware
from attnbench.core import records
from attnbench.core.atomic import atomic_write_bytes, atomic_write_text
from attnbench.measure.compiler_caches import KEEP_ENV
from attnbench.measure.engine import Case, Options, case_record, measure_case
from attnbench.measure.figures import pool_rounds, pool_stream_rounds
from attnbench.measure.process_env import scoped_environ
from attnbench.run import adaptive
from attnbench.run.adaptive import RoundPlan
from attnbench.run.plan import plan, preload
from attnbench.run.worker import Worker

# Imported where used: pandas (the torch_xla venv has no report libraries); tqdm (not in every venv).


def measure_cases(cases: list[Case], *, isolate: bool = True, timeout_s: float = 300.0,
                  memory_cap_bytes: int | None = None, threads: int | None = None, progress: bool = True,
                  on_record=None, rounds: RoundPlan | None = None, deadline: float | None = None,
                  prior: dict[int, dict] | None = None, spent: dict[str, float] | None = None) -> list[dict]:
    """The record of each case (a ``Case`` the plan admitted), in order; one failing case never
    stops the sweep.

    Each case runs in a killable worker (``isolate``); a case with ``own_process`` gets a fresh one,
    so no earlier case's compiles or caches are in it. ``on_record(i, record)``: as ``cases[i]``
    ends, again as its later rounds are pooled (after every look at them), and once they end; with
    rounds to come a record is filed ``rounds_complete`` false until they end.

    ``rounds``: the later timing rounds of every ``timed_in_rounds`` case, paired and adaptive
    (``run/adaptive.py``), pooled into its record (``figures.pool_rounds``). ``prior``: records an
    earlier, interrupted sweep made (``{index: record}``): those cases are not measured again, and
    rounds it had not finished go on from the ones it kept.

    ``deadline`` (``time.time()`` seconds): no case starts or runs past it; those left are recorded
    ``unsupported`` (asv: n/a), so a run out of time stops cleanly. ``spent``: filled with where the
    sweep's seconds went (``time_spent``).
    """
    prior = prior or {}
    first: list[dict | None] = [prior.get(i) for i in range(len(cases))]
    spent = {} if spent is None else spent
    began = time.time()
    with run_probe_dir(), tempfile.TemporaryDirectory(prefix="attnbench-compiled-") as compiled, \
            scoped_environ(**{KEEP_ENV: compiled}):
        todo = [i for i, record in enumerate(first) if record is None]
        with_rounds = rounds is not None and rounds.max_rounds > 0
        spent["first pass worker starts"] = _first_pass(cases, first, todo, isolate, timeout_s,
                                                        memory_cap_bytes, threads, progress, on_record,
                                                        deadline, pending=with_rounds)
        spent["first pass"] = time.time() - began
        for i in todo:
            for phase, seconds in json.loads(first[i].get("phase_seconds") or "{}").items():
                spent[f"first pass: {phase}"] = spent.get(f"first pass: {phase}", 0.0) + seconds
        if with_rounds:
            _later_rounds(cases, first, rounds, isolate, threads, on_record, deadline, spent, compiled)
            for i, record in enumerate(first):  # the cases the rounds did not time: done as they were
                if record is not None and record.get("rounds_complete") is False:
                    first[i] = {k: v for k, v in record.items() if k != "rounds_complete"}
                    if on_record:
                        on_record(i, first[i])
    return first


def time_spent(spent: dict[str, float]) -> str:
    """Where a sweep's seconds went, on one line (stderr, results/LOG.md)."""
    return ", ".join(f"{name} {seconds:.0f} s" if name != "rounds" else f"{seconds:.0f} rounds"
                     for name, seconds in spent.items())


def _first_pass(cases, first, todo, isolate, timeout_s, memory_cap_bytes, threads, progress, on_record,
                deadline, pending: bool = False) -> float:
    """Every case of ``todo`` once: its whole record (regime stream, first window, memory, evidence,
    numerics); returns the seconds its workers took to start. ``pending``: later rounds follow, so
    each ok record is filed ``rounds_complete`` false until they end (a sweep stopped before its
    rounds gives the case its rounds when resumed)."""
    bar = _progress(len(todo), progress)
    worker = Worker(measure_case, threads=threads, memory_cap_bytes=memory_cap_bytes) if isolate else None
    statics = {(c.impl, c.workload, c.config): j for j, c in enumerate(cases) if c.regime == "static"}
    try:
        for i in todo:
            case = with_ceiling(cases[i], first, statics)
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
            if pending and record.get("status") == records.OK:
                record = {**record, "rounds_complete": False}
            first[i] = record
            if on_record:
                on_record(i, record)
            if bar:
                bar.update(1)
    finally:
        if worker:
            worker.close()
        if bar:
            bar.close()
    return getattr(worker, "start_seconds", 0.0) if worker else 0.0


CEILING = 1.25  # a stream of another regime stops past this much of its kernel's static stream


def with_ceiling(case: Case, first: list, statics: dict) -> Case:
    """``case`` with its stream's ceiling (``Options.stream_ceiling_s``): a stream of another regime
    stops once its steps after the first have cost ``CEILING`` times what the same kernel's whole
    static stream's steps after its first did (measured before it: the suite measures static cases
    first). From there it cannot be the kernel's cheapest way through the same requests: its costs
    only add up. The first calls are left out of both, as a case of another regime runs in a fresh
    process and a static case may not; the quarter is room for the noise of two streams measured
    once. A static case, or one whose static stream is not at hand, as it is."""
    j = statics.get((case.impl, case.workload, case.config))
    static = first[j] if j is not None else None
    if case.regime == "static" or not static or static.get("status") != records.OK:
        return case
    per_step, steps, first_call = (static.get(k) for k in ("seconds_per_step_with_compiles", "regime_steps",
                                                            "first_call_s"))
    if not per_step or not steps or first_call is None or static.get("stream_steps_planned") != steps:
        return case
    after_first = float(per_step) * int(steps) - float(first_call)
    return dataclasses.replace(case, options=dataclasses.replace(
        case.options, stream_ceiling_s=CEILING * max(after_first, 0.0)))


def _later_rounds(cases, first, plan: RoundPlan, isolate, threads, on_record, deadline, spent,
                  compiled: str | None = None) -> None:
    """The timed cases' later rounds (``adaptive.run_rounds``), each case's record pooled over them."""
    priced = adaptive.priced_ways(cases, first)
    timed = [i for i, (case, record) in enumerate(zip(cases, first, strict=True))
             if (timed_in_rounds(case, record) or i in priced) and record.get("rounds_complete") is not True]
    if not timed:
        return
    values = {i: adaptive.round_values(first[i]) for i in timed}
    done = min(sum(1 for v in values[i] if v.round > 0) for i in timed)
    next_round = 1 + max((v.round for i in timed for v in values[i]), default=0)

    def keep(stopped: dict[int, str], complete: bool = False) -> None:
        # a case stopped at a look is done: a resumed sweep leaves it out (its pairs were settled)
        for i in timed:
            pool = pool_rounds if cases[i].regime == "static" else pool_stream_rounds
            first[i] = pool(first[i], values[i], stopped=stopped.get(i), complete=complete or i in stopped)
            if on_record:
                on_record(i, first[i])

    frameworks = tuple(sorted({f for i in timed for f in preload(cases[i].impl)}))
    with round_compile_caches(compiled):
        groups = adaptive.groups_of(cases, first, timed, frozenset(priced), probes=isolate)
        stopped = adaptive.run_rounds(groups, values, plan, threads=threads,
                                      preload=frameworks, deadline=deadline, first_round=next_round,
                                      done_rounds=done, on_look=keep, in_process=not isolate, spent=spent,
                                      records_of={i: first[i] for i in timed})
    keep(stopped, complete=True)


def timed_in_rounds(case: Case, record: dict | None) -> bool:
    """Whether a static case gets later timing rounds: ok, and not interpreted (an interpreter's
    speed decides nothing, and rounds would pay its slow trace again). A case of another regime
    gets them only as a priced way (``adaptive.priced_ways``), through its stream's sample of steps:
    a round of every stream cost ten of the static steps' here (results/LOG.md)."""
    return (record is not None and case.regime == "static" and record.get("status") == records.OK
            and bool(record.get("timing_samples_s")) and record.get("execution") != "interpret")


@contextlib.contextmanager
def run_probe_dir():
    """One CPU GEMM probe per run, shared by its workers (``hardware.PROBE_DIR_ENV``): the run's own
    folder for as long as the block lasts, unless an enclosing run set one."""
    with contextlib.ExitStack() as stack:
        if not os.environ.get(hardware.PROBE_DIR_ENV):
            probes = stack.enter_context(tempfile.TemporaryDirectory(prefix="attnbench-probes-"))
            stack.enter_context(scoped_environ(**{hardware.PROBE_DIR_ENV: probes}))
        yield os.environ[hardware.PROBE_DIR_ENV]


@contextlib.contextmanager
def round_compile_caches(compiled: str | None = None):
    """The compiler caches of one sweep's later rounds: a jax persistent compilation cache and an
    Inductor cache directory that live for the rounds (handed to the round workers through the
    environment), so a replaced worker loads its steps' compiled code instead of compiling it again;
    the Inductor one starts with what the first pass's cold cases compiled (``compiled``: their kept
    folders). Rounds time only the steady step, so this changes no figure; the first pass stays cold."""
    with tempfile.TemporaryDirectory(prefix="attnbench-round-caches-") as folder, \
            scoped_environ(JAX_COMPILATION_CACHE_DIR=os.path.join(folder, "jax"),
                           JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                           TORCHINDUCTOR_CACHE_DIR=os.path.join(folder, "inductor")):
        inductor = os.path.join(folder, "inductor")
        os.makedirs(inductor)
        for case in sorted(glob.glob(os.path.join(compiled, "*"))) if compiled else ():
            shutil.copytree(case, inductor, dirs_exist_ok=True)
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


__all__ = ["Case", "Options", "RoundPlan", "max_feasible_lengths", "measure_cases", "write_table"]
