"""``attnbench compare REV_A REV_B``: two revisions' cases measured interleaved on this machine.

``asv continuous`` measures one revision, then the other, so outside load lands on one side only.
Here each revision runs in its own worktree and worker, alternating A B, B A, ... so drift falls on
both sides; workers are replaced every ``restart_every`` rounds because one process can sit apart
from another for its whole life (``attnbench/core/stats.py``). The figure is the median per-round
B/A ratio with its 95% interval (``judge``); the command exits 1 when any case is ``slower``.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import subprocess
import tempfile
from dataclasses import dataclass

from attnbench.core import stats
from attnbench.core.workload import Workload
from attnbench.run.worker import Worker

CASE_TIMEOUT_S = 600.0


def time_case(impl: str, workload_fields: dict, min_seconds: float) -> dict:
    """In a revision's worker: one static case timed by that revision's engine, no numerics.

    Older revisions take the case as ``measure_case(impl, workload, options)`` and check support in
    the engine (some in flat modules); newer ones take a ``Case`` whose kernel the caller asked."""
    try:
        from attnbench.core.workload import Workload
        from attnbench.measure import engine
    except ImportError:
        from attnbench import engine
        from attnbench.workload import Workload
    options = engine.Options(regime="static", min_seconds=min_seconds, numerics=False)
    workload = Workload(**workload_fields)
    if hasattr(engine, "Case"):
        from attnbench.run.plan import measure_here

        record = measure_here(engine.Case(impl, workload, options))
    else:
        record = engine.measure_case(impl, workload, options)
    return {**{k: record.get(k) for k in ("status", "reason", "seconds_per_step")}, "pid": os.getpid()}


@dataclass(frozen=True)
class Verdict:
    impl: str
    seq: int
    ratio: float  # B / A, median over rounds
    ci_low: float
    ci_high: float
    rounds: int
    verdict: str  # faster | slower | no change | error
    note: str = ""
    processes: int = 0  # worker processes per revision the rounds were spread over


def judge(a_seconds: list[float], b_seconds: list[float],
          threshold: float) -> tuple[float, float, float, str]:
    """(ratio, ci_low, ci_high, verdict) from paired per-round step times of A and B: ``slower`` or
    ``faster`` only when the whole interval excludes 1 and the ratio passes ``threshold``."""
    if len(a_seconds) != len(b_seconds) or not a_seconds:
        raise ValueError("judge needs as many B rounds as A rounds, at least one")
    logs = [math.log(b / a) for a, b in zip(a_seconds, b_seconds, strict=True)]
    low, high = stats.median_ci(logs)
    ratio = math.exp(statistics.median(logs))
    ci_low, ci_high = math.exp(low), math.exp(high)
    if ci_low > 1.0 and ratio > 1.0 + threshold:
        verdict = "slower"
    elif ci_high < 1.0 and ratio < 1.0 - threshold:
        verdict = "faster"
    else:
        verdict = "no change"
    return ratio, ci_low, ci_high, verdict


class _Revision:
    """One revision's worktree and the worker (``run.worker.Worker``) that imports it."""

    def __init__(self, repo: str, rev: str, root: str, label: str, threads: int):
        self.rev, self.path = rev, os.path.join(root, label)
        subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "--quiet", self.path, rev],
                       check=True, capture_output=True, text=True)
        pythonpath = self.path + os.pathsep + os.environ.get("PYTHONPATH", "")
        self.worker = Worker(time_case, threads=threads, checkout=self.path,
                             environ={"PYTHONPATH": pythonpath})  # started by its first call

    def time_case(self, impl: str, workload: Workload, min_seconds: float) -> dict:
        record, failure = self.worker.call((impl, workload.to_dict(), min_seconds), CASE_TIMEOUT_S)
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


def compare(rev_a: str, rev_b: str, impls: list[str], seqs: list[int], *, template: Workload,
            rounds: int = 10, threshold: float = 0.05, min_seconds: float = 0.2, threads: int | None = None,
            restart_every: int = 2, repo: str = ".", progress=print) -> list[Verdict]:
    """Measure every (impl, seq) of both revisions interleaved; one ``Verdict`` per case."""
    if rounds < 2:
        raise ValueError(f"--rounds must be at least 2 (one warm-up pair is discarded), got {rounds}")
    if restart_every < 1:
        raise ValueError(f"--restart-every must be at least 1 round, got {restart_every}")
    sha_a, sha_b = resolve(repo, rev_a), resolve(repo, rev_b)
    threads = threads or len(os.sched_getaffinity(0))
    results: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="attnbench-compare-") as root, contextlib.ExitStack() as stack:
        revisions = {}
        for label, sha in (("a", sha_a), ("b", sha_b)):
            revisions[label] = _Revision(repo, sha, root, label, threads)
            stack.callback(revisions[label].close, repo)
        for impl in impls:
            for seq in seqs:
                workload = template.replace(seq_q=seq, seq_k=seq)
                times, pids = {"a": [], "b": []}, {"a": set(), "b": set()}
                failure = None
                # Round 0 warms both workers (imports, compiles) and is discarded.
                for r in range(rounds + 1):
                    if r > 1 and (r - 1) % restart_every == 0:
                        for revision in revisions.values():
                            revision.worker.close()  # the next call starts a fresh process
                    order = ("a", "b") if r % 2 == 0 else ("b", "a")
                    got = {label: revisions[label].time_case(impl, workload, min_seconds) for label in order}
                    bad = [f"{rev}: {rec['status']} {rec.get('reason') or ''}".strip()
                           for rev, rec in got.items() if rec["status"] != "ok"]
                    if bad:
                        failure = "; ".join(bad)
                        break
                    if r:
                        for label in order:
                            times[label].append(got[label]["seconds_per_step"])
                            pids[label].add(got[label].get("pid"))
                if failure:
                    results.append(Verdict(impl, seq, math.nan, math.nan, math.nan, 0, "error", failure))
                else:
                    ratio, low, high, verdict = judge(times["a"], times["b"], threshold)
                    results.append(Verdict(impl, seq, ratio, low, high, rounds, verdict,
                                           processes=min(len(pids["a"]), len(pids["b"]))))
                progress(format_verdict(results[-1]))
    return results


def format_verdict(v: Verdict) -> str:
    if v.verdict == "error":
        return f"{v.impl:28s} S={v.seq:<6d} error: {v.note}"
    return (f"{v.impl:28s} S={v.seq:<6d} B/A {v.ratio:6.3f}  95% [{v.ci_low:.3f}, {v.ci_high:.3f}]  "
            f"{v.rounds} rounds in {v.processes} processes each  {v.verdict}")
