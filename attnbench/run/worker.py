"""Run cases in a worker process that can be killed: timeouts, memory caps, crashes.

A timed-out XLA compile or a segfaulting kernel cannot be stopped from inside the process, so a
sweep sends each case to a long-lived worker (spawned fresh: no framework state is inherited) and
waits at most ``timeout_s``. A worker that times out or dies is replaced; the sweep goes on.
"""

from __future__ import annotations

import multiprocessing
import resource
import signal

from attnbench.core import records
from attnbench.measure.engine import measure_case, new_record
from attnbench.measure.process_env import pin_threads


def _worker_main(conn, threads: int | None, memory_cap_bytes: int | None, task=measure_case) -> None:
    if threads:
        pin_threads(threads)
    if memory_cap_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_cap_bytes, memory_cap_bytes))
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return
        conn.send(task(*args))


class Worker:
    """One killable process that answers ``task(*args)`` (default: ``engine.measure_case``, one
    record per case); restarted after a timeout or a crash. ``task`` is a module-level function."""

    def __init__(self, threads: int | None = None, memory_cap_bytes: int | None = None, task=measure_case):
        self.threads, self.memory_cap_bytes, self.task = threads, memory_cap_bytes, task
        self._process = self._conn = None

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=_worker_main,
                                    args=(child, self.threads, self.memory_cap_bytes, self.task), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent

    def call(self, args: tuple, timeout_s: float):
        """``(answer, None)``, or ``(None, (status, reason))`` when the worker timed out or died (it is
        closed then, and the next call starts a fresh one)."""
        if self._process is None or not self._process.is_alive():
            self._start()
        try:
            self._conn.send(args)
            if self._conn.poll(timeout_s):
                return self._conn.recv(), None
            failure = (records.TIMEOUT, f"no result within {timeout_s:g} s; worker killed")
        except (EOFError, ConnectionError):  # the worker died: closed pipe, or reset mid-message
            self._process.join(5)
            code = self._process.exitcode
            if code == -signal.SIGKILL:
                failure = (records.OOM, "worker killed by SIGKILL (the kernel's OOM killer, most likely)")
            else:
                failure = (records.ERROR, f"worker died (exit code {code})")
        self.close()
        return None, failure

    def measure(self, impl, workload, options, timeout_s: float) -> dict:
        record, failure = self.call((impl, workload, options), timeout_s)
        if failure is None:
            return record
        return new_record(workload, options, impl=impl if isinstance(impl, str) else impl.name,
                          threads=self.threads, status=failure[0], reason=failure[1])

    def close(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(5)
        self._process = self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
