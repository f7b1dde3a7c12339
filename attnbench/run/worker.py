"""Killable workers: one spawned process that answers ``task(*args)``, restarted when it fails.

A hung XLA compile or a segfaulting kernel cannot be stopped from inside the process, so such tasks
run in a spawned worker (no framework state inherited). A worker that times out or dies is killed,
the call answers a ``Failure`` and the next call starts a new process.

A call's timeout starts once a fresh worker says it is ready (set up, and its ``preload`` modules
imported): on a loaded host, importing torch or jax can take longer than a tight case timeout.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import resource
import signal
import sys
import time
from typing import NamedTuple

from attnbench.core import statuses
from attnbench.measure.process_env import pin_threads, scoped_environ


class Failure(NamedTuple):
    """Why a call gave no answer: ``status`` is ``timeout``, ``oom`` or ``error`` (core.statuses)."""

    status: str
    reason: str


def enter_checkout(path: str) -> None:
    """Make this process import ``attnbench`` and the kernels from another checkout (``compare``'s
    revisions): spawn hands a child the parent's ``sys.path`` and has imported this checkout's."""
    sys.path.insert(0, path)
    for name in [n for n in sys.modules if n.split(".")[0] in ("attnbench", "attention_impls")]:
        del sys.modules[name]


READY = "ready"


def _serve(conn, task, threads, memory_cap_bytes, log_path, checkout, preload) -> None:
    # Ctrl-C stops the sweep, which closes its workers: a worker stopped by it first would be
    # recorded as a case that died, and a resumed run would not measure that case again
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if log_path:  # the compilers' own logging goes to a file whose tail explains a crash
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    if threads:
        pin_threads(threads)
    if memory_cap_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_cap_bytes, memory_cap_bytes))
    if checkout:
        enter_checkout(checkout)
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the task that needs it reports why it does not import
            pass
    conn.send(READY)
    while True:
        try:
            args = conn.recv()
        except EOFError:
            return
        conn.send(task(*args))


class Worker:
    """One killable process answering ``task(*args)``, a module-level function.

    ``memory_cap_bytes``: an address-space cap; ``log_path``: its stdout and stderr, whose tail a
    crash's reason quotes; ``checkout``: import the project from there (another revision's worktree);
    ``startup_timeout_s``: how long a fresh process may take to get ready (not part of any call's).
    """

    def __init__(self, task, *, threads: int | None = None, memory_cap_bytes: int | None = None,
                 environ: dict | None = None, log_path: str | None = None, checkout: str | None = None,
                 startup_timeout_s: float = 600.0):
        self.task, self.threads, self.memory_cap_bytes = task, threads, memory_cap_bytes
        self.environ, self.log_path, self.checkout = dict(environ or {}), log_path, checkout
        self.startup_timeout_s = startup_timeout_s
        self._process = self._conn = None
        self.starts, self.start_seconds = 0, 0.0  # processes started, and the seconds they took to be ready

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self, preload: tuple[str, ...] = (), deadline: float | None = None) -> Failure | None:
        """A fresh process (the old one, if any, is closed first), ready once it has imported
        ``preload``; a ``Failure`` (and no process) when it dies or is not ready in time: within
        ``startup_timeout_s``, and before ``deadline`` (``time.time()`` seconds) when one is given."""
        self.close()
        began = time.perf_counter()
        try:
            return self._start(preload, deadline)
        finally:
            self.starts += 1
            self.start_seconds += time.perf_counter() - began

    def _start(self, preload: tuple[str, ...], deadline: float | None) -> Failure | None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_serve, daemon=True, args=(
            child, self.task, self.threads, self.memory_cap_bytes, self.log_path, self.checkout,
            tuple(preload)))
        with scoped_environ(**self.environ):  # spawn copies this environment; restored after
            process.start()
        child.close()
        self._process, self._conn = process, parent
        wait, within = _wait(self.startup_timeout_s, deadline)
        try:
            if self._conn.poll(wait) and self._conn.recv() == READY:
                return None
            failure = Failure(statuses.TIMEOUT, f"worker not ready {within} "
                                                f"(importing {', '.join(preload) or 'the task'}); killed")
        except (EOFError, ConnectionError):
            failure = self._died()
        self.close()
        return failure

    def call(self, args: tuple, timeout_s: float, preload: tuple[str, ...] = (),
             deadline: float | None = None):
        """``(answer, None)``, or ``(None, Failure)`` when the worker timed out or died (it is closed
        then, and the next call starts a fresh one). ``preload``: what a fresh worker imports before
        ``timeout_s`` starts counting; ``deadline`` (``time.time()`` seconds): neither the start nor
        the call runs past it."""
        if self._process is None or not self._process.is_alive():
            failure = self.start(preload, deadline)
            if failure is not None:
                return None, failure
        wait, within = _wait(timeout_s, deadline)
        try:
            self._conn.send(args)
            if self._conn.poll(wait):
                return self._conn.recv(), None
            failure = Failure(statuses.TIMEOUT, f"no result {within}; worker killed")
        except (EOFError, ConnectionError):  # the worker died: closed pipe, or reset mid-message
            failure = self._died()
        self.close()
        return None, failure

    def _died(self) -> Failure:
        self._process.join(5)
        failure = _death(self._process.exitcode)
        tail = self.log_tail()
        return failure._replace(reason=f"{failure.reason}; its log ends: {tail}") if tail else failure

    def log_tail(self, lines: int = 3, limit: int = 400) -> str:
        """The last non-empty lines of the worker's log, on one line ('' without a log)."""
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 4096))
                kept = [x.strip() for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return " | ".join(kept[-lines:])[:limit]

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


def _wait(timeout_s: float, deadline: float | None) -> tuple[float, str]:
    """How long to wait (``timeout_s``, or less when ``deadline`` comes first), and how a failure
    says it: "within 8 s", or "within 3.2 s (the time left before the deadline)"."""
    left = None if deadline is None else max(0.0, deadline - time.time())
    if left is None or left >= timeout_s:
        return timeout_s, f"within {timeout_s:g} s"
    return left, f"within {left:.3g} s (the time left before the deadline)"


def _death(code: int | None) -> Failure:
    if code == -signal.SIGKILL:
        return Failure(statuses.OOM, "worker killed by SIGKILL (the kernel's OOM killer, most likely)")
    if code is not None and code < 0:
        return Failure(statuses.ERROR, f"worker died (killed by signal {signal.Signals(-code).name})")
    return Failure(statuses.ERROR, f"worker died (exit code {code})")
