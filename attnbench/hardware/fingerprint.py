"""Which host a run ran on: one machine name (``cpu-2core``, ``h200``) stands for many hosts (cloud
CI runners, preemptible VMs, a team's shared boxes), and asv keys history by that name alone.

:func:`host_fingerprint` reads the ``IDENTITY`` fields and the run's CPU GEMM probe without
initialising any device, for every sidecar; the analysis calls two hosts different when an identity
field differs or the probe moved beyond its noise (``analysis.host_changes``).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess

from attnbench.core.host_identity import PROBE
from attnbench.hardware.accel import accelerator_present
from attnbench.hardware.detection import detect_host


def _cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """A short digest of the CPU's feature flags (x86 ``flags``, Arm ``Features``), with their count."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags = sorted(value.split())
                    digest = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12]
                    return f"{len(flags)} flags, sha256 {digest}"
    except OSError:
        pass
    return None


def _caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> str | None:
    """``L1d 32K, L1i 32K, L2 1024K, L3 32768K`` from sysfs."""
    found = []
    for index in sorted(glob.glob(os.path.join(root, "index*"))):
        try:
            level, kind, size = (open(os.path.join(index, n), encoding="ascii").read().strip()
                                 for n in ("level", "type", "size"))
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        found.append(f"L{level}{suffix} {size}")
    return ", ".join(found) or None


def _nvidia(which=shutil.which, run=subprocess.run) -> tuple[str | None, str | None]:
    """(GPU names, driver) from ``nvidia-smi --query-gpu``; (None, None) without it."""
    exe = which("nvidia-smi")
    if not exe:
        return None, None
    try:
        out = run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                  text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    if not rows:
        return None, None
    names = sorted({r[0] for r in rows})
    return f"{len(rows)} x {', '.join(names)}", rows[0][1] if len(rows[0]) > 1 else None


def _probe(directory: str | None) -> dict:
    """The run's float32 torch GEMM probe (``peak_probe``'s shared files), else nothing."""
    if not directory:
        return {}
    for path in sorted(glob.glob(os.path.join(directory, "gemm-*.json"))):
        try:
            with open(path, encoding="utf-8") as fh:
                probe = json.load(fh)
        except (OSError, ValueError):
            continue
        if probe.get("dtype") == "fp32":
            return {"gemm_peak_tflops": probe.get("best_tflops"),
                    "gemm_median_tflops": probe.get("median_tflops")}
    return {}


def host_fingerprint(probe_dir: str | None = None, **where) -> dict:
    """The host's fingerprint (``IDENTITY`` and ``PROBE`` fields; a field that cannot be read is None)."""
    host = detect_host()
    attached = accelerator_present()
    accelerator, driver = _nvidia(**where)
    if accelerator is None and attached is not None:
        accelerator = f"{attached.count} x {attached.platform} {attached.version or ''}".strip()
    return {"cpu_model": host.cpu_model, "cpu_flags": _cpu_flags(), "logical_cores": host.logical_cores,
            "usable_cores": host.usable_cores, "caches": _caches(),
            "memory_gib": round(host.memory_bytes / 2**30) if host.memory_bytes else None,
            "accelerator": accelerator, "driver": driver, **dict.fromkeys(PROBE), **_probe(probe_dir)}

