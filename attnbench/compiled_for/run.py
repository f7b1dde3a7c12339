"""The compiled-for tier's sweeps: a grid of cases, the longest feasible length, the table.

``run_cases`` compiles every (target, implementation, workload) in a killable worker
(``CompileWorker``), one after another, with a progress bar; the table is rewritten atomically
after every case, so an interrupted sweep keeps what it compiled. ``max_feasible`` bisects, per
implementation x target x mode x dtype, on lengths that are multiples of the kernel's block for the
longest one whose program compiles and fits (``bisect_max_length``, which knows nothing of
compilers). Nothing here imports jax: the workers do.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.atomic import atomic_write_bytes
from attnbench.compiled_for import classify
from attnbench.compiled_for.records import COLUMNS, MAX_SEQ_COLUMNS
from attnbench.workload import Workload

DEFAULT_BLOCK = 128  # every kernel here tiles lengths by 128 at least
BLOCK_NAMES = ("BLOCK", "BLOCK_FWD", "BLOCK_Q")


@dataclass(frozen=True)
class Case:
    target: object  # targets.Target
    impl: str
    workload: Workload


def plan(targets, impls: list[str], template: Workload, seqs: list[int], modes: list[str],
         dtypes: list[str]) -> list[Case]:
    """Every target x implementation x mode x dtype x length, in that nesting (lengths innermost)."""
    return [Case(t, i, template.replace(seq_q=s, seq_k=s, mode=m, dtype=d))
            for t in targets for i in impls for m in modes for d in dtypes for s in seqs]


def kernel_block(impl) -> int:
    """The length granularity of ``impl``: its module's ``BLOCK`` (``BLOCK_FWD``, ``BLOCK_Q``), or 128."""
    module = sys.modules.get(type(impl).__module__)
    for name in BLOCK_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_BLOCK


def feasible(record: dict) -> bool:
    """A length is feasible when its program compiled and fits the device (``fits`` may come back
    from a CSV as a string or a numpy bool)."""
    return record.get("status") == classify.OK and str(record.get("fits")) == "True"


def bisect_max_length(is_feasible: Callable[[int], bool], block: int, hi: int) -> tuple[int, int]:
    """``(longest feasible length, lengths tried)`` among multiples of ``block`` up to ``hi``,
    assuming feasibility only falls as the length grows; 0 when not even ``block`` is feasible.
    ``hi`` is tried first (all feasible: one try), then a bisection on block counts."""
    top = hi // block
    if top < 1:
        raise ValueError(f"the bisection's upper length {hi} is below the kernel's block {block}")
    tried = 1
    if is_feasible(top * block):
        return top * block, tried
    lo_units, hi_units = 0, top  # lo feasible (0: nothing yet), hi infeasible
    while hi_units - lo_units > 1:
        mid = (lo_units + hi_units) // 2
        tried += 1
        if is_feasible(mid * block):
            lo_units = mid
        else:
            hi_units = mid
    return lo_units * block, tried


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _session(worker, total: int, progress: bool, desc: str):
    """``(worker, bar)`` for one sweep: the caller's worker or a new one (closed afterwards), and a
    progress bar (tqdm; none when ``progress`` is false, so that an environment without tqdm, a
    release matrix's, compiles too) closed whatever happens."""
    from attnbench.compiled_for.worker import CompileWorker

    own = worker is None
    worker = worker or CompileWorker()
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit="compile", file=sys.stderr, dynamic_ncols=True)
    else:
        bar = _NoBar()
    try:
        yield worker, bar
    finally:
        bar.close()
        if own:
            worker.close()


def run_cases(cases: list[Case], *, timeout_s: float = 300.0, progress: bool = True,
              on_record: Callable[[list[dict]], None] | None = None, hlo_dir: str | None = None,
              worker=None) -> list[dict]:
    """One record per case, in order; never stops for a failed case."""
    rows: list[dict] = []
    with _session(worker, len(cases), progress, "compile-for") as (worker, bar):
        for case in cases:
            w = case.workload
            bar.set_postfix_str(f"{case.target.name} {case.impl} {w.seq_q} {w.mode}")
            rows.append(worker.compile(case.target, case.impl, case.workload, timeout_s=timeout_s,
                                       hlo_dir=hlo_dir))
            if on_record:
                on_record(rows)
            bar.update(1)
    return rows


