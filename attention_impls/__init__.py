"""What is measured: every attention kernel, one file each, discovered automatically.

    import attention_impls
    from attnbench.backends import here           # what a kernel can do on this device
    attention_impls.names()                      # every registered name
    impl = attention_impls.get("jax-xla")        # KeyError lists the known names
    out = here.run_numpy(impl, q, k, v, causal=True)   # float64 [B, Sq, Hq, D]; raises Unsupported

Every module not starting with ``_`` (except ``base``, ``registry``) is a kernel file; importing
one imports no framework.
"""

from __future__ import annotations

import importlib
import pkgutil

from attention_impls.base import FORCED_FLASH, NATIVE, AttentionImpl, Unsupported
from attention_impls.registry import _REGISTRY
from attnbench.core.errors import UnknownName

_NOT_KERNELS = {"base", "registry"}
# Listing order: by framework, then by name (results and tables read in this order).
_FRAMEWORK_ORDER = ("numpy", "jax", "torch", "torch_xla")

KERNEL_MODULES = sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if not m.name.startswith("_") and m.name not in _NOT_KERNELS)
for _module in KERNEL_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["FORCED_FLASH", "NATIVE", "AttentionImpl", "Unsupported", "get", "names"]


def names() -> list[str]:
    """Every registered implementation name, by framework, then by name."""
    def order(name: str):
        framework = _REGISTRY[name].framework
        rank = _FRAMEWORK_ORDER.index(framework) if framework in _FRAMEWORK_ORDER else len(_FRAMEWORK_ORDER)
        return rank, name

    return sorted(_REGISTRY, key=order)


def get(name: str) -> AttentionImpl:
    """The implementation registered as ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownName(f"unknown implementation {name!r}; known: {', '.join(names())}") from None
