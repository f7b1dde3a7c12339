"""Tuned tiles on the compile targets: every candidate tile config, compiled ahead of time, the one kept.

    .venv-targets/bin/python -m attnbench tune-targets [--target tpu-v5e tpu-v6e h200]
        [--impl jax-pallas-tpu-splash ...] [--case llama-3.1-8b:prefill:8k,32k ...] [--max-batch 4096]

For each target x kernel x preset workload (at its real length), each candidate of the kernel's
``search_space`` that the workload takes (``AttentionImpl.candidates``: a refused one is a row with its
reason) is compiled for the target in the tier's killable worker (``compile_case`` with the config),
then the largest batch the defaults fit is bisected (``run.bisect_max_batch``, as ``compile-for
--max-batch``), and another candidate's where its linear estimate from its peak (``max_batch_estimate``)
beats the best checked one's. Per candidate the row says whether it compiles and why not, whether it fits, the
compiler's memory (peak, HLO temporaries, the Pallas kernel's scoped VMEM from the compiled HLO) and
the roofline **model**'s tokens per second per chip. Nothing runs on the target: speed there is
modelled, never measured. Numerics are checked on this host instead: the best-ranked candidate's
tiles run in the kernel's interpreter (or XLA) on the CPU at a small float32 case of the preset's mask
against the float64 reference; one that fails is recorded with its error and the next is checked.

The kept config, per target x kernel x workload: among the candidates that compile and fit at the
preset's batch and do not fail the numerics check, the one that holds the most tokens per chip
(largest batch x length), then the most modelled tokens/s per chip, then the defaults. A candidate
that fails to compile, does not fit, breaks numerics or was refused is never kept. Written
atomically after every case to ``results/tuning/compiled-for.csv`` (one row per candidate, ``kept``)
and ``results/tuning/compiled-for-kept.csv`` (one row per case).
Nothing here imports jax: the worker does.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import attention_impls
from attention_impls.base import config_text, parse_config
from attnbench.compiled_for import classify, run
from attnbench.compiled_for import worker as compile_worker
from attnbench.compiled_for.records import KEPT_COLUMNS, new_record
from attnbench.core import presets
from attnbench.core.workload import Workload

TUNING_DIR = os.path.join("results", "tuning")
ROWS_PATH = os.path.join(TUNING_DIR, "compiled-for.csv")
KEPT_PATH = os.path.join(TUNING_DIR, "compiled-for-kept.csv")
DEFAULT_TARGETS = ("tpu-v5e", "tpu-v6e", "h200")
# The presets at their real lengths, as ``make headroom`` compiles them (HEADROOM_CASES).
DEFAULT_CASES = ("llama-3.1-8b:prefill:8k,32k", "llama-3.1-8b:decode:32k,128k", "gemma-2-9b:prefill:8k")
DTYPE = "bfloat16"
SPEED = "modelled (roofline), not measured: nothing ran on the target"
NUMERICS = "not checked (only the best-ranked candidates are run, until one passes)"
# The numerics check: the candidate's tiles run in its interpreter on this CPU (a compile target runs
# nothing), float32 inputs at a small length, against the float64 reference (numerics_check).
# A row's status beyond the compiler's (classify): the workload refuses the config before compiling,
# or the kernel is not compiled for its tiles on this target at all.
REFUSED = "refused"
NOT_COMPILED = "not-compiled"

COLUMNS = [
    "target", "impl", "workload", "phase", "mode", "dtype", "seq_len", "seq_q", "seq_k", "batch",
    "config", "is_default", "kept", "config_source", "status", "fits", "reason",
    "peak_bytes", "hbm_bytes", "temp_bytes", "argument_bytes", "output_bytes", "generated_code_bytes",
    "kernel_vmem_bytes", "max_scoped_vmem_bytes", "inserted_copy_bytes", "kernel_evidence",
    "max_batch_estimate", "max_batch", "max_batch_capped", "batches_tried", "tokens_per_chip",
    "peak_bytes_at_max",
    "model_roofline_seconds", "model_roofline_bound", "model_tokens_per_s_per_chip",
    "model_tokens_per_s_per_chip_at_max", "speed", "numerics", "numerics_ok", "numerics_max_error",
    "compile_seconds",
    "jax", "libtpu", "jax_cuda12_plugin", "cudnn",
]
_SCOPED = re.compile(r'"memory_space":"1","offset":"\d+","size":"(\d+)"')


@dataclass(frozen=True)
class TuneCase:
    preset: str
    phase: str
    lengths: tuple[int, ...]


def parse_case(text: str) -> TuneCase:
    """``llama-3.1-8b:prefill:8k,32k``: a preset, a phase and its lengths (decode: cache keys);
    ``ValueError`` names what is wrong."""

    parts = text.split(":")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"a case looks like llama-3.1-8b:prefill:8k,32k (preset:phase:lengths), "
                         f"not {text!r}")
    preset, phase, lengths = parts
    known = presets.get(preset)  # an unknown preset: ValueError naming the known ones
    if phase not in known.phases:
        raise ValueError(f"{preset} has no {phase!r} phase; its phases: {', '.join(known.phases)}")
    try:
        values = tuple(run.parse_length(n) for n in lengths.split(","))
    except Exception as exc:  # argparse.ArgumentTypeError
        raise ValueError(f"case {text!r}: {exc}") from None
    for n in values:  # beyond the preset's context: ValueError naming it
        presets.workload(preset, phase, size="real", dtype=DTYPE, **_extent(phase, n))
    return TuneCase(preset, phase, values)


def _extent(phase: str, length: int) -> dict:
    return {"kv_len": length} if phase == "decode" else {"seq": length}


def case_workloads(case: TuneCase) -> list[tuple[int, Workload]]:
    return [(n, presets.workload(case.preset, case.phase, size="real", dtype=DTYPE, **_extent(case.phase, n)))
            for n in case.lengths]


def default_impls(platform: str) -> list[str]:
    """The kernels with tile knobs written for ``platform`` that run natively there (TPU: Pallas flash
    and splash; GPU: Pallas mha and the FA2 port)."""
    out = []
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        if (impl.framework == "jax" and impl.search_space is not None and platform in impl.designed_for
                and impl.platform_support[platform].status == "runs"):
            out.append(name)
    return out


def check_impls(names: list[str]) -> None:
    """``ValueError`` for a kernel that is unknown, not jax, or has no tile knobs to tune."""
    for name in names:
        impl = attention_impls.get(name)  # an unknown name: UnknownName naming the known ones
        if impl.framework != "jax":
            raise ValueError(f"{name} is {impl.framework}: the compile targets compile jax kernels only")
        if impl.search_space is None:
            raise ValueError(f"{name} has no tile knobs to tune (no search_space)")


def not_compiled_reason(impl, platform: str) -> str | None:
    """Why the tuner does not compile ``impl``'s tiles for a target of ``platform``."""
    support = impl.platform_support[platform]
    if support.status == "unsupported":
        return support.note
    if support.status == "interpret-only":
        return (f"interpret-only on {platform} ({support.note}): the interpreter's memory says nothing "
                "of the kernel's tiles")
    return None


