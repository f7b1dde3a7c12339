"""A roofline lower bound per step, and its price: a model, never a measurement.

    compute_seconds = FLOPs per chip / peak FLOP/s of the chip in the workload's dtype
    memory_seconds  = bytes per chip / HBM bytes per second of the chip
    seconds         = max(compute_seconds, memory_seconds)        (no step can be faster)
    usd             = seconds x price per chip-hour x chips / 3600

FLOPs are ``Workload.flops`` (only the pairs the mask keeps), split evenly over the chips. Bytes are
the compiler's ``cost_analysis()['bytes accessed']``, never less than ``Workload.min_bytes``, which
also stands in where the compiler gives none (XLA:GPU). Peaks, bandwidth and price are the
hardware profile's (``attnbench/hardware/hardware_profiles.toml``).
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
    """The lower bound of one step on ``chips`` chips in parallel; a missing figure drops its side."""
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
    """(bytes per chip, source), not below the workload's minimum; ``-1``/``None``: the compiler gave none."""
    if compiler_bytes_per_device is None or compiler_bytes_per_device < 0:
        return float(min_bytes_per_chip), "workload minimum (the compiler gives no bytes accessed)"
    compiler = float(compiler_bytes_per_device) * devices_per_chip
    if compiler < min_bytes_per_chip:
        return float(min_bytes_per_chip), "workload minimum (the compiler counted less)"
    return compiler, "compiler (cost_analysis bytes accessed)"
