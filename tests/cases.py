"""The tests' short ways to measure: a case by its three parts, and a sweep of
``(impl, workload, regime)`` tuples with one ``Options`` for every regime."""

import dataclasses

from attnbench.measure.engine import Case, Options
from attnbench.run import plan, sweep


def measure(impl, workload, options: Options | None = None) -> dict:
    """One case in this process, its kernel asked first (``run.plan.measure_here``)."""
    return plan.measure_here(Case(impl, workload, options or Options()))


def measure_sweep(cases, options: Options, *, fresh_process: bool = True, **kwargs) -> list[dict]:
    """``sweep.measure_cases`` of ``cases``, planned here: the refused ones' records in place."""
    every = [Case(impl, workload, dataclasses.replace(options, regime=regime),
                  own_process=fresh_process or regime != "static") for impl, workload, regime in cases]
    refused, admitted = plan.plan(every, in_process=True)
    measured = sweep.measure_cases([every[i] for i in admitted], **kwargs)
    out = dict(refused)
    out.update(zip(admitted, measured, strict=True))
    return [out[i] for i in range(len(every))]



def eight_round_sweep(cases) -> list[dict]:
    """``cases`` swept in one warm worker over eight rounds of 10 ms windows, their streams 16 steps of
    the azure-code trace in four windows: small enough for a test, every round's task in it."""
    from attnbench.run.adaptive import RoundPlan

    options = Options(min_seconds=0.02, regime_steps=16, numerics=False, traffic="azure-code",
                      stream_windows=4)
    return measure_sweep(cases, options, rounds=RoundPlan(min_rounds=8, max_rounds=8, window_s=0.01),
                         progress=False, fresh_process=False)
