"""The report's sections that read only folders of their own (the compile-for records, the release
matrix), made in a process of their own while the report analyses the history: their pictures are a
sixth of the report's time, and a machine with two cores draws them beside the analysis.

``start`` returns an ``Aside`` at once; its ``result`` is the two sections' contexts, as
``compiled.compiled_part`` and ``releases.releases_part`` return them (the PNGs written into the
report's folder by the process that drew them). The process is this module's ``main`` run again
(``WORKER``, with the results and report folders): nothing of the report's state is shared, and the
sections cross back pickled on its standard output, as values. It is started only where it pays: two
usable cores and something for it to draw; else, and where it dies, the sections are made here, in
the report's own process, as before.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass, field

from attnbench.report.compiled import compiled_part, record_files
from attnbench.report.releases import TABLE as RELEASES_TABLE
from attnbench.report.releases import releases_part

OK, FAILED = "ok", "failed"
# The aside process' program: ``main`` of this module (not ``-m``: the package imports this module first)
WORKER = "import sys; from attnbench.report.aside import main; sys.exit(main(sys.argv[1:]))"


class AsideError(RuntimeError):
    """A section made in the aside process raised: its type, message and traceback there."""


def made(results_dir: str, out_dir: str) -> dict:
    """``{"compiled_for": ..., "releases": ...}``: the two sections, each None where its folder holds
    nothing."""
    return {"compiled_for": compiled_part(results_dir, out_dir),
            "releases": releases_part(results_dir, out_dir)}


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worth_a_process(results_dir: str) -> bool:
    """Two usable cores, and a section to draw (a process costs a second of imports)."""
    has_work = bool(record_files(results_dir)) or os.path.exists(os.path.join(results_dir, RELEASES_TABLE))
    return has_work and _usable_cores() >= 2


def _receive(process: subprocess.Popen, into: list) -> None:
    """The aside process' answer, read as soon as it is written: the process can then end, and give
    its memory back, long before the report asks for the sections."""
    data = process.stdout.read()
    process.stdout.close()
    process.wait()
    try:
        into.append(pickle.loads(data) if process.returncode == 0 else None)
    except (pickle.UnpicklingError, EOFError, ValueError, AttributeError, ImportError):
        into.append(None)  # it died part way through its answer


@dataclass
class Aside:
    """The two sections, being made elsewhere (``process``) or to be made here (``process`` None)."""

    results_dir: str
    out_dir: str
    process: subprocess.Popen | None = None
    receiver: threading.Thread | None = field(default=None, repr=False)
    answer: list = field(default_factory=list, repr=False)

    def result(self) -> dict:
        """The sections (``made``); raises ``AsideError`` with the aside process' traceback where one
        of them raised there. A process that died without an answer is warned of, and the sections
        are made here."""
        if self.process is None:
            return made(self.results_dir, self.out_dir)
        self.receiver.join()
        answer = self.answer[0] if self.answer else None
        if answer is None:
            warnings.warn(f"the report's aside process died (exit code {self.process.returncode}): the "
                          "compiled-for and releases sections are made in the report's process", stacklevel=2)
            return made(self.results_dir, self.out_dir)
        if answer[0] == FAILED:
            raise AsideError(f"{answer[1]} (in the report's aside process)\n{answer[2]}")
        return answer[1]


def start(results_dir: str, out_dir: str) -> Aside:
    """The sections started in a process of their own where that pays (``worth_a_process``)."""
    if not worth_a_process(results_dir):
        return Aside(results_dir, out_dir)
    os.makedirs(out_dir, exist_ok=True)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # attnbench's parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, "-c", WORKER, results_dir, out_dir], stdout=subprocess.PIPE,
                               env=env)
    answer: list = []
    receiver = threading.Thread(target=_receive, args=(process, answer), daemon=True,
                                name="attnbench-report-aside")
    receiver.start()
    return Aside(results_dir, out_dir, process, receiver, answer)


def main(argv: list[str]) -> int:
    """The aside process: the sections, or what went wrong, pickled onto standard output once."""
    results_dir, out_dir = argv
    answers, sys.stdout = sys.stdout.buffer, sys.stderr  # standard output carries the answer alone
    try:
        answer = (OK, made(results_dir, out_dir))
    except Exception as exc:  # noqa: BLE001 (sent back and raised in the report's process)
        answer = (FAILED, f"{type(exc).__name__}: {exc}", traceback.format_exc())
    answers.write(pickle.dumps(answer))
    answers.flush()
    return 0
