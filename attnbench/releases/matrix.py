"""What the release matrix runs, and what a cell's status means. No framework is imported here.

Which releases and why: docs/releases.md. In short, the last patch of each jax minor series up to
the newest with a Python 3.11 wheel (the upgrade steps a team pinning a minor line takes), each
TPU one with the libtpu its ``jax[tpu]`` pins, each also beside the companions a user's environment
holds (``COMPANIONS``); libtpu varied on its own (``LIBTPU_AXIS``); four torch minors, 2.11 (the
lent H200's) and the pin among them.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.core import presets
from attnbench.core.statuses import (  # noqa: F401  (the matrix's names for them: matrix.OK, ...)
    API_CHANGED,
    COMPILE_FAILED,
    DOES_NOT_FIT,
    NUMERICS_FAILED,
    OK,
    RELEASE_STATUSES,
    RUNTIME_ERROR,
    UNSUPPORTED,
)
from attnbench.core.workload import Workload


@dataclass(frozen=True)
class Release:
    framework: str
    version: str
    date: str  # the release's upload date on PyPI
    why: str
    libtpu: str | None = None  # the libtpu its jax[tpu] extra pins (TPU compiles), None: none


JAX_RELEASES = (
    Release("jax", "0.6.2", "2025-06-17", "last of the 0.6 series"),
    Release("jax", "0.7.2", "2025-09-16", "last of the 0.7 series"),
    Release("jax", "0.8.2", "2025-12-18", "last of the 0.8 series", libtpu="0.0.32.1"),
    Release("jax", "0.9.2", "2026-03-18", "last of the 0.9 series", libtpu="0.0.37"),
    Release("jax", "0.10.2", "2026-06-17", "the newest jax with a Python 3.11 wheel", libtpu="0.0.42.1"),
)
TORCH_RELEASES = (
    Release(
        "torch", "2.9.0", "2025-10-15", "the torch_xla venv's (the CUDA build torch_xla 2.9.0 needs), on CPU"
    ),
    Release("torch", "2.11.0", "2026-03-23", "the lent H200 image's (PyPI's CUDA build, run on the CPU)"),
    Release("torch", "2.13.0", "2026-07-08", "the main venv's (the CPU build lying on this host)"),
    Release("torch", "2.14.1", "2026-09-30",
            "the newest this host installs (its pip constraints cap torch at 2.14.1; PyPI's CUDA build, run "
            "on the CPU)"),
)
RELEASES = JAX_RELEASES + TORCH_RELEASES
# The torch releases' venvs: the two make setup builds, and the others make releases builds under
# TORCH_VENV_ROOT (pip install torch==V numpy asv_runner and the project, nothing else).
TORCH_VENV_ROOT = ".asv/releases-torch"
TORCH_SETUP_VENVS = {"2.13.0": ".venv", "2.9.0": ".venv-xla"}

# The companions a user's jax environment holds (chex and optax depend on absl-py): each jax release
# runs once bare (what ``pip install jax[tpu]==V`` gives) and once beside them, so a module a release
# imports without declaring it shows as the difference between the two.
COMPANIONS = ("absl-py", "chex")
# libtpu on its own: every jax release with a libtpu compiles its TPU cells with the other releases'
# libtpu too (overlaid on its environment), so a libtpu change is told from a jax change; and with
# the newest libtpu on PyPI (no jax this Python installs pins it: 0.0.52, 2026-11-05, has a cp311
# wheel), so a team sees whether its jax accepts the newest build.
NEWEST_LIBTPU = "0.0.52"
LIBTPU_AXIS = (*(r.libtpu for r in JAX_RELEASES if r.libtpu), NEWEST_LIBTPU)


# Releases this Python or host cannot install: jax 0.11.0 and later ship no jaxlib wheel for Python
# 3.11 (pip finds jax up to 0.10.2); torch 2.15.0 (2026-10-28, with a cp311 wheel) is refused by this
# host's pip constraints (/etc/xdg/pip/constraints.txt: torch<=2.14.1; the resolver says
# "ResolutionImpossible").
CANNOT_INSTALL = {
    "jax": ("0.11.0", "jax 0.11.0 and later ship no jaxlib wheel for Python 3.11"),
    "torch": ("2.15.0", "this host's pip constraints (/etc/xdg/pip/constraints.txt) cap torch at 2.14.1"),
}


def release(framework: str, version: str) -> Release:
    """The matrix's release ``framework`` ``version``; ``ValueError`` naming what is wrong: an unknown
    framework, a release this Python cannot install, or one the matrix does not hold."""
    known = [r for r in RELEASES if r.framework == framework]
    if not known:
        raise ValueError(f"unknown framework {framework!r}: the release matrix has jax and torch")
    found = next((r for r in known if r.version == version), None)
    if found is not None:
        return found
    first, why = CANNOT_INSTALL[framework]
    if version_key(version) >= version_key(first):
        raise ValueError(f"{framework} {version} cannot install here: {why} (the newest the matrix runs is "
                         f"{newest(framework).version})")
    raise ValueError(f"{framework} {version} is not a release of the matrix; it has "
                     + ", ".join(r.version for r in known))


def pinned_libtpu(jax_version: str) -> str | None:
    """The libtpu ``jax[tpu]`` of that jax release pins (``None``: the matrix compiles none for it)."""
    return next((r.libtpu for r in JAX_RELEASES if r.version == jax_version), None)


def newest(framework: str) -> Release:
    """The release every step time of ``framework`` is relative to."""
    return max((r for r in RELEASES if r.framework == framework), key=lambda r: version_key(r.version))


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("+")[0].split("."))


# The toy shape and a preset with GQA and a window, small enough that interpreted Pallas kernels run
# in seconds. float32: the CPU's own dtype.
WORKLOADS = {
    "causal-256": Workload(
        batch=1, q_heads=8, head_dim=64, seq_q=256, seq_k=256, causal=True, mode="fwd", dtype="float32"
    ),
    "mistral-7b-prefill-128": presets.workload("mistral-7b", "prefill", size="smoke", dtype="float32"),
}

# TPU compiles per libtpu release: the forced kernels and plain XLA, on a v5e and a v6e.
TPU_TARGETS = ("tpu-v5e", "tpu-v6e")
TPU_IMPLS = ("jax-pallas-tpu-flash", "jax-pallas-tpu-splash", "jax-xla")
TPU_SEQS = (4096, 32768)
MAX_BATCH_HI = 1024  # the largest batch searched per TPU cell (flash fits 635 at 4k on a v6e)

# A cell's status (core/statuses.py): the first failing stage decides it; its exception's first line
# is the reason. unsupported: the kernel refuses the cell here (another platform's kernel), with why;
# does-not-fit: a TPU compile the compiler refused for HBM (a size fact, not a breakage).
STATUSES = RELEASE_STATUSES
BROKEN = (API_CHANGED, COMPILE_FAILED, NUMERICS_FAILED, RUNTIME_ERROR)
STAGES = ("import", "compile", "run", "numerics", "time")

# Exceptions that say the library's surface moved: a module, a name or a signature is not there.
_API_TYPES = (ImportError, AttributeError)
_SIGNATURE_WORDS = ("argument", "keyword", "positional", "takes", "got an unexpected", "missing")


def classify(stage: str, exc: BaseException) -> str:
    """The status of a cell whose ``stage`` raised ``exc``."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    if isinstance(exc, _API_TYPES) or (
        isinstance(exc, TypeError) and any(w in str(exc) for w in _SIGNATURE_WORDS)
    ):
        return API_CHANGED
    if stage in ("import", "compile"):
        return COMPILE_FAILED
    return RUNTIME_ERROR


