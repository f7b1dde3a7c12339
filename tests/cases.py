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

