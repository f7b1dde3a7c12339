"""Atomic file writes: write a sibling temp file, fsync, then rename over the target.

An interrupted run leaves either the old file or the new one, never a truncated mix.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "wb") -> Iterator[IO]:
    """A file to write ``path``'s new content into (``mode`` "wb", or "w" for UTF-8 text); it takes
    ``path``'s place when the block ends, and is gone if the block raises. For content too large to
    hold whole in memory first (a report's tidy table)."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_file writes anew: mode 'wb' or 'w', not {mode!r}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": ""} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    with atomic_file(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
