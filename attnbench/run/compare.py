"""``attnbench compare REV_A REV_B``: two revisions' cases measured interleaved on this machine.

``asv continuous`` measures one revision, then the other, so outside load lands on one side only.
Here each revision runs in its own worktree and worker, and every round times each case once per
revision, back to back (A B, then B A the next round), so what moves the machine moves both; the
workers keep each case's step warm and are replaced every ``restart_every`` rounds, because one
process can sit apart from another for its whole life (results/LOG.md). Each case's figure is the
median per-round B/A ratio with its 99% interval (``core.stats.paired_ratio``), read against the
threshold (``judge``). The command exits 1 when any case is ``slower``.

The revision's own code builds each step (its kernel, backend and inputs: what a change to them
changes); the window is timed by this checkout's loop, the same for both sides. ``attnbench
confirm`` (``run/confirm.py``) uses this to measure a step of the newest run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from attnbench.core.stats import ABOVE, BELOW, EQUAL, paired_ratio
from attnbench.core.workload import Workload
from attnbench.measure.timing import time_window
from attnbench.run.worker import Worker

CASE_TIMEOUT_S = 600.0
SLOWER, FASTER, NO_CHANGE, CANT_TELL, ERROR = "slower", "faster", "no change", "can't tell", "error"

_steps: dict = {}  # in a revision's worker: its built steps, by (impl, workload)


def time_case(impl: str, workload_fields: dict, window_s: float) -> dict:
    """In a revision's worker: one window of a static case, its step built once by that revision's
    code and kept warm. Revisions older than ``attnbench.backends.here`` are measured whole by their
    own engine each time (slower, and their own timing loop)."""
    key = (impl, json.dumps(workload_fields, sort_keys=True))
    try:
        if key not in _steps:
            _steps[key] = _build(impl, workload_fields)
        step = _steps[key]
        if isinstance(step, dict):  # an old revision: its whole record each time
            record = _old_revision_record(impl, workload_fields, window_s)
            kept = {k: record.get(k) for k in ("status", "reason", "seconds_per_step")}
            return {**kept, "pid": os.getpid()}
        timing = time_window(step.run, number=_number(step), min_seconds=window_s, min_samples=3)
        return {"status": "ok", "reason": None, "seconds_per_step": timing.median_s, "pid": os.getpid()}
    except Exception as exc:  # noqa: BLE001 - the case's failure is the answer
        _steps.pop(key, None)
        return {"status": "error", "reason": f"{type(exc).__name__}: {exc}"[:500], "pid": os.getpid()}


def _build(impl: str, workload_fields: dict):
    try:
        from attnbench.backends import here
        from attnbench.core.workload import Workload as TheirWorkload
        from attnbench.measure.engine import resolve_impl
    except ImportError:
        return {"old": True}
    step = here.make_step(resolve_impl(impl), TheirWorkload(**workload_fields))
    step.run()
    return step


def _number(step) -> int:
    """Calls per block: as many as last 20 ms, at least one (the step is warm)."""
    start = time.perf_counter()
    step.run()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(1 << 12, int(0.02 / once)))


def _old_revision_record(impl: str, workload_fields: dict, window_s: float) -> dict:
    try:
        from attnbench.core.workload import Workload as TheirWorkload
        from attnbench.measure import engine
    except ImportError:
        from attnbench import engine
        from attnbench.workload import Workload as TheirWorkload
    options = engine.Options(regime="static", min_seconds=window_s, numerics=False)
    workload = TheirWorkload(**workload_fields)
    if hasattr(engine, "Case"):  # the kernel asked first, as that revision's callers did
        from attnbench.run.plan import measure_here

        return measure_here(engine.Case(impl, workload, options))
    return engine.measure_case(impl, workload, options)


@dataclasses.dataclass(frozen=True)
class Verdict:
    impl: str
    workload: str  # Workload.describe()
    ratio: float  # B / A, median over rounds
    ci_low: float
    ci_high: float
    rounds: int
    verdict: str  # slower | faster | no change | can't tell | error
    note: str = ""
    processes: int = 0  # worker processes per revision the rounds were spread over
    seq: int = 0


def judge(a_seconds: list[float], b_seconds: list[float],
          threshold: float) -> tuple[float, float, float, str]:
    """(ratio, ci_low, ci_high, verdict) from paired per-round step times of A and B at 99%: ``no
    change`` when the interval lies within ``1 +- threshold``; ``slower`` (``faster``) when it lies
    wholly above (below) 1 and the ratio passes the threshold; else ``can't tell``."""
    if len(a_seconds) != len(b_seconds) or not a_seconds:
        raise ValueError("judge needs as many B rounds as A rounds, at least one")
    ratio = paired_ratio(b_seconds, a_seconds)
    state = ratio.against_one(threshold)
    if state == EQUAL:
        verdict = NO_CHANGE
    elif state == ABOVE and ratio.ratio > 1.0 + threshold:
        verdict = SLOWER
    elif state == BELOW and ratio.ratio < 1.0 - threshold:
        verdict = FASTER
    else:
        verdict = CANT_TELL
    return ratio.ratio, ratio.low, ratio.high, verdict


