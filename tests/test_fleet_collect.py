"""fleet-collect: every machine's results from the bucket merged into results/<machine>/, the bad
files warned about and left out, the rest kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from attnbench.fleet import collect

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["result", "params", "version"]


def _asv(machine: str, results: dict, env: str = "existing-py") -> dict:
    return {"commit_hash": "ab" * 20, "env_name": env, "params": {"machine": machine, "python": "3.11"},
            "result_columns": COLUMNS, "results": results, "durations": {}, "version": 2}


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _bucket(tmp_path: Path) -> Path:
    """A bucket copy in the runner's layout: two machines, and what a bad fleet can leave there."""
    root = tmp_path / "bucket" / "attnbench"
    tpu = root / "tpu-v5-lite-8" / "results"
    _write(tpu / "machine.json", {"machine": "tpu-v5-lite-8", "version": 1})
    _write(tpu / "abababab-existing-py.json",
           _asv("tpu-v5-lite-8", {"attention.Forward.track_x": [[1.0, "NaN"]]}))
    (tpu / "abababab-existing-py.json").write_text(  # asv's bare NaN, as asv writes it
        (tpu / "abababab-existing-py.json").read_text().replace('"NaN"', "NaN"))
    _write(tpu / "cdcdcdcd-existing-py.json", '{"commit_hash": "cdcd", "results": {"attention.F')  # truncated
    misfiled = _asv("h200", {"attention.Forward.track_x": [[9.0]]})
    _write(tpu / "efefefef-existing-py.json", misfiled)
    _write(tpu / "sidecars" / "abababab-existing-py.sidecar",
           {"versions": {"jax": "0.10.2"}, "cases": {"Forward|a|256|static|bfloat16": {}}})
    _write(tpu / "fleet" / "abababab.fleet",
           {"machine": "tpu-v5-lite-8", "attempts": [{"id": "2", "started_utc": "b"}]})
    _write(tpu / "traces" / "abababab-existing-py" / "a.csv", "step,seconds\n0,0.1\n")
    _write(tpu / "notes.txt", "stray")
    h200 = root / "h200" / "results"
    _write(h200 / "machine.json", {"machine": "h200", "version": 1})
    _write(h200 / "abababab-existing-py.json", _asv("h200", {"attention.Training.track_x": [[2.0]]}))
    _write(root / "h200" / "state" / "case-cache" / "x.case", "{}")  # working state, not history
    return tmp_path / "bucket"


def test_merge_keeps_the_good_files_and_warns_about_the_rest(tmp_path):
    results = tmp_path / "results"
    # what the history already holds for the TPU at that commit: one benchmark the fleet did not rerun
    _write(results / "tpu-v5-lite-8" / "abababab-existing-py.json",
           _asv("tpu-v5-lite-8", {"attention.Training.track_x": [[3.0]],
                                  "attention.Forward.track_x": [[0.5]]}))
    _write(results / "tpu-v5-lite-8" / "fleet" / "abababab.fleet",
           {"machine": "tpu-v5-lite-8", "attempts": [{"id": "1", "started_utc": "a"}]})
    report = collect.collect(str(_bucket(tmp_path)), results)

    warnings = "\n".join(report.warnings)
    assert "tpu-v5-lite-8/cdcdcdcd-existing-py.json does not parse" in warnings
    assert ("tpu-v5-lite-8/efefefef-existing-py.json holds results of machine 'h200', "
            "not 'tpu-v5-lite-8'") in warnings
    assert "tpu-v5-lite-8/notes.txt: not a results file" in warnings
    assert not (results / "tpu-v5-lite-8" / "cdcdcdcd-existing-py.json").exists()
    assert not (results / "tpu-v5-lite-8" / "efefefef-existing-py.json").exists()

    merged = json.loads((results / "tpu-v5-lite-8" / "abababab-existing-py.json").read_text())
    assert merged["results"]["attention.Training.track_x"] == [[3.0]]  # kept
    assert merged["results"]["attention.Forward.track_x"][0][0] == 1.0  # the fleet's value wins
    attempts = json.loads((results / "tpu-v5-lite-8" / "fleet" / "abababab.fleet").read_text())["attempts"]
    assert [a["id"] for a in attempts] == ["1", "2"]
    h200 = results / "h200"
    assert json.loads((h200 / "machine.json").read_text())["machine"] == "h200"
    assert (h200 / "abababab-existing-py.json").read_bytes() == \
        (tmp_path / "bucket/attnbench/h200/results/abababab-existing-py.json").read_bytes()  # byte for byte
    assert not (h200 / "state").exists() and not list(results.rglob("*.case"))
    assert (results / "tpu-v5-lite-8" / "traces" / "abababab-existing-py" / "a.csv").exists()
    assert (results / "tpu-v5-lite-8" / "sidecars" / "abababab-existing-py.sidecar").exists()

    again = collect.collect(str(tmp_path / "bucket"), results)  # idempotent
    assert not again.copied and not again.merged


def test_a_merged_asv_file_still_loads_in_asv(tmp_path):
    """A real committed results file split in two (history and fleet), merged back: asv reads it."""
    import pytest

    asv_results = pytest.importorskip("asv.results", reason="asv is in the main venv only")
    real = sorted((ROOT / "results" / "cpu-2core").glob("*-virtualenv-*.json"))[0]
    data = json.loads(real.read_text())
    names = sorted(data["results"])
    half = len(names) // 2
    history = {**data, "results": {k: data["results"][k] for k in names[:half]}}
    fleet_side = {**data, "results": {k: data["results"][k] for k in names[half:]}}
    _write(tmp_path / "results" / "cpu-2core" / real.name, history)
    _write(tmp_path / "bucket" / "cpu-2core" / real.name, fleet_side)
    report = collect.collect(str(tmp_path / "bucket"), tmp_path / "results")
    assert report.merged == [f"cpu-2core/{real.name}"] and not report.warnings
    merged = asv_results.Results.load(str(tmp_path / "results" / "cpu-2core" / real.name))
    assert sorted(merged.get_all_result_keys()) == names


def test_collect_command_line_on_a_bad_source(tmp_path):
    cmd = [sys.executable, "-m", "attnbench.fleet", "collect", "--from"]
    proc = subprocess.run([*cmd, str(tmp_path / "nope")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "no such folder" in proc.stderr
    proc = subprocess.run([*cmd, str(_bucket(tmp_path)), "--results", str(tmp_path / "results")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "fleet-collect:" in proc.stdout
