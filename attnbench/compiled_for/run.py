"""The compiled-for tier's sweeps: a grid of cases, the longest feasible length, the table.

Every compile runs in a killable worker; the table is rewritten atomically after every case, so an
interrupted sweep keeps what it compiled. The bisections know nothing of compilers. Nothing here
imports jax: the workers do.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import attention_impls
from attnbench.compiled_for import classify
from attnbench.compiled_for import worker as compile_worker
from attnbench.compiled_for.records import COLUMNS, MAX_BATCH_COLUMNS, MAX_SEQ_COLUMNS
from attnbench.core.atomic import atomic_write_bytes
from attnbench.core.workload import CUSTOM, Workload

# Imported where used: pandas (the torch_xla venv has no report libraries); tqdm (not in every venv).

DEFAULT_BLOCK = 128  # every kernel here tiles lengths by 128 at least
BLOCK_NAMES = ("BLOCK", "BLOCK_FWD", "BLOCK_Q")
# Counts a table writes as integers even beside missing values (pandas would make them floats).
INTEGER_COLUMNS = ("seq_q", "seq_k", "fusions", "inserted_copies", "devices", "window", "documents",
                   "max_batch", "tokens_per_chip")


@dataclass(frozen=True)
class Case:
    target: object  # targets.Target
    impl: str
    workload: Workload


def plan(targets, impls: list[str], template: Workload, seqs: list[int], modes: list[str],
         dtypes: list[str]) -> list[Case]:
    """Every target x implementation x mode x dtype x length, in that nesting (lengths innermost). A
    length is the template's ``stream_length`` (a preset's decode: its cache; else seq_q = seq_k)."""
    return [Case(t, i, template.replace(mode=m, dtype=d).at_length(s))
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
    """Compiled and fits (``fits`` may come back from a CSV as a string or a numpy bool)."""
    return record.get("status") == classify.OK and str(record.get("fits")) == "True"


def bisect_max_length(is_feasible: Callable[[int], bool], block: int, hi: int) -> tuple[int, int]:
    """``(longest feasible length, lengths tried)`` among multiples of ``block`` up to ``hi``.

    Assumes feasibility only falls as the length grows; 0 when not even ``block`` is feasible."""
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


def bisect_max_batch(is_feasible: Callable[[int], bool], hi: int,
                     estimates: Iterable[int | None] = ()) -> tuple[int, int]:
    """``(largest feasible batch in 1..hi, batches tried)``, assuming feasibility only falls as the
    batch grows; 0 when batch 1 is not feasible.

    ``estimates`` are read lazily, so a later guess can use the compiles before it; each is tried
    with its neighbour, so a good guess answers in two tries. The answer is always confirmed on
    both sides: feasible, and ``hi`` or its successor tried and infeasible.
    """
    if hi < 1:
        raise ValueError(f"the bisection's upper batch {hi} is below 1")
    asked: dict[int, bool] = {}

    def ask(batch: int) -> bool:
        if batch not in asked:
            asked[batch] = bool(is_feasible(batch))
        return asked[batch]

    if not ask(1):
        return 0, len(asked)
    lo, up = 1, hi + 1  # lo feasible, up infeasible (hi + 1: nothing known to fail yet)
    for guess in estimates:
        if up - lo <= 1:
            break
        if guess is None:
            continue
        guess = min(max(int(guess), lo + 1), up - 1)  # only a batch inside the bracket says anything
        if ask(guess):
            lo = guess
            if guess + 1 < up:
                lo, up = (guess + 1, up) if ask(guess + 1) else (lo, guess + 1)
        else:
            up = guess
            if guess - 1 > lo:
                lo, up = (guess - 1, up) if ask(guess - 1) else (lo, guess - 1)
    if up > hi and lo < hi:
        if ask(hi):
            lo = hi
        else:
            up = hi
    while up - lo > 1:
        mid = (lo + up) // 2
        if ask(mid):
            lo = mid
        else:
            up = mid
    return lo, len(asked)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _session(worker, total: int, progress: bool, desc: str):
    """``(worker, bar)`` for one sweep; tqdm is imported only with ``progress`` (not in every venv)."""
    own = worker is None
    worker = worker or compile_worker.CompileWorker()
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
              on_record: Callable[[int, dict], None] | None = None, hlo_dir: str | None = None,
              worker=None) -> list[dict]:
    """One record per case, in order; never stops for a failed case. ``on_record(i, record)`` as each ends."""
    rows: list[dict] = []
    with _session(worker, len(cases), progress, "compile-for") as (worker, bar):
        for i, case in enumerate(cases):
            w = case.workload
            bar.set_postfix_str(f"{case.target.name} {case.impl} {w.seq_q} {w.mode}")
            rows.append(worker.compile(case.target, case.impl, case.workload, timeout_s=timeout_s,
                                       hlo_dir=hlo_dir))
            if on_record:
                on_record(i, rows[-1])
            bar.update(1)
    return rows


def max_feasible(targets, impls: list[str], template: Workload, modes: list[str], dtypes: list[str],
                 hi: int, *, known: list[dict] = (), timeout_s: float = 300.0, progress: bool = True,
                 worker=None) -> tuple[list[dict], list[dict]]:
    """Per target x implementation x mode x dtype: the longest feasible length up to ``hi``.

    Returns ``(summary rows, every record compiled for it)``; records in ``known`` are not compiled
    again. A case ``unsupported`` at the top length is not bisected: lengths are multiples of the
    kernel's block, so the refusal does not depend on the length.
    """
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
            stopped_by = _stopped_by(failing[0], seen[failing[0]]) if failing else None
            summary.append({"target": target.name, "impl": impl, "mode": mode, "dtype": dtype,
                            "block": block, "execution": seen[top].get("execution"),
                            "max_feasible_seq": longest or None, "tried_up_to": hi,
                            "lengths_tried": len(consulted), "compiles": fresh, "stopped_by": stopped_by})
            bar.update(1)
    return summary, compiled


def _stopped_by(at: int, record: dict) -> str:
    """``4096: does-not-fit: <the compiler's words>``: what an infeasible record says, at ``at``."""
    why = record["status"] if record["status"] != classify.OK else "does not fit (peak > HBM)"
    reason = record.get("reason")
    return f"{at}: {why}" + (f": {reason}" if isinstance(reason, str) else "")


