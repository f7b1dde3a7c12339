"""The platform a kernel is traced for: this host's, or a target's it is compiled for.

The harness asks ``attnbench.backends.here.platform(impl)``; a jax kernel choosing interpret mode
inside ``attention`` asks ``jax_platform()``. Inside ``compiling_for(...)`` both answer the
target's platform, so the compiled-for tier (docs/compiled-for.md) traces each kernel as on its
own hardware. Imports no framework at import time.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

TARGET_PLATFORMS = ("gpu", "tpu")


@dataclass(frozen=True)
class CompileTarget:
    """What a kernel may ask about the hardware it is being compiled for."""

    platform: str  # "gpu" | "tpu"
    name: str = ""  # the target's name, e.g. "tpu-v5e", "h200"
    compute_capability: tuple[int, int] | None = None  # NVIDIA targets: (major, minor)


_TARGET: contextvars.ContextVar[CompileTarget | None] = contextvars.ContextVar(
    "attnbench_compile_target", default=None)


def compile_target() -> CompileTarget | None:
    """The target being compiled for, or ``None`` (the usual case: kernels run on this host)."""
    return _TARGET.get()


@contextlib.contextmanager
def compiling_for(platform: str, *, name: str = "",
                  compute_capability: tuple[int, int] | None = None) -> Iterator[CompileTarget]:
    """Trace kernels as for ``platform`` (``"gpu"`` or ``"tpu"``) for the duration of the block."""
    if platform not in TARGET_PLATFORMS:
        raise ValueError(f"compile target platform must be one of {TARGET_PLATFORMS}, got {platform!r}")
    target = CompileTarget(platform, name, compute_capability)
    token = _TARGET.set(target)
    try:
        yield target
    finally:
        _TARGET.reset(token)


# jax's backend names that are a GPU
JAX_GPU_BACKENDS = {"cuda": "gpu", "rocm": "gpu"}


def jax_platform() -> str:
    """cpu/gpu/tpu a jax kernel traces for: the target's inside ``compiling_for``, else the platform
    of jax's default backend."""
    target = compile_target()
    if target is not None:
        return target.platform
    import jax

    backend = jax.default_backend()
    return JAX_GPU_BACKENDS.get(backend, backend)
