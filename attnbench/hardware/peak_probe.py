"""The peak an MFU is taken against: a profile's spec figure, or a GEMM probe of this CPU.

A CPU peak here is an *achieved-GEMM* peak, not a spec-sheet peak: the TFLOP/s one large square
matmul reaches on this machine through the framework's own matmul (the backend's ``gemm_runner``).
An MFU against it means "fraction of this machine's own matmul speed", not comparable with an
accelerator's spec-sheet MFU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass

from attnbench import backends
from attnbench.core.atomic import atomic_write_text
from attnbench.hardware.detection import Device
from attnbench.hardware.dtypes import LONG_DTYPE, canonical_dtype
from attnbench.hardware.hardware_profiles import HardwareProfile
from attnbench.measure.timing import time_step


@dataclass(frozen=True)
class GemmProbe:
    """An achieved square-GEMM rate of this CPU: ``2 * size**3`` FLOPs per matmul."""

    framework: str
    dtype: str  # bf16 | fp16 | fp32
    size: int  # n of the n x n x n matmul
    threads: int | None  # threads the framework's matmul uses (None: unknown)
    best_tflops: float  # best of the rounds' medians
    median_tflops: float  # median of the rounds' medians
    rounds: int

    @property
    def tflops(self) -> float:
        """The figure used as the CPU's peak: the best round."""
        return self.best_tflops


_PROBE_CACHE: dict[tuple, GemmProbe] = {}
# Shared by one run's worker processes (``sweep.measure_cases`` sets it): one probe, so one peak, per run.
PROBE_DIR_ENV = "ATTNBENCH_PROBE_DIR"


def _shared_probe_path(key: tuple) -> str | None:
    directory = os.environ.get(PROBE_DIR_ENV)
    if not directory:
        return None
    return os.path.join(directory, f"gemm-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.json")


def _load_shared_probe(path: str | None) -> GemmProbe | None:
    if path is None:  # no shared directory: this process probes on its own
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return GemmProbe(**json.load(f))
    except (TypeError, OSError, ValueError):  # not probed yet, or a damaged file: probe again
        return None


def clear_cpu_peak_cache() -> None:
    _PROBE_CACHE.clear()


def cpu_peak_tflops(dtype="float32", framework: str = "torch", *, size: int | None = None,
                    max_size: int = 2048, min_call_seconds: float = 0.05, rounds: int = 3) -> GemmProbe:
    """Measure this CPU's achieved GEMM TFLOP/s in ``dtype`` through ``framework``'s matmul.

    Unless given, the size doubles from 256 up to ``max_size`` until one matmul takes
    ``min_call_seconds`` (compute bound, timer noise negligible; a dtype the CPU runs slowly stops
    early). ``ValueError`` for a framework or dtype without a matmul. Memoised per process and shared
    through ``$ATTNBENCH_PROBE_DIR`` by one sweep's workers, so a run probes once per framework and dtype.
    """
    dtype = canonical_dtype(dtype)
    make, threads = backends.get(framework).gemm_runner(dtype)
    key = (framework, dtype, size, max_size, min_call_seconds, rounds, threads)
    shared = _shared_probe_path(key)
    probe = _PROBE_CACHE.get(key) or _load_shared_probe(shared)
    if probe is not None:
        _PROBE_CACHE[key] = probe
        return probe
    if size is None:
        n = 256
        while True:
            run = make(n)
            run()  # warm (and, for jax, compile)
            elapsed = _clock_one(run)
            if elapsed >= min_call_seconds or n * 2 > max_size:
                break
            n *= 2
    else:
        if size <= 0:
            raise ValueError(f"cpu_peak_tflops: size must be positive, got {size}")
        n = size
        run = make(n)
    flops = 2.0 * n ** 3
    rates = []
    for r in range(max(1, rounds)):
        timing = time_step(run, warmup=1 if r == 0 else 0, block_seconds=min_call_seconds,
                           min_seconds=0.2, min_samples=3, max_seconds=10.0)
        rates.append(flops / timing.median_s / 1e12)
    probe = GemmProbe(framework=framework, dtype=dtype, size=n, threads=threads,
                      best_tflops=max(rates), median_tflops=statistics.median(rates), rounds=len(rates))
    _PROBE_CACHE[key] = probe
    if shared:
        atomic_write_text(shared, json.dumps(dataclasses.asdict(probe)))
    return probe


def _clock_one(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


@dataclass(frozen=True)
class Peak:
    """The peak an MFU is taken against; ``tflops`` None means unknown and ``source`` says why."""

    tflops: float | None
    source: str
    probe: GemmProbe | None = None

    @property
    def known(self) -> bool:
        return self.tflops is not None


# One probe per machine, dtype and run for every framework, through a matmul both venvs have:
# per-framework probes differ, which would make MFUs incomparable across frameworks.
CPU_PROBE_FRAMEWORK = "torch"


def peak_tflops(device: Device, hardware_profile: HardwareProfile | None, dtype) -> Peak:
    """Spec-sheet peak from ``hardware_profile`` for an accelerator; the torch GEMM probe for a CPU."""
    dt = canonical_dtype(dtype)
    if device.platform == "cpu":
        probe_fw = CPU_PROBE_FRAMEWORK
        try:
            probe = cpu_peak_tflops(dt, probe_fw)
        except (ValueError, ImportError) as exc:
            return Peak(None, f"unknown: CPU GEMM probe unavailable ({exc})")
        return Peak(probe.tflops, f"probe: achieved {probe_fw} {LONG_DTYPE[dt]} GEMM n={probe.size}, "
                    f"{probe.threads if probe.threads is not None else '?'} threads (not a spec peak)",
                    probe)
    if hardware_profile is None:
        return Peak(None, f"unknown: no hardware profile matches {device.name!r}; pass --hardware-profile")
    entry = hardware_profile.peak(dt)
    if entry is None:
        have = ", ".join(hardware_profile.peak_tflops) or "none"
        return Peak(None, f"unknown: profile {hardware_profile.name!r} gives no {LONG_DTYPE[dt]} peak "
                    f"(has: {have})")
    return Peak(entry.value, f"spec: {entry.source} ({entry.date.isoformat()})")
