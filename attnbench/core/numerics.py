"""Comparing a kernel's output with the float64 reference: errors and per-dtype tolerances.

Tolerances are for outputs of order 1 (softmax-weighted averages of standard-normal values). The
reference sees the same low-precision inputs as the kernel, so what remains is the kernel's own
rounding: accumulation order in float32, the output cast in bfloat16/float16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# dtype -> (atol, rtol) for forward outputs; gradients get GRAD_SLACK times more room because
# they chain two more matmuls and a softmax derivative.
TOLERANCE = {"float32": (2e-5, 1e-4), "float16": (4e-3, 4e-3), "bfloat16": (3e-2, 2e-2)}
GRAD_SLACK = 4.0


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float  # max |a - b| / max |b|: relative to the reference's scale, stable near zero
    finite: bool
    ok: bool

    def describe(self) -> str:
        if not self.finite:
            return "output holds NaN or inf"
        return f"max abs err {self.max_abs:.3g}, rel {self.max_rel:.3g}"


def compare(actual: np.ndarray, reference: np.ndarray, dtype: str, *, slack: float = 1.0) -> Comparison:
    """Error of ``actual`` against ``reference``; NaN or inf anywhere is a failure, never a pass."""
    actual = np.asarray(actual, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if actual.shape != reference.shape:
        raise ValueError(f"shape mismatch: got {actual.shape}, reference is {reference.shape}")
    finite = bool(np.isfinite(actual).all())
    if not finite:
        return Comparison(float("nan"), float("nan"), False, False)
    diff = np.abs(actual - reference)
    max_abs = float(diff.max(initial=0.0))
    scale = float(np.abs(reference).max(initial=0.0)) or 1.0
    atol, rtol = TOLERANCE[dtype]
    ok = bool(np.all(diff <= slack * (atol + rtol * np.abs(reference))))
    return Comparison(max_abs, max_abs / scale, True, ok)
