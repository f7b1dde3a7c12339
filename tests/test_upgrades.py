"""What an upgrade costs: the paired rounds' judging, the memory alerts, the planted faults, bad input."""

import dataclasses
import json
import os
import random
import sys

import pytest

from attnbench.releases import matrix, memory, planted, rounds, upgrade
from attnbench.run.adaptive import RoundPlan
from tests.conftest import FRAMEWORKS

needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="needs jax installed")


def _rounds(n: int, factor: float, seed: int, noise: float = 0.03) -> tuple[list[float], list[float]]:
    """Synthetic paired rounds: the machine's drift moves both sides of a round alike."""
    rng = random.Random(seed)
    before, after = [], []
    for _ in range(n):
        machine = 1e-3 * rng.uniform(0.8, 1.3)  # what moved the host this round
        before.append(machine * rng.lognormvariate(0.0, noise))
        after.append(machine * factor * rng.lognormvariate(0.0, noise))
    return before, after


def test_a_20_percent_slowdown_is_slower_and_an_aa_pair_equal():
    slow = upgrade.judge(*_rounds(24, 1.20, seed=1))
    assert slow["state"] == upgrade.SLOWER and 1.1 < slow["ratio_low"] <= slow["ratio"] <= slow["ratio_high"]
    assert slow["ratio"] == pytest.approx(1.2, rel=0.05)
    same = upgrade.judge(*_rounds(24, 1.0, seed=2))
    assert same["state"] == upgrade.SAME and 0.9 <= same["ratio_low"] and same["ratio_high"] <= 1.1
    fast = upgrade.judge(*_rounds(24, 0.6, seed=3))
    assert fast["state"] == upgrade.FASTER


def test_too_few_or_too_noisy_rounds_cannot_tell_and_the_interval_stays_positive():
    few = upgrade.judge(*_rounds(5, 1.5, seed=4))  # 5 rounds carry no 99% interval of a median
    assert few["state"] == upgrade.CANT_TELL
    noisy = upgrade.judge(*_rounds(12, 1.05, seed=5, noise=0.5))
    assert noisy["state"] == upgrade.CANT_TELL and noisy["ratio_low"] > 0
    assert upgrade.judge([], [])["state"] == upgrade.CANT_TELL


def test_a_look_settles_only_at_its_stricter_confidence():
    plan = RoundPlan(min_rounds=12, max_rounds=40, look_every=4)
    before, after = _rounds(40, 1.20, seed=6)
    filed = [[i + 1, b, a] for i, (b, a) in enumerate(zip(before, after, strict=True))]
    assert rounds.settled(filed, plan)
    assert not rounds.settled(filed[:6], plan)


def test_consecutive_steps_follow_release_order():
    sides = {v: upgrade.Side(v, f"/py{v}") for v in ("0.10.2", "0.6.2", "0.8.2")}
    names = [s.name for s in upgrade.consecutive_steps("jax", sides)]
    assert names == ["jax 0.6.2 -> 0.8.2", "jax 0.8.2 -> 0.10.2"]


def test_the_table_counts_decided_steps_and_names_the_width(tmp_path):
    store = {"jax 0.9.2 -> 0.10.2": {"framework": "jax", "before": "0.9.2", "after": "0.10.2",
                                     "kind": upgrade.UPGRADE, "cells": {}}}
    cells = store["jax 0.9.2 -> 0.10.2"]["cells"]
    for i, factor in enumerate((1.2, 1.0, 1.02)):
        before, after = _rounds(24 if factor != 1.02 else 6, factor, seed=10 + i)
        cells[f"k{i}|w"] = {"impl": f"k{i}", "workload": "w", "stopped": "settled",
                            "rounds": [[r, b, a] for r, (b, a) in enumerate(zip(before, after, strict=True))]}
    cells["k9|w"] = {"impl": "k9", "workload": "w", "rounds": [], "stopped": upgrade.NOT_TIMED,
                     "reason": "jax 0.9.2: unsupported: another platform's kernel"}
    path = upgrade.write_table(upgrade.table_rows(store, "abc"), str(tmp_path / "u.csv"))
    before = open(path).read()
    frame = upgrade.load_table(path)
    assert open(path).read() == before  # reading never writes
    states = dict(zip(frame["impl"], frame["state"], strict=True))
    assert states == {"k0": upgrade.SLOWER, "k1": upgrade.SAME, "k2": upgrade.CANT_TELL,
                      "k9": upgrade.NOT_TIMED}
    assert upgrade.share_decided(frame) == (2, 3)
    assert (frame["width"].dropna() >= 1).all()