def classify_text(stage: str, reason: str | None) -> str:
    """``classify`` for an error already reduced to its ``Type: message`` text (a compile worker's)."""
    text = reason or ""
    kind = text.split(":", 1)[0].strip()
    if kind in ("ImportError", "ModuleNotFoundError", "AttributeError") or (
        kind == "TypeError" and any(w in text for w in _SIGNATURE_WORDS)
    ):
        return API_CHANGED
    return COMPILE_FAILED if stage in ("import", "compile") else RUNTIME_ERROR


def first_line(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


def cell_key(impl: str, workload: str) -> str:
    return f"{impl}|{workload}"


# releases.csv: one row per release x kernel x target x workload, with every version.
COLUMNS = [
    "framework",
    "release",
    "release_date",
    "impl",
    "label",
    "target",
    "environment",
    "workload",
    "seq_len",
    "status",
    "stage",
    "reason",
    "line",
    "companions",
    "api_surface",
    "execution",
    "kernel_evidence",
    "seconds_per_step",
    "ci_low_s",
    "ci_high_s",
    "relative_to_newest",
    "max_abs_err",
    "peak_bytes",
    "temp_bytes",
    "inserted_copy_bytes",
    "max_batch",
    "custom_calls",
    "jax",
    "jaxlib",
    "libtpu",
    "torch",
    "numpy",
    "absl-py",
    "chex",
    "python",
    "env_name",
    "commit",
]
