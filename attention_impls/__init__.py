"""What is measured: every attention implementation, behind one registry.

    import attention_impls
    attention_impls.names()                      # every registered name
    impl = attention_impls.get("jax-xla")        # KeyError lists the known names
    out = impl.run_numpy(q, k, v, causal=True)   # float64 [B, Sq, Hq, D]; raises Unsupported
"""

from __future__ import annotations

import importlib

from attention_impls.base import FORCED_FLASH, NATIVE, AttentionImpl, Step, Unsupported
from attention_impls.registry import _REGISTRY

# One module per implementation family; importing one imports no framework.
_MODULES = (
    "reference",
    "jax_xla",
    "jax_cudnn",
    "jax_pallas_tpu_flash",
    "jax_pallas_tpu_splash",
    "jax_pallas_gpu_mha",
    "jax_blockwise",
    "torch_sdpa",
    "torch_flex",
    "torch_blockwise",
    "torch_xla_sdpa",
    "torch_xla_pallas_flash",
    "torch_xla_blockwise",
)
for _module in _MODULES:
    importlib.import_module(f"attention_impls.{_module}")

__all__ = ["FORCED_FLASH", "NATIVE", "AttentionImpl", "Step", "Unsupported", "get", "names"]


def names() -> list[str]:
    """Every registered implementation name, in registration order."""
    return list(_REGISTRY)


def get(name: str) -> AttentionImpl:
    """The implementation registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(_REGISTRY)}") from None