def _tpu_row(jax, libtpu, environment, temp, impl="jax-xla", status=matrix.OK):
    return {"framework": "jax", "release": jax, "libtpu": libtpu, "environment": environment,
            "target": "tpu-v5e", "impl": impl, "seq_len": 4096, "status": status,
            "peak_bytes": temp + 1000, "temp_bytes": temp, "inserted_copy_bytes": 0}


def test_memory_changes_name_the_release_pair_kernel_and_what_grew():
    import pandas as pd

    frame = pd.DataFrame([
        _tpu_row("0.8.2", "0.0.32.1", "with companions", 1000),
        _tpu_row("0.9.2", "0.0.37", "with companions", 1000),
        _tpu_row("0.10.2", "0.0.42.1", "with companions", 1500),
        _tpu_row("0.10.2", "0.0.37", "libtpu 0.0.37", 1000),
        _tpu_row("0.10.2", "0.0.42.1", "bare", 9999),  # the bare environment is not a build of its own
    ])
    found = memory.changes(frame)
    temps = [c for c in found if c["figure"] == "temporaries"]
    assert {(c["axis"], c["before"], c["after"]) for c in temps} == {
        ("jax[tpu]", "jax 0.9.2 + libtpu 0.0.37", "jax 0.10.2 + libtpu 0.0.42.1"),
        ("libtpu alone", "jax 0.10.2 + libtpu 0.0.37", "jax 0.10.2 + libtpu 0.0.42.1")}
    assert all(c["change"] == pytest.approx(0.5) and "+50%" in c["alert"] for c in temps)
    planted_frame = pd.DataFrame([_tpu_row("0.10.2", "0.0.42.1", "with companions", 2100)])
    grown = [c for c in memory.changes(frame, planted_frame) if c["planted"] and c["figure"] == "temporaries"]
    assert len(grown) == 1 and grown[0]["change"] == pytest.approx(0.4)
    assert "planted-bloat" in grown[0]["after"] and "jax 0.10.2 + libtpu 0.0.42.1" == grown[0]["before"]


def test_a_build_that_broke_is_no_memory_change():
    import pandas as pd

    frame = pd.DataFrame([_tpu_row("0.8.2", "0.0.32.1", "with companions", 1000),
                          _tpu_row("0.9.2", "0.0.37", "with companions", 0, status=matrix.COMPILE_FAILED)])
    assert memory.changes(frame) == []


@pytest.mark.parametrize("framework,version,words", [
    ("jax", "0.7.9", "not a release of the matrix"),
    ("jax", "0.11.0", "cannot install here"),
    ("torch", "2.15.0", "pip constraints"),
    ("flax", "0.1", "unknown framework"),
])
def test_a_release_the_matrix_cannot_take_is_named(framework, version, words):
    with pytest.raises(ValueError, match=words):
        matrix.release(framework, version)


