"""Stand-in compile tasks for ``CompileWorker(task=...)``: a compile that hangs, a compiler that kills
its process. Importable by the spawned worker (pytest puts ``tests/`` on ``sys.path``, and spawn
hands ``sys.path`` to the child). They import no framework."""

from __future__ import annotations

import os
import sys
import time


def hang(target, impl, workload, hlo_dir):
    time.sleep(3600)


def die(target, impl, workload, hlo_dir):
    print("F0000 00:00:0 compiler.cc:42] Check failed: layout assignment aborted", file=sys.stderr,
          flush=True)
    os._exit(3)


def echo(target, impl, workload, hlo_dir):
    """Answers every case as compiled; the implementation named ``crash`` kills the process."""
    if impl == "crash":
        os._exit(9)
    return {"target": target, "impl": impl, "seq_q": workload.seq_q, "mode": workload.mode,
            "status": "ok", "fits": True}
