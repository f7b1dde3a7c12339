"""One backend per framework: how the harness places, runs, meters and inspects a kernel.

``attention_impls`` declares kernels (what is measured); a backend knows its framework (how it is
measured). Callers use the ``Backend`` protocol (``attnbench/backends/base.py``) and never branch on
a framework's name.
"""

from __future__ import annotations

import importlib

from attnbench.backends.base import Backend

# framework -> module holding its ``BACKEND``; imported on first use, so an environment without
# torch_xla can still list every backend.
_MODULES = {
    "numpy": "attnbench.backends.numpy_backend",
    "jax": "attnbench.backends.jax_backend",
    "torch": "attnbench.backends.torch_backend",
    "torch_xla": "attnbench.backends.torch_xla_backend",
}
FRAMEWORKS = tuple(_MODULES)
_INSTANCES: dict[str, Backend] = {}

__all__ = ["FRAMEWORKS", "Backend", "get"]


def get(framework: str) -> Backend:
    """The backend of ``framework``; an unknown name raises ``ValueError`` listing the known ones."""
    if framework not in _MODULES:
        raise ValueError(f"unknown framework {framework!r}; expected one of {list(FRAMEWORKS)}")
    if framework not in _INSTANCES:
        _INSTANCES[framework] = importlib.import_module(_MODULES[framework]).BACKEND
    return _INSTANCES[framework]
