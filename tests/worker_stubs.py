"""Tasks for ``run.worker.Worker`` in the tests: importable by the spawned worker (``tests`` is a
package on the parent's ``sys.path``, which spawn hands to the child). No framework is imported."""

from __future__ import annotations

import os
import signal
import time


def pid_and(value):
    return os.getpid(), value


def sleep(seconds):
    time.sleep(seconds)


def exit_with(code):
    print("the task's last words", flush=True)
    os._exit(code)


def killed():
    os.kill(os.getpid(), signal.SIGKILL)


def attnbench_file():
    import attnbench

    return attnbench.__file__


def loaded_modules(prefix):
    import sys

    return sorted(name for name in sys.modules if name.startswith(prefix))
