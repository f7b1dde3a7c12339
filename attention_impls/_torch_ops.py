"""What torch's profiler names of an attention step, shared by the torch kernels' evidence hooks."""

from __future__ import annotations

# The dispatching wrapper names no kernel: SDPA's choice is the op it calls.
SDPA_WRAPPER = "aten::scaled_dot_product_attention"


def attention_ops(ops: dict[str, int]) -> list[str]:
    """The ATen attention kernels among ``ops`` (profiled op name -> count)."""
    return sorted(name for name in ops if "attention" in name and name != SDPA_WRAPPER)
