"""The one killable worker (``attnbench.run.worker.Worker``) every subprocess of the harness uses."""

from __future__ import annotations

import time

from attnbench.core import statuses
from attnbench.run.worker import Failure, Worker
from tests import worker_stubs as stubs


def test_a_worker_answers_call_after_call_in_one_process():
    with Worker(stubs.pid_and) as worker:
        (first, a), failure = worker.call(("a",), timeout_s=60)
        (second, b), _ = worker.call(("b",), timeout_s=60)
    assert failure is None and (a, b) == ("a", "b") and first == second


def test_a_timeout_is_a_failure_and_the_next_call_gets_a_fresh_process():
    with Worker(stubs.sleep) as worker:
        answer, failure = worker.call((30,), timeout_s=1)
        assert answer is None and failure == Failure(statuses.TIMEOUT, "no result within 1 s; worker killed")
        assert worker.pid is None  # killed, not left running
        assert worker.call((0,), timeout_s=60) == (None, None)


def test_a_death_names_its_exit_code_and_quotes_the_log_and_sigkill_reads_as_oom(tmp_path):
    log = tmp_path / "worker.log"
    with Worker(stubs.exit_with, log_path=str(log)) as worker:
        _, failure = worker.call((3,), timeout_s=60)
    assert failure.status == statuses.ERROR
    assert failure.reason == "worker died (exit code 3); its log ends: the task's last words"
    with Worker(stubs.killed) as worker:
        _, failure = worker.call((), timeout_s=60)
    assert failure.status == statuses.OOM and "SIGKILL" in failure.reason


def test_a_worker_in_another_checkout_imports_the_project_from_there(tmp_path):
    (tmp_path / "attnbench").mkdir()
    (tmp_path / "attnbench" / "__init__.py").write_text("")
    with Worker(stubs.attnbench_file, checkout=str(tmp_path)) as worker:
        path, failure = worker.call((), timeout_s=60)
    assert failure is None and path == str(tmp_path / "attnbench" / "__init__.py")


def test_a_fresh_workers_preload_is_not_part_of_the_calls_timeout():
    # The import takes 3 s and the call may take 1: the clock starts once the worker is ready.
    with Worker(stubs.loaded_modules) as worker:
        loaded, failure = worker.call(("tests.slow",), timeout_s=1, preload=("tests.slow_import_stub",))
    assert failure is None and loaded == ["tests.slow_import_stub"]


def test_a_worker_not_ready_in_time_is_a_timeout_that_names_what_it_was_importing():
    with Worker(stubs.loaded_modules, startup_timeout_s=1) as worker:
        answer, failure = worker.call(("tests",), timeout_s=60, preload=("tests.slow_import_stub",))
        assert answer is None and worker.pid is None
    assert failure == Failure(statuses.TIMEOUT, "worker not ready within 1 s (importing "
                                                "tests.slow_import_stub); killed")


def test_a_preload_that_does_not_import_leaves_the_task_to_say_so():
    with Worker(stubs.loaded_modules) as worker:
        loaded, failure = worker.call(("tests.no_such",), timeout_s=60, preload=("tests.no_such_module",))
    assert failure is None and loaded == []


def test_a_deadline_cuts_both_a_workers_start_and_its_call():
    # The run's deadline (ATTNBENCH_DEADLINE) holds a fresh worker's start (a 3 s import here, with
    # 600 s allowed) as well as the call.
    with Worker(stubs.loaded_modules) as worker:
        answer, failure = worker.call(("tests",), timeout_s=60, preload=("tests.slow_import_stub",),
                                      deadline=time.time() + 1)
        assert answer is None and worker.pid is None
    assert failure.status == statuses.TIMEOUT
    assert "(the time left before the deadline) (importing tests.slow_import_stub)" in failure.reason
    with Worker(stubs.sleep) as worker:
        worker.start()
        answer, failure = worker.call((30,), timeout_s=60, deadline=time.time() + 1)
    assert answer is None and failure.status == statuses.TIMEOUT
    assert failure.reason.startswith("no result within ") and "before the deadline" in failure.reason
