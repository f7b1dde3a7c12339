"""The dtype names a peak is given in: ``bf16``, ``fp16``, ``fp32``."""

from __future__ import annotations

from typing import Literal, get_args

PeakDtype = Literal["bf16", "fp16", "fp32"]
PEAK_DTYPES: tuple[str, ...] = get_args(PeakDtype)
LONG_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "single": "fp32",
}


def canonical_dtype(dtype) -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp32"`` for a dtype name or a torch/jax/numpy dtype object."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or getattr(
        dtype, "__name__", None) or str(dtype)
    key = str(name).lower().removeprefix("torch.").removeprefix("jnp.").removeprefix("np.")
    try:
        return _DTYPE_ALIASES[key]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_ALIASES)}") from None
