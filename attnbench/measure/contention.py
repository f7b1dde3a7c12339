"""How busy the machine was, apart from us, while a figure was measured.

On a shared machine another process taking a core slows a kernel, and one run cannot tell that
from a regression, so each timing window records what the rest of the machine did. It is
**contended** when other processes used more than ``OTHER_CPU_LIMIT`` cores or hypervisor steal
exceeded ``STEAL_LIMIT``; PSI CPU pressure counts our own threads too, so it is recorded, not judged.
Reports never call a contended figure a regression, a spike or a winner.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

OTHER_CPU_LIMIT = 0.10  # cores used by other processes during the window
STEAL_LIMIT = 0.05  # cores stolen by the hypervisor
# The kernel counts CPU time in clock ticks (10 ms): two readings of machine and own time can be
# off by a few ticks, which is a large share of a 0.2 s window; that much is never called contention.
TICK_SLACK_S = 0.03
PRESSURE_FILE = "/proc/pressure/cpu"


def _busy_seconds(times) -> float:
    """Machine-wide CPU seconds that were not idle or waiting on I/O (steal counted apart)."""
    return sum(getattr(times, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


def _pressure_total_us() -> int | None:
    try:
        with open(PRESSURE_FILE) as f:
            for line in f:
                if line.startswith("some "):
                    return int(dict(kv.split("=") for kv in line.split()[1:])["total"])
    except (OSError, ValueError, KeyError):
        pass
    return None


@dataclass(frozen=True)
class Contention:
    wall_s: float
    other_cpu_share: float  # cores
    steal_share: float  # cores
    cpu_pressure_share: float | None  # fraction of the window (None: no PSI on this kernel)
    load_1min: float

    @property
    def reasons(self) -> list[str]:
        out, slack = [], TICK_SLACK_S / self.wall_s
        if self.other_cpu_share > OTHER_CPU_LIMIT + slack:
            out.append(f"other processes used {self.other_cpu_share:.2f} cores (limit {OTHER_CPU_LIMIT})")
        if self.steal_share > STEAL_LIMIT + slack:
            out.append(f"hypervisor steal {self.steal_share:.2f} cores (limit {STEAL_LIMIT})")
        return out

    @property
    def contended(self) -> bool:
        return bool(self.reasons)

    def columns(self) -> dict:
        return {"contended": self.contended, "contention_reason": "; ".join(self.reasons) or None,
                "other_cpu_share": self.other_cpu_share, "steal_share": self.steal_share,
                "cpu_pressure_share": self.cpu_pressure_share, "load_1min": self.load_1min}


class ContentionMonitor:
    """``with ContentionMonitor() as m: ...`` then ``m.result``: what the rest of the machine did."""

    result: Contention | None = None

    def __enter__(self):
        self._process = psutil.Process()
        self._start = (time.perf_counter(), psutil.cpu_times(), self._own_seconds(), _pressure_total_us())
        return self

    def _own_seconds(self) -> float:
        own = self._process.cpu_times()
        return own.user + own.system

    def __exit__(self, *exc) -> None:
        wall0, cpu0, own0, psi0 = self._start
        wall, cpu, own, psi = time.perf_counter() - wall0, psutil.cpu_times(), self._own_seconds(), \
            _pressure_total_us()
        wall = max(wall, 1e-9)
        others = max(0.0, (_busy_seconds(cpu) - _busy_seconds(cpu0)) - (own - own0))
        steal = max(0.0, getattr(cpu, "steal", 0.0) - getattr(cpu0, "steal", 0.0))
        pressure = (psi - psi0) / 1e6 / wall if psi is not None and psi0 is not None else None
        self.result = Contention(wall_s=wall, other_cpu_share=others / wall, steal_share=steal / wall,
                                 cpu_pressure_share=pressure, load_1min=os.getloadavg()[0])
