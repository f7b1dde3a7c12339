"""The asv glue of ``benchmarks/releases.py``: measure this environment's cells once, file them, and
hand each benchmark its cell.

Cells are also filed beside the asv results as ``<machine>/cells/<commit8>-<env>.cells``: statuses,
reasons and evidence, which asv's numbers cannot hold. Not ``.json``: ``asv publish`` would read it
as a result file.
"""

from __future__ import annotations

import json
import os

import attention_impls
from attnbench.asv.machine import asv_context
from attnbench.compiled_for import classify
from attnbench.compiled_for.run import max_batch
from attnbench.compiled_for.suite import TEMPLATE, compile_grid, key
from attnbench.compiled_for.targets import get_targets
from attnbench.compiled_for.worker import CompileWorker
from attnbench.core.atomic import atomic_write_text
from attnbench.releases import api, matrix
from attnbench.releases.cell import companions, run_cells, versions

VERSION = "1"  # the benchmarks' explicit asv version


def impl_names() -> list[str]:
    """Every jax and torch kernel but those from a library beyond the framework (``library``: the
    release environments do not hold its pin); params must not differ between environments."""
    return [n for n in attention_impls.names()
            if attention_impls.get(n).framework in ("jax", "torch") and not attention_impls.get(n).library]


def cells_path(context: dict) -> str:
    return os.path.join(
        context["results_dir"], context["machine"], "cells", f"{context['commit'][:8]}-{context['env']}.cells"
    )


def file_cells(rows: dict, context: dict | None = None) -> str | None:
    """Merge ``rows`` into the environment's cells file (atomically; ``context``: asv's by default);
    ``None`` outside asv."""
    context = context or asv_context()
    if context is None:
        return None
    path = cells_path(context)
    merged = read_cells(path)
    merged.update(
        {k: {**row, "env_name": context["env"], "commit": context["commit"]} for k, row in rows.items()}
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, json.dumps(merged, indent=1, sort_keys=True, default=str))
    return path


def filed_here(context: dict | None = None) -> dict:
    """The cells this environment already filed for this commit (a resumed matrix measures the rest)."""
    context = context or asv_context()
    return read_cells(cells_path(context)) if context else {}


def read_cells(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def measure_cells() -> dict:
    """``Releases.setup_cache``: this environment's CPU cells, filed; those filed already for this
    commit are kept, not measured again."""
    filed = filed_here()
    rows = run_cells(done=frozenset(filed))
    if rows:
        file_cells(rows)
    return {**filed, **rows}


def tpu_key(target: str, impl: str, seq_len: int) -> str:
    return f"{target}|{impl}|{seq_len}"


def compile_tpu_cells(context: dict | None = None) -> dict:
    """``ReleasesTPU.setup_cache``: the TPU compiles of this environment's libtpu, filed (``context``:
    where; asv's by default). When every one was filed for this commit, nothing compiles; else the
    grid compiles again (seconds) and the cells filed already are kept as they were."""
    filed = filed_here(context)
    keys = [tpu_key(t, i, s) for t in matrix.TPU_TARGETS for i in matrix.TPU_IMPLS for s in matrix.TPU_SEQS]
    if all(k in filed for k in keys):
        return filed
    records = compile_grid(
        list(matrix.TPU_TARGETS), list(matrix.TPU_IMPLS), list(matrix.TPU_SEQS), ["fwd"], ["bfloat16"]
    )
    largest = largest_batches(records)
    out = {}
    for t in matrix.TPU_TARGETS:
        for i in matrix.TPU_IMPLS:
            for s in matrix.TPU_SEQS:
                record, k = records[key(t, i, s, "fwd", "bfloat16")], tpu_key(t, i, s)
                out[k] = record if "skip" in record else {**tpu_row(k, record), "max_batch": largest.get(k)}
    compiled = {k: row for k, row in out.items() if "skip" not in row and k not in filed}
    if compiled:
        file_cells(compiled, context)
    return {**out, **{k: row for k, row in filed.items() if k in out}}


def largest_batches(records: dict) -> dict[str, int | None]:
    """``{tpu key: the largest batch that compiles and fits}`` (up to ``matrix.MAX_BATCH_HI``) of each
    cell that compiled at batch 1, found by the compiled-for tier's own search (``run.max_batch``,
    its batch-1 record reused)."""
    ok = [(t, i, s) for t in matrix.TPU_TARGETS for i in matrix.TPU_IMPLS for s in matrix.TPU_SEQS
          if records[key(t, i, s, "fwd", "bfloat16")].get("status") == classify.OK]
    out = {}
    if not ok:
        return out
    with CompileWorker() as worker:  # one process for every search, not one per cell
        for t, i, s in ok:
            [row], _ = max_batch(get_targets([t]), [i], TEMPLATE, [s], ["fwd"], ["bfloat16"],
                                 matrix.MAX_BATCH_HI, known=[records[key(t, i, s, "fwd", "bfloat16")]],
                                 progress=False, worker=worker)
            out[tpu_key(t, i, s)] = row["max_batch"]
    return out


def tpu_row(k: str, record: dict) -> dict:
    """A compiled-for record as a release-matrix row."""
    target, impl, seq = k.split("|")
    status = {
        classify.OK: matrix.OK,
        classify.UNSUPPORTED: matrix.UNSUPPORTED,
        classify.DOES_NOT_FIT: matrix.DOES_NOT_FIT,
    }.get(record.get("status"))
    if status == matrix.UNSUPPORTED and "does not import in" in (record.get("reason") or ""):
        status = matrix.API_CHANGED  # the support check's import failed: the release moved, not the kernel
    if status is None:  # refused by Mosaic, timed out, or raised
        status = matrix.classify_text("compile", record.get("reason"))
    fits = record.get("fits")
    row = {
        "impl": impl,
        "framework": "jax",
        "target": target,
        "workload": "causal-tpu",
        "seq_len": int(seq),
        "status": status,
        "stage": "compile" if status in matrix.BROKEN else None,
        "reason": record.get("reason") or (None if fits is not False else "does not fit in HBM"),
        "label": record.get("label"),
        "execution": record.get("execution"),
        "kernel_evidence": record.get("kernel_evidence"),
        "custom_calls": record.get("custom_calls"),
        "peak_bytes": record.get("peak_bytes"),
        "temp_bytes": record.get("temp_bytes"),
        "inserted_copy_bytes": record.get("inserted_copy_bytes"),
        **versions(),
    }
    if record.get("libtpu"):
        row["libtpu"] = record["libtpu"]
    row["companions"] = companions("jax", row)
    row["api_surface"] = api.surface_text(attention_impls.get(impl))
    return row


def cell_for(cache: dict, k: str) -> dict:
    """The cell, for ``setup``: ``NotImplementedError`` (n/a) where not run or refused,
    ``RuntimeError`` where it broke."""
    row = cache.get(k)
    if row is None:
        raise NotImplementedError(f"{k}: not a cell of this environment")
    if "skip" in row:
        raise NotImplementedError(row["skip"])
    status = row.get("status")
    if status == matrix.UNSUPPORTED:
        raise NotImplementedError(row.get("reason") or "unsupported")
    if status in matrix.BROKEN:
        raise RuntimeError(f"{status}: {row.get('reason')}")
    return row


def number(row: dict, column: str) -> float:
    value = row.get(column)
    return float("nan") if value is None else float(value)