# ------------------------------------------------------------------------ in the worker
def _instructions(hlo_text: str) -> list[str]:
    """The HLO text's instructions, each joined with its continuation lines (a Pallas call's kernel
    metadata spans several)."""
    out: list[str] = []
    for line in hlo_text.splitlines():
        head = line.strip()
        if head.startswith(("%", "ROOT ", "ENTRY ", "HloModule ")) or not out:
            out.append(line)
        else:
            out[-1] += "\n" + line
    return out


def vmem_evidence(hlo_text: str) -> tuple[int | None, int | None]:
    """``(the Pallas TPU kernels' scoped VMEM, the largest scoped VMEM of any instruction)`` in bytes,
    from the compiled HLO's ``used_scoped_memory_configs`` (memory space 1, VMEM); ``None`` where
    absent (a GPU target)."""
    kernel, every = [], []
    for instruction in _instructions(hlo_text):
        sizes = [int(s) for s in _SCOPED.findall(instruction)]
        if not sizes:
            continue
        every.append(max(sizes))
        if 'custom_call_target="tpu_custom_call"' in instruction:
            kernel.append(max(sizes))
    return (max(kernel) if kernel else None), (max(every) if every else None)


def numerics_workload(config, workload: Workload) -> Workload:
    """The small case a candidate's numerics are checked at: one sequence, one kv head and up to two
    query heads (grouped where the preset is), float32, the preset's mask, long enough for two of its
    largest tiles (at least 1024)."""
    group = min(2, workload.q_heads // workload.kv_heads)
    largest = max([value for _, value in config] or [512])
    small = workload.replace(batch=1, q_heads=group, kv_heads=1, dtype="float32")
    return small.at_length(max(1024, 2 * largest))


def numerics_check(name: str, config, workload: Workload) -> dict:
    """In the worker: the candidate's forward in its interpreter here vs the float64 reference, with
    the project's float64 check and its tolerance for the dtype (``core.numerics.compare``)."""
    from attention_impls.reference_float64 import attention_fwd
    from attnbench.backends import here
    from attnbench.core.inputs import make_inputs
    from attnbench.core.numerics import compare
    from attnbench.measure.reference_check import reference_mask

    impl = attention_impls.get(name).with_config(config)
    small = numerics_workload(impl.config_now, workload)
    refused = here.check(impl, small)
    if refused:
        return {"numerics": f"not checked: {refused}", "numerics_ok": None}
    x = make_inputs(small, seed=7)
    mask = reference_mask(small, x)
    got = here.run_numpy(impl, x.q, x.k, x.v, causal=small.causal, **mask)
    checked = compare(got, attention_fwd(x.q, x.k, x.v, causal=small.causal, **mask), small.dtype)
    ok, error = checked.ok, checked.max_abs if checked.finite else float("inf")
    how = "its interpreter" if impl.execution(here.platform(impl)) == "interpret" else "XLA"
    where = (f"{how} on this host's CPU, float32, {small.seq_q}x{small.seq_k}, "
             f"{small.q_heads}/{small.kv_heads} heads")
    return {"numerics": f"{'ok' if ok else 'fails'}: max |error| {error:.2g} vs float64 ({where})",
            "numerics_ok": ok, "numerics_max_error": error}


def tune_task(target: str, spec: tuple, workload: Workload, hlo_dir: str | None) -> dict:
    """One candidate in the worker: ``spec`` = (kernel, config text[, "numerics"]); compiled, its
    record with the VMEM read from the compiled HLO (a temporary folder, removed); or its numerics."""
    from attnbench.compiled_for.compile import compile_case
    from attnbench.compiled_for.targets import load_targets

    name, config = spec[:2]
    if spec[2:] == ("numerics",):
        try:
            return numerics_check(name, parse_config(config) if config else (), workload)
        except Exception as exc:  # noqa: BLE001 - a kernel that breaks on the candidate: its reason
            return {"numerics": f"fails: {type(exc).__name__}: {classify.first_lines(str(exc), 300)}",
                    "numerics_ok": False}
    with tempfile.TemporaryDirectory(prefix="attnbench-tune-") as tmp:
        try:
            record = compile_case(target, name, workload, tmp, config=parse_config(config) if config else ())
        except Exception as exc:  # noqa: BLE001 - a bug reading the result: an error record
            return new_record(load_targets()[target], name, workload, status=classify.ERROR,
                              reason=f"{type(exc).__name__}: {classify.first_lines(str(exc))}")
        texts = [open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(tmp, "*.hlo.txt"))]
    kernel, every = vmem_evidence("\n".join(texts)) if texts else (None, None)
    record.update(kernel_vmem_bytes=kernel, max_scoped_vmem_bytes=every)
    return record


