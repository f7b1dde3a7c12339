"""A sweep that says where it is: one line at least every ``EVERY_S`` seconds, from its first case to
its last round, with the cases done of those planned, the phase, the time spent and an ETA.

asv runs a class's ``setup_cache`` (where the suite measures) with its output captured, so a run
said nothing for a quarter of an hour. Each line goes to stderr (asv shows it with ``-e``) and is
appended to the file ``ATTNBENCH_PROGRESS_FILE`` names, which ``asv.selection.run`` follows on the
terminal while asv runs (``follow``).

The ETA: the first pass's cases left at its mean seconds a case so far, plus the later rounds' time
budget (the most they may take; they stop sooner when every pair is decided); during the rounds,
what is left of that budget.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

EVERY_S = 30.0
FILE_ENV = "ATTNBENCH_PROGRESS_FILE"
PREFIX = "attnbench progress"


def _minutes(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


@dataclass
class Progress:
    """Where a sweep is: ``planned`` cases in its first pass (``done``: those a resumed sweep already
    had), then its later rounds within ``rounds_budget_s`` (None: no budget, no ETA for them)."""

    label: str
    planned: int
    rounds_budget_s: float | None = None
    clock: object = time.monotonic
    done: set = field(default_factory=set)
    cases: list | None = None  # the sweep's cases: with them, a provisional verdict after the first pass
    records: dict = field(default_factory=dict)
    write: object = None  # where the provisional verdict goes (default: ``emit``)
    phase: str = "first pass"
    started: float = 0.0
    rounds_started: float | None = None
    looks: int = 0

    def __post_init__(self):
        self.started = self.clock()
        if len(self.done) >= self.planned:  # a resumed sweep whose first pass was done
            self.phase, self.rounds_started = "later rounds", self.started

    def recorded(self, index: int, record: dict | None = None) -> None:
        """A case's record came in: the first time in the first pass, again at each look of the
        later rounds (``sweep.measure_cases``' ``on_record``). The first pass's last one prints the
        provisional verdict (``provisional``)."""
        if record is not None:
            self.records[index] = record
        if self.phase == "first pass":
            self.done.add(index)
            if len(self.done) >= self.planned:
                self.phase, self.rounds_started = "later rounds", self.clock()
                if self.cases is not None and len(self.records) == len(self.cases):
                    write = self.write or emit
                    for line in provisional(self.cases, [self.records[i] for i in range(len(self.cases))]):
                        write(line)
        else:
            self.looks += 1

    def line(self) -> str:
        """``attnbench progress Forward: 12/40 cases, first pass, 3 min spent, ETA 11 min``."""
        now = self.clock()
        spent = now - self.started
        head = f"{PREFIX} {self.label}: {len(self.done)}/{self.planned} cases, {self.phase}"
        budget = self.rounds_budget_s or 0.0
        if self.phase in ("done", "stopped"):
            return f"{head}, {_minutes(spent)} spent"
        if self.phase == "first pass":
            per_case = spent / len(self.done) if self.done else None
            eta = None if per_case is None else per_case * (self.planned - len(self.done)) + budget
        else:
            eta = max(0.0, budget - (now - self.rounds_started)) if self.rounds_budget_s else None
        tail = f"ETA up to {_minutes(eta)}" if eta is not None else "ETA not known yet"
        return f"{head}, {_minutes(spent)} spent, {tail}"


def provisional(cases: list, first: list[dict]) -> list[str]:
    """The verdict as the first pass has it, one line per comparison: the forced and native kernel
    whose first-pass stream cost least per useful token (``adaptive.priced_ways``, the ways the
    verdict prices) and their ratio over that cold-start stream: one run, not paired; the later
    rounds and the report decide."""
    from attnbench.run.adaptive import FORCED_LABEL, NATIVE_LABEL, group_key, priced_ways, stream_cost

    groups: dict[tuple, dict[str, int]] = {}
    for i, label in priced_ways(cases, first).items():
        groups.setdefault(group_key(cases[i], first[i]), {})[label] = i
    lines = []
    for (framework, workload), sides in groups.items():
        if FORCED_LABEL not in sides or NATIVE_LABEL not in sides:
            continue
        f, n = sides[FORCED_LABEL], sides[NATIVE_LABEL]
        ratio = stream_cost(first[f]) / stream_cost(first[n])
        lines.append(f"{PREFIX} provisional verdict, {framework} {workload.describe()}: forced "
                     f"{cases[f].impl} ({cases[f].regime}) costs {ratio:.2f}x native {cases[n].impl} "
                     f"({cases[n].regime}) per useful token over the cold-start stream (first pass: one "
                     "run, not paired; the later rounds and the report decide)")
    return lines


def emit(line: str) -> None:
    """``line`` to stderr and, where ``ATTNBENCH_PROGRESS_FILE`` is set, appended to that file."""
    print(line, file=sys.stderr, flush=True)
    path = os.environ.get(FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def _stop(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def stopping_on_sigterm():
    """SIGTERM read as Ctrl-C while the block runs (main thread only): asv runs a benchmark in its
    own process group, which the terminal's Ctrl-C does not reach; asv stops it with SIGTERM, and
    then kills it a second later."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _in_background(run, name: str):
    """``run(stop)`` in a daemon thread while the block runs; then ``stop`` is set and the thread
    joined."""
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def heartbeat(progress: Progress, every_s: float = EVERY_S, write=emit):
    """``progress.line()`` written at the start, every ``every_s`` seconds and at the end; on Ctrl-C
    also the provisional verdict of what was measured and how to go on."""

    def beat(stop: threading.Event) -> None:
        while not stop.wait(every_s):
            write(progress.line())

    write(progress.line())
    try:
        with _in_background(beat, "attnbench-progress"):
            yield progress
    except KeyboardInterrupt:  # Ctrl-C: the verdict so far, and how to go on
        progress.phase = "stopped"
        if progress.cases is not None:
            kept = sorted(progress.records)
            for line in provisional([progress.cases[i] for i in kept], [progress.records[i] for i in kept]):
                write(line)
        write(f"{PREFIX} {progress.label}: stopped; every case measured so far is kept in the run's case "
              "cache (make bench: .asv/cases/), and the same command again goes on from it")
        raise
    finally:
        if progress.phase != "stopped":
            progress.phase = "done" if len(progress.done) >= progress.planned else "stopped"
        write(progress.line())


@contextlib.contextmanager
def ticking(label: str, budget_s: float | None = None, every_s: float = EVERY_S, write=emit,
            clock=time.monotonic):
    """A step with no cases to count (``make bench``'s confirm, its report) says it is alive: ``label``
    and the time spent every ``every_s`` seconds, with what is left of ``budget_s`` where it has one."""
    began = clock()

    def beat(stop: threading.Event) -> None:
        while not stop.wait(every_s):
            spent = clock() - began
            left = f", ETA up to {_minutes(budget_s - spent)}" if budget_s and budget_s > spent else ""
            write(f"{PREFIX} {label}: {_minutes(spent)} spent{left}")

    with _in_background(beat, "attnbench-ticking"):
        yield


@contextlib.contextmanager
def follow(path: str, write=None, poll_s: float = 1.0):
    """While the block runs, every line appended to ``path`` written out (default: stderr), so the
    lines a captured process appends reach the terminal as they come."""
    write = write or (lambda line: print(line, file=sys.stderr, flush=True))
    started = []

    def read_new(handle) -> None:
        for line in handle.readlines():
            if not started:  # asv leaves its own line open ("Setting up attention:78"): end it first
                started.append(True)
                write("")
            write(line.rstrip("\n"))

    def run(stop: threading.Event) -> None:
        while not os.path.exists(path) and not stop.wait(poll_s):
            pass
        if not os.path.exists(path):
            return
        with open(path, encoding="utf-8") as handle:
            while not stop.wait(poll_s):
                read_new(handle)
            read_new(handle)

    with _in_background(run, "attnbench-follow"):
        yield
