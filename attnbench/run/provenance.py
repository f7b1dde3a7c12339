"""Provenance of a run: the commit, the library versions and the host it ran on."""

from __future__ import annotations

import datetime as dt
import os
import platform as host_platform
import subprocess
from importlib import metadata as importlib_metadata

from attnbench import hardware

VERSIONED = ("jax", "jaxlib", "libtpu", "torch", "torch_xla", "numpy")


def library_versions() -> dict:
    out = {}
    for name in VERSIONED:
        try:
            out[f"version_{name}"] = importlib_metadata.version(name.replace("_", "-"))
        except importlib_metadata.PackageNotFoundError:
            try:
                out[f"version_{name}"] = importlib_metadata.version(name)
            except importlib_metadata.PackageNotFoundError:
                out[f"version_{name}"] = None
    return out


def git_commit(cwd: str | None = None) -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=cwd or os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run_metadata() -> dict:
    host = hardware.detect_host()
    return {"run_started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "python": host_platform.python_version(),
            "host_cpu": host.cpu_model, "host_cores": host.usable_cores, **library_versions()}
