"""Misbehaving implementations, used only by tests of the engine's statuses. Never registered.

The engine reaches them as ``"tests.stub_impls:ClassName"``, also inside a spawned worker.
"""

from __future__ import annotations

import time

import numpy as np

from attention_impls.reference import Float64Reference
from attnbench.workload import Workload


class _Stub(Float64Reference):
    framework = "numpy"
    summary = "test stub"

    def execution(self, platform: str) -> str:
        return "eager"


class NanKernel(_Stub):
    """Fast and wrong: returns NaN. Must end as numerics-failed, never ok."""

    name = "stub-nan"

    def run_numpy(self, q, k, v, *, causal, scale=None):
        return np.full(super().run_numpy(q, k, v, causal=causal).shape, np.nan)


class SlowKernel(_Stub):
    """Hangs: must end as timeout when run in a worker with a timeout."""

    name = "stub-slow"

    def make_step(self, workload: Workload, seed: int = 0):
        time.sleep(3600)


class HogKernel(_Stub):
    """Allocates far more than any memory cap a test sets: must end as oom."""

    name = "stub-hog"

    def make_step(self, workload: Workload, seed: int = 0):
        hog = np.ones(64 * 2**30 // 8)  # 64 GiB
        return hog


class BrokenKernel(_Stub):
    """Raises an ordinary bug: must end as error, with the message kept."""

    name = "stub-broken"

    def make_step(self, workload: Workload, seed: int = 0):
        raise ZeroDivisionError("stub kernel divided by zero")


class CrashingKernel(_Stub):
    """Kills its own process, as a segfaulting kernel does: must end as error, the sweep going on."""

    name = "stub-crash"

    def make_step(self, workload: Workload, seed: int = 0):
        import os

        os._exit(3)
