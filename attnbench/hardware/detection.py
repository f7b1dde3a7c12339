"""What a run ran on: the host, and the device a framework's default placement uses.

:func:`detect_accelerator` asks the framework's backend (``attnbench.backends``), which imports its
framework lazily; nothing here knows a framework by name. :func:`accelerator_present` answers
"is there a GPU or TPU attached?" from device files alone, initialising nothing: what a process
that must not touch a device (the asv parent process) may ask.
"""

from __future__ import annotations

import glob
import os
import platform as _platform
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Host:
    cpu_model: str
    logical_cores: int  # every logical CPU of the machine
    usable_cores: int  # the ones this process may run on (its CPU affinity)
    memory_bytes: int | None


@dataclass(frozen=True)
class Device:
    """The device a run's steps execute on.

    ``platform`` is ``"cpu"``, ``"gpu"`` or ``"tpu"``; ``name`` is what the framework calls it
    (``torch.cuda.get_device_name``, jax ``device_kind``, torch_xla device kind) or, on a CPU, the
    host CPU model; ``count`` is how many such devices the framework sees (1 for a CPU host);
    ``host_cores`` is the host's usable logical cores.
    """

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
    """CPU model (``/proc/cpuinfo`` "model name", else ``platform.processor()``); logical and usable
    cores and total memory from psutil."""
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

    The framework's backend says which (``attnbench.backends.get(framework).detect_device``); an
    unknown framework raises ``ValueError`` listing the known ones.
    """
    from attnbench import backends

    return backends.get(framework).detect_device(detect_host())


# The device files and PCI ids jax itself checks before it initialises a backend
# (jax/_src/hardware_utils.py): reading them opens no device.
NVIDIA_DEVICE_FILES = ("nvidia0", "nvidiactl", "dxg")
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027": "v3", "0x0056": "plc", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e",
                   "0x006f": "v6e", "0x0076": "tpu7x"}  # Google's gVNIC shares the vendor id, not these


@dataclass(frozen=True)
class Attached:
    """An accelerator seen from device files: ``platform`` gpu/tpu, ``count`` (0: unknown), ``version``
    (TPU generation from its PCI id, else None)."""

    platform: str
    count: int
    version: str | None = None


def accelerator_present(dev: str = "/dev", pci: str = "/sys/bus/pci/devices") -> Attached | None:
    """The GPU or TPU attached to this host, from device files and PCI ids only; ``None`` when none.

    Initialises no device and imports no framework: TPU chips are counted by their PCI device ids
    (Google's vendor id 0x1ae0), NVIDIA GPUs are seen through ``/dev/nvidia0`` (``/dev/nvidiactl`` in
    containers, ``/dev/dxg`` on WSL2), counted by ``/dev/nvidia<N>``. Whether a framework in this
    environment can use the device is another question, answered only by initialising it.
    """
    chips, version = 0, None
    for vendor_file in glob.glob(os.path.join(pci, "*", "vendor")):
        try:
            with open(vendor_file, encoding="ascii") as fh:
                if fh.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(os.path.dirname(vendor_file), "device"), encoding="ascii") as fh:
                device = fh.read().strip()
        except OSError:
            continue
        if device in TPU_PCI_DEVICES:
            chips, version = chips + 1, TPU_PCI_DEVICES[device]
    if chips:
        return Attached("tpu", chips, version)
    if any(os.path.exists(os.path.join(dev, name)) for name in NVIDIA_DEVICE_FILES):
        count = len([p for p in glob.glob(os.path.join(dev, "nvidia*"))
                     if os.path.basename(p).removeprefix("nvidia").isdigit()])
        return Attached("gpu", count)
    return None
