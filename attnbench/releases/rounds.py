"""The paired rounds of an upgrade step: release N and release N+1 timed in the same rounds, as the
verdict times forced against native (judged and tabled by ``upgrade.py``).

For one ``upgrade.Step``, two ``EnvWorker`` processes, one per release, build every cell of the
matrix (a kernel x workload, ``matrix.WORKLOADS``) with this checkout's code. A round times each
cell's blocks in both, interleaved in a balanced order (A B B A ..., the side that starts alternating
by round), so what moved the machine in that round moved both releases alike; the round's ratio is
the after side's median block over the before side's. The workers are replaced every
``restart_every`` rounds, so that no ratio rests on one pair of processes.

Rounds are sized as the verdict's (``run.adaptive.RoundPlan``): ``min_rounds``, then a look every
``look_every`` rounds at the look's confidence (``look_confidence``: shared over every look the plan
can make, so that looking often makes no decision easier than the 99% stated); a cell stops once its
paired ratio is decided or equal within the margin, at ``max_rounds``, or when the step's budget is
spent. Every round is kept in the store (saved after every look), so an interrupted run goes on where
it stopped.
"""

from __future__ import annotations

import math
import statistics
import time

from attnbench.releases import matrix, upgrade
from attnbench.releases.env_worker import EnvWorker
from attnbench.releases.upgrade import FASTER, NOT_TIMED, SAME, SLOWER, Step, judge
from attnbench.run.adaptive import RoundPlan

# min 12 rounds, a look every 4, at most 40, workers replaced every 4 rounds: 10 process pairs at most.
PLAN = RoundPlan(min_rounds=12, max_rounds=40, look_every=4, budget_s=300.0, margin=upgrade.MARGIN,
                 min_samples=8, restart_every=4)
