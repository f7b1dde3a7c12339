"""``attnbench confirm``: the newest run's steps measured again, paired, before they are called.

A step at this machine's newest commit beyond the threshold, in a figure that follows the steady step
(seconds, rates, costs per step or per token; ``Metric.time_exponent``), across commits that changed
the code its series measures, is only one figure against a history whose runs move by more than the
step (docs/reports.md). Here each such step's case is measured again at the commit before the step
and at the newest, interleaved round by round (``run/compare.py``), and the result is written to
``results/<machine>/confirmations/<newest8>.confirm`` (``results/confirmations.py``). The report then
calls the step a regression (confirmed: the newest commit is slower, beyond the threshold), dismisses
it (equal within the threshold, or faster), or keeps it unconfirmed (the re-measurement could not
tell). ``make bench`` runs it before the report, within its budget; the report names the command when
steps are left.

A torch_xla case is measured by ``.venv-xla``'s interpreter (``python -m attnbench.run.compare``), as
torch_xla cannot live in the main venv.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import tempfile
import time

from attnbench.asv import sizes
from attnbench.core import presets
from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import Workload
from attnbench.results import code, confirmations
from attnbench.results.asv_results import load_results
from attnbench.run.compare import Verdict, compare

XLA_VENV = ".venv-xla"


def workload_of(case: dict, settings: dict) -> Workload:
    """The workload a suite's case ran (its class, length, dtype; a preset's at the run's size)."""
    dtype = case.get("dtype") or str(settings.get("setting_dtypes") or "float32").split(",")[0]
    if case["suite"] == "Models":
        size = settings.get("setting_preset_size") or "default"
        return presets.workload(case["workload"], case["phase"], size=str(size), dtype=dtype)
    seq = int(case["seq_len"])
    base = sizes.TRAINING if case["suite"] == "Training" else sizes.FORWARD
    return base.replace(seq_q=seq, seq_k=seq, dtype=dtype)


def confirm(results_dir: str = "results", *, repo: str = ".", machine: str, thresholds: dict | None = None,
            threshold: float = 0.1, rounds: int = 12, budget_s: float | None = None, window_s: float = 0.1,
            progress=print) -> list[dict]:
    """Measure every confirmable step of ``machine``'s newest run again and write the confirmations;
    returns their entries. Steps beyond ``budget_s`` are left unconfirmed (said on ``progress``)."""
    from attnbench.results.steps import find_steps, to_confirm

    frame = load_results(results_dir, repo=repo)
    done = confirmations.load(results_dir)
    steps = find_steps(frame, thresholds, repo=repo, confirmed=done)
    todo = to_confirm(frame, steps, machine, repo, done)
    if not todo:
        progress(f"confirm: no step at {machine}'s newest commit to measure again")
        return []
    settings = _settings(frame, machine, todo[0]["commit_after"])
    started, entries = time.time(), []
    by_pair: dict[tuple, list[dict]] = {}
    for case in todo:
        by_pair.setdefault((case["commit_before"], case["env_name"]), []).append(case)
    for (before, env), cases in by_pair.items():
        if not code.paired_measurement_at(repo, before):
            progress(f"confirm: {before[:8]} predates the warm, paired measurement (attnbench/backends/"
                     f"here.py): its {len(cases)} step(s) of {env} are left as the history judged them")
            continue
        left = None if budget_s is None else budget_s - (time.time() - started)
        if left is not None and left <= 0:
            progress(f"confirm: budget spent; {len(cases)} case(s) of {env} left unconfirmed")
            continue
        workloads = [(c["implementation"], workload_of(c, settings)) for c in cases]
        progress(f"confirm: {len(cases)} case(s) of {env}, {before[:8]} against "
                 f"{cases[0]['commit_after'][:8]}")
        verdicts = _measure(env, before, cases[0]["commit_after"], workloads, repo, rounds=rounds,
                            threshold=threshold, window_s=window_s, budget_s=left, progress=progress)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        for case, verdict in zip(cases, verdicts, strict=True):
            entries.append({**{k: v for k, v in case.items() if k != "commit_after"}, "ratio": verdict.ratio,
                            "ci_low": verdict.ci_low, "ci_high": verdict.ci_high, "rounds": verdict.rounds,
                            "verdict": verdict.verdict, "note": verdict.note, "threshold": threshold,
                            "measured_at": now})
    if entries:
        write(results_dir, machine, todo[0]["commit_after"], entries)
    return entries


def _settings(frame, machine: str, commit: str) -> dict:
    rows = frame[(frame["machine"] == machine) & (frame["commit_hash"] == commit)]
    return {c: rows[c].dropna().iloc[0] for c in ("setting_dtypes", "setting_preset_size")
            if c in rows and rows[c].notna().any()}


def _measure(env: str, before: str, after: str, workloads: list, repo: str, **kwargs) -> list[Verdict]:
    """``compare`` in this interpreter, or in ``.venv-xla``'s for the torch_xla environment."""
    if "torch-xla" not in env:
        return compare(before, after, workloads, repo=repo, **kwargs)
    python = os.path.join(repo, XLA_VENV, "bin", "python")
    if not os.path.exists(python):
        why = f"torch_xla's cases need {XLA_VENV} (make setup builds it)"
        return [Verdict(impl, w.describe(), float("nan"), float("nan"), float("nan"), 0, "error", why)
                for impl, w in workloads]
    with tempfile.TemporaryDirectory(prefix="attnbench-confirm-") as folder:
        spec, out = os.path.join(folder, "spec.json"), os.path.join(folder, "out.json")
        with open(spec, "w", encoding="utf-8") as fh:
            json.dump({"rev_a": before, "rev_b": after, "repo": os.path.abspath(repo),
                       "cases": [{"impl": impl, "workload": w.to_dict()} for impl, w in workloads],
                       **{k: kwargs[k] for k in ("rounds", "threshold", "window_s", "budget_s")}}, fh)
        done = subprocess.run([python, "-m", "attnbench.run.compare", spec, out], capture_output=True,
                              text=True)
        for line in done.stderr.splitlines()[-len(workloads):]:
            kwargs["progress"](line)
        if done.returncode or not os.path.exists(out):
            why = f"{XLA_VENV}'s compare failed: {done.stderr.strip()[-300:]}"
            return [Verdict(impl, w.describe(), float("nan"), float("nan"), float("nan"), 0, "error", why)
                    for impl, w in workloads]
        return [Verdict(**v) for v in json.load(open(out, encoding="utf-8"))]


def write(results_dir: str, machine: str, commit_after: str, entries: list[dict]) -> str:
    """The confirmations of ``machine``'s run at ``commit_after``, merged into those already there."""
    file = confirmations.path(results_dir, machine, commit_after)
    old = []
    if os.path.exists(file):
        with open(file, encoding="utf-8") as fh:
            old = json.load(fh).get("cases", [])
    ids = {_identity(e) for e in entries}
    merged = [e for e in old if _identity(e) not in ids] + entries
    payload = {"machine": machine, "commit_after": commit_after, "cases": merged}
    os.makedirs(os.path.dirname(file), exist_ok=True)
    atomic_write_text(file, json.dumps(payload, indent=1, sort_keys=True, allow_nan=True) + "\n")
    return file


def _identity(e: dict) -> tuple:
    return tuple(str(e.get(k)) for k in ("commit_before", "env_name", "suite", "implementation", "seq_len",
                                         "workload", "phase", "dtype"))
