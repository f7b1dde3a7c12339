"""Host-side memory probes shared by every backend."""

from __future__ import annotations

import psutil


def rss_growth_bytes(run) -> int | None:
    """How far this process's resident high-water mark rises above its current RSS during ``run()``.

    Linux only: writing 5 to /proc/self/clear_refs resets VmHWM (psutil cannot), so the figure is
    per step even in a long-lived worker. Host memory only, even on a GPU/TPU.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    process = psutil.Process()
    before = process.memory_info().rss
    run()
    peak_kib = _vm_hwm_kib()
    return None if peak_kib is None else peak_kib * 1024 - before


def _vm_hwm_kib() -> int | None:
    # psutil exposes RSS but not the high-water mark VmHWM; read it where the kernel keeps it.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
