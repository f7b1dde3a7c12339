"""The tuner: each tiled kernel's candidate configs (``search_space``, declared in its own file)
measured at a workload, paired by round, and the fastest kept only where it is decided faster than
the kernel's defaults (docs/tuning.md).

A **group** is one kernel at one workload. Its candidates are built in one worker, each checked once
against the float64 reference (a candidate that fails to build or breaks numerics is recorded with
its reason and never kept), then timed in ``rounds`` rounds, their blocks interleaved as the sweep's
rounds time a verdict's kernels (``measure/round_timing.py``), the order turned by one each round, a
fresh worker every ``restart_every`` rounds. Each candidate's ratio to the defaults is the median of
its per-round ratios with its interval (``core.stats.paired_ratio``), at a confidence shared over the
candidates (Bonferroni), so that trying four candidates does not make a spurious win likelier than
the 99% the verdict states.

Values in, values out: a group's entry is a dict that ``results/tuned.py`` files; nothing here prints
but the caller's progress line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import statistics
import time

from attention_impls.base import config_text
from attnbench.core import records
from attnbench.core.stats import CONFIDENCE, pair_rounds, paired_ratio
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options, classify_exception, resolve_impl
from attnbench.run.adaptive import InProcess
from attnbench.run.worker import Worker

GROUP_TIMEOUT_S = 600.0
REFUSED, NUMERICS_FAILED = "refused", records.NUMERICS_FAILED


@dataclasses.dataclass(frozen=True)
class TunePlan:
    """How a group is measured: ``rounds`` paired rounds (10 at least: at a confidence shared over four
    candidates, fewer rounds cannot carry the interval), ``window_s`` per candidate per round."""

    rounds: int = 12
    window_s: float = 0.05
    min_samples: int = 3
    restart_every: int = 6
    confidence: float = CONFIDENCE

    def __post_init__(self):
        if self.rounds < 2 or self.window_s <= 0 or self.restart_every < 1:
            raise ValueError(f"a tuning plan needs at least 2 rounds and a positive window, got {self}")


# -- in the worker ----------------------------------------------------------------------------------
def _serve(op: str, *args):
    """The worker's one task: ``prepare`` the candidates, or time one ``round`` of them."""
    from attnbench.measure.round_timing import time_round

    if op == "prepare":
        return [_prepare(case) for case in args[0]]
    return time_round(*args)


