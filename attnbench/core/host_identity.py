"""Which host a run ran on, as a value: the fingerprint fields that name a host, and the one string
they make. ``hardware/fingerprint.py`` reads them from the host; the analysis compares them."""

from __future__ import annotations

# The fields that name a host; the probe fields measure it (and move with its load).
IDENTITY = ("cpu_model", "cpu_flags", "logical_cores", "usable_cores", "caches", "memory_gib",
            "accelerator", "driver")
PROBE = ("gemm_peak_tflops", "gemm_median_tflops")


def identity(fingerprint: dict | None) -> str | None:
    """One string naming the host (its ``IDENTITY`` fields); None when nothing was recorded."""
    if not fingerprint or all(fingerprint.get(k) is None for k in IDENTITY):
        return None
    return "; ".join(f"{k}={fingerprint.get(k)}" for k in IDENTITY)