def max_feasible(targets, impls: list[str], template: Workload, modes: list[str], dtypes: list[str],
                 hi: int, *, known: list[dict] = (), timeout_s: float = 300.0, progress: bool = True,
                 worker=None) -> tuple[list[dict], list[dict]]:
    """Per target x implementation x mode x dtype: the longest feasible length up to ``hi``.

    Returns ``(summary rows, every record compiled for it)``. Records already in ``known`` (a
    grid's) answer their lengths without compiling again (``lengths_tried``: lengths the bisection
    looked at; ``compiles``: how many of them it had to compile). A case the implementation refuses at the
    top length (``unsupported``: the platform, the head sharding; lengths are multiples of the
    kernel's block, so not its block rule) stops there with its reason, without bisecting.
    """
    import attention_impls

    summary, compiled = [], []
    groups = [(t, i, m, d) for t in targets for i in impls for m in modes for d in dtypes]
    with _session(worker, len(groups), progress, "max length") as (worker, bar):
        for target, impl, mode, dtype in groups:
            block = kernel_block(attention_impls.get(impl))
            base = template.replace(mode=mode, dtype=dtype)
            seen = {r["seq_q"]: r for r in known if (r["target"], r["impl"], r["mode"], r["dtype"])
                    == (target.name, impl, mode, dtype) and r["seq_q"] == r["seq_k"]}
            fresh, consulted = 0, set()

            def check(length, target=target, impl=impl, base=base, seen=seen, consulted=consulted):
                nonlocal fresh
                consulted.add(length)
                if length not in seen:
                    record = worker.compile(target, impl, base.replace(seq_q=length, seq_k=length),
                                            timeout_s=timeout_s)
                    seen[length] = record
                    compiled.append(record)
                    fresh += 1
                return feasible(seen[length])

            bar.set_postfix_str(f"{target.name} {impl} {mode}")
            top = (hi // block) * block
            check(top)
            if seen[top].get("status") == classify.UNSUPPORTED:
                longest = 0
            else:
                longest, _ = bisect_max_length(check, block, hi)
            failing = sorted(n for n, r in seen.items() if n > longest and not feasible(r))
            stop = seen[failing[0]] if failing else None
            stopped_by = None
            if stop is not None:
                why = stop["status"] if stop["status"] != classify.OK else "does not fit (peak > HBM)"
                reason = stop.get("reason")
                stopped_by = f"{failing[0]}: {why}" + (f": {reason}" if isinstance(reason, str) else "")
            summary.append({"target": target.name, "impl": impl, "mode": mode, "dtype": dtype,
                            "block": block, "execution": seen[top].get("execution"),
                            "max_feasible_seq": longest or None, "tried_up_to": hi,
                            "lengths_tried": len(consulted), "compiles": fresh, "stopped_by": stopped_by})
            bar.update(1)
    return summary, compiled


def write_table(rows: list[dict], path: str, columns: list[str] = COLUMNS) -> None:
    """``rows`` as CSV or Parquet (by the extension), written atomically; columns in ``columns``'
    order, then any others."""
    import pandas as pd

    extra = [c for r in rows for c in r if c not in columns]
    frame = pd.DataFrame(rows, columns=list(columns) + list(dict.fromkeys(extra)))
    for column in frame.columns:  # byte counts and lengths stay integers beside missing values
        values = frame[column]
        if values.dtype.kind == "f" and values.notna().any() and (values.dropna() % 1 == 0).all() \
                and (column.endswith(("_bytes", "_seq")) or column in ("seq_q", "seq_k", "fusions",
                                                                         "inserted_copies", "devices",
                                                                         "window", "documents")):
            frame[column] = values.astype("Int64")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".parquet"):
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        atomic_write_bytes(path, buffer.getvalue())
    else:
        atomic_write_bytes(path, frame.to_csv(index=False).encode("utf-8"))


def max_seq_table(rows: list[dict], path: str) -> None:
    write_table(rows, path, MAX_SEQ_COLUMNS)
