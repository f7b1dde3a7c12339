"""The client of a timing worker in a release's own environment (the worker: ``env_server.py``).

``python -m attnbench.releases.env_server`` runs under a release venv's python (this checkout first
on ``PYTHONPATH``), so jax, jaxlib or torch are that release's while the step is built and timed by
this checkout's code: what differs between two workers is the release. It reads one JSON request per
line on stdin and answers one JSON line on its own copy of stdout (fd 1 itself goes to stderr, so
that a library printing cannot corrupt an answer):

- ``{"op": "build", "impl": I, "workload": W}``: the matrix cell's step (``matrix.WORKLOADS[W]``)
  built and run once, kept warm for the process' life; answers ``status`` (``ok``, or the matrix's
  status of the stage that failed, with ``reason``), ``execution`` and the versions it runs.
- ``{"op": "block", "impl": I, "workload": W, "number": N}``: ``N`` calls of the warm step;
  answers ``seconds`` per call.

``EnvWorker`` starts one such process from another python and answers its calls, a ``Failure``
when the worker dies or does not answer in time (it is killed then; the next call starts a new one).
Values cross the boundary, never code: pyperf's worker is the model.
"""

from __future__ import annotations

import json
import os
import select
import subprocess

from attnbench.core import statuses
from attnbench.run.worker import Failure


class EnvWorker:
    """One worker process under ``python`` (a release venv's), ``pythonpath`` first on its path.

    ``call(request, timeout_s)`` answers ``(answer, None)`` or ``(None, Failure)``; a worker that
    failed is killed and the next call starts a fresh one. ``starts``: processes started."""

    def __init__(self, python: str, *, pythonpath: tuple[str, ...] = (), environ: dict | None = None,
                 startup_timeout_s: float = 120.0):
        self.python, self.pythonpath = python, tuple(pythonpath)
        self.environ, self.startup_timeout_s = dict(environ or {}), startup_timeout_s
        self._process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> Failure | None:
        self.close()
        checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, **self.environ,
               "PYTHONPATH": os.pathsep.join([*self.pythonpath, checkout])}
        self._process = subprocess.Popen(
            [self.python, "-m", "attnbench.releases.env_server"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)
        self.starts += 1
        answer, failure = self._answer(self.startup_timeout_s)
        if failure is None and not answer.get("ready"):
            failure = Failure(statuses.ERROR, f"the worker under {self.python} did not say it was ready")
        if failure is not None:
            self.close()
        return failure

    def call(self, request: dict, timeout_s: float) -> tuple[dict | None, Failure | None]:
        if self._process is None or self._process.poll() is not None:
            failure = self.start()
            if failure is not None:
                return None, failure
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return None, Failure(statuses.ERROR, f"the worker under {self.python} died")
        answer, failure = self._answer(timeout_s)
        if failure is not None:
            self.close()
        return answer, failure

    def _answer(self, timeout_s: float) -> tuple[dict | None, Failure | None]:
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not ready:
            return None, Failure(statuses.TIMEOUT, f"no answer within {timeout_s:g} s; worker killed")
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait(5)
            return None, Failure(statuses.ERROR, f"the worker under {self.python} died (exit code {code})")
        return json.loads(line), None

    def close(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(5)
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()
        self._process = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
