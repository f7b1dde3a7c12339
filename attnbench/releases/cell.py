"""One cell of the release matrix, run in the release's own environment, stage by stage.

The first stage (``matrix.STAGES``) that raises decides the status; a compiled torch kernel
compiles on its first call, so that call is its ``compile`` stage. Each cell runs in a killable
worker: a release whose jaxlib crashes or hangs ends that cell, not the matrix.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform as host_platform
import sys
import traceback

import attention_impls
import attnbench
from attnbench.backends import here
from attnbench.core import stats
from attnbench.measure.reference_check import check_numerics
from attnbench.measure.timing import time_step
from attnbench.releases import api, matrix
from attnbench.run.worker import Worker

CELL_TIMEOUT_S = 300.0
TIMING = {"min_seconds": 0.2, "target_rel_iqr": 0.05, "max_seconds": 0.5}
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def versions() -> dict:
    """The library versions this environment really has (``None``: not installed)."""
    out = {"python": host_platform.python_version()}
    for dist in ("jax", "jaxlib", "libtpu", "torch", "numpy", *matrix.COMPANIONS):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _project_line(exc: BaseException) -> str | None:
    """``path:line: code`` of the innermost frame of this project's code (installed or not)."""
    packages = [os.path.dirname(os.path.abspath(m.__file__)) for m in (attnbench, attention_impls)]

    def ours(path: str) -> bool:
        path = os.path.abspath(path)
        if any(path.startswith(p + os.sep) for p in packages):
            return True
        return path.startswith(_CHECKOUT + os.sep) and f"{os.sep}site-packages{os.sep}" not in path

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if ours(f.filename)]
    if not frames:
        return None
    frame = frames[-1]
    path = os.path.abspath(frame.filename)
    base = next((os.path.dirname(p) for p in packages if path.startswith(p + os.sep)), _CHECKOUT)
    return f"{os.path.relpath(path, base)}:{frame.lineno}: {(frame.line or '').strip()}"


def companions(framework: str, found: dict) -> str | None:
    """``absl-py 2.5.1, chex 0.1.90``: the companions this jax environment holds, ``none`` without
    them; ``None`` for torch (the matrix varies no companions of torch)."""
    if framework != "jax":
        return None
    return ", ".join(f"{d} {found[d]}" for d in matrix.COMPANIONS if found.get(d)) or "none"


def _row(impl_name: str, workload_name: str) -> dict:
    """A cell's identity and this environment's versions, before any stage ran."""
    framework = attention_impls.get(impl_name).framework
    found = versions()
    return {"impl": impl_name, "framework": framework, "workload": workload_name,
            "seq_len": matrix.WORKLOADS[workload_name].seq_q, "target": "cpu", "status": None, "stage": None,
            "reason": None, "line": None, "companions": companions(framework, found), **found}


def warm_step(impl_name: str, workload_name: str) -> tuple[dict, object | None]:
    """The cell's stages up to a step that ran once: the support check, import, compile, first run.
    ``(fields, step)``: the label and execution found, and the step; or, where a stage failed, those
    found before it with the status, stage, reason and line, and no step. Never raises for a failing
    cell (``run_cell`` goes on to numerics and time; ``env_server`` keeps the step to time it)."""
    workload = matrix.WORKLOADS[workload_name]
    impl = attention_impls.get(impl_name)
    fields: dict = {}
    stage = "import"
    try:
        # The support check first: a kernel refused here in every release (another platform's, a
        # mask it lacks) is unsupported, whatever its modules do on import in this one.
        reason = here.refusal_before_import(impl, workload)
        if reason:
            return {"status": matrix.UNSUPPORTED, "stage": stage, "reason": reason}, None
        # What is left of here.check(impl, workload): its refusals above and this import
        moved = impl.api_missing()
        if moved:  # a module the kernel imports is gone or breaks in this release
            return {"status": matrix.API_CHANGED, "stage": stage, "reason": moved}, None
        fields["label"] = impl.label(here.platform(impl))
        stage = "compile"
        step = here.make_step(impl, workload, seed=0)
        fields["execution"] = step.execution
        compiled_lazily = step.compile_info is None and step.execution == "compiled"
        stage = "compile" if compiled_lazily else "run"
        step.run()
    except attention_impls.Unsupported as exc:  # refused at a stage past the support check
        return {**fields, "status": matrix.UNSUPPORTED, "stage": stage, "reason": exc.reason}, None
    except Exception as exc:
        return {**fields, **_failed(stage, exc)}, None
    return fields, step


