"""Which accelerator this host has, read from device files, PCI ids and ``nvidia-smi``: no framework,
no device initialised, nothing outside the standard library.

``make`` runs this file before any venv exists to choose what to build (``cpu``, ``cuda``, ``tpu``). A
requested ``ACCEL`` that contradicts the host is refused unless forced: the frameworks would then run
somewhere other than the machine's name says.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

ACCELS = ("cpu", "cuda", "tpu")
# What jax itself checks before it initialises a backend (jax/_src/hardware_utils.py).
NVIDIA_DEVICE_FILES = ("nvidia0", "nvidiactl", "dxg")  # dxg: WSL2
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027": "v3", "0x0056": "plc", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e",
                   "0x006f": "v6e", "0x0076": "tpu7x"}  # Google's gVNIC shares the vendor id, not these


@dataclass(frozen=True)
class Attached:
    """An accelerator seen from the host: ``platform`` gpu/tpu, ``count`` (0: unknown), ``version``
    (a TPU generation from its PCI id, else None), ``evidence`` (what it was seen from)."""

    platform: str
    count: int
    version: str | None = None
    evidence: str = field(default="", compare=False)

    @property
    def accel(self) -> str:
        return "cuda" if self.platform == "gpu" else "tpu"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _google_pci_devices(pci: str) -> list[str]:
    """PCI device ids of every Google device (TPU chips, and the gVNIC)."""
    found = []
    for vendor_file in sorted(glob.glob(os.path.join(pci, "*", "vendor"))):
        if _read(vendor_file) == GOOGLE_PCI_VENDOR:
            device = _read(os.path.join(os.path.dirname(vendor_file), "device"))
            if device:
                found.append(device)
    return found


def nvidia_smi_gpus(which=shutil.which, run=subprocess.run) -> list[str]:
    """GPU names ``nvidia-smi -L`` lists (``GPU 0: NVIDIA H200 (UUID: ...)``); none without it."""
    exe = which("nvidia-smi")
    if not exe:
        return []
    try:
        out = run([exe, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.group(1).strip() for m in re.finditer(r"^GPU \d+: (.+?)(?: \(UUID:.*)?$", out, re.M)]


def accelerator_present(dev: str = "/dev", pci: str = "/sys/bus/pci/devices", which=shutil.which,
                        run=subprocess.run) -> Attached | None:
    """The GPU or TPU attached to this host; ``None`` when none is seen.

    TPU: a TPU PCI device id, else ``/dev/accel<N>`` (v2-v4 VMs), else vfio groups beside a Google
    PCI device (v5e and later; a vfio group alone can be any passthrough device). NVIDIA: its device
    files, else ``nvidia-smi -L``. Whether a framework can use the device needs initialising it.
    """
    google = _google_pci_devices(pci)
    chips = [TPU_PCI_DEVICES[d] for d in google if d in TPU_PCI_DEVICES]
    if chips:
        return Attached("tpu", len(chips), chips[-1], f"{len(chips)} TPU {chips[-1]} PCI device(s), vendor "
                        f"{GOOGLE_PCI_VENDOR}")
    accel = sorted(p for p in glob.glob(os.path.join(dev, "accel*")) if re.search(r"accel\d+$", p))
    if accel:
        return Attached("tpu", len(accel), None, f"{len(accel)} TPU device file(s) {accel[0]}")
    groups = sorted(p for p in glob.glob(os.path.join(dev, "vfio", "*")) if os.path.basename(p).isdigit())
    if groups and google:
        return Attached("tpu", len(groups), None, f"{len(groups)} vfio group(s) in {dev}/vfio beside a "
                        f"Google PCI device ({', '.join(google)})")
    files = [os.path.join(dev, n) for n in NVIDIA_DEVICE_FILES if os.path.exists(os.path.join(dev, n))]
    if files:
        count = len([p for p in glob.glob(os.path.join(dev, "nvidia*"))
                     if os.path.basename(p).removeprefix("nvidia").isdigit()])
        return Attached("gpu", count, None, f"NVIDIA device file {files[0]}")
    gpus = nvidia_smi_gpus(which, run)
    if gpus:
        return Attached("gpu", len(gpus), None, f"nvidia-smi lists {len(gpus)} GPU(s): {gpus[0]}")
    return None


def detect(**where) -> tuple[str, str]:
    """``(accel, why)``: the accelerator to build for and what that was decided from."""
    attached = accelerator_present(**where)
    if attached is None:
        return "cpu", "no NVIDIA or TPU device file, PCI id or nvidia-smi GPU on this host"
    return attached.accel, attached.evidence


class Refused(ValueError):
    """A requested ACCEL that contradicts the host, or is not one of ``ACCELS``."""


def choose(requested: str | None, force: bool = False, **where) -> tuple[str, str]:
    """``(accel, why)``: ``requested`` when it agrees with the host (or is forced), else the detected one.
    Raises ``Refused`` (one line, naming the fix) for an unknown value or an unforced contradiction."""
    requested = (requested or "").strip().lower()
    if requested and requested not in ACCELS:
        raise Refused(f"ACCEL must be one of {', '.join(ACCELS)}, got {requested!r}")
    detected, why = detect(**where)
    if not requested:
        return detected, f"detected: {why}"
    if requested == detected:
        return requested, f"as requested, and the host agrees: {why}"
    if force:
        return requested, (f"forced (ACCEL_FORCE=1) although the host says {detected} ({why}); its results "
                           "are filed under the machine the frameworks really ran on")
    if detected == "cpu":
        problem = f"ACCEL={requested} but this host has no {'NVIDIA GPU' if requested == 'cuda' else 'TPU'}"
    else:
        problem = (f"ACCEL={requested} but this host has a {'GPU' if detected == 'cuda' else 'TPU'} "
                   f"({why}): the frameworks would run on the {requested.upper()} wheels' device, not on it")
    raise Refused(f"{problem}; use ACCEL={detected} (or leave ACCEL unset), or ACCEL_FORCE=1 to build for "
                  f"{requested} anyway")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the accelerator make builds for: cpu, cuda or tpu")
    parser.add_argument("--requested", default="", help="ACCEL as given (empty: detect)")
    parser.add_argument("--force", default="", help="ACCEL_FORCE (1: accept a contradicting ACCEL)")
    parser.add_argument("--quiet", action="store_true", help="no reason on stderr")
    args = parser.parse_args(argv)
    try:
        accel, why = choose(args.requested, force=args.force.strip() not in ("", "0"))
    except Refused as exc:
        print(f"REFUSED: {exc}")
        return 2
    print(accel)
    if not args.quiet:
        print(f"ACCEL={accel} ({why})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
