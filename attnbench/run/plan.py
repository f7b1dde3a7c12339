"""Which cases are measured: every kernel asked once whether it takes its workload here, before any
measuring worker starts.

The question initialises devices (a kernel's limits depend on the platform it would run on), and the
process that starts the measuring workers must not: jax would preallocate 75% of a GPU, and a TPU
admits one process. So it is asked of one spawned worker, which exits before the sweep begins. A
refused case becomes its record here; the others are the ``Case`` values the sweep measures.
"""

from __future__ import annotations

import attention_impls
from attnbench.backends import here
from attnbench.core import records, regimes, statuses
from attnbench.measure.engine import Case, case_record, measure_case, resolve_impl
from attnbench.run.worker import Worker

CHECK_TIMEOUT_S = 600.0  # the check imports every framework of its cases and initialises their devices


def support(case: Case) -> dict:
    """In the checking process: ``reason`` the kernel refuses the case here (``None`` if it takes
    it), its ``framework`` and ``gqa`` mode, and the ``platform``, ``label`` and ``execution`` it
    would run with; ``{"error": ...}`` when the kernel cannot even say."""
    try:
        impl = resolve_impl(case.impl, case.config)
        reason = regimes.regime_reason(case.workload, case.regime) \
            or here.check(impl, regimes.runner_template(case.workload, case.regime))
        answer = {"reason": reason, "framework": impl.framework,
                  "gqa": impl.gqa_mode(case.workload)}
        if not here.framework_missing(impl):
            platform = here.platform(impl)
            answer.update(platform=platform, label=impl.label(platform), execution=impl.execution(platform))
        return answer
    except Exception as exc:  # an unknown name, a framework that cannot say where it runs
        return check_failed(case, exc)


def check_failed(case: Case, exc: Exception) -> dict:
    """The answer for a case whose kernel could not say whether it takes the workload here."""
    return {"error": f"support check of {case.impl} failed: {type(exc).__name__}: {exc}"[:2000]}


def _support_of_each(cases: list[Case]) -> list[dict]:
    return [support(case) for case in cases]


def ask_in_worker(task, cases: list, *args, timeout_s: float = CHECK_TIMEOUT_S) -> list[dict]:
    """``task(cases, *args)`` (a module-level function answering one dict per case) in one spawned
    worker, gone before this returns. A check that gives no answer makes an ``error`` answer for
    each case, naming why."""
    with Worker(task) as worker:
        frameworks = sorted({f for case in cases for f in preload(case.impl)})
        answers, failure = worker.call((cases, *args), timeout_s, preload=tuple(frameworks))
    if failure is None:
        return answers
    why = (f"no answer within {timeout_s:g} s" if failure.status == statuses.TIMEOUT
           else f"the check process died: {failure.reason}")
    return [{"error": f"the support check failed: {why}"}] * len(cases)


def refused(case: Case, answer: dict) -> dict | None:
    """The record of a case its answer refuses (``unsupported``) or could not check (``error``);
    ``None`` for a case to measure."""
    if answer.get("error"):
        return case_record(case, status=records.ERROR, reason=answer["error"])
    if answer.get("reason"):
        known = {k: answer[k] for k in ("framework", "gqa", "platform", "label", "execution") if k in answer}
        return case_record(case, status=records.UNSUPPORTED, reason=answer["reason"], **known)
    return None


def plan(cases: list[Case], *, in_process: bool = False) -> tuple[dict[int, dict], list[int]]:
    """``({index: record} of the cases refused here, [indices of the cases to measure])``.

    ``in_process``: ask here (a sweep without workers, which initialises its devices anyway)."""
    answers = _support_of_each(cases) if in_process else ask_in_worker(_support_of_each, cases)
    out, admitted = {}, []
    for i, (case, answer) in enumerate(zip(cases, answers, strict=True)):
        record = refused(case, answer)
        if record is None:
            admitted.append(i)
        else:
            out[i] = record
    return out, admitted


def measure_here(case: Case) -> dict:
    """One case outside a sweep, in this process: the kernel asked, then the case measured unless
    refused (``compare``'s workers; tests). Initialises the case's device here."""
    return refused(case, support(case)) or measure_case(case)


def preload(impl) -> tuple[str, ...]:
    """The framework a fresh worker imports for ``impl`` before its clock starts. A registry lookup
    only: a ``"module:Class"`` spec is not imported here, in the parent, but by the worker's task; an
    unknown name gets no preload, and its record says what is wrong."""
    try:
        return (attention_impls.get(impl).framework if isinstance(impl, str) else impl.framework,)
    except KeyError:
        return ()

