"""Run cases in a worker process that can be killed: timeouts, memory caps, crashes.

A timed-out XLA compile or a segfaulting kernel cannot be stopped from inside the process, so a
sweep sends each case to a long-lived worker (spawned fresh: no framework state is inherited) and
waits at most ``timeout_s``. A worker that times out or dies is replaced; the sweep goes on.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import signal

from attnbench import records

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@contextlib.contextmanager
def scoped_environ(**values: str):
    """Set environment variables (seen by workers spawned meanwhile); restore them afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pin_threads(threads: int) -> None:
    """Pin CPU thread pools before jax/torch load (timings on 2 cores jump up to 50x otherwise)."""
    os.environ["ATTNBENCH_THREADS"] = str(threads)
    for var in THREAD_ENV:
        os.environ[var] = str(threads)
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        eigen = "true" if threads > 1 else "false"
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_cpu_multi_thread_eigen={eigen} "
                                   f"intra_op_parallelism_threads={threads}").strip()
    import sys

    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(threads)


def _worker_main(conn, threads: int | None, memory_cap_bytes: int | None) -> None:
    if threads:
        pin_threads(threads)
    if memory_cap_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_cap_bytes, memory_cap_bytes))
    from attnbench.engine import measure_case

    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        impl, workload, options = task
        conn.send(measure_case(impl, workload, options))


class Worker:
    """One killable measuring process; restarted after a timeout or a crash."""

    def __init__(self, threads: int | None = None, memory_cap_bytes: int | None = None):
        self.threads, self.memory_cap_bytes = threads, memory_cap_bytes
        self._process = self._conn = None

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=_worker_main, args=(child, self.threads, self.memory_cap_bytes),
                                    daemon=True)
        self._process.start()
        child.close()
        self._conn = parent

    def measure(self, impl, workload, options, timeout_s: float) -> dict:
        from attnbench.engine import new_record

        if self._process is None or not self._process.is_alive():
            self._start()
        failure = None
        try:
            self._conn.send((impl, workload, options))
            if self._conn.poll(timeout_s):
                return self._conn.recv()
            failure = (records.TIMEOUT, f"no result within {timeout_s:g} s; worker killed")
        except (EOFError, ConnectionError):  # the worker died: closed pipe, or reset mid-message
            self._process.join(5)
            code = self._process.exitcode
            if code == -signal.SIGKILL:
                failure = (records.OOM, "worker killed by SIGKILL (the kernel's OOM killer, most likely)")
            else:
                failure = (records.ERROR, f"worker died (exit code {code})")
        self.close()
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
