"""Misbehaving implementations, used only by tests of the engine's statuses. Never registered.

The engine reaches them as ``"tests.stub_impls:ClassName"``, also inside a spawned worker. Each
misbehaves in its own ``attention``, as a real kernel would: the harness runs it as any other.
"""

from __future__ import annotations

import inspect
import time

import numpy as np

from attention_impls.reference_float64 import Float64Reference


class _Stub(Float64Reference):
    framework = "numpy"
    summary = "test stub"


class NanKernel(_Stub):
    """Fast and wrong: returns NaN. Must end as numerics-failed, never ok."""

    name = "stub-nan"

    def attention(self, q, k, v, *, causal, scale):
        return np.full(super().attention(q, k, v, causal=causal, scale=scale).shape, np.nan)


class SlowKernel(_Stub):
    """Hangs: must end as timeout when run in a worker with a timeout."""

    name = "stub-slow"

    def attention(self, q, k, v, *, causal, scale):
        time.sleep(3600)


class HogKernel(_Stub):
    """Allocates far more than any memory cap a test sets: must end as oom."""

    name = "stub-hog"

    def attention(self, q, k, v, *, causal, scale):
        hog = np.ones(64 * 2**30 // 8)  # 64 GiB
        return hog


class BrokenKernel(_Stub):
    """Raises an ordinary bug: must end as error, with the message kept."""

    name = "stub-broken"

    def attention(self, q, k, v, *, causal, scale):
        raise ZeroDivisionError("stub kernel divided by zero")


class CrashingKernel(_Stub):
    """Kills its own process, as a segfaulting kernel does: must end as error, the sweep going on."""

    name = "stub-crash"

    def attention(self, q, k, v, *, causal, scale):
        import os

        os._exit(3)


class LinearTimeKernel(_Stub):
    """Takes 20 ms per 256 query tokens, whatever else it does: its real throughput is a constant
    12,800 tokens/s per sequence at every length, which a regime's tokens/s must report."""

    name = "stub-linear-time"
    SECONDS_PER_TOKEN = 0.020 / 256

    def attention(self, q, k, v, *, causal, scale):
        time.sleep(q.shape[1] * self.SECONDS_PER_TOKEN)
        return super().attention(q, k, v, causal=causal, scale=scale)


class WrongOnTheTimedPath(_Stub):
    """Right through the conformance entry point, wrong in the step that is timed (zeros): the
    numerics beside a timing must come from the timed step, so this ends numerics-failed."""

    name = "stub-wrong-timed-path"

    def attention(self, q, k, v, *, causal, scale):
        out = super().attention(q, k, v, causal=causal, scale=scale)
        conformance = any(frame.function == "run_numpy" for frame in inspect.stack(0))
        return out if conformance else np.zeros_like(out)


class TiledStub(_Stub):
    """A kernel with one tile knob: ``block=3`` fails to build (raises), ``block=4`` breaks numerics
    (zeros), ``block=8`` is refused for every workload; the tuner must record each and keep none."""

    name = "stub-tiled"

    from attention_impls.base import SearchSpace

    search_space = SearchSpace(defaults=(("block", 2),),
                               candidates=tuple((("block", b),) for b in (1, 2, 3, 4, 8)))
    del SearchSpace

    def config_reason(self, config, workload):
        return "block=8 is refused here (a test's reason)" if dict(config)["block"] == 8 else None

    def attention(self, q, k, v, *, causal, scale, **mask):
        block = self.knob("block")
        if block == 3:
            raise ValueError("block=3 cannot be built (a test's failure)")
        out = super().attention(q, k, v, causal=causal, scale=scale, **mask)
        return np.zeros_like(out) if block == 4 else out