@pytest.mark.parametrize("argv,words", [
    (["--release", "jax=0.7.9"], "not a release of the matrix"),
    (["--release", "jax=0.12.1"], "cannot install here"),
    (["--release", "jax"], "FRAMEWORK=VERSION"),
    (["--budget", "0"], "more than 0 seconds"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(argv, words, monkeypatch, capsys):
    from attnbench import cli
    from attnbench.releases import run

    def never(*a, **k):
        raise AssertionError("nothing may run on bad input")

    monkeypatch.setattr(run, "run_matrix", never)
    monkeypatch.setattr(run, "run_upgrades", never)
    with pytest.raises(SystemExit) as exit_:
        sys.exit(cli.main(["releases", *argv]))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and words in err and len(err.splitlines()) == 1


def test_the_planted_overlays_change_one_kernel_and_say_so(tmp_path):
    slow = planted.overlay(planted.SLOW, root=str(tmp_path))
    text = open(os.path.join(slow, "sitecustomize.py")).read()
    assert "jax-xla" in text and "0.2" in text and "planted fault" in text
    bloated = planted.overlay(planted.BLOATED, root=str(tmp_path))
    bloat = open(os.path.join(bloated, "sitecustomize.py")).read()
    assert "1.4" in bloat and "_read_compiled" in bloat
    with pytest.raises(ValueError, match="planted fault"):
        planted.overlay("faster", root=str(tmp_path))


@needs_jax
def test_paired_rounds_in_two_workers_time_both_sides_and_resume(tmp_path):
    """Two real worker processes (this venv, and this venv under the planted 20% slowdown) time
    jax-xla in rounds; the store is saved at each look, and a second call goes on from it."""
    here = upgrade.Side("0.10.2", sys.executable)
    overlay = planted.overlay(planted.SLOW, str(tmp_path))
    slow = upgrade.Side("0.10.2+planted-slow", sys.executable, (overlay,))
    step = upgrade.Step("jax", here, slow, upgrade.PLANTED)
    plan = RoundPlan(min_rounds=8, max_rounds=8, look_every=4, budget_s=120, min_samples=4, restart_every=4)
    store, path = {}, tmp_path / "rounds.json"

    def save():
        path.write_text(json.dumps(store))

    rounds.run_step(step, [("jax-xla", "causal-256"), ("jax-cudnn", "causal-256")], plan, store, save,
                     progress=lambda line: None)
    cells = json.loads(path.read_text())[step.name]["cells"]
    assert cells["jax-cudnn|causal-256"]["stopped"] == upgrade.NOT_TIMED  # refused on a CPU, with why
    xla = cells["jax-xla|causal-256"]
    assert len(xla["rounds"]) == 8 and xla["stopped"] in ("settled", "max rounds")
    assert all(b > 0 and a > 0 for _, b, a in xla["rounds"])  # both sides timed in every round
    # (how large the planted 20% reads is a measurement: results/LOG.md, not a timed unit test)
    store = json.loads(path.read_text())  # a new run reads what the last one filed
    store[step.name]["cells"]["jax-xla|causal-256"]["stopped"] = None  # as if interrupted before its look
    longer = dataclasses.replace(plan, max_rounds=12)
    rounds.run_step(step, [("jax-xla", "causal-256")], longer, store, save, progress=lambda line: None)
    assert [r[0] for r in store[step.name]["cells"]["jax-xla|causal-256"]["rounds"]] == list(range(1, 13))


def test_the_report_names_the_planted_slowdown_and_growth_with_their_release_pairs(tmp_path):
    from attnbench.releases.table import matrix_frame, write_table
    from attnbench.report.releases import releases_part

    results, out = tmp_path / "results", tmp_path / "out"
    (results / "releases").mkdir(parents=True)
    out.mkdir()
    def cell(jax, libtpu, temp):
        return {**_tpu_row(jax, libtpu, None, temp), "jax": jax, "workload": "causal-tpu",
                "companions": "absl-py 2.5.1, chex 0.1.90"}

    rows = [cell("0.9.2", "0.0.37", 1000), cell("0.10.2", "0.0.42.1", 1000)]
    write_table(matrix_frame(rows), str(results / "releases" / "releases.csv"))
    write_table(matrix_frame([cell("0.10.2", "0.0.42.1", 1400)]), str(results / "releases" / "planted.csv"))
    store = {}
    for name, kind, before_v, after_v, factor in (
            ("jax 0.9.2 -> 0.10.2", upgrade.UPGRADE, "0.9.2", "0.10.2", 1.0),
            ("jax 0.10.2 -> 0.10.2", upgrade.CONTROL, "0.10.2", "0.10.2", 1.0),
            ("jax 0.10.2 -> 0.10.2+planted-slow", upgrade.PLANTED, "0.10.2", "0.10.2+planted-slow", 1.2)):
        before, after = _rounds(24, factor, seed=len(store))
        store[name] = {"framework": "jax", "before": before_v, "after": after_v, "kind": kind, "cells": {
            "jax-xla|causal-256": {"impl": "jax-xla", "workload": "causal-256", "stopped": "settled",
                                   "rounds": [[i, b, a] for i, (b, a) in enumerate(zip(before, after,
                                                                                        strict=True))]}}}
    upgrade.write_table(upgrade.table_rows(store, "abc"), str(results / "releases" / "upgrades.csv"))
    part = releases_part(str(results), str(out))["upgrades"]
    assert (part["decided"], part["timed"]) == (1, 1) and part["controls"] == f"1 {upgrade.SAME}"
    first_bad = part["first_bad"].cells
    text = first_bad.to_csv()
    assert "jax 0.10.2 -> 0.10.2+planted-slow" in text and "slower" in text
    assert "jax 0.10.2 + libtpu 0.0.42.1 + planted-bloat" in text and "temporaries" in text and "+40%" in text
    assert (out / "upgrades.png").read_bytes()[:4] == b"\x89PNG"