BLOCK_S = 0.005  # a block's length: about 5 ms of calls, as the verdict's rounds
BUILD_TIMEOUT_S, BLOCK_TIMEOUT_S = 600.0, 120.0
# Both sides alike, set so that a worker's speed does not depend on which process it is (results/LOG.md):
# - OpenMP threads that finished a block sleep instead of spinning: two workers take turns on two cores,
#   and a spinning idle one steals the other's cycles (torch's A/A step at 85f0711: 1 of 8 cells equal).
# - glibc's malloc thresholds fixed (mallopt(3); setting them turns off its dynamic mmap threshold,
#   which rises with the process's own history of frees): otherwise one process serves a tensor from
#   reused heap pages and another from a fresh mmap, faulting its pages in on every call, and the same
#   release is 1.5-1.7x apart from process to process (torch's SDPA math, its A/A at 874fc36). 32 MiB
#   is the largest mmap threshold mallopt(3) documents on 64-bit; the trim threshold keeps freed heap.
WORKER_ENVIRON = {"OMP_WAIT_POLICY": "PASSIVE", "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                  "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def settled(rounds: list[list[float]], plan: RoundPlan) -> bool:
    """Whether a look settles the cell: its ratio decided or equal at the look's confidence."""
    state = judge([r[1] for r in rounds], [r[2] for r in rounds], plan.margin, plan.look_confidence)["state"]
    return state in (SLOWER, FASTER, SAME)


def run_step(step: Step, cells: list[tuple[str, str]], plan: RoundPlan, store: dict, save,
             progress=print) -> None:
    """Time ``step``'s cells in rounds, into ``store[step.name]`` (what an earlier, interrupted run
    filed there goes on: its rounds are kept, its stopped cells stay stopped); ``save()`` after every
    look. A cell that does not build on a side is filed ``not timed`` with that side's reason."""
    mine = store.setdefault(step.name, {"framework": step.framework, "before": step.before.release,
                                        "after": step.after.release, "kind": step.kind, "cells": {}})
    filed = mine["cells"]
    open_cells = [c for c in cells if not filed.get(matrix.cell_key(*c), {}).get("stopped")]
    if not open_cells:
        return
    workers = tuple(EnvWorker(side.python, pythonpath=side.pythonpath, environ=WORKER_ENVIRON)
                    for side in (step.before, step.after))
    started, rounds_here = time.time(), 0
    try:
        active = _build(workers, open_cells, filed, step)
        save()
        # the last round any cell filed (a round a cell lost leaves it fewer rounds, never a round id twice)
        done = max((filed[matrix.cell_key(*c)]["rounds"][-1][0] for c in active
                    if filed[matrix.cell_key(*c)]["rounds"]), default=0)
        for r in range(done + 1, plan.max_rounds + 1):
            if not active:
                break
            if plan.budget_s is not None and time.time() - started >= plan.budget_s:
                for c in active:
                    filed[matrix.cell_key(*c)]["stopped"] = "budget spent"
                active = []
                break
            if rounds_here and rounds_here % plan.restart_every == 0:
                for w in workers:
                    w.close()
                active = _build(workers, active, filed, step)
            rounds_here += 1
            for cell in active if r % 2 else active[::-1]:
                _time_cell(workers, cell, filed[matrix.cell_key(*cell)], r, plan)
            if r >= plan.min_rounds and (r - plan.min_rounds) % plan.look_every == 0:
                for cell in active:
                    entry = filed[matrix.cell_key(*cell)]
                    if entry.get("failed"):
                        entry["stopped"] = f"failed: {entry['failed']}"
                    elif settled(entry["rounds"], plan):
                        entry["stopped"] = "settled"
                active = [c for c in active if not filed[matrix.cell_key(*c)].get("stopped")]
                save()
        for c in active:
            filed[matrix.cell_key(*c)]["stopped"] = "max rounds"
    finally:
        for w in workers:
            w.close()
        save()
    progress(f"{step.name}: {sum(1 for e in filed.values() if e.get('rounds'))} cells timed, "
             f"{rounds_here} rounds in {time.time() - started:.0f} s")


def _build(workers, cells, filed: dict, step: Step) -> list[tuple[str, str]]:
    """Each cell's step built on both sides (a fresh pair of processes); the cells both built, with
    their block size; a cell either side refuses or breaks is filed ``not timed``, with why."""
    out = []
    for impl, workload in cells:
        entry = filed.setdefault(matrix.cell_key(impl, workload),
                                 {"impl": impl, "workload": workload, "rounds": []})
        answers = []
        for side, worker in zip((step.before, step.after), workers, strict=True):
            request = {"op": "build", "impl": impl, "workload": workload}
            answer, failure = worker.call(request, BUILD_TIMEOUT_S)
            if failure is not None:
                answer = {"status": failure.status, "reason": failure.reason}
            answers.append(answer)
            if answer.get("status") != matrix.OK:
                entry.update(stopped=NOT_TIMED, status=answer.get("status"),
                             reason=f"{step.framework} {side.release}: {answer.get('status')}: "
                                    f"{answer.get('reason')}")
                break
        else:
            entry.update(execution=answers[1].get("execution"), versions_before=answers[0].get("versions"),
                         versions_after=answers[1].get("versions"))
            if "number" not in entry:
                entry["number"] = _number(workers[0], impl, workload)
            out.append((impl, workload))
    return out


def _number(worker: EnvWorker, impl: str, workload: str) -> int:
    """Calls per block: as many as last ``BLOCK_S`` on the release before (the same on both sides)."""
    answer, failure = worker.call({"op": "block", "impl": impl, "workload": workload, "number": 1},
                                  BLOCK_TIMEOUT_S)
    seconds = (answer or {}).get("seconds") if failure is None else None
    return max(1, int(BLOCK_S / seconds)) if seconds else 1


def _time_cell(workers, cell: tuple[str, str], entry: dict, round_id: int, plan: RoundPlan) -> None:
    """One round of a cell: ``plan.min_samples`` blocks per side in the order A B B A (B A A B in
    even rounds); the round's medians filed as ``[round, before s, after s]``."""
    impl, workload = cell
    first = 0 if round_id % 2 else 1
    order = [first, 1 - first, 1 - first, first] * math.ceil(plan.min_samples / 2)
    blocks: tuple[list[float], list[float]] = ([], [])
    for side in order[:2 * plan.min_samples]:
        request = {"op": "block", "impl": impl, "workload": workload, "number": entry["number"]}
        answer, failure = workers[side].call(request, BLOCK_TIMEOUT_S)
        seconds = None if failure is not None else answer.get("seconds")
        if seconds is None:  # the round of this cell is lost; twice, the cell stops at the next look
            entry["failures"] = entry.get("failures", 0) + 1
            if entry["failures"] >= 2:
                entry["failed"] = (failure.reason if failure else answer.get("reason")) or "no time"
            return
        blocks[side].append(seconds)
    entry["rounds"].append([round_id, statistics.median(blocks[0]), statistics.median(blocks[1])])
