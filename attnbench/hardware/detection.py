"""What a run ran on: the host, and the device a framework's default placement uses.

The device comes from the framework's backend; nothing here knows a framework by name.
:func:`accelerator_present` (``accel.py``) initialises nothing: what the asv parent process may ask.
"""

from __future__ import annotations

import platform as _platform
from dataclasses import dataclass

import psutil

from attnbench import backends
from attnbench.hardware.accel import Attached, accelerator_present


@dataclass(frozen=True)
class Host:
    cpu_model: str
    logical_cores: int  # every logical CPU of the machine
    usable_cores: int  # the ones this process may run on (its CPU affinity)
    memory_bytes: int | None


@dataclass(frozen=True)
class Device:
    """The device a run's steps execute on: ``name`` is what the framework calls it (on a CPU, its
    model), ``count`` how many it sees (1 for a CPU host), ``host_cores`` the usable logical cores."""

    platform: str
    name: str
    count: int
    host_cpu: str
    host_cores: int


def _cpu_model() -> str:
    # psutil has no CPU model name: /proc/cpuinfo on Linux, else what the platform module says.
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "unknown CPU"


def detect_host() -> Host:
    """CPU model, logical and usable cores, and total memory."""
    logical = psutil.cpu_count(logical=True) or 1
    try:
        usable = len(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error, OSError):  # no affinity API on this OS (macOS)
        usable = logical
    try:
        memory = int(psutil.virtual_memory().total)
    except (psutil.Error, OSError):
        memory = None
    return Host(cpu_model=_cpu_model(), logical_cores=logical, usable_cores=max(1, usable),
                memory_bytes=memory)


def cpu_device(host: Host) -> Device:
    """The host CPU as a run's device: what a framework without an accelerator runs on."""
    return Device("cpu", host.cpu_model, 1, host.cpu_model, host.usable_cores)


def detect_accelerator(framework: str) -> Device:
    """The device ``framework``'s default placement runs on; the host CPU when it has no accelerator.
    An unknown framework raises ``ValueError``."""
    return backends.get(framework).detect_device(detect_host())


# Re-exported: what a process that must not touch a device may ask (attnbench/hardware/accel.py).
__all__ = ["Attached", "Device", "Host", "accelerator_present", "cpu_device", "detect_accelerator",
           "detect_host"]
