"""What the asv class ``benchmarks/compiled_for.py`` compiles, and how it reads the records.

Sizes follow ``ATTNBENCH_SUITE`` like the measured suite: ``default`` (``make bench``: two targets,
forward, two lengths, kernels on their own or a portable lowering only; ~20 s of compiles here),
``smoke`` (the tests), ``full`` (every target, both modes, 1k-128k, interpreted kernels too).
``ATTNBENCH_COMPILE_TARGETS=tpu-v5e,h200`` and ``ATTNBENCH_IMPLS`` narrow a run.

The class runs where the compilers are: the targets venv (``.venv-targets``: libtpu and the CUDA
plugin); ``make bench`` runs it there as an existing asv environment. Anywhere else every case is
skipped (``NotImplementedError`` with the install step: asv shows n/a), without importing jax.
Figures tracked are the compiler's decisions, deterministic for a given commit and compiler
versions: peak/temp bytes, inserted copy bytes, fits, the roofline model, a status code.
"""

from __future__ import annotations

import math
import os

from attnbench.compiled_for import classify
from attnbench.workload import Workload

VERSION = "1"  # the benchmarks' explicit asv version: cosmetic edits keep the history
TEMPLATE = Workload(batch=1, q_heads=8, head_dim=64, seq_q=4096, causal=True, mode="fwd", dtype="bfloat16")
SUITES = {
    "default": {"targets": ("tpu-v5e", "h200"), "seqs": (4096, 32768), "modes": ("fwd",),
                "dtypes": ("bfloat16",), "interpreted": False},
    "smoke": {"targets": ("tpu-v5e", "h200"), "seqs": (1024,), "modes": ("fwd",),
              "dtypes": ("bfloat16",), "interpreted": False},
    "full": {"targets": ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v5e-2x2", "h100-sxm", "h200"),
             "seqs": (1024, 4096, 16384, 32768, 65536, 131072), "modes": ("fwd", "fwd_bwd"),
             "dtypes": ("bfloat16",), "interpreted": True},
}
COMPILE_TIMEOUT_S = 900.0
# The status metric: lower is better, as asv assumes. unsupported cases are skipped (n/a) instead.
STATUS_CODES = {classify.OK: 0, classify.DOES_NOT_FIT: 1, classify.KERNEL_REFUSED: 2,
                classify.TIMEOUT: 3, classify.ERROR: 4}
TARGETS_ENV = "ATTNBENCH_COMPILE_TARGETS"


def settings() -> dict:
    from attnbench.asv_suite import suite_name

    name = suite_name()
    if name not in SUITES:
        raise ValueError(f"ATTNBENCH_SUITE must be one of {sorted(SUITES)}, got {name!r}")
    return SUITES[name]


def target_names() -> list[str]:
    from attnbench.compiled_for.targets import get_targets

    chosen = os.environ.get(TARGETS_ENV)
    names = [n.strip() for n in chosen.split(",") if n.strip()] if chosen else list(settings()["targets"])
    return [t.name for t in get_targets(names)]  # unknown names fail loudly


def impl_names() -> list[str]:
    import attention_impls
    from attnbench.asv_suite import impl_names as suite_impls

    return [n for n in suite_impls() if attention_impls.get(n).framework == "jax"]


def workload(seq_len: int, mode: str, dtype: str) -> Workload:
    return TEMPLATE.replace(seq_q=seq_len, seq_k=seq_len, mode=mode, dtype=dtype)


def key(target: str, impl: str, seq_len: int, mode: str, dtype: str) -> str:
    from attnbench.compiled_for.records import case_key

    return case_key(target, impl, workload(seq_len, mode, dtype))


def outside_suite(target, impl_name: str, grid: dict) -> str | None:
    """Why a case is left out of this suite size without compiling (interpreted kernels in default)."""
    import attention_impls

    support = attention_impls.get(impl_name).platform_support[target.platform]
    if support.status == "interpret-only" and not grid["interpreted"]:
        return (f"{impl_name} is interpret-only on {target.platform} ({support.note}); the "
                "default suite compiles kernels on their own hardware and portable lowerings only "
                "(ATTNBENCH_SUITE=full compiles it too)")
    return None


def compile_grid(targets: list[str], impls: list[str], seqs: list[int], modes: list[str],
                 dtypes: list[str]) -> dict:
    """``{case key: record}``: every case compiled once (one killable worker), or a skip record
    ``{"skip": reason}`` where this environment lacks the target's compiler or the suite leaves
    the case out. Imports jax only in the worker."""
    from attnbench.compiled_for.run import Case, run_cases
    from attnbench.compiled_for.targets import environment_problem, get_targets

    grid = settings()
    out, cases = {}, []
    for target in get_targets(targets):
        problem = environment_problem(target.platform)
        for impl in impls:
            left_out = problem or outside_suite(target, impl, grid)
            for mode in modes:
                for dtype in dtypes:
                    for seq in seqs:
                        k = key(target.name, impl, seq, mode, dtype)
                        if left_out:
                            out[k] = {"skip": left_out}
                        else:
                            cases.append((k, Case(target, impl, workload(seq, mode, dtype))))
    if cases:
        rows = run_cases([c for _, c in cases], timeout_s=COMPILE_TIMEOUT_S, progress=False)
        out.update({k: row for (k, _), row in zip(cases, rows, strict=True)})
    return out


def record_for(cache: dict, target: str, impl: str, seq_len: int, mode: str, dtype: str) -> dict:
    """The case's record; ``NotImplementedError`` (asv: n/a) for a skipped or unsupported case."""
    record = cache.get(key(target, impl, seq_len, mode, dtype))
    if record is None:
        raise NotImplementedError(f"{target} {impl} {seq_len} {mode} {dtype}: not compiled in this run")
    if "skip" in record:
        raise NotImplementedError(record["skip"])
    if record.get("status") == classify.UNSUPPORTED:
        raise NotImplementedError(f"{impl} on {target}: {record.get('reason')}")
    return record


def number(record: dict, column: str) -> float:
    """A column as a float for asv; NaN (n/a) where the compile gave none."""
    value = record.get(column)
    if value is None or isinstance(value, str):
        return math.nan
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    value = float(value)
    return value if math.isfinite(value) else math.nan


def status_code(record: dict) -> float:
    return float(STATUS_CODES.get(record.get("status"), STATUS_CODES[classify.ERROR]))


def does_not_fit(record: dict) -> float:
    """1 when the program does not fit the target's HBM (or the compiler refused it for that), 0
    when it fits; lower is better, as asv assumes. NaN where unknowable (a failed compile)."""
    fits = record.get("fits")
    return math.nan if fits is None else (0.0 if fits else 1.0)
