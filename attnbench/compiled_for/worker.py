"""A killable process that compiles cases for targets: a timeout or a crash is a record, not a stop.

A compile can hang or bring the process down (a compiler abort, a segfault in a plugin), and
neither can be stopped from inside. So every compile runs in a spawned worker with
``JAX_PLATFORMS=cpu`` (the CUDA plugin otherwise fails at ``cuInit`` on a host without a GPU, and
libtpu would look for a TPU); the parent waits at most ``timeout_s`` per case, kills the worker on
a timeout and replaces it. The worker's stdout/stderr (libtpu's and XLA's logging) go to a log
file, whose tail explains a crash. The worker is reused between cases: importing jax and loading
libtpu cost a few seconds, a compile often less.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile

from attnbench.compiled_for import classify
from attnbench.compiled_for.records import new_record

# The environment every compiling process gets (set before jax is imported). libtpu takes an
# exclusive lock (/tmp/libtpu_lockfile) when it loads; a process that only compiles needs no TPU, and
# without ALLOW_MULTIPLE_LIBTPU_LOAD a second compiling process (a test beside a sweep) fails with
# "Internal error when accessing libtpu multi-process lockfile".
ENVIRONMENT = {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
               "TPU_STDERR_LOG_LEVEL": "3", "TPU_MIN_LOG_LEVEL": "3", "JAX_ENABLE_COMPILATION_CACHE": "false"}


def compile_environment() -> None:
    """Make this process a compiling one: host CPU only for jax, quiet compilers, no disk cache."""
    os.environ.update(ENVIRONMENT)


def _worker_main(conn, log_path: str) -> None:
    compile_environment()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from attnbench.compiled_for.compile import compile_case
    from attnbench.compiled_for.targets import load_targets

    while True:
        try:
            target, impl, workload, hlo_dir = conn.recv()
        except EOFError:
            return
        try:
            record = compile_case(target, impl, workload, hlo_dir)
        except Exception as exc:  # noqa: BLE001 - a bug reading the result: an error record
            record = new_record(load_targets()[target], impl, workload, status=classify.ERROR,
                                reason=f"{type(exc).__name__}: {classify.first_lines(str(exc))}")
        conn.send(record)


class CompileWorker:
    """One compiling process; ``compile()`` returns a record whatever happens to the process."""

    def __init__(self, main=None):
        # ``main(conn, log_path)``: the worker's loop (tests pass stand-ins that hang or die).
        self._main = main or _worker_main
        self._process = self._conn = None
        handle, self.log_path = tempfile.mkstemp(prefix="attnbench-compile-", suffix=".log")
        os.close(handle)

    def _start(self) -> None:
        from attnbench.measure.process_env import scoped_environ

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=self._main, args=(child, self.log_path), daemon=True)
        with scoped_environ(**ENVIRONMENT):  # spawn copies the parent's environment; restored after
            self._process.start()
        child.close()
        self._conn = parent

    def compile(self, target, impl: str, workload, *, timeout_s: float, hlo_dir: str | None = None) -> dict:
        """The record of compiling ``impl`` at ``workload`` for ``target`` (a ``Target``)."""
        if self._process is None or not self._process.is_alive():
            self._start()
        try:
            self._conn.send((target.name, impl, workload, hlo_dir))
            if self._conn.poll(timeout_s):
                return self._conn.recv()
            status, reason = classify.TIMEOUT, f"no result within {timeout_s:g} s; worker killed"
        except (EOFError, ConnectionError):  # the worker died mid-compile
            self._process.join(5)
            code = self._process.exitcode
            how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exit code {code}")
            tail = self.log_tail()
            reason = f"worker died ({how})" + (f"; its log ends: {tail}" if tail else "")
            status = classify.ERROR
        self.close(keep_log=True)
        return new_record(target, impl, workload, status=status, reason=reason)

    def log_tail(self, limit: int = 400) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 4096))
                lines = [x for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
        except OSError:
            return ""
        return classify.first_lines("\n".join(lines[-3:]), limit)

    def close(self, keep_log: bool = False) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(5)
        self._process = self._conn = None
        if not keep_log and os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
