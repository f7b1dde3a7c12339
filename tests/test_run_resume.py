"""``attnbench run --out DIR --resume``: an interrupted sweep is finished by measuring only the cases
missing from its records; the rows already there stay byte for byte."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.skipif("numpy" not in FRAMEWORKS, reason="the sweep measures the numpy reference")
ROOT = Path(__file__).resolve().parents[1]
FAST = ["--impl", "reference-float64", "--regime", "static", "--steps", "2", "--min-seconds", "0.01",
        "--no-numerics", "--no-isolate", "--quiet"]


def _run(out: Path, seqs, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnbench", "run", *FAST, "--seq", *map(str, seqs),
                           "--out", str(out), *extra], capture_output=True, text=True, cwd=ROOT, timeout=600)


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_resume_measures_only_the_missing_cases_and_keeps_the_rest_byte_for_byte(tmp_path):
    out = tmp_path / "sweep"
    first = _run(out, [32, 48, 64])
    assert first.returncode == 0, first.stderr
    records = out / "records.csv"
    data = records.read_bytes()
    # An interruption after two cases leaves the table of those two (it is rewritten after every case).
    cut = data.index(b"\n", data.index(b"\n", data.index(b"\n") + 1) + 1) + 1
    records.write_bytes(data[:cut])
    kept = records.read_bytes()
    assert [r["seq_q"] for r in _rows(records)] == ["32", "48"]

    again = _run(out, [32, 48, 64, 96], "--resume")
    assert again.returncode == 0, again.stderr
    assert "resume: 2 cases already in" in again.stderr and "measuring the 2 missing" in again.stderr
    after = records.read_bytes()
    assert after.startswith(kept)  # the rows measured before, byte for byte, first
    rows = _rows(records)
    assert [r["seq_q"] for r in rows] == ["32", "48", "64", "96"]  # each case once
    assert rows[0]["run_started_utc"] == rows[1]["run_started_utc"] != rows[2]["run_started_utc"]

    done = _run(out, [32, 48, 64, 96], "--resume")  # nothing missing: nothing measured, nothing rewritten
    assert done.returncode == 0 and "measuring the 0 missing" in done.stderr
    assert records.read_bytes() == after


@pytest.mark.slow
def test_resume_refuses_other_measurement_options_and_needs_out(tmp_path):
    out = tmp_path / "sweep"
    assert _run(out, [32]).returncode == 0
    proc = _run(out, [32, 48], "--resume", "--steps", "3")
    assert proc.returncode == 2 and "--steps 2 then, 3 now" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "attnbench", "run", *FAST, "--seq", "32", "--resume"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 2 and "--resume needs --out DIR" in proc.stderr


def test_a_row_cut_mid_rounds_rejoins_the_sweep_with_its_rounds(tmp_path):
    """A written row whose later rounds were cut short (``rounds_complete`` False) is no done case: it
    comes back as a record, numbers and lists as they were written, for the sweep to go on from."""
    from attnbench.core.workload import Workload
    from attnbench.measure.engine import Case, Options
    from attnbench.run import adaptive, resume

    workload = Workload(batch=1, q_heads=1, seq_q=32, head_dim=8, causal=True)
    done, cut = (Case("reference-float64", workload.replace(seq_q=n, seq_k=n), Options()) for n in (32, 64))
    path = tmp_path / "records.csv"
    rows = [{**dict(zip(resume.IDENTITY, resume.case_identity(c.impl, c.workload, c.regime), strict=True)),
             "status": "ok", "seconds_per_step": 0.001, "round_ids": "[0, 1, 2]",
             "round_medians_s": "[0.001, 0.0011, 0.0009]", "rounds_complete": complete}
            for c, complete in ((done, True), (cut, False))]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    kept, todo, prior = resume.split(str(path), [done, cut])
    assert [r["seq_q"] for r in kept] == ["32"] and todo == [cut] and list(prior) == [0]
    record = prior[0]
    assert record["rounds_complete"] is False and record["seconds_per_step"] == 0.001
    assert [(v.round, v.median_s) for v in adaptive.round_values(record)] == [(0, 0.001), (1, 0.0011),
                                                                             (2, 0.0009)]


def test_the_options_file_is_no_json_asv_would_read_and_an_old_one_still_counts(tmp_path):
    """asv reads every ``*.json`` under ``results/`` as a result of its own and warns about a folder
    without its machine.json: a sweep's options go to ``run-args.txt``; a folder an older version
    wrote (``run-args.json``) still refuses a resume with other options."""
    import argparse
    import json

    from attnbench.run import resume

    args = argparse.Namespace(steps=2, price_kind=None)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    resume.check_args(str(fresh), args, resuming=False)
    assert [p.name for p in fresh.iterdir()] == ["run-args.txt"]
    assert json.loads((fresh / "run-args.txt").read_text())["steps"] == 2
    old = tmp_path / "old"
    old.mkdir()
    (old / "run-args.json").write_text(json.dumps({"steps": 3}))
    with pytest.raises(ValueError, match="--steps 3 then, 2 now"):
        resume.check_args(str(old), args)