def _peak(record: dict) -> float | None:
    """Bytes per device the program needs: its peak, or what the compiler said when it refused."""
    key = "peak_bytes" if record.get("status") == classify.OK else "compiler_required_bytes"
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and value == value and value > 0 else None


def _batch_estimates(seen: dict[int, dict], hbm) -> Iterator[int]:
    """Guesses at the largest batch that fits, memory linear in the batch: through zero and batch 1,
    then through batch 1 and the largest compiled since (which sees a part fixed in the batch)."""
    first = _peak(seen[1])
    if first is None or not isinstance(hbm, (int, float)) or not hbm == hbm or hbm <= 0:
        return
    yield int(hbm // first)
    points = [(b, p) for b, p in ((b, _peak(r)) for b, r in seen.items() if b > 1) if p is not None]
    if points:
        batch, peak = max(points)
        if peak > first:
            yield 1 + int((hbm - first) // ((peak - first) / (batch - 1)))


def max_batch(targets, impls: list[str], template: Workload, seqs: list[int], modes: list[str],
              dtypes: list[str], hi: int, *, known: list[dict] = (), timeout_s: float = 300.0,
              progress: bool = True, worker=None,
              on_row: Callable[[list[dict]], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Per target x implementation x mode x dtype x length: the largest feasible batch up to ``hi``.

    Returns ``(summary rows, every record compiled for it)``; ``on_row(rows so far)`` after each
    case. An interpreted case is skipped: the Pallas interpreter's memory says nothing about the
    real kernel.
    """
    summary, compiled = [], []
    groups = [(t, i, m, d, s) for t in targets for i in impls for m in modes for d in dtypes for s in seqs]
    with _session(worker, len(groups), progress, "max batch") as (worker, bar):
        for target, impl, mode, dtype, seq in groups:
            base = template.replace(mode=mode, dtype=dtype).at_length(seq)
            # a record from before records named their workload and mask is the B1 H8 D64 shape's
            seen = {int(r["batch"]): r for r in known
                    if (r["target"], r["impl"], r["mode"], r["dtype"], r["seq_q"], r["seq_k"],
                        r.get("workload") or CUSTOM, r.get("mask") or base.mask)
                    == (target.name, impl, mode, dtype, base.seq_q, base.seq_k, base.name, base.mask)
                    and r.get("batch") is not None}
            fresh, consulted = 0, set()

            def check(batch, target=target, impl=impl, base=base, seen=seen, consulted=consulted):
                nonlocal fresh
                consulted.add(batch)
                if batch not in seen:
                    record = worker.compile(target, impl, base.replace(batch=batch), timeout_s=timeout_s)
                    seen[batch] = record
                    compiled.append(record)
                    fresh += 1
                return feasible(seen[batch])

            bar.set_postfix_str(f"{target.name} {impl} {seq} {mode}")
            check(1)
            first = seen[1]
            largest, capped, stopped_by, skipped = 0, None, None, None
            if first.get("status") == classify.UNSUPPORTED:
                skipped, stopped_by = "unsupported at batch 1", _stopped_by(1, first)
            elif first.get("execution") == "interpret":
                skipped = "interpret: the Pallas interpreter's memory says nothing about the kernel"
            else:
                largest, _ = bisect_max_batch(check, hi, _batch_estimates(seen, first.get("hbm_bytes")))
                capped = largest == hi
                if largest == 0:
                    skipped = "not feasible at batch 1"
                if not capped:
                    stopped_by = _stopped_by(largest + 1, seen[largest + 1])
            at = seen[largest] if largest else {}
            tokens = largest * seq
            chips = getattr(target, "chips", 1) or 1
            summary.append({"target": target.name, "impl": impl, "workload": base.name, "phase": base.phase,
                            "mode": mode, "dtype": dtype, "seq_len": seq,
                            "execution": first.get("execution"), "max_batch": largest or None,
                            "tried_up_to": hi, "batches_tried": len(consulted), "compiles": fresh,
                            "capped": capped,
                            "tokens_per_chip": (tokens // chips if tokens % chips == 0 else tokens / chips)
                            if largest else None,
                            "peak_bytes_at_max": at.get("peak_bytes"), "hbm_bytes": first.get("hbm_bytes"),
                            "inserted_copy_bytes_at_max": at.get("inserted_copy_bytes"),
                            "stopped_by": stopped_by, "skipped": skipped})
            if on_row:
                on_row(summary)
            bar.update(1)
    return summary, compiled


def write_table(rows: list[dict], path: str, columns: list[str] = COLUMNS) -> None:
    """``rows`` as CSV or Parquet (by the extension), written atomically, ``columns`` first."""
    import pandas as pd

    extra = [c for r in rows for c in r if c not in columns]
    frame = pd.DataFrame(rows, columns=list(columns) + list(dict.fromkeys(extra)))
    for column in frame.columns:  # byte counts and lengths stay integers beside missing values
        values = frame[column]
        if values.dtype.kind == "f" and values.notna().any() and (values.dropna() % 1 == 0).all() \
                and (column.endswith(("_bytes", "_seq", "_bytes_at_max")) or column in INTEGER_COLUMNS):
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


def max_batch_table(rows: list[dict], path: str) -> None:
    write_table(rows, path, MAX_BATCH_COLUMNS)


def parse_length(text: str) -> int:
    """``4096``, ``4k`` (4096) or ``1m`` (2^20)."""
    raw = text.strip().lower()
    factor = {"k": 1024, "m": 1024 * 1024}.get(raw[-1:], 1)
    try:
        value = int(raw[:-1] if factor > 1 else raw) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"a length looks like 4096, 4k or 64k, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a length must be positive, got {text!r}")
    return value
