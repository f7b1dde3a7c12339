"""What a run ran on, what that hardware can do, and where those numbers come from.

:mod:`.detection` (host and device; :func:`accelerator_present` initialises nothing),
:mod:`.hardware_profiles` (spec-sheet peaks, memory and prices from ``hardware_profiles.toml``, each
number with its source and date) and :mod:`.peak_probe` (the peak an MFU is taken against: the
profile's spec figure on an accelerator, a GEMM probe on a CPU).
"""

from attnbench.hardware.detection import (
    Attached,
    Device,
    Host,
    accelerator_present,
    cpu_device,
    detect_accelerator,
    detect_host,
)
from attnbench.hardware.dtypes import PEAK_DTYPES, canonical_dtype
from attnbench.hardware.hardware_profiles import (
    KINDS,
    PRICE_UNITS,
    HardwareProfile,
    Prices,
    Sourced,
    get_hardware_profile,
    load_hardware_profiles,
    match_hardware_profile,
)
from attnbench.hardware.peak_probe import (
    PROBE_DIR_ENV,
    GemmProbe,
    Peak,
    clear_cpu_peak_cache,
    cpu_peak_tflops,
    peak_tflops,
)

__all__ = [
    "KINDS", "PEAK_DTYPES", "PRICE_UNITS", "PROBE_DIR_ENV",
    "Attached", "Device", "GemmProbe", "HardwareProfile", "Host", "Peak", "Prices", "Sourced",
    "accelerator_present", "canonical_dtype", "clear_cpu_peak_cache", "cpu_device", "cpu_peak_tflops",
    "detect_accelerator", "detect_host", "get_hardware_profile", "load_hardware_profiles",
    "match_hardware_profile", "peak_tflops",
]
