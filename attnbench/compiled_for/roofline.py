"""A roofline lower bound per step, and its price: a model, never a measurement.

    compute_seconds = FLOPs per chip / peak FLOP/s of the chip in the workload's dtype
    memory_seconds  = bytes per chip / HBM bytes per second of the chip
    seconds         = max(compute_seconds, memory_seconds)        (no step can be faster)
    usd             = seconds x price per chip-hour x chips / 3600

FLOPs are the workload's (``Workload.flops``, ``attnbench/core/workload.py``: the two matmuls over the
(query, key) pairs its mask keeps, counted exactly, so a causal, windowed or packed mask is credited
only with the pairs it keeps; backward 2.5x), split evenly over the chips. Bytes are what the
target's compiler says the program accesses (``cost_analysis()['bytes accessed']``) where it says
it, never less than the workload's minimum traffic (``Workload.min_bytes``: read q, k, v, write o,
and the backward's; for decode that is the KV cache, read once, its valid keys only when ragged);
where the compiler gives no figure (the GPU compiler has no cost analysis) the workload's minimum
is used. Peaks, bandwidth and price are the hardware profile's
(``attnbench/hardware/hardware_profiles.toml``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    seconds: float | None
    bound: str  # "compute" | "memory" | why there is none
    compute_seconds: float | None
    memory_seconds: float | None
    usd: float | None

    def as_record(self) -> dict:
        return {"model_roofline_seconds": self.seconds, "model_roofline_bound": self.bound,
                "model_compute_seconds": self.compute_seconds, "model_memory_seconds": self.memory_seconds,
                "model_roofline_usd": self.usd}


def roofline(*, flops_per_chip: float, bytes_per_chip: float, peak_tflops: float | None,
             hbm_tb_s: float | None, price_per_chip_hour: float | None, chips: int = 1) -> Roofline:
    """The lower bound of one step on ``chips`` chips working in parallel. A missing peak drops the
    compute side (the bound is then the memory side only, and says so); a missing bandwidth the
    memory side; a missing price leaves ``usd`` None."""
    compute = flops_per_chip / (peak_tflops * 1e12) if peak_tflops else None
    memory = bytes_per_chip / (hbm_tb_s * 1e12) if hbm_tb_s else None
    if compute is None and memory is None:
        return Roofline(None, "none: the profile has neither a peak for this dtype nor a bandwidth",
                        None, None, None)
    if compute is None:
        seconds, bound = memory, "memory (no peak for this dtype in the profile: compute side unknown)"
    elif memory is None:
        seconds, bound = compute, "compute (no bandwidth in the profile: memory side unknown)"
    else:
        seconds, bound = (compute, "compute") if compute >= memory else (memory, "memory")
    usd = seconds * price_per_chip_hour * chips / 3600.0 if price_per_chip_hour else None
    return Roofline(seconds, bound, compute, memory, usd)


def roofline_bytes(compiler_bytes_per_device: float | None, devices_per_chip: int,
                   min_bytes_per_chip: float) -> tuple[float, str]:
    """(bytes per chip, where they come from): the compiler's figure for the chip's devices, not
    below the workload's minimum; ``-1``/``None`` from the compiler means it gave none."""
    if compiler_bytes_per_device is None or compiler_bytes_per_device < 0:
        return float(min_bytes_per_chip), "workload minimum (the compiler gives no bytes accessed)"
    compiler = float(compiler_bytes_per_device) * devices_per_chip
    if compiler < min_bytes_per_chip:
        return float(min_bytes_per_chip), "workload minimum (the compiler counted less)"
    return compiler, "compiler (cost_analysis bytes accessed)"
