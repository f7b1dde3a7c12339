"""A compile that failed, in the compiler's own words, classified; and whether a program fits.

Statuses of a compiled-for record (``attnbench/compiled_for/records.py``):

* ``ok``: the target's compiler produced an executable (it may still not *fit*: the GPU compiler
  does not refuse an over-capacity program, so ``fits`` is computed, see ``fits``);
* ``does-not-fit``: the compiler refused because the program needs more HBM than the device has
  (libtpu: ``RESOURCE_EXHAUSTED: Ran out of memory on HBM ...``);
* ``kernel-refused``: a custom kernel's own compiler refused it (Mosaic for Pallas TPU kernels,
  Triton / ptxas for Pallas GPU kernels, cuDNN's graph checks), e.g. ``Unsupported matmul RHS type``
  or running out of VMEM / shared memory;
* ``unsupported``: the implementation cannot express this case on this target: its declaration
  (``platform_support``), a shape rule (``shape_reason``, block divisibility), the head sharding of a
  multi-device target, or a lowering that does not exist for the platform (``MLIR translation rule
  ... not found for platform``);
* ``timeout`` / ``error``: the worker was killed after its time limit / anything else (the
  exception, or the exit code of a worker that died).
"""

from __future__ import annotations

import re

OK = "ok"
DOES_NOT_FIT = "does-not-fit"
KERNEL_REFUSED = "kernel-refused"
UNSUPPORTED = "unsupported"
TIMEOUT = "timeout"
ERROR = "error"
STATUSES = (OK, DOES_NOT_FIT, KERNEL_REFUSED, UNSUPPORTED, TIMEOUT, ERROR)

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
    """``(status, reason)`` for a compile that raised ``exc_type: message``; the reason is the
    compiler's own message (prefixed with what refused, for a kernel)."""
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
    """Whether a compiled program fits the device: its peak (``memory_analysis``) within the HBM of
    its hardware profile. A compiler's refusal for memory is ``False``; unknowable is ``None``.

    Both sides are per device. The GPU compiler accepts programs larger than the device, so this
    comparison is the only verdict there; on a TPU the compiler refuses them itself (its usable HBM,
    e.g. 15.75 GiB of a v5e's 16 GB, is a little above the profile's 16e9 bytes), and the
    comparison with the profile's capacity makes the verdict the conservative one of the two.
    """
    if status == DOES_NOT_FIT:
        return False
    if status != OK or peak_bytes is None or hbm_bytes is None:
        return None
    return peak_bytes <= hbm_bytes