def _prepare(case: Case) -> dict:
    """Build the candidate's step (kept for the rounds), check it once against the float64 reference
    and size its timing blocks; ``{"status", "reason", "number", "max_abs_err", "numerics_ok"}``."""
    from attnbench.measure.reference_check import check_numerics
    from attnbench.measure.round_timing import warm_step
    from attnbench.measure.timing import time_step

    try:
        impl = resolve_impl(case.impl, case.config)
        step = warm_step(case)
        checked = check_numerics(impl, case.workload, step, case.options.seed)
        timing = time_step(step.run, min_seconds=0.1, min_samples=3, max_seconds=5.0)
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot build is recorded, never kept
        return {"status": classify_exception(exc), "reason": f"{type(exc).__name__}: {exc}"[:500]}
    answer = {"status": records.OK, "reason": None, "number": max(1, timing.steps_per_sample // 4),
              "max_abs_err": checked.get("max_abs_err"), "numerics_ok": checked.get("numerics_ok")}
    if checked.get("numerics_ok") is False:
        answer.update(status=NUMERICS_FAILED, reason=(
            f"max abs error {checked.get('max_abs_err'):.3g} against the float64 reference is beyond "
            f"the {case.workload.dtype} tolerance ({checked.get('numerics_workload')})"))
    return answer


# -- in the caller ----------------------------------------------------------------------------------
def tune_group(kernel: str, workload: Workload, plan: TunePlan = TunePlan(), *, threads: int | None = None,
               preload: tuple[str, ...] = (), in_process: bool = False) -> dict:
    """The tuning entry of ``kernel`` (a registered name, or ``"module:Class"``) at ``workload``
    (``results/tuned.py`` files it)."""
    impl = resolve_impl(kernel)
    if impl.search_space is None:
        raise ValueError(f"{kernel} has no tile knobs to tune (no search_space in its file)")
    defaults = impl.search_space.defaults
    began = time.perf_counter()
    rows = {config_text(c): {"config": config_text(c), "status": REFUSED, "reason": reason}
            for c, reason in impl.candidates(workload) if reason}
    cases = [Case(kernel, workload, Options(regime="static"), config=c, config_source="candidate",
                  variant=config_text(c)) for c, reason in impl.candidates(workload) if not reason]
    worker = InProcess(_serve) if in_process else Worker(_serve, threads=threads)
    try:
        prepared, failure = worker.call(("prepare", cases), GROUP_TIMEOUT_S, preload=preload)
        if failure is not None:
            prepared = [{"status": failure.status, "reason": failure.reason}] * len(cases)
        timed = []
        for case, answer in zip(cases, prepared, strict=True):
            rows[case.variant] = {"config": case.variant, "status": answer["status"],
                                  "reason": answer["reason"], "max_abs_err": answer.get("max_abs_err")}
            if answer["status"] == records.OK:
                timed.append((case, answer["number"]))
        medians = _rounds(worker, timed, plan, preload)
    finally:
        worker.close()
    return _entry(kernel, impl, workload, defaults, rows, medians, plan, time.perf_counter() - began)


def _rounds(worker, timed: list[tuple[Case, int]], plan: TunePlan, preload) -> dict[str, dict[int, float]]:
    """``{config: {round: median}}`` over ``plan.rounds`` rounds, the candidates' order turned each round."""
    medians: dict[str, dict[int, float]] = {case.variant: {} for case, _ in timed}
    if len(timed) < 2:
        return medians
    for round_id in range(1, plan.rounds + 1):
        if round_id > 1 and (round_id - 1) % plan.restart_every == 0:
            worker.close()  # no ratio rests on one process
        turn = (round_id - 1) % len(timed)
        jobs = timed[turn:] + timed[:turn]
        answers, failure = worker.call(("round", jobs, plan.window_s, plan.min_samples), GROUP_TIMEOUT_S,
                                       preload=preload)
        if failure is not None:
            continue  # a lost round: the pairs are made of the rounds every candidate has
        for answer, (case, _) in zip(answers, jobs, strict=True):
            if answer.get("status") == records.OK:
                medians[case.variant][round_id] = answer["median_s"]
    return medians


def _entry(kernel, impl, workload, defaults, rows, medians, plan: TunePlan, seconds: float) -> dict:
    base = config_text(defaults)
    others = [c for c in medians if c != base]
    confidence = 1.0 - (1.0 - plan.confidence) / max(1, len(others))
    for config, by_round in medians.items():
        row = rows[config]
        row["median_s"] = statistics.median(by_round.values()) if by_round else None
        if config == base or base not in medians:
            continue
        a, b = pair_rounds(by_round, medians[base])
        if a:
            ratio = paired_ratio(a, b, confidence)
            row.update(ratio=ratio.ratio, low=ratio.low, high=ratio.high, rounds=ratio.rounds,
                       faster=ratio.carried and ratio.high < 1.0)
    faster = [rows[c] for c in others if rows[c].get("faster")]
    best = min(faster, key=lambda r: r["ratio"]) if faster else None
    if best is not None:
        why = (f"fastest candidate, decided faster than the defaults ({base}): "
               f"{best['ratio']:.2f}x [{best['low']:.2f}-{best['high']:.2f}]")
    elif base not in medians or not medians[base]:
        why = "the defaults could not be timed: nothing kept but the defaults"
    else:
        why = f"no candidate decided faster than the defaults at {confidence:.2%} over {plan.rounds} rounds"
    return {"kernel": kernel, "framework": impl.framework, "workload": workload.describe(),
            "kept": best["config"] if best else base, "defaults": base, "why": why,
            "rounds": plan.rounds, "confidence": confidence, "window_s": plan.window_s,
            "seconds": round(seconds, 1),
            "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "candidates": [_clean(rows[c]) for c in sorted(rows, key=_order(impl))]}


def _order(impl):
    order = [config_text(c) for c in impl.search_space.candidates]
    return lambda config: order.index(config) if config in order else len(order)


def _clean(row: dict) -> dict:
    """JSON-safe: NaN as None, floats rounded to what a timing carries."""
    out = {}
    for k, v in row.items():
        if isinstance(v, float):
            v = None if math.isnan(v) else float(f"{v:.6g}")
        out[k] = v
    return out


def summary_line(entry: dict) -> str:
    """One progress line: the group, what was kept and why."""
    return (f"{entry['kernel']} {entry['workload']}: kept {entry['kept']} "
            f"({entry['why']}; {entry['seconds']:.0f} s)")

