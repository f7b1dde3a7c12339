"""The peak an MFU is taken against: a profile's spec figure, or a GEMM probe of this CPU.

A CPU peak here is an *achieved-GEMM* peak, not a spec-sheet peak: the TFLOP/s one large square
matmul reaches on this machine, in this dtype, through the framework's own matmul (MKL/oneDNN for
torch, XLA:CPU for jax, the BLAS for numpy), with the threads the framework uses. The matmul comes
from the framework's backend (``attnbench.backends.get(framework).gemm_runner(dtype)``); the probe
itself knows no framework. An MFU against it therefore means "fraction of this machine's own matmul
speed", which answers "how far is attention from the best this CPU does" and is not comparable with
an accelerator's spec-sheet MFU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass

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
# A directory where probes are shared between the processes of one run (``run_sweep`` sets it):
# each case runs in a fresh worker, and re-probing there cost ~3 s per case and gave each case
# of the run a slightly different peak.
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

    The matmul and its thread count come from ``attnbench.backends.get(framework).gemm_runner``
    (``ValueError`` for a framework or dtype without one). The matrix size, unless given, grows
    256, 512, ... up to ``max_size`` until one matmul takes ``min_call_seconds`` (compute bound,
    timer noise negligible; a dtype the CPU runs slowly, e.g. torch fp16 without native support,
    stops early instead of taking minutes). Then ``rounds`` rounds of
    :func:`attnbench.measure.timing.time_step` (blocked, median per round); ``best_tflops`` is the best
    round, ``median_tflops`` the median round.

    The result is memoised per process (keyed by every argument and the framework's thread count),
    and shared through ``$ATTNBENCH_PROBE_DIR`` between the worker processes of one sweep, so a run
    pays for the probe once per framework and dtype; :func:`clear_cpu_peak_cache` forgets the
    process's copy. This is an achieved-GEMM peak, not a spec-sheet peak: MFU against it is
    "fraction of this machine's own matmul speed".
    """
    from attnbench import backends

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
        from attnbench.results.atomic import atomic_write_text

        atomic_write_text(shared, json.dumps(dataclasses.asdict(probe)))
    return probe


def _clock_one(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------ the peak
@dataclass(frozen=True)
class Peak:
    """The peak an MFU is taken against; ``tflops`` None means unknown and ``source`` says why."""

    tflops: float | None
    source: str
    probe: GemmProbe | None = None

    @property
    def known(self) -> bool:
        return self.tflops is not None


# Every framework's run on a CPU is divided by the same peak: one probe per machine, dtype and run
# (shared through $ATTNBENCH_PROBE_DIR), through one matmul that both venvs have. Probing per
# framework gave jax 0.207 and torch 0.195 TFLOP/s in one run here, so MFUs were not comparable.
CPU_PROBE_FRAMEWORK = "torch"


def peak_tflops(device: Device, hardware_profile: HardwareProfile | None, dtype) -> Peak:
    """Spec-sheet peak from ``hardware_profile`` for an accelerator; the GEMM probe for a CPU.

    On a CPU the probe is torch's matmul whatever the run's framework (``CPU_PROBE_FRAMEWORK``).
    """
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