def _failed(stage: str, exc: BaseException) -> dict:
    return {"status": matrix.classify(stage, exc), "stage": stage, "reason": matrix.first_line(exc),
            "line": _project_line(exc)}


def run_cell(impl_name: str, workload_name: str) -> dict:
    """The cell's row (``matrix.COLUMNS`` it knows here); never raises for a failing cell."""
    workload = matrix.WORKLOADS[workload_name]
    cell = _row(impl_name, workload_name)
    impl = attention_impls.get(impl_name)
    # The names and signatures the kernel's call uses, as this release has them: the evidence of an
    # API change between two releases (api.moved), read before any stage can fail.
    cell["api_surface"] = api.surface_text(impl)
    fields, step = warm_step(impl_name, workload_name)
    cell.update(fields)
    if step is None:
        return cell
    stage = "numerics"
    try:
        numerics = check_numerics(impl, workload, step, seed=0)
        cell["max_abs_err"] = numerics.get("max_abs_err")
        if numerics.get("numerics_ok") is False:
            return {
                **cell,
                "status": matrix.NUMERICS_FAILED,
                "stage": stage,
                "reason": f"output differs from the float64 reference: max abs err {cell['max_abs_err']}",
            }
        stage = "time"
        timing = time_step(step.run, **TIMING)
        window = stats.estimate([timing.samples_s])
        cell.update(seconds_per_step=timing.median_s, ci_low_s=window.ci_low, ci_high_s=window.ci_high,
                    kernel_evidence=step.evidence())
    except attention_impls.Unsupported as exc:  # refused at a stage past the support check
        return {**cell, "status": matrix.UNSUPPORTED, "stage": stage, "reason": exc.reason}
    except Exception as exc:
        return {**cell, **_failed(stage, exc)}
    return {**cell, "status": matrix.OK}


def frameworks_here() -> tuple[str, ...]:
    """torch where installed (a torch venv's jax cells come from the jax releases), else jax."""
    return ("torch",) if importlib.util.find_spec("torch") is not None else ("jax",)


def kernel_names(framework: str) -> list[str]:
    """The framework's kernels the matrix varies: not those from a library beyond it (``library``),
    whose own pin the release environments do not hold."""
    return [n for n in attention_impls.names()
            if attention_impls.get(n).framework == framework and not attention_impls.get(n).library]


def run_cells(frameworks: tuple[str, ...] | None = None, progress: bool = False,
              done: frozenset = frozenset()) -> dict:
    """``{cell key: row}`` for every kernel of ``frameworks`` x workload not in ``done`` (cell keys
    already measured: a resumed matrix), in a killable worker."""
    cells = [
        (impl, name)
        for fw in (frameworks or frameworks_here())
        for impl in kernel_names(fw)
        for name in matrix.WORKLOADS
        if matrix.cell_key(impl, name) not in done
    ]
    if not cells:
        return {}
    out = {}
    with Worker(task=run_cell) as worker:
        for impl, name in cells:
            row, failure = worker.call((impl, name), CELL_TIMEOUT_S)
            if failure is not None:  # the worker hung or died: the library crashed under the cell
                row = {**_row(impl, name), "status": matrix.RUNTIME_ERROR, "reason": failure[1]}
            out[matrix.cell_key(impl, name)] = row
            if progress:
                print(
                    f"{impl} {name}: {row['status']}" + (f" ({row['reason']})" if row.get("reason") else ""),
                    file=sys.stderr,
                    flush=True,
                )
    return out
