"""Whether a case compiles against empty or already-filled on-disk compiler caches.

Inductor keeps compiled kernels on disk (``TORCHINDUCTOR_CACHE_DIR``, under /tmp), so a compile
figure would depend on what ran before on the machine. ``cold`` (the default) gives Inductor an empty
directory per case and switches jax's persistent cache off; ``warm`` leaves both as the user has
them (a serving setup that ships its caches). torch_xla keeps no persistent cache unless
``initialize_cache`` is called, which this project never does.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from attnbench.measure.process_env import scoped_environ

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).

MODES = ("cold", "warm")
INDUCTOR_DIR = "TORCHINDUCTOR_CACHE_DIR"
# A folder where each cold case's Inductor directory is kept, not deleted (the sweep sets it for its
# first pass and hands what was compiled to its later rounds: ``run.sweep.round_compile_caches``)
KEEP_ENV = "ATTNBENCH_KEEP_COLD_CACHES"


def _clear_inductor_memory_caches() -> None:
    """Inductor also memoises loaded kernels in-process; clear them so the new directory counts."""
    if "torch._inductor" in sys.modules:
        from torch._inductor.utils import clear_caches

        clear_caches()


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"compile_cache must be one of {', '.join(MODES)}, got {mode!r}")


@contextlib.contextmanager
def _empty_folder():
    """An empty folder for one cold case: kept under ``KEEP_ENV`` when set, else deleted after."""
    keep = os.environ.get(KEEP_ENV)
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield tempfile.mkdtemp(prefix="case-", dir=keep)
        return
    with tempfile.TemporaryDirectory(prefix="attnbench-inductor-") as folder:
        yield folder


@contextlib.contextmanager
def compiler_caches(mode: str):
    check_mode(mode)
    if mode == "warm":
        yield
        return
    jax = sys.modules.get("jax")
    jax_cache = jax.config.jax_enable_compilation_cache if jax else None
    # JAX_ENABLE_COMPILATION_CACHE is read when jax is first imported, inside the case.
    with _empty_folder() as empty, \
            scoped_environ(**{INDUCTOR_DIR: empty, "JAX_ENABLE_COMPILATION_CACHE": "false"}):
        if jax:
            jax.config.update("jax_enable_compilation_cache", False)
        _clear_inductor_memory_caches()
        try:
            yield
        finally:
            _clear_inductor_memory_caches()
            if jax:
                jax.config.update("jax_enable_compilation_cache", jax_cache)
