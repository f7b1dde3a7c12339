"""A sweep that says where it is (run/progress.py): its line, its heartbeat, and the file the
terminal follows while asv captures the sweep's own output."""

from __future__ import annotations

import threading
import time

from attnbench.run import progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_counts_cases_names_the_phase_and_estimates_what_is_left():
    clock = Clock()
    where = progress.Progress("Forward", 4, rounds_budget_s=150.0, clock=clock)
    assert where.line() == "attnbench progress Forward: 0/4 cases, first pass, 0 s spent, ETA not known yet"
    clock.now += 20
    where.recorded(0)
    where.recorded(1)
    # two cases in 20 s: two more at 10 s each, then at most the rounds' 150 s (170 s)
    assert where.line() == "attnbench progress Forward: 2/4 cases, first pass, 20 s spent, ETA up to 3 min"
    where.recorded(2)
    where.recorded(3)
    assert where.phase == "later rounds"
    clock.now += 100
    where.recorded(0)  # a look in the rounds: no case counted twice
    assert where.line() == "attnbench progress Forward: 4/4 cases, later rounds, 2 min spent, ETA up to 50 s"


def test_a_resumed_sweep_counts_what_it_had_and_may_start_in_its_rounds():
    where = progress.Progress("Models", 2, rounds_budget_s=None, clock=Clock(), done={0, 1})
    assert where.phase == "later rounds"
    assert where.line().endswith("ETA not known yet")


def test_the_heartbeat_writes_at_start_between_and_at_the_end():
    lines: list[str] = []
    where = progress.Progress("Forward", 1, clock=Clock())
    with progress.heartbeat(where, every_s=0.01, write=lines.append):
        time.sleep(0.1)
        where.recorded(0)
    assert len(lines) >= 3
    assert lines[0].startswith("attnbench progress Forward: 0/1 cases, first pass")
    assert lines[-1].startswith("attnbench progress Forward: 1/1 cases, done")
    assert progress.EVERY_S <= 30  # issue 56: a line at least every 30 s


def test_a_sweep_cut_short_says_stopped():
    lines: list[str] = []
    try:
        where = progress.Progress("Forward", 3, clock=Clock())
        with progress.heartbeat(where, every_s=60, write=lines.append):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert ", stopped," in lines[-1]
    assert "stopped; every case measured so far is kept" in lines[-2]


def test_lines_appended_to_the_file_reach_the_follower_as_they_come(tmp_path, monkeypatch):
    path = tmp_path / "progress.log"
    monkeypatch.setenv(progress.FILE_ENV, str(path))
    seen: list[str] = []
    with progress.follow(str(path), write=seen.append, poll_s=0.01):
        progress.emit("one")
        deadline = time.time() + 5
        while not seen and time.time() < deadline:
            time.sleep(0.01)
        assert seen == ["", "one"]  # read while the block still runs, on a line of its own
        writer = threading.Thread(target=progress.emit, args=("two",))
        writer.start()
        writer.join()
    assert seen == ["", "one", "two"]
    assert path.read_text() == "one\ntwo\n"


def test_a_file_that_never_comes_is_no_error(tmp_path):
    seen: list[str] = []
    with progress.follow(str(tmp_path / "never.log"), write=seen.append, poll_s=0.01):
        time.sleep(0.05)
    assert seen == []


def _record(label: str, tokens_per_s: float) -> dict:
    return {"status": "ok", "label": label, "framework": "jax", "useful_tokens_per_s": tokens_per_s,
            "execution": "compiled"}


def test_the_first_pass_ends_with_a_provisional_verdict_of_the_ways_the_verdict_prices():
    from types import SimpleNamespace

    from attnbench.asv.sizes import FORWARD

    workload = FORWARD
    cases = [SimpleNamespace(impl=impl, regime=regime, workload=workload)
             for impl, regime in (("jax-blockwise-flash", "static"), ("jax-blockwise-flash", "bucketed"),
                                  ("jax-xla", "static"))]
    first = [_record("forced-flash", 100.0), _record("forced-flash", 200.0), _record("native", 160.0)]
    lines: list[str] = []
    where = progress.Progress("Forward", 3, clock=Clock(), cases=cases, write=lines.append)
    for i, record in enumerate(first):
        assert not lines
        where.recorded(i, record)
    [line] = lines
    # the forced kernel's cheaper way (bucketed, 200 tokens/s) against the native one: 160/200
    assert line.startswith(f"attnbench progress provisional verdict, jax {workload.describe()}: forced "
                           "jax-blockwise-flash (bucketed) costs 0.80x native jax-xla (static) per useful "
                           "token")
    assert "not paired" in line


def test_asvs_sigterm_stops_a_sweep_as_ctrl_c_does():
    import os
    import signal

    import pytest

    lines: list[str] = []
    where = progress.Progress("Forward", 2, clock=Clock())
    with pytest.raises(KeyboardInterrupt), progress.stopping_on_sigterm(), \
            progress.heartbeat(where, every_s=60, write=lines.append):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert ", stopped," in lines[-1]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after


def test_ctrl_c_waits_for_asv_to_stop_its_benchmark_process(monkeypatch):
    import subprocess
    import sys

    import pytest

    from attnbench.asv import selection

    class Interrupted:
        def __init__(self, command, env):
            self.waits = []

        def wait(self, timeout=None):
            self.waits.append(timeout)
            if len(self.waits) == 1:
                raise KeyboardInterrupt
            return 0

        def kill(self):
            raise AssertionError("asv stopped in time: nothing to kill")

    made: list[Interrupted] = []

    def popen(command, env):
        made.append(Interrupted(command, env))
        return made[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(KeyboardInterrupt):
        selection.run_asv([sys.executable, "-c", "pass"], env={})
    assert made[0].waits == [None, selection.ASV_STOP_S]


def test_a_step_without_cases_ticks_with_its_budget_left():
    lines: list[str] = []
    clock = Clock()
    with progress.ticking("confirm", budget_s=90, every_s=0.01, write=lines.append, clock=clock):
        clock.now += 30
        deadline = time.time() + 5
        while not lines and time.time() < deadline:
            time.sleep(0.01)
        clock.now += 100
        count = len(lines)
        while len(lines) == count and time.time() < deadline:
            time.sleep(0.01)
    assert lines[0] == "attnbench progress confirm: 30 s spent, ETA up to 60 s"
    assert lines[-1] == "attnbench progress confirm: 2 min spent"  # past its budget: no ETA
