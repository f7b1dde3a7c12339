"""Re-execute ``notebooks/cost_spikes.ipynb`` in place: ``make notebook``.

The notebook is committed executed, so that a code host shows its tables and plots (PNG outputs,
matplotlib inline). ``python -m attnbench.report.notebook [NOTEBOOK]`` runs it top to bottom with
nbclient in a fresh ``python3`` kernel of this interpreter's environment (cwd ``notebooks/``), on the
committed ``results/`` (``ATTNBENCH_NOTEBOOK_RESULTS`` is not passed on), and writes it back
atomically only when every cell ran without error and nothing under ``results/`` changed; otherwise
the file on disk is left as it was and the command exits 1 naming the cell and the error.

What it writes diffs reasonably: no execution timing metadata (``metadata.execution``), execution
counts 1, 2, ... in cell order, consecutive stream outputs of one cell merged.
``tests/test_report.py`` executes the notebook with ``execute`` and compares ``structure`` of the
committed notebook with the fresh execution's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from attnbench.core.atomic import atomic_write_text

# Imported where used: jupyter_client, nbclient, nbformat (the torch_xla venv has no report libraries).

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "cost_spikes.ipynb"
RESULTS = ROOT / "results"
RESULTS_ENV = "ATTNBENCH_NOTEBOOK_RESULTS"
KERNEL = "python3"


class NotebookCellError(RuntimeError):
    """A cell failed (raised, timed out, killed its kernel): its index in ``nb.cells`` and the error."""

    def __init__(self, index: int | None, cell_id: str | None, ename: str, evalue: str):
        self.index, self.cell_id, self.ename, self.evalue = index, cell_id, ename, evalue
        where = "before any cell" if index is None else f"cell {index}"
        where += f" (id {cell_id})" if index is not None and cell_id else ""
        super().__init__(f"{where}: {ename}: {evalue}")


def execute(path: str | os.PathLike = NOTEBOOK, results: str | os.PathLike | None = None, timeout: int = 600):
    """A fresh execution of the notebook at ``path`` (the file is only read), normalised.

    ``results``: the folder it reads (None: the repository's ``results/``). Raises
    ``NotebookCellError`` on the first failing cell.
    """
    import nbclient
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env.pop(RESULTS_ENV, None)
    if results is not None:
        env[RESULTS_ENV] = str(results)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # plots as PNG outputs
    # This environment's own kernelspec (its "python" argv is this interpreter), never a user-wide one.
    specs = KernelSpecManager(kernel_dirs=[os.path.join(sys.prefix, "share", "jupyter", "kernels")])

    class Client(nbclient.NotebookClient):
        def create_kernel_manager(self):
            self.km = self.kernel_manager_class(kernel_name=KERNEL, kernel_spec_manager=specs,
                                                config=self.config)
            return self.km

    current: dict = {"index": None, "id": None}
    client = Client(nb, timeout=timeout, kernel_name=KERNEL, record_timing=False, coalesce_streams=True,
                    resources={"metadata": {"path": str(path.parent)}},
                    on_cell_start=lambda cell, cell_index: current.update(index=cell_index,
                                                                          id=cell.get("id")))
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        raise NotebookCellError(current["index"], current["id"], e.ename, e.evalue) from e
    except (CellTimeoutError, DeadKernelError) as e:
        raise NotebookCellError(current["index"], current["id"], type(e).__name__,
                                str(e).strip().splitlines()[0] if str(e).strip() else "") from e
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                raise NotebookCellError(index, cell.get("id"), out.ename, out.evalue)
    return normalise(nb)


def normalise(nb):
    """Drop execution timing metadata and number the executed code cells 1, 2, ... in order."""
    count = 0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        if cell.execution_count is not None:
            count += 1
            cell.execution_count = count
        for out in cell.outputs:
            if out.output_type == "execute_result":
                out.execution_count = cell.execution_count
    return nb


def structure(nb) -> dict[int, list[str]]:
    """Per code cell with outputs (by index in ``nb.cells``): its kinds of output, sorted, e.g.
    ``stream:stdout``, ``display_data:image/png``, ``execute_result:text/html``, ``error:NameError``."""
    kinds: dict[int, set[str]] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.outputs:
            continue
        for out in cell.outputs:
            if out.output_type == "stream":
                found = {f"stream:{out.name}"}
            elif out.output_type == "error":
                found = {f"error:{out.ename}"}
            else:
                found = {f"{out.output_type}:{mime}" for mime in out.get("data", {})} or {out.output_type}
            kinds.setdefault(index, set()).update(found)
    return {index: sorted(found) for index, found in kinds.items()}


def listing(folder: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder`` with its (mtime_ns, size): a folder's mtime moves when
    an entry is created or removed in it, even a temporary one."""
    folder = Path(folder)
    entries = {".": (folder.stat().st_mtime_ns, 0)} if folder.exists() else {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        entries[str(p.relative_to(folder))] = (st.st_mtime_ns, 0 if p.is_dir() else st.st_size)
    return entries


def changed(before: dict, after: dict) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.report.notebook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", nargs="?", default=str(NOTEBOOK), help="default: %(default)s")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default %(default)s)")
    args = parser.parse_args(argv)
    import nbformat

    start = time.monotonic()
    before = listing(RESULTS)
    try:
        nb = execute(args.notebook, None, args.timeout)
    except NotebookCellError as e:
        print(f"{args.notebook} not written: {e}", file=sys.stderr)
        return 1
    moved = changed(before, listing(RESULTS))
    if moved:
        print(f"{args.notebook} not written: executing it changed {len(moved)} path(s) under {RESULTS}: "
              f"{', '.join(moved[:10])} (the notebook must only read results/; or a concurrent `make bench`)",
              file=sys.stderr)
        return 1
    nbformat.validate(nb)
    text = nbformat.writes(nb, version=4)

    mode = os.stat(args.notebook).st_mode & 0o7777
    atomic_write_text(args.notebook, text if text.endswith("\n") else text + "\n")
    os.chmod(args.notebook, mode)  # the temp file atomic_write_text renames is 0600
    cells = [c for c in nb.cells if c.cell_type == "code"]
    print(f"{args.notebook}: executed {len(cells)} code cells in {time.monotonic() - start:.0f} s, "
          f"{sum(1 for c in cells if c.outputs)} with outputs, {len(text.encode()) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
