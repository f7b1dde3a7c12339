"""``attnbench compare REV_A REV_B``: two revisions' cases measured interleaved on this machine.

The pull-request gate ``asv continuous`` is not on a noisy machine: it measures one revision, then
the other, so whatever else the machine does meanwhile lands on one side only. Here each revision
is checked out in its own git worktree and served by a worker process (this machine's venv, the
worktree first on ``PYTHONPATH``); the cases are measured in rounds, alternating A B, B A, A B ...
so that drift and bursts of outside load fall on both sides. Both workers are replaced by fresh
processes every ``restart_every`` rounds: on this machine one process can sit 5-20% away from
another for its whole life (``attnbench/measure/stats.py``), which one long-lived pair would report as a
difference between the revisions. Per
case, each round gives the ratio B/A of the two adjacent medians; the figure is the median ratio
with its 95% interval (order statistics of the per-round log ratios, ``attnbench.measure.stats``), and
the verdict is

* ``slower``: the whole interval lies above 1 and the ratio exceeds ``1 + threshold``;
* ``faster``: the whole interval lies below 1 and the ratio is under ``1 - threshold``;
* ``no change`` otherwise (the interval holds 1, or the effect is smaller than the threshold).

The command exits 1 when any case is ``slower``: a gate for a pull request.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from attnbench.core.workload import Workload
from attnbench.measure import stats

# Runs inside a worktree. Written against the engine API every revision since the engine has
# (measure_case, Options(regime, min_seconds, numerics)), so older revisions can be compared too:
# those before the modules were grouped by role have them flat under attnbench/.
WORKER = r"""
import json, os, sys
try:
    from attnbench.measure.process_env import pin_threads
    GROUPED = True
except ImportError:
    GROUPED = False
    try:
        from attnbench.process_env import pin_threads
    except ImportError:
        from attnbench.isolation import pin_threads
pin_threads(int(sys.argv[1]))  # before the engine's imports start any thread pool
if GROUPED:
    from attnbench.measure.engine import Options, measure_case
    from attnbench.core.workload import Workload
else:
    from attnbench.engine import Options, measure_case
    from attnbench.workload import Workload
for line in sys.stdin:
    task = json.loads(line)
    options = Options(regime="static", min_seconds=task["min_seconds"], numerics=False)
    record = measure_case(task["impl"], Workload(**task["workload"]), options)
    keep = {k: record.get(k) for k in ("status", "reason", "seconds_per_step")}
    keep["pid"] = os.getpid()
    print(json.dumps(keep), flush=True)
"""


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
    """(ratio, ci_low, ci_high, verdict) from paired per-round step times of A and B."""
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


class _RevisionWorker:
    """One revision's worktree and the worker process measuring in it."""

    def __init__(self, repo: str, rev: str, root: str, label: str, threads: int):
        self.rev, self.path = rev, os.path.join(root, label)
        subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", "--quiet", self.path, rev],
                       check=True, capture_output=True, text=True)
        self.threads = threads
        self.process = None
        self.start()

    def start(self) -> None:
        """A fresh worker process (the old one, if any, is closed first)."""
        self.stop()
        env = {**os.environ, "PYTHONPATH": self.path + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, str(self.threads)], cwd=self.path,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def measure(self, impl: str, workload: Workload, min_seconds: float) -> dict:
        task = {"impl": impl, "workload": workload.to_dict(), "min_seconds": min_seconds}
        self.process.stdin.write(json.dumps(task) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker for {self.rev} exited (code {self.process.poll()})")
        return json.loads(line)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def close(self, repo: str) -> None:
        self.stop()
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
        workers = {}
        for label, sha in (("a", sha_a), ("b", sha_b)):
            workers[label] = _RevisionWorker(repo, sha, root, label, threads)
            stack.callback(workers[label].close, repo)
        for impl in impls:
            for seq in seqs:
                workload = template.replace(seq_q=seq, seq_k=seq)
                times, pids = {"a": [], "b": []}, {"a": set(), "b": set()}
                failure = None
                # Round 0 warms both workers (imports, compiles) and is discarded.
                for r in range(rounds + 1):
                    if r > 1 and (r - 1) % restart_every == 0:
                        for worker in workers.values():
                            worker.start()
                    order = ("a", "b") if r % 2 == 0 else ("b", "a")
                    got = {label: workers[label].measure(impl, workload, min_seconds) for label in order}
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
