"""A stand-in for ``asv`` in the fleet runner's tests: fast, and preemptible on cue.

It takes the command lines the runner gives asv (``machine --yes --machine NAME`` and ``run
--bench REGEX --skip-existing-successful --machine NAME -E existing:ENV --set-commit-hash SHA``)
and behaves as asv does where the runner depends on it:

* one results file per machine x commit x environment, ``results/<machine>/<sha8>-<env>.json``,
  loaded at the start (a damaged one makes the run fail, as asv's does) and written only when the
  run ends, not atomically;
* ``--skip-existing-successful`` skips a benchmark whose stored values hold no failure;
* the benchmarks of a class share one measurement per case through the suite's real measure-once
  cache (``attnbench.asv.suite.measure_suite`` with ``ATTNBENCH_CASE_CACHE``); the fake
  measurement appends the case to ``$FAKE_ASV_LEDGER`` once it is stored, so a test can count how
  often each case was measured.

Cues (environment): ``FAKE_ASV_CASE_SECONDS`` (how long a case takes), ``FAKE_ASV_HANG_AFTER_CASES=N``
(stop, as if mid-measurement, once this process measured N cases, with a worker process in a process
group of its own, as asv's are: its pid in ``$FAKE_ASV_LEDGER.worker``), ``FAKE_ASV_HANG_IN_SAVE=TEXT``
(while saving the results of a ``--bench`` containing TEXT, write half the file, touch
``$FAKE_ASV_LEDGER.saving`` and hang), for the test to send its SIGTERM then.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from attnbench.asv import suite as asv_suite
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case
from attnbench.run import case_cache, sweep

CLASSES = {"Forward": [("fake-a", 64), ("fake-a", 128), ("fake-b", 64), ("fake-b", 128), ("fake-c", 64),
                       ("fake-c", 128)],
           "Training": [("fake-a", 64), ("fake-b", 64), ("fake-c", 64)]}
METRICS = ("seconds_per_step", "usd_per_step")
MODES = {"Forward": "fwd", "Training": "fwd_bwd"}
_measured_here = 0


def cases_of(cls: str):
    return [(name, Workload(seq_q=seq, causal=True, mode=MODES[cls]), "static") for name, seq in CLASSES[cls]]


def admit_all(cases, size) -> tuple[dict, list[Case]]:
    """``asv.suite.plan_cases`` without its support check: every case admitted, in order."""
    return {}, [Case(impl, workload, size.options(regime, trace_dir=None, compile_cache="cold"),
                     own_process=size.own_process(workload, regime)) for impl, workload, regime in cases]


def fake_measure(cases, on_record=None, **kwargs):
    """``sweep.measure_cases`` without measuring: a record per case, after a short sleep."""
    global _measured_here
    out = []
    for i, case in enumerate(cases):
        hang_after = int(os.environ.get("FAKE_ASV_HANG_AFTER_CASES", "0") or 0)
        if hang_after and _measured_here >= hang_after:
            # "mid-measurement": a measuring worker in a process group of its own, as asv's
            # forkserver and benchmark processes are; the test's SIGTERM lands here
            import subprocess

            sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
            worker = subprocess.Popen(sleeper, process_group=0)
            Path(os.environ["FAKE_ASV_LEDGER"] + ".worker").write_text(str(worker.pid))
            time.sleep(3600)
        time.sleep(float(os.environ.get("FAKE_ASV_CASE_SECONDS", "0.02")))
        record = {"status": "ok", "impl": case.impl, "seconds_per_step": case.workload.seq_q * 1e-5,
                  "usd_per_step_on_demand": case.workload.seq_q * 1e-9}
        if on_record:
            on_record(i, record)
        out.append(record)
        _measured_here += 1
        with open(os.environ["FAKE_ASV_LEDGER"], "a", encoding="utf-8") as ledger:
            ledger.write(f"{os.environ['FAKE_ASV_ENV']}|{case.key}\n")
    return out


def track_value(record: dict, metric: str):
    return record["seconds_per_step"] if metric == "seconds_per_step" else record["usd_per_step_on_demand"]


def main(argv: list[str]) -> int:
    asv_suite.plan_cases, sweep.measure_cases = admit_all, fake_measure  # the suite, without measuring
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("--config", required=True)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--yes", action="store_true")
    parser.add_argument("--bench")
    parser.add_argument("--skip-existing-successful", action="store_true")
    parser.add_argument("-E", dest="env_spec")
    parser.add_argument("--set-commit-hash")
    args = parser.parse_args(argv)
    results = Path(args.config).parent / "results" / args.machine
    results.mkdir(parents=True, exist_ok=True)
    if args.command == "machine":
        (results / "machine.json").write_text(json.dumps({"machine": args.machine, "version": 1}))
        return 0
    assert args.command == "run" and args.env_spec.startswith("existing:"), argv
    env = "existing-" + args.env_spec.split(":", 1)[1]
    os.environ["FAKE_ASV_ENV"] = env
    with open(os.environ["FAKE_ASV_LEDGER"] + ".env", "a", encoding="utf-8") as fh:  # what asv was handed
        fh.write(f"ATTNBENCH_CATALOG_PRICE={os.environ.get('ATTNBENCH_CATALOG_PRICE', '')}\n")
    commit = args.set_commit_hash
    path = results / f"{commit[:8]}-{env}.json"
    stored = json.loads(path.read_text()) if path.exists() else {  # damaged: fails here, as asv does
        "version": 2, "commit_hash": commit, "env_name": env, "params": {"machine": args.machine},
        "results": {}}
    wanted = [f"attention.{cls}.track_{m}" for cls in CLASSES for m in METRICS
              if re.search(args.bench, f"attention.{cls}.track_{m}")]
    if args.skip_existing_successful:
        wanted = [b for b in wanted if not (b in stored["results"] and None not in stored["results"][b][0])]
    cache = case_cache.CaseCache(os.environ[case_cache.CACHE_ENV], args.machine, commit, env, {"fake": 1})
    for cls in CLASSES:
        benchmarks = [b for b in wanted if b.split(".")[1] == cls]
        if not benchmarks:
            continue
        measured = asv_suite.measure_suite(cases_of(cls), benchmark=cls, cache=cache)
        records = list(measured.values())
        for bench in benchmarks:
            metric = bench.rsplit("track_", 1)[1]
            stored["results"][bench] = [[track_value(r, metric) for r in records],
                                        [[f"{n}|{s}" for n, s in CLASSES[cls]]]]
    text = json.dumps(stored, indent=1)
    with open(path, "w", encoding="utf-8") as fh:  # asv's save: not atomic
        half = len(text) // 2
        fh.write(text[:half])
        fh.flush()
        cue = os.environ.get("FAKE_ASV_HANG_IN_SAVE")
        if cue and cue in args.bench:
            Path(os.environ["FAKE_ASV_LEDGER"] + ".saving").touch()
            time.sleep(3600)
        fh.write(text[half:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
