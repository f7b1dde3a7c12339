"""ATen's MATH backend of SDPA: the materialized softmax in plain ATen ops (portable, native).

The backend is forced with ``sdpa_kernel([backend])``: torch raises instead of falling back, so
the name is the kernel that ran. Rules and the dispatcher check live in ``_sdpa.py``.
"""

from __future__ import annotations

from attention_impls._sdpa import SdpaBackendKernel
from attention_impls.registry import register


@register
class TorchSdpaMath(SdpaBackendKernel):
    name = "torch-sdpa-math"
    sdpa_backend = "MATH"
    summary = "SDPA forced to the MATH backend: materialized softmax in ATen ops"
