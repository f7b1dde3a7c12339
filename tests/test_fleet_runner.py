"""The fleet's resumable run loop, preempted for real (SIGTERM) and started again.

The benchmark group runner is ``tests/fleet_fake_asv.py``: asv's command line and results-file
behaviour (written only when a run ends, not atomically), the suite's real measure-once case cache,
and a measurement that takes 20 ms and logs each case it measured. No cloud, no SkyPilot.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.asv import suite as asv_suite
from attnbench.fleet import runner
from attnbench.run import case_cache, sweep
from tests import fleet_fake_asv as fake

FAKE = Path(fake.__file__).resolve()
MACHINE = "fake-tpu"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ENVS = ("main", "xla")
GROUPS = [r"^attention\.Forward\.track_seconds_per_step(\(|$)",
          r"^attention\.Forward\.track_usd_per_step(\(|$)",
          r"^attention\.Training\.track_(seconds_per_step|usd_per_step)(\(|$)", "."]
ALL_BENCHMARKS = {f"attention.{c}.track_{m}" for c in fake.CLASSES for m in fake.METRICS}


def _every_case() -> list[str]:
    from attnbench.asv.suite import case_key

    return sorted(f"existing-{env}|{case_key(*case)}" for env in ENVS for cls in fake.CLASSES
                  for case in fake.cases_of(cls))


@pytest.fixture()
def fleet(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "results").mkdir(parents=True)
    (checkout / "asv.conf.json").write_text("{}")
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    ledger = tmp_path / "measured.log"
    ledger.touch()
    return checkout, bucket, ledger


def _start(checkout: Path, bucket: Path, ledger: Path, **cues) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "attnbench.fleet.runner", "--machine", MACHINE, "--commit", COMMIT,
           "--checkout", str(checkout), "--bucket", str(bucket), "--asv", sys.executable, str(FAKE)]
    for env in ENVS:
        cmd += ["--env", f"existing:{env}"]
    for group in GROUPS:
        cmd += ["--group", group]
    env = {**os.environ, "FAKE_ASV_LEDGER": str(ledger),
           **{f"FAKE_ASV_{k.upper()}": str(v) for k, v in cues.items()}}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the runner ended early ({proc.returncode}):\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out:\n{proc.stdout.read()}")
        time.sleep(0.05)


def _preempt(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == runner.STOPPED_EXIT, out
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _ledger(ledger: Path) -> list[str]:
    return [line for line in ledger.read_text().splitlines() if line]


def _bucket_results(bucket: Path) -> dict[str, bytes]:
    root = bucket / "attnbench" / MACHINE / "results"
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_preempted_twice_then_resumed_measures_every_case_once_and_loses_nothing(fleet):
    checkout, bucket, ledger = fleet
    local = checkout / "results" / MACHINE

    # 1. Preempted in the middle of the first group's measurement (4 of its 6 cases done).
    proc = _start(checkout, bucket, ledger, hang_after_cases=4)
    _wait_for(lambda: Path(f"{ledger}.worker").exists(), proc)  # measuring the fifth case
    _preempt(proc)
    assert len(_ledger(ledger)) == 4
    worker = int(Path(f"{ledger}.worker").read_text())  # asv's own process groups die with the job too
    assert not _alive(worker)
    cache_files = list((bucket / "attnbench" / MACHINE / "state" / "case-cache").rglob("*.case"))
    assert len(cache_files) == 4  # each measured case reached the bucket as it ended

    # 2. A new VM (nothing local survives), preempted while asv writes a Training group's results.
    shutil.rmtree(local)
    proc = _start(checkout, bucket, ledger, hang_in_save="Training")
    _wait_for(lambda: Path(f"{ledger}.saving").exists(), proc)
    published_before = _bucket_results(bucket)
    _preempt(proc)
    truncated = local / f"{COMMIT[:8]}-existing-main.json"
    with pytest.raises(ValueError):
        json.loads(truncated.read_text())  # asv's non-atomic save, cut short
    assert _bucket_results(bucket) == published_before  # nothing half-written reached the bucket

    # 3. The job restarts on the same VM and finishes.
    Path(f"{ledger}.saving").unlink()
    proc = _start(checkout, bucket, ledger)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "is damaged" in out and "restoring the bucket's copy" in out

    measured = _ledger(ledger)
    assert sorted(measured) == _every_case()  # every case of both environments, each exactly once
    final = _bucket_results(bucket)
    for env in ENVS:
        data = json.loads(final[f"{COMMIT[:8]}-existing-{env}.json"])
        assert set(data["results"]) == ALL_BENCHMARKS
        assert all(None not in value[0] for value in data["results"].values())
    for name, content in published_before.items():  # what was published before stays, value for value
        if name.endswith(".json") and name != "machine.json":
            before, after = json.loads(content)["results"], json.loads(final[name])["results"]
            assert {k: after[k] for k in before} == before
    state = bucket / "attnbench" / MACHINE / "state"
    progress = json.loads((state / f"progress-{COMMIT[:8]}.json").read_text())
    assert set(progress["groups"]) == set(GROUPS)
    provenance = json.loads(final[f"fleet/{COMMIT[:8]}.fleet"])
    assert len(provenance["attempts"]) == 3 and "finished_utc" in provenance["attempts"][-1]


@pytest.mark.slow
def test_a_finished_run_started_again_measures_nothing(fleet):
    checkout, bucket, ledger = fleet
    proc = _start(checkout, bucket, ledger)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    first = _ledger(ledger)
    assert sorted(first) == _every_case()
    shutil.rmtree(checkout / "results" / MACHINE)  # even from a fresh VM
    proc = _start(checkout, bucket, ledger)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert _ledger(ledger) == first
    assert out.count("done before") == len(GROUPS)


def test_restore_replaces_damaged_files_and_publish_never_ships_one(tmp_path):
    bucket = tmp_path / "bucket"
    run = runner.Runner(machine=MACHINE, commit=COMMIT, checkout=tmp_path / "co", bucket=bucket, asv=[],
                        envs=[], groups=[])
    good = json.dumps({"results": {"a": [[1.0]]}, "params": {"machine": MACHINE}})
    remote = bucket / "attnbench" / MACHINE / "results"
    remote.mkdir(parents=True)
    (remote / "x.json").write_text(good)
    run.results.mkdir(parents=True)
    (run.results / "x.json").write_text(good[:10])  # truncated by a kill
    (run.results / "y.json").write_text("{not json")  # damaged, no copy anywhere
    run.restore()
    assert (run.results / "x.json").read_text() == good
    assert not (run.results / "y.json").exists()
    assert list(run.results.glob("y.json.damaged-*"))
    (run.results / "z.json").write_text('{"results": {}, "v": NaN}')  # asv's bare NaN is fine
    (run.results / "w.json").write_text('{"trunc')
    assert run.publish() == 1
    assert (remote / "z.json").exists() and not (remote / "w.json").exists()


def _measuring(monkeypatch, sweeps: list) -> None:
    """``measure_suite`` with every case admitted and a fake sweep that notes the cases it got."""
    def measure(cases, on_record=None, **kwargs):
        sweeps.append(cases)
        out = []
        for i, case in enumerate(cases):
            out.append({"status": "ok", "n": i, "mode": case.workload.mode})
            if on_record:
                on_record(i, out[-1])
        return out

    monkeypatch.setattr(asv_suite, "plan_cases", fake.admit_all)
    monkeypatch.setattr(sweep, "measure_cases", measure)


def test_case_cache_measures_only_the_missing_cases_and_survives_a_damaged_file(tmp_path, monkeypatch):
    cache = case_cache.CaseCache(str(tmp_path), "m", COMMIT, "env", {"suite": "smoke"})
    cases = fake.cases_of("Forward")
    sweeps = []
    _measuring(monkeypatch, sweeps)
    first = asv_suite.measure_suite(cases[:2], "Forward", cache=cache)
    everything = asv_suite.measure_suite(cases, "Forward", cache=cache)
    assert [len(s) for s in sweeps] == [2, 4] and len(everything) == 6
    assert {k: everything[k] for k in first} == first  # the first two were read, not measured again
    Path(cache.path(list(first)[0])).write_text("{trunc")
    asv_suite.measure_suite(cases, "Forward", cache=cache)
    assert [len(s) for s in sweeps] == [2, 4, 1]  # the damaged one only
    other = case_cache.CaseCache(str(tmp_path), "m", COMMIT, "env", {"suite": "full"})
    assert other.load(list(everything)) == {}  # other settings never read these records


def test_the_first_class_measures_the_others_cases_in_its_sweep_and_hands_them_over(tmp_path, monkeypatch):
    """make bench's run-long cache: one sweep (one set of round workers) per environment."""
    from attnbench.asv.suite import case_key

    cache = case_cache.CaseCache(str(tmp_path), "m", COMMIT, "env", {"suite": "smoke"})
    forward, training = fake.cases_of("Forward"), fake.cases_of("Training")
    sweeps = []
    _measuring(monkeypatch, sweeps)
    got_forward = asv_suite.measure_suite(forward, "Forward", cache=cache, also={"Training": training})
    got_training = asv_suite.measure_suite(training, "Training", cache=cache, also={"Forward": forward})
    assert [[c.key for c in s] for s in sweeps] == [[case_key(*c) for c in forward + training]]  # one sweep
    assert list(got_forward) == [case_key(*c) for c in forward]  # each class gets its own cases only
    assert list(got_training) == [case_key(*c) for c in training]
    assert {r["mode"] for r in got_training.values()} == {"fwd_bwd"}
    # Without a cache nothing could hand them on: each class measures its own, and only its own.
    sweeps.clear()
    asv_suite.measure_suite(training, "Training", cache=None, also={"Forward": forward})
    assert [[c.key for c in s] for s in sweeps] == [[case_key(*c) for c in training]]


def test_default_groups_cover_every_metric_once_per_class():
    import re

    from attnbench.core import metrics

    groups = runner.default_groups()
    assert groups[-1] == "."
    for cls in ("Forward", "Training"):
        for m in metrics.METRICS:
            for name in (f"attention.{cls}.track_{m.name}",  # asv also matches the parameterized name
                         f"attention.{cls}.track_{m.name}('jax-xla', 1024)"):
                assert sum(bool(re.search(g, name)) for g in groups[:-1]) == 1, name
