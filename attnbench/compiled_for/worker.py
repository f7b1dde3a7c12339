"""A killable process that compiles cases for targets: a timeout or a crash is a record, not a stop.

A compile can hang or abort the process, which cannot be stopped from inside, so each runs in a
spawned worker (``attnbench.run.worker``) with ``JAX_PLATFORMS=cpu`` (the CUDA plugin otherwise
fails at ``cuInit`` without a GPU). Its output goes to a log whose tail explains a crash. The
worker is reused: importing jax and loading libtpu cost more than most compiles.
"""

from __future__ import annotations

import os
import tempfile

from attnbench.compiled_for import classify
from attnbench.compiled_for.compile import compile_case
from attnbench.compiled_for.records import new_record
from attnbench.compiled_for.targets import load_targets
from attnbench.core import statuses
from attnbench.run.worker import Worker

# Set before jax is imported. Without ALLOW_MULTIPLE_LIBTPU_LOAD a second compiling process fails on
# libtpu's exclusive /tmp/libtpu_lockfile ("Internal error when accessing libtpu multi-process lockfile").
ENVIRONMENT = {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
               "TPU_STDERR_LOG_LEVEL": "3", "TPU_MIN_LOG_LEVEL": "3", "JAX_ENABLE_COMPILATION_CACHE": "false"}


def compile_environment() -> None:
    """Make this process a compiling one: host CPU only for jax, quiet compilers, no disk cache."""
    os.environ.update(ENVIRONMENT)


def compile_task(target: str, impl: str, workload, hlo_dir: str | None) -> dict:
    """One compile in the worker: its record, an ``error`` record when reading the result fails."""
    try:
        return compile_case(target, impl, workload, hlo_dir)
    except Exception as exc:  # noqa: BLE001 - a bug reading the result: an error record
        return new_record(load_targets()[target], impl, workload, status=classify.ERROR,
                          reason=f"{type(exc).__name__}: {classify.first_lines(str(exc))}")


class CompileWorker:
    """One compiling process; ``compile()`` returns a record whatever happens to the process."""

    def __init__(self, task=compile_task):
        # ``task(target, impl, workload, hlo_dir)``: tests pass stand-ins that hang or die.
        handle, self.log_path = tempfile.mkstemp(prefix="attnbench-compile-", suffix=".log")
        os.close(handle)
        self._worker = Worker(task, environ=ENVIRONMENT, log_path=self.log_path)

    def compile(self, target, impl: str, workload, *, timeout_s: float, hlo_dir: str | None = None) -> dict:
        """The record of compiling ``impl`` at ``workload`` for ``target`` (a ``Target``)."""
        record, failure = self._worker.call((target.name, impl, workload, hlo_dir), timeout_s)
        if failure is None:
            return record
        status = classify.TIMEOUT if failure.status == statuses.TIMEOUT else classify.ERROR
        return new_record(target, impl, workload, status=status, reason=failure.reason)

    def close(self) -> None:
        self._worker.close()
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