# ------------------------------------------------------------------------ in the parent
def tokens_per_step(workload: Workload) -> int:
    """Tokens one step processes: every prompt or training token; decode: one per sequence."""
    return workload.batch * workload.seq_q


def model_tokens_per_s(record: dict, workload: Workload, chips: int) -> float | None:
    seconds = record.get("model_roofline_seconds")
    if not isinstance(seconds, (int, float)) or not seconds or seconds != seconds:
        return None
    return tokens_per_step(workload) / seconds / chips


def _compile(worker, target, name: str, config, workload: Workload, timeout_s: float) -> dict:
    spec = (name, config_text(config) if config else "")
    record = worker.compile(target, spec, workload, timeout_s=timeout_s)
    record["impl"] = name  # a failed call's record names the spec
    return record


def compile_candidate(worker, target, name: str, config, workload: Workload, *, timeout_s: float) -> dict:
    """One candidate's row: its compile at the preset's batch, with the largest batch that a linear
    model of its peak would fit (``max_batch_estimate``, unchecked)."""
    first = _compile(worker, target, name, config, workload, timeout_s)
    row = _row(first, workload, target)
    row["_record"] = first
    peak, hbm = first.get("peak_bytes"), first.get("hbm_bytes")
    if run.feasible(first) and isinstance(peak, (int, float)) and peak > 0 and isinstance(hbm, (int, float)):
        row["max_batch_estimate"] = max(workload.batch, int(hbm * workload.batch // peak))
    return row


def search_batch(worker, target, name: str, config, workload: Workload, row: dict, *, max_batch: int,
                 timeout_s: float) -> None:
    """Bisect the largest batch in 1..``max_batch`` the candidate fits, checked by the compiler on both
    sides (``run.bisect_max_batch``, as ``compile-for --max-batch``), into ``row``."""
    first = row["_record"]
    seen = {workload.batch: first}

    def check(batch: int) -> bool:
        if batch not in seen:
            seen[batch] = _compile(worker, target, name, config, workload.replace(batch=batch), timeout_s)
        return run.feasible(seen[batch])

    check(1)
    estimates = run._batch_estimates(seen, first.get("hbm_bytes"))
    largest, tried = run.bisect_max_batch(check, max_batch, estimates)
    at = seen.get(largest, {})
    chips = target.chips or 1
    tokens = largest * workload.stream_length
    speed = model_tokens_per_s(at, workload.replace(batch=largest), chips) if largest else None
    row.update(max_batch=largest or None, max_batch_capped=largest == max_batch, batches_tried=tried,
               tokens_per_chip=(tokens / chips) if largest else None, peak_bytes_at_max=at.get("peak_bytes"),
               model_tokens_per_s_per_chip_at_max=speed)


def _row(record: dict, workload: Workload, target) -> dict:
    row = {c: record.get(c) for c in COLUMNS if c in record}
    row.update(seq_len=workload.stream_length, speed=SPEED, numerics=NUMERICS,
               model_tokens_per_s_per_chip=model_tokens_per_s(record, workload, target.chips or 1))
    return row


def _blank(target, name: str, workload: Workload, status: str, reason: str) -> dict:
    return {"target": target.name, "impl": name, "workload": workload.name, "phase": workload.phase,
            "mode": workload.mode, "dtype": workload.dtype, "seq_len": workload.stream_length,
            "seq_q": workload.seq_q, "seq_k": workload.seq_k, "batch": workload.batch, "status": status,
            "reason": reason, "fits": None, "speed": SPEED, "numerics": NUMERICS}


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and value == value else -1.0


def _key(r: dict) -> tuple:
    """The ranking: tokens per chip held (checked), then modelled tokens/s per chip, then the defaults."""
    speed = r.get("model_tokens_per_s_per_chip_at_max")
    if speed is None:
        speed = r.get("model_tokens_per_s_per_chip")
    return (_number(r.get("tokens_per_chip")), _number(speed), bool(r.get("is_default")))


def _estimate_key(r: dict, workload: Workload, target) -> tuple:
    """``_key`` with the unchecked linear estimate of the batch in place of the bisected one."""
    estimate = r.get("max_batch_estimate")
    tokens = estimate * workload.stream_length / (target.chips or 1) if estimate else None
    return (_number(tokens), _number(r.get("model_tokens_per_s_per_chip")), bool(r.get("is_default")))


def choose(rows: list[dict], defaults_text: str) -> tuple[dict | None, str]:
    """``(the kept row, why)`` among one case's candidate rows: compiled and fits at the preset's
    batch; the most tokens per chip held, then the most modelled tokens/s per chip, then the defaults.
    Never a row that failed to compile, does not fit, or was refused."""
    feasible = [r for r in rows if r.get("status") == classify.OK and str(r.get("fits")) == "True"
                and r.get("numerics_ok") is not False and str(r.get("numerics_ok")) != "False"]
    if not feasible:
        return None, "no candidate compiles and fits"

    key = _key
    best = max(feasible, key=key)
    default = next((r for r in feasible if r["config"] == defaults_text), None)
    if best is default:
        ties = [r["config"] for r in feasible if key(r)[:2] == key(best)[:2] and r is not best]
        why = ("the defaults: no candidate holds more tokens per chip or models more tokens/s"
               + (f" ({len(ties)} tie)" if ties else ""))
    elif default is None:
        why = "the defaults do not compile and fit here; the best of the rest"
    elif _number(best.get("tokens_per_chip")) > _number(default.get("tokens_per_chip")):
        why = (f"holds more tokens per chip than the defaults ({_number(best['tokens_per_chip']):.0f} "
               f"against {_number(default['tokens_per_chip']):.0f}; modelled speed, not measured)")
    else:
        why = "as many tokens per chip as the defaults and more modelled tokens/s (roofline, not measured)"
    return best, why


def candidates(impl, workload: Workload, configs=None) -> list[tuple[tuple, str | None]]:
    """``impl.candidates(workload)``, the defaults first (a kernel that refuses the workload itself,
    ``unsupported``, refuses every tile); ``configs``: those instead, beside the defaults."""
    defaults = impl.search_space.defaults
    if configs is None:
        chosen = impl.candidates(workload)
    else:
        chosen = [(defaults, None)] + [(c, impl.config_reason(c, workload)) for c in configs if c != defaults]
    return sorted(chosen, key=lambda c: c[0] != defaults)


def check_numerics(worker, target, name: str, config, workload: Workload, timeout_s: float,
                   cache: dict | None = None) -> dict:
    """The candidate's numerics (``numerics_check`` in the worker), once per kernel x config x mask."""
    small = numerics_workload(config, workload)
    key = (name, config, small.describe())
    if cache is not None and key in cache:
        return cache[key]
    answer = worker.compile(target, (name, config_text(config), "numerics"), small, timeout_s=timeout_s)
    if "numerics" not in answer:  # the worker timed out or died: the kernel broke on it
        answer = {"numerics": f"fails: {answer.get('status')}: {answer.get('reason')}", "numerics_ok": False}
    answer = {k: answer.get(k) for k in ("numerics", "numerics_ok", "numerics_max_error")}
    if cache is not None:
        cache[key] = answer
    return answer


def tune_case(worker, target, name: str, workload: Workload, *, max_batch: int, timeout_s: float,
              configs=None, numerics: bool = True, cache: dict | None = None) -> list[dict]:
    """Every candidate's row for one target x kernel x workload, the kept one marked."""
    impl = attention_impls.get(name)
    defaults_text = config_text(impl.search_space.defaults)
    skip = not_compiled_reason(impl, target.platform)
    candidates_here = candidates(impl, workload, configs)
    rows = []
    for i, (config, refused) in enumerate(candidates_here):
        text = config_text(config)
        if skip or refused:
            row = _blank(target, name, workload, NOT_COMPILED if skip else REFUSED, skip or refused)
        else:
            row = compile_candidate(worker, target, name, config, workload, timeout_s=timeout_s)
        row.update(config=text, is_default=text == defaults_text, kept=False, _config=config)
        rows.append(row)
        if skip or row.get("status") == classify.UNSUPPORTED:  # the kernel, not its tiles, is refused
            for other, _ in candidates_here[i + 1:]:
                extra = _blank(target, name, workload, row["status"], row.get("reason") or "")
                extra.update(config=config_text(other), is_default=False, kept=False)
                rows.append(extra)
            break
    if max_batch:
        # The defaults' batch is checked; another candidate's only where its estimate beats the best
        # checked one's estimate (more tokens, or as many and more modelled tokens/s): the linear
        # estimate runs a little high for every candidate alike, so estimates are compared to estimates.
        feasible = sorted((r for r in rows if run.feasible(r)),
                          key=lambda r: _estimate_key(r, workload, target), reverse=True)
        feasible.sort(key=lambda r: not r["is_default"])
        best = None
        for r in feasible:
            beats = best is None or _estimate_key(r, workload, target) > _estimate_key(best, workload, target)
            if not beats:
                continue
            search_batch(worker, target, name, r["_config"], workload, r, max_batch=max_batch,
                         timeout_s=timeout_s)
            if best is None or _key(r) > _key(best):
                best = r
    if numerics:  # the best-ranked feasible candidates, until one passes
        for r in sorted((r for r in rows if run.feasible(r)), key=_key, reverse=True):
            r.update(check_numerics(worker, target, name, r["_config"], workload, timeout_s, cache))
            if r.get("numerics_ok") is False:
                r["reason"] = f"numerics: {r['numerics']}"
            if r.get("numerics_ok") is not False:
                break
    for r in rows:
        r.pop("_record", None)
        r.pop("_config", None)
    kept, _why = choose(rows, defaults_text)
    for row in rows:
        row["kept"] = row is kept
        row["config_source"] = ("defaults" if row["is_default"] else "tuned") if row is kept else None
    return rows


def kept_row(rows: list[dict]) -> dict:
    """One case's summary row: the kept config and its evidence beside the defaults'."""
    first = rows[0]
    kept = next((r for r in rows if r["kept"]), None)
    defaults = next((r for r in rows if r["is_default"]), {})
    defaults_text = defaults.get("config", "")
    _, why = choose(rows, defaults_text)
    compiled = [r for r in rows if r.get("status") not in (REFUSED, NOT_COMPILED, classify.UNSUPPORTED)]
    feasible = [r for r in rows if run.feasible(r)]
    if kept is None:
        reasons = sorted({r["reason"] for r in rows if isinstance(r.get("reason"), str) and r["reason"]})
        refused_kernel = all(r.get("status") in (classify.UNSUPPORTED, NOT_COMPILED) for r in rows)
        why = ("the kernel does not take this workload here" if refused_kernel else why) + (
            ": " + "; ".join(reasons)[:300] if reasons else "")
    k = kept or {}
    return {"target": first["target"], "impl": first["impl"], "workload": first["workload"],
            "phase": first["phase"], "mode": first["mode"], "dtype": first["dtype"],
            "seq_len": first["seq_len"],
            "kept_config": k.get("config"), "config_source": k.get("config_source"), "candidates": len(rows),
            "compiled": len(compiled), "feasible": len(feasible), "max_batch": k.get("max_batch"),
            "tokens_per_chip": k.get("tokens_per_chip"), "peak_bytes": k.get("peak_bytes"),
            "temp_bytes": k.get("temp_bytes"), "kernel_vmem_bytes": k.get("kernel_vmem_bytes"),
            "model_tokens_per_s_per_chip": k.get("model_tokens_per_s_per_chip"),
            "defaults_max_batch": defaults.get("max_batch"), "why": why, "speed": SPEED}


def tune(targets, impls: list[str] | None, cases: list[TuneCase], *, max_batch: int = 4096,
         timeout_s: float = 900.0, rows_path: str = ROWS_PATH, kept_path: str = KEPT_PATH,
         progress: bool = True, worker=None, configs: dict | None = None, numerics: bool = True,
         on_case: Callable[[list[dict]], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Every target x kernel x case x length; both tables rewritten atomically after each case.
    ``impls`` None: ``default_impls`` per target's platform."""
    groups = [(t, name, w) for t in targets for name in (impls or default_impls(t.platform))
              for case in cases for _, w in case_workloads(case)]
    rows: list[dict] = []
    summary: list[dict] = []
    own = worker is None
    worker = worker or compile_worker.CompileWorker(task=tune_task)
    cache: dict = {}
    try:
        with run._session(worker, len(groups), progress, "tune-targets") as (worker, bar):
            for target, name, workload in groups:
                bar.set_postfix_str(f"{target.name} {name} {workload.name} {workload.phase} "
                                    f"{workload.stream_length}")
                case_rows = tune_case(worker, target, name, workload, max_batch=max_batch,
                                      timeout_s=timeout_s, configs=(configs or {}).get(name),
                                      numerics=numerics, cache=cache)
                rows += case_rows
                summary.append(kept_row(case_rows))
                run.write_table(rows, rows_path, COLUMNS)
                run.write_table(summary, kept_path, KEPT_COLUMNS)
                if on_case:
                    on_case(case_rows)
                bar.update(1)
    finally:
        if own:
            worker.close()
    return rows, summary


def rebuild_kept(rows_path: str = ROWS_PATH, kept_path: str = KEPT_PATH) -> list[dict]:
    """``compiled-for-kept.csv`` again from ``compiled-for.csv`` (no compiles)."""
    import pandas as pd

    frame = pd.read_csv(rows_path)
    records = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
               for r in frame.to_dict("records")]
    keys = ["target", "impl", "workload", "phase", "mode", "dtype", "seq_len"]
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    summary = [kept_row(g) for g in groups.values()]
    run.write_table(summary, kept_path, KEPT_COLUMNS)
    return summary


# ------------------------------------------------------------------------ for the reports
