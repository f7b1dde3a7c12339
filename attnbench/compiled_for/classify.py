"""A compile that failed, in the compiler's own words, classified; and whether a program fits.

The statuses are described in docs/compiled-for.md. ``ok`` may still not *fit*: the GPU compiler
does not refuse an over-capacity program, so ``fits`` is computed.
"""

from __future__ import annotations

import re

from attnbench.core.statuses import (  # noqa: F401  (the tier's names for them: classify.OK, ...)
    DOES_NOT_FIT,
    ERROR,
    KERNEL_REFUSED,
    OK,
    TIMEOUT,
    UNSUPPORTED,
)

_HBM_AVAILABLE = re.compile(r"available HBM \(([\d.]+)\s*([KMGT])i?B?\)", re.I)
_HBM_REQUIRED = re.compile(r"(?:total memory required[^(]*|HBM used[^(]*)\(([\d.]+)\s*([KMGT])i?B?\)", re.I)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}  # libtpu's "15.75G" for a 16 GiB chip
_UNSUPPORTED = (
    re.compile(r"MLIR translation rule for primitive '[^']+' not found for platform", re.I),
    re.compile(r"Cannot lower pallas_call on platform", re.I),
    re.compile(r"Only interpret mode is supported", re.I),
    re.compile(r"cuDNN is not detected", re.I),
)
_KERNEL = (
    ("Mosaic", re.compile(r"mosaic|tpu_custom_call|Unsupported matmul|vmem|scoped memory|"
                          r"apply_vector_layout|infer[_-]memref[_-]layout", re.I)),
    ("Triton", re.compile(r"triton|ptxas|shared memory|Requested shared memory|out of resource", re.I)),
    ("cuDNN", re.compile(r"cudnn|fmha", re.I)),
)
MAX_REASON = 600


def _bytes(match) -> int | None:
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()]) if match else None


def compiler_hbm_bytes(message: str) -> int | None:
    """The HBM the compiler says it has for the program (libtpu: ``available HBM (15.75G)``)."""
    return _bytes(_HBM_AVAILABLE.search(message))


def compiler_required_bytes(message: str) -> int | None:
    """What the compiler says the program would need (``... HLO temporaries (132.25G)``)."""
    return _bytes(_HBM_REQUIRED.search(message))


def first_lines(message: str, limit: int = MAX_REASON) -> str:
    """The message on one line, cut to ``limit`` characters (tracebacks and MLIR dumps are long)."""
    text = " ".join(line.strip() for line in str(message).strip().splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_compile_error(message: str, exc_type: str = "") -> tuple[str, str]:
    """``(status, reason)`` for a compile that raised; the reason is the compiler's own message."""
    text = str(message)
    lowered = text.lower()
    reason = first_lines(text)
    out_of_memory = "resource_exhausted" in lowered or "out of memory" in lowered
    if out_of_memory and "hbm" in lowered:
        return DOES_NOT_FIT, reason
    if exc_type in ("Unsupported", "NotImplementedError") or any(p.search(text) for p in _UNSUPPORTED):
        return UNSUPPORTED, reason
    for who, pattern in _KERNEL:
        if pattern.search(text):
            return KERNEL_REFUSED, f"{who}: {reason}"
    if out_of_memory:  # out of some other memory (VMEM, shared memory) with no kernel named
        return KERNEL_REFUSED, reason
    return ERROR, f"{exc_type}: {reason}" if exc_type else reason


def fits(peak_bytes: int | None, hbm_bytes: int | None, status: str = OK) -> bool | None:
    """Whether the per-device peak (``memory_analysis``) is within the profile's HBM per device.

    A compiler's refusal for memory is ``False``; unknowable is ``None``. The GPU compiler accepts
    oversized programs, so this is the only verdict there; on a TPU libtpu's usable HBM is a little
    above the profile's, so comparing with the profile is the conservative verdict.
    """
    if status == DOES_NOT_FIT:
        return False
    if status != OK or peak_bytes is None or hbm_bytes is None:
        return None
    return peak_bytes <= hbm_bytes
