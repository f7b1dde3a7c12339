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


# What an accelerator cannot run as asked: a TPU computes float32 matmuls in bfloat16 passes by default
# (JAX "Matmul precision": bfloat16 on TPU), so a "float32" figure would not be what its name says,
# and no TPU has a published float32 or float16 peak.
MACHINE_DTYPES = {"tpu": ("bfloat16",)}


def machine_dtype_problem(platform: str, dtype: str) -> str | None:
    """Why a machine of ``platform`` (cpu/gpu/tpu) cannot run ``dtype`` as its name says, naming the
    dtypes it can; ``None`` when it can."""
    allowed = MACHINE_DTYPES.get(platform)
    if allowed is None or dtype in allowed:
        return None
    return (f"a {platform.upper()} runs {', '.join(allowed)} only here (its float32 matmuls are bfloat16 "
            f"passes, and it has no published {dtype} peak); choose {' or '.join(allowed)}")
