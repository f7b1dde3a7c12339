"""ATen's MATH backend of SDPA: the materialized softmax in plain ATen ops (portable, native).

Forcing and rules: ``_sdpa.py``. GQA is ``repeated``: the math path ``repeat_interleave``s the kv
heads (``attention.cpp`` ``pre_process_group_query_attention_input``).
"""

from __future__ import annotations

from attention_impls._sdpa import SdpaBackendKernel
from attention_impls.registry import register


@register
class TorchSdpaMath(SdpaBackendKernel):
    name = "torch-sdpa-math"
    sdpa_backend = "MATH"
    summary = "SDPA forced to the MATH backend: materialized softmax in ATen ops"
    gqa = "repeated"
