"""Throw-away releases with a planted fault: the proof that the upgrade judging catches one.

Each is a directory put first on ``PYTHONPATH`` over a real release's environment (as a libtpu
overlay is), holding a ``sitecustomize.py`` that Python imports at start-up and that changes one
kernel in one way:

- ``slow``: the kernel's step spins for ``SLOWDOWN`` of its own time after each call (an upgrade
  that made it 20% slower); timed against the release it overlays (``rounds.run_step``).
- ``bloat``: the kernel's compiled temporaries read ``BLOAT`` times larger, its peak larger by
  as many bytes (an upgrade whose compiler kept 40% more live); compiled for the TPUs
  (``suite.compile_tpu_cells``) and compared with the release it overlays (``memory.changes``).

Nothing here is a measurement of a release: their rows carry the kind ``planted`` and the release
``V+planted-slow`` / ``V+planted-bloat`` wherever they show.
"""

from __future__ import annotations

import os

from attnbench.core.atomic import atomic_write_text

SLOWDOWN, BLOAT = 0.20, 1.40
KERNEL = "jax-xla"  # the kernel each planted release changes
ROOT = os.path.join(".asv", "releases-planted")
SLOW, BLOATED = "planted-slow", "planted-bloat"

_SLOW = '''# A planted fault (attnbench/releases/planted.py): {kernel}'s step {share:.0%} slower.
import time

import attnbench.backends.here as _here

_make_step = _here.make_step


def _slower(impl, workload, seed=0):
    step = _make_step(impl, workload, seed)
    if impl.name != {kernel!r}:
        return step
    run = step.run

    def slow_run():
        start = time.perf_counter()
        out = run()
        until = time.perf_counter() + {share!r} * (time.perf_counter() - start)
        while time.perf_counter() < until:
            pass
        return out

    step.run = slow_run
    return step


_here.make_step = _slower
'''

_BLOAT = '''# A planted fault (attnbench/releases/planted.py): {kernel}'s compiled temporaries x{factor}.
import attnbench.compiled_for.compile as _compile

_read = _compile._read_compiled


def _bloated(record, *args, **kwargs):
    _read(record, *args, **kwargs)
    if record.get("impl") == {kernel!r} and record.get("temp_bytes"):
        grown = int(record["temp_bytes"] * {factor!r}) - record["temp_bytes"]
        record["temp_bytes"] += grown
        if record.get("peak_bytes") is not None:
            record["peak_bytes"] += grown


_compile._read_compiled = _bloated
'''


def release_name(release: str, fault: str) -> str:
    return f"{release}+{fault}"


def overlay(fault: str, root: str = ROOT) -> str:
    """The overlay directory of ``fault`` (``SLOW`` or ``BLOATED``), written afresh."""
    if fault not in (SLOW, BLOATED):
        raise ValueError(f"a planted fault is {SLOW!r} or {BLOATED!r}, got {fault!r}")
    path = os.path.abspath(os.path.join(root, fault))
    text = (_SLOW.format(kernel=KERNEL, share=SLOWDOWN) if fault == SLOW
            else _BLOAT.format(kernel=KERNEL, factor=BLOAT))
    atomic_write_text(os.path.join(path, "sitecustomize.py"), text)
    return path
