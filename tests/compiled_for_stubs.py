"""Stand-in worker loops for ``CompileWorker(main=...)``: a compile that hangs, a compiler that kills
its process. Importable by the spawned worker (pytest puts ``tests/`` on ``sys.path``, and spawn
hands ``sys.path`` to the child). They import no framework."""

from __future__ import annotations

import os
import time


def hang_main(conn, log_path):
    conn.recv()
    time.sleep(3600)


def die_main(conn, log_path):
    with open(log_path, "a") as log:
        log.write("F0000 00:00:0 compiler.cc:42] Check failed: layout assignment aborted\n")
    conn.recv()
    os._exit(3)


def echo_main(conn, log_path):
    """Answers every case as compiled; the implementation named ``crash`` kills the process."""
    while True:
        try:
            target, impl, workload, _ = conn.recv()
        except EOFError:
            return
        if impl == "crash":
            os._exit(9)
        conn.send({"target": target, "impl": impl, "seq_q": workload.seq_q, "mode": workload.mode,
                   "status": "ok", "fits": True})
