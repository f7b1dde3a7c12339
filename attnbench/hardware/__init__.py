"""What a run ran on, what that hardware can do, and where those numbers come from.

* :mod:`.detection`: :func:`detect_host` and :func:`detect_accelerator` say what the run used (the
  framework's backend detects its device; framework imports are lazy); :func:`cpu_device`;
  :func:`accelerator_present` (a GPU/TPU seen from device files alone: initialises nothing).
* :mod:`.hardware_profiles`: :func:`load_hardware_profiles` reads ``hardware_profiles.toml``
  (packaged, or the user's own file of the same schema): spec-sheet peaks, memory and prices, every
  number with its source and date. :func:`match_hardware_profile` picks the profile for a detected
  device, :func:`get_hardware_profile` one by name.
* :mod:`.peak_probe`: :func:`cpu_peak_tflops` measures a CPU's peak with a GEMM probe;
  :func:`peak_tflops` gives the peak an MFU is taken against: the hardware profile's spec figure on
  an accelerator, the probe on a CPU.
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
