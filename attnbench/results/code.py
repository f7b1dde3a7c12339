"""Which code a series measures, and which commits between two runs changed it. Reads git, never writes.

A kernel's figures depend on its own file (one kernel per file under ``attention_impls/``), the kernel
files it imports (``jax-pallas-tpu-splash`` uses ``jax_pallas_tpu_flash``'s tiling), its framework's
backend, and the measurement path every case runs through: the engine and its timing, the worker and
the sweep, the value types, the hardware profiles and probes, and the asv suite. The rest of the
package (the command line, the reports, the analysis, the checks, the fleet, the release matrix,
provenance and environment naming) measures nothing. Both layouts are known: the modules were flat
under ``attnbench/`` until they were grouped by role. The later timing rounds' code (``ROUNDS_ONLY``)
runs after a case's first pass and pools only a static case's step time and the figures that follow
it (``Metric.time_exponent``): a first-pass figure (a stream's latency, compiles and padding, memory,
a first call, a stream regime's figures) does not measure it.
"""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass

import attention_impls
from attnbench.core import metrics

MEASURED_ROOTS = ("attention_impls", "attnbench", "benchmarks")
_PATH_MODULES = ("(measure/)?(engine|timing|stats|contention|compiler_caches|process_env|cost|isolation"
                 "|round_timing|figures|reference_check)",
                 "(run/)?(worker|sweep|adaptive)",
                 "(core/)?(inputs|numerics|workload|masks|presets|regimes|records|statuses|metrics|stats)",
                 "backends/(base|memory|__init__)", "hardware",
                 "hardware/(detection|dtypes|hardware_profiles|peak_probe|__init__)", "(asv/|asv_)suite")
MEASUREMENT_PATH = re.compile(
    rf"^(benchmarks/attention\.py|attnbench/({'|'.join(_PATH_MODULES)})\.py"
    r"|attnbench/(hardware/)?hardware_profiles\.toml"
    r"|attention_impls/(base|registry|__init__|_compile_target)\.py)$")
ROUNDS_ONLY = re.compile(r"^attnbench/(run/)?adaptive\.py$|^attnbench/(measure/)?round_timing\.py$")
COMPILED_FOR = re.compile(r"^(benchmarks/compiled_for\.py|attnbench/compiled_for/.*)$")
BACKEND = {"jax": ("jax_backend", "jax_steps"), "torch": ("torch_backend",),
           "torch_xla": ("torch_xla_backend",), "numpy": ("numpy_backend",)}
KERNEL_DIR = "attention_impls/"
KERNEL_IMPORT = r"attention_impls\.[A-Za-z0-9_]+"  # a Python regex and a `git grep -E` pattern
SUFFIXES = (".py", ".toml")