class _Revision:
    """One revision's worktree and the worker (``run.worker.Worker``) that imports it."""

    def __init__(self, repo: str, rev: str, root: str, label: str, threads: int):
        self.rev, self.path = rev, os.path.join(root, label)
        subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "--quiet", self.path, rev],
                       check=True, capture_output=True, text=True)
        pythonpath = self.path + os.pathsep + os.environ.get("PYTHONPATH", "")
        self.worker = Worker(time_case, threads=threads, checkout=self.path,
                             environ={"PYTHONPATH": pythonpath})  # started by its first call

    def time_case(self, impl: str, workload: Workload, window_s: float) -> dict:
        record, failure = self.worker.call((impl, workload.to_dict(), window_s), CASE_TIMEOUT_S)
        return record if failure is None else {"status": failure.status, "reason": failure.reason}

    def close(self, repo: str) -> None:
        self.worker.close()
        subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", self.path], capture_output=True)


def resolve(repo: str, rev: str) -> str:
    out = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"unknown revision {rev!r} in {repo}")
    return out.stdout.strip()


def compare(rev_a: str, rev_b: str, cases: list[tuple[str, Workload]], *, rounds: int = 12,
            threshold: float = 0.05, window_s: float = 0.1, threads: int | None = None,
            restart_every: int = 4, repo: str = ".", budget_s: float | None = None,
            progress=print) -> list[Verdict]:
    """Measure every ``(impl, workload)`` of both revisions interleaved; one ``Verdict`` per case.
    ``budget_s``: no round starts after it is spent (the cases' verdicts use the rounds they had)."""
    if rounds < 2:
        raise ValueError(f"--rounds must be at least 2 (a 99% interval needs 8), got {rounds}")
    if restart_every < 1:
        raise ValueError(f"--restart-every must be at least 1 round, got {restart_every}")
    sha_a, sha_b = resolve(repo, rev_a), resolve(repo, rev_b)
    threads = threads or len(os.sched_getaffinity(0))
    started = time.time()
    times = {i: {"a": [], "b": []} for i in range(len(cases))}
    pids: dict[int, dict[str, set]] = {i: {"a": set(), "b": set()} for i in range(len(cases))}
    failed: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="attnbench-compare-") as root, contextlib.ExitStack() as stack:
        revisions = {}
        for label, sha in (("a", sha_a), ("b", sha_b)):
            revisions[label] = _Revision(repo, sha, root, label, threads)
            stack.callback(revisions[label].close, repo)
        # Round 0 warms both workers (imports, builds, compiles) and is discarded.
        for r in range(rounds + 1):
            if budget_s is not None and r > 1 and time.time() - started > budget_s:
                break
            if r > 1 and (r - 1) % restart_every == 0:
                for revision in revisions.values():
                    revision.worker.close()  # the next call starts a fresh process
            for i, (impl, workload) in enumerate(cases):
                if i in failed:
                    continue
                order = ("a", "b") if (r + i) % 2 == 0 else ("b", "a")
                got = {label: revisions[label].time_case(impl, workload, window_s) for label in order}
                bad = [f"{rev}: {rec['status']} {rec.get('reason') or ''}".strip()
                       for rev, rec in got.items() if rec["status"] != "ok"]
                if bad:
                    failed[i] = "; ".join(bad)
                elif r:
                    for label in order:
                        times[i][label].append(got[label]["seconds_per_step"])
                        pids[i][label].add(got[label].get("pid"))
    results = []
    for i, (impl, workload) in enumerate(cases):
        a, b = times[i]["a"], times[i]["b"]
        if i in failed or not a:
            verdict = Verdict(impl, workload.describe(), math.nan, math.nan, math.nan, 0, ERROR,
                              failed.get(i, "no round measured"), seq=workload.seq_k)
        else:
            ratio, low, high, state = judge(a, b, threshold)
            verdict = Verdict(impl, workload.describe(), ratio, low, high, len(a), state,
                              processes=min(len(pids[i]["a"]), len(pids[i]["b"])), seq=workload.seq_k)
        results.append(verdict)
        progress(format_verdict(verdict))
    return results


def format_verdict(v: Verdict) -> str:
    if v.verdict == ERROR:
        return f"{v.impl:28s} {v.workload}: error: {v.note}"
    return (f"{v.impl:28s} {v.workload}: B/A {v.ratio:6.3f}  99% [{v.ci_low:.3f}, {v.ci_high:.3f}]  "
            f"{v.rounds} rounds in {v.processes} processes each  {v.verdict}")


def write_json(verdicts: list[Verdict], path: str) -> None:
    """The verdicts as JSON (``compare --json``; ``confirm`` reads it from another venv's run)."""
    from attnbench.core.atomic import atomic_write_text

    atomic_write_text(path, json.dumps([dataclasses.asdict(v) for v in verdicts], allow_nan=True))


def main_json(argv: list[str]) -> int:  # pragma: no cover - ``confirm`` calls it in another venv
    """``python -m attnbench.run.compare SPEC.json OUT.json``: ``compare`` of a spec written by
    ``run/confirm.py``, in this interpreter."""
    spec = json.load(open(argv[0], encoding="utf-8"))
    cases = [(c["impl"], Workload(**c["workload"])) for c in spec["cases"]]
    verdicts = compare(spec["rev_a"], spec["rev_b"], cases, rounds=spec["rounds"],
                       threshold=spec["threshold"], window_s=spec["window_s"], repo=spec["repo"],
                       budget_s=spec.get("budget_s"),
                       progress=lambda line: print(line, file=sys.stderr))
    write_json(verdicts, argv[1])
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main_json(sys.argv[1:]))
