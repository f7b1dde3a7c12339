"""This process's environment for measuring: pinned thread pools and scoped variables.

Set before a framework loads (worker processes are spawned, so they start from these values).
"""

from __future__ import annotations

import contextlib
import os
import sys

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).

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
    """Pin this process to ``threads`` cores, and the thread pools to as many threads, before
    jax/torch load (oversubscribed pools make timings jump).

    The affinity is what holds every framework: XLA:CPU has no intra-op thread flag that jax
    honours. Cost is charged for these cores (``ATTNBENCH_THREADS``).
    """
    if hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        if threads > len(allowed):
            raise ValueError(f"cannot pin {threads} threads: this process may run on {len(allowed)} cores")
        os.sched_setaffinity(0, allowed[:threads])
    os.environ["ATTNBENCH_THREADS"] = str(threads)
    # jax takes 75% of a GPU's memory at its first op otherwise: a worker that measures torch cases
    # after jax ones would have a quarter of the device, and peaks would read the pool, not the step.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    for var in THREAD_ENV:
        os.environ[var] = str(threads)
    flags = os.environ.get("XLA_FLAGS", "")
    if "intra_op_parallelism_threads" not in flags:
        eigen = "true" if threads > 1 else "false"
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_cpu_multi_thread_eigen={eigen} "
                                   f"intra_op_parallelism_threads={threads}").strip()
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(threads)