def _git(repo: str, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


PAIRED_MEASUREMENT = "attnbench/backends/here.py"  # what `attnbench compare` builds a step with


@functools.lru_cache(maxsize=256)
def paired_measurement_at(repo: str | None, commit: str) -> bool:
    """Whether ``commit`` builds a step the way ``compare`` times it window for window: an older one is
    measured whole by its own engine, another timing loop, which a paired ratio would mistake for a
    change of the kernel (``attnbench confirm`` leaves its steps as the history judged them)."""
    return bool(repo) and _git(repo, "cat-file", "-e", f"{commit}:{PAIRED_MEASUREMENT}") is not None


@functools.lru_cache(maxsize=4096)
def files_changed(repo: str | None, before: str, after: str) -> tuple[str, ...] | None:
    """The code files under ``MEASURED_ROOTS`` that differ between two commits; None where git cannot say."""
    if not repo:
        return None
    out = _git(repo, "diff", "--name-only", before, after, "--", *MEASURED_ROOTS)
    if out is None:
        return None
    return tuple(f for f in out.splitlines() if f.strip() and f.endswith(SUFFIXES))


def framework_of(implementation: str | None) -> str | None:
    """The kernel's framework (the registry's; its name's prefix for a kernel no longer registered)."""
    if not implementation:
        return None
    try:
        return attention_impls.get(implementation).framework
    except KeyError:
        for prefix, framework in (("torch-xla-", "torch_xla"), ("torch-", "torch"), ("jax-", "jax"),
                                  ("reference-", "numpy")):
            if implementation.startswith(prefix):
                return framework
        return None


def _imports(text: str) -> list[str]:
    return [m.removeprefix("attention_impls.") for m in re.findall(KERNEL_IMPORT, text)]


@functools.lru_cache(maxsize=4096)
def kernel_modules(repo: str, commit: str, implementation: str) -> frozenset[str]:
    """The ``attention_impls`` modules ``implementation`` runs at ``commit``: its own file and the
    files it imports, transitively (shared ``_*.py`` helpers included)."""
    seen, todo = set(), [implementation.replace("-", "_")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(_imports(_git(repo, "show", f"{commit}:{KERNEL_DIR}{module}.py") or ""))
    return frozenset(seen)


def measures(path: str, *, framework: str | None, modules: frozenset[str] | None, compiled_for: bool,
             rounds: bool = True) -> bool:
    """Whether a changed file is code the series measures (see the module docstring); ``rounds``:
    whether the series' figure is pooled from the later timing rounds."""
    if not rounds and ROUNDS_ONLY.match(path):
        return False
    if MEASUREMENT_PATH.match(path):
        return True
    if compiled_for and COMPILED_FOR.match(path):
        return True
    backend = re.match(r"^attnbench/backends/(\w+)\.py$", path)
    if backend:
        return framework is None or backend.group(1) in BACKEND.get(framework, ())
    if path.startswith(KERNEL_DIR) and path.endswith(".py") and "/" not in path[len(KERNEL_DIR):]:
        return modules is None or path[len(KERNEL_DIR):-3] in modules
    return False


@dataclass(frozen=True)
class CodeChange:
    """The measured files a series' step spans, and the commits in between that changed them."""

    files: tuple[str, ...]
    commits: tuple[str, ...]  # "<sha8> <subject>", oldest first


def code_changed_for(repo: str | None, before: str, after: str, implementation: str | None,
                     benchmark: str | None = None, metric: str | None = None,
                     regime: str | None = None) -> CodeChange | None:
    """What changed between two commits in the code ``implementation``'s series in ``benchmark``
    measures (its ``metric`` in ``regime``, where known); None where git cannot say."""
    files = files_changed(repo, before, after)
    if files is None:
        return None
    framework = framework_of(implementation)
    modules = None
    if implementation:
        modules = kernel_modules(repo, before, implementation) | kernel_modules(repo, after, implementation)
    compiled_for = str(benchmark or "").startswith("compiled_for.")
    rounds = pooled_from_rounds(metric, regime)
    kept = tuple(f for f in files if measures(f, framework=framework, modules=modules,
                                              compiled_for=compiled_for, rounds=rounds))
    return CodeChange(kept, commits_touching(repo, before, after, kept) if kept else ())


def pooled_from_rounds(metric: str | None, regime: str | None) -> bool:
    """Whether a series' figure can come from the later timing rounds: a static case's step time or a
    figure that follows it; True where the metric is unknown (the safe side)."""
    if metric is None or metric not in metrics.names():
        return True
    column = metrics.get(metric).column  # a twin (mfu_shortfall) reads the same column as what it follows
    follows = any(m.time_exponent for m in metrics.METRICS if m.column == column)
    return regime in (None, "", "static") and follows


@functools.lru_cache(maxsize=4096)
def commits_touching(repo: str, before: str, after: str, files: tuple[str, ...]) -> tuple[str, ...]:
    """``"<sha8> <subject>"`` of the commits after ``before`` up to ``after`` that changed ``files``."""
    out = _git(repo, "log", "--reverse", "--format=%h %s", "--abbrev=8", f"{before}..{after}", "--", *files)
    return tuple(line[:110] for line in (out or "").splitlines() if line.strip())
