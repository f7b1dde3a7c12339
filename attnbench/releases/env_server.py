"""A timing worker in a release's own environment: ``python -m attnbench.releases.env_server``.

Run by ``env_worker.EnvWorker`` under a release venv's python, this checkout first on its path; the
protocol is in ``env_worker.py``. Kept apart from the client so that what reads upgrade tables
(the report) never imports the backends this worker builds steps with.
"""

from __future__ import annotations

import json
import os
import sys
import time

from attnbench.core import statuses

_steps: dict[tuple[str, str], object] = {}


def _build(impl_name: str, workload_name: str) -> dict:
    """The matrix cell's stages up to a warm step (``cell.warm_step``, as the matrix runs them), the
    step kept for ``_block``."""
    from attnbench.releases import matrix
    from attnbench.releases.cell import versions, warm_step

    fields, step = warm_step(impl_name, workload_name)
    if step is None:
        return {"status": fields["status"], "reason": fields.get("reason")}
    _steps[(impl_name, workload_name)] = step
    return {"status": matrix.OK, "execution": fields["execution"], "versions": versions()}


def _block(impl_name: str, workload_name: str, number: int) -> dict:
    run = _steps[(impl_name, workload_name)].run
    start = time.perf_counter()
    for _ in range(number):
        run()
    return {"seconds": (time.perf_counter() - start) / number}


def serve() -> None:
    """The worker's loop: a request per line in, an answer per line out, until stdin closes."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    threads = os.environ.get("ATTNBENCH_THREADS")
    if threads:
        from attnbench.measure.process_env import pin_threads

        pin_threads(int(threads))
    answers.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "build":
                answer = _build(request["impl"], request["workload"])
            else:
                answer = _block(request["impl"], request["workload"], int(request["number"]))
        except Exception as exc:  # noqa: BLE001 - a request that fails answers why
            answer = {"status": statuses.ERROR, "reason": f"{type(exc).__name__}: {exc}"[:500]}
        answers.write(json.dumps(answer, default=str) + "\n")


if __name__ == "__main__":
    serve()
