"""Does the framework's own profiler attribute a kernel's time to a named attention op?

``python -m attnbench observability`` prepares each kernel's step through its backend
(``here.make_step``, as the measurements do), runs it once warm and once under the framework's
profiler (the backend's ``profile_ops``; the XLA profile's reading is ``backends/profiles.py``), in a
killable worker, and writes ``results/observability/<machine>-<framework>.csv``.

The rule (``decide``), the same for every framework: each profiled op's self time goes to the
innermost op or scope, itself or one it runs inside, whose name matches ``ATTENTION_NAME`` (the
kernel's own name, or a scope its call declares); ``profiler_visible`` when that is at least
``VISIBLE_SHARE`` of the step's op time. torch: ``torch.profiler`` CPU events, each inside its parent
events (an SDPA call's bmm and softmax run inside it); compiled regions (``OPAQUE_NAME``) never count.
jax: the XLA op events of the profile (those with an ``hlo_op`` stat), named as the profile names
them with a custom call's target, each inside the scopes of its compiled HLO's ``op_name`` (what
XProf's framework-op view groups by: ``jit(flash_attention)``). torch_xla: its profile's XLA op
events; its HLO's scopes are not read here.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import os
import re
import sys
from collections import defaultdict
from importlib import metadata

import attention_impls
from attention_impls.base import Unsupported
from attnbench import backends
from attnbench.asv.machine import machine_name
from attnbench.backends import here
from attnbench.backends.profiles import OpTime, ProfileUnreadable
from attnbench.core import atomic
from attnbench.core.workload import Workload
from attnbench.measure.engine import resolve_impl
from attnbench.results.observability import COLUMNS, FRAMEWORKS
from attnbench.results.table import render
from attnbench.run.worker import Worker

# Imported where used: jax, torch, torch_xla (not every venv has them); pandas (not in the xla venv).

VISIBLE_SHARE = 0.5  # most of the step's op time must sit under attention-named ops
ATTENTION_NAME = re.compile(r"attention|attn|flash|sdpa|fmha|(?<![a-z])mha(?![a-z])", re.IGNORECASE)
# An attention-named op below this share of the step is not listed as carrying its time.
CARRIER_FLOOR = 0.01
# A compiled region is opaque (its generated name may match by chance): never attributed to attention.
OPAQUE_NAME = re.compile(r"Torch-Compiled Region|CompiledFunction|CompiledFxGraph|TorchDynamo")
SEQ_LEN = 256
DEFAULT_TIMEOUT_S = 300.0


def default_workload(seq: int = SEQ_LEN) -> Workload:
    return Workload(batch=1, q_heads=8, seq_q=seq, seq_k=seq, head_dim=64, dtype="float32", causal=True,
                    mode="fwd")


# -- the decision rule ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    visible: bool | None
    attributed_to: str
    share: float | None
    top_ops: str
    reason: str


def names_attention(name: str) -> bool:
    return bool(ATTENTION_NAME.search(name)) and not OPAQUE_NAME.search(name)


def carrier(op: OpTime) -> str | None:
    """The innermost attention-named op among ``op`` and those it runs inside, or ``None``."""
    for name in (op.name, *reversed(op.within)):
        if names_attention(name):
            return name
    return None


def _shares(seconds: dict[str, float], total: float, n: int, floor: float = 0.0) -> list[tuple[str, float]]:
    ranked = sorted(seconds.items(), key=lambda kv: -kv[1])
    return [(name, s / total) for name, s in ranked[:n] if s / total > floor]


def short(name: str) -> str:
    """``name`` with generated hashes cut (a compiled graph's 52-character key) for the tables."""
    return re.sub(r"\b([a-z0-9]{8})[a-z0-9]{16,}\b", r"\1...", name)


def _text(shares: list[tuple[str, float]]) -> str:
    return "; ".join(f"{short(name)} {share:.0%}" for name, share in shares)


def decide(ops: list[OpTime], kind: str = "torch") -> Decision:
    """The rule of the module doc on one profiled step's ops; ``kind`` (torch | xla) only words
    the reason."""
    total = sum(op.seconds for op in ops)
    if not ops or total <= 0:
        return Decision(None, "", None, "", "the profiler recorded no op time for the step")
    by_name, by_carrier = defaultdict(float), defaultdict(float)
    for op in ops:
        by_name[op.name] += op.seconds
        who = carrier(op)
        if who:
            by_carrier[who] += op.seconds
    share = sum(by_carrier.values()) / total
    carriers = _shares(by_carrier, total, 3, floor=CARRIER_FLOOR)
    attributed = "; ".join(name for name, _ in carriers)
    top = _text(_shares(by_name, total, 3))
    visible = share >= VISIBLE_SHARE
    if visible:
        inner = defaultdict(float)  # time of ops that only run inside a carrier (math's bmm, softmax)
        for op in ops:
            if carrier(op) and carrier(op) != op.name:
                inner[op.name] += op.seconds
        reason = f"{share:.0%} of the op time is under {attributed}"
        if sum(inner.values()) >= share * total / 2:  # mostly in children: say which
            children = sorted(inner, key=lambda n: -inner[n])[:2]
            reason += f", most of it in generic ops it calls ({', '.join(children)})"
        return Decision(True, attributed, share, top, reason)
    rest = {n: s for n, s in by_name.items() if n not in by_carrier}
    biggest, first = _text(_shares(rest, total, 2)), max(rest, key=rest.get)  # worded by the largest
    if OPAQUE_NAME.search(first):
        why = f"the time is in an opaque compiled region ({biggest})"
    elif kind == "xla" and re.search(r"\(.+\)$", first):
        why = f"the time is in custom calls whose target names no attention ({biggest})"
    elif kind == "xla":
        why = f"the time is in XLA ops named by opcode ({biggest})"
    else:
        why = f"the time is spread over generic ops ({biggest})"
    lead = f"only {share:.0%} of the op time under attention-named ops" if share else "no op named attention"
    return Decision(False, attributed, share, top, f"{lead}: {why}")


# -- one kernel (the worker's task) ----------------------------------------------------------------
def framework_version(framework: str) -> str:
    try:
        return metadata.version(framework.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return ""


def empty_row(impl: str, framework: str, workload: Workload) -> dict:
    row = dict.fromkeys(COLUMNS, "")
    row.update(framework=framework, impl=impl, profiler=backends.get(framework).profiler if framework else "",
               framework_version=framework_version(framework) if framework else "",
               seq_len=workload.seq_q, dtype=workload.dtype)
    return row


def observe(impl_spec, workload: Workload | None = None) -> dict:
    """One kernel's row; never raises for a failing kernel (a crash or hang needs ``observe_all``)."""
    workload = workload or default_workload()
    try:
        impl = resolve_impl(impl_spec)
    except Exception as exc:
        row = empty_row(str(impl_spec), "", workload)
        row["reason"] = f"error: {type(exc).__name__}: {exc}"
        return row
    row = empty_row(impl.name, impl.framework, workload)
    reason = here.check(impl, workload)
    if reason:
        row["reason"] = f"unsupported: {reason}"
        return row
    platform = here.platform(impl)
    row.update(platform=platform, label=impl.label(platform), execution=impl.execution(platform))
    backend = here.backend_of(impl)
    try:
        step = here.make_step(impl, workload)
        row["execution"] = step.execution
        step.run()  # warm: the profiled step compiles nothing
        ops, note = backend.profile_ops(impl, workload, step)
    except Unsupported as exc:
        row["reason"] = f"unsupported: {exc.reason}"
        return row
    except ProfileUnreadable as exc:
        row["reason"] = str(exc)
        return row
    except Exception as exc:
        row["reason"] = f"error: {type(exc).__name__}: {exc}"[:500]
        return row
    decision = decide(ops, backend.profile_kind)
    row.update(profiler_visible=decision.visible, attributed_to=decision.attributed_to,
               attributed_share=None if decision.share is None else round(decision.share, 4),
               top_ops=decision.top_ops, reason=decision.reason)
    if note and decision.visible is False:
        row["reason"] += f"; {note}"
    return row


def observe_all(impl_specs: list, workload: Workload | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                threads: int | None = None, progress: bool = True) -> list[dict]:
    """Every kernel's row, each observed in a killable worker; a crash or timeout is a row."""
    workload = workload or default_workload()
    rows = []
    with Worker(threads=threads, task=observe) as worker:
        for spec in impl_specs:
            if progress:
                print(f"observability: {spec}", file=sys.stderr, flush=True)
            row, failure = worker.call((spec, workload), timeout_s)
            if failure is not None:
                impl = resolve_impl(spec)
                row = empty_row(impl.name, impl.framework, workload)
                row["reason"] = f"{failure[0]}: {failure[1]}"
                try:  # the worker's platform is this process's (no accelerator is initialised here)
                    platform = here.platform(impl)
                    row.update(platform=platform, label=impl.label(platform))
                except Exception:
                    pass
            rows.append(row)
    return rows


# -- files ----------------------------------------------------------------------------------------
def _cell(value) -> str:
    return "" if value is None else str(value)


def to_csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: _cell(row.get(c)) for c in COLUMNS} for row in rows)
    return buffer.getvalue()


def write_rows(path: str, rows: list[dict]) -> None:
    """Write ``rows`` to ``path`` atomically; the rows already there of other kernels are kept."""
    fresh = {row["impl"] for row in rows}
    kept = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            kept = [r for r in csv.DictReader(f) if r.get("impl") not in fresh]
    order = {name: i for i, name in enumerate(attention_impls.names())}
    merged = sorted(kept + rows, key=lambda r: (order.get(r["impl"], len(order)), r["impl"]))
    atomic.atomic_write_text(path, to_csv(merged))


def output_path(out_dir: str, machine: str, framework: str) -> str:
    return os.path.join(out_dir, f"{machine}-{framework}.csv")


# -- command line ---------------------------------------------------------------------------------
TABLE_COLUMNS = ["impl", "label", "execution", "profiler_visible", "attributed_to", "attributed_share",
                 "top_ops", "reason"]


def plan(frameworks: list[str] | None, impls: list[str] | None) -> dict[str, list[str]]:
    """``{framework: kernel names}`` to observe; bad names raise ``KeyError``/``ValueError`` naming them."""
    chosen = [attention_impls.get(name) for name in impls] if impls else None  # KeyError names it
    if frameworks is None:
        frameworks = sorted({i.framework for i in chosen} & set(FRAMEWORKS), key=FRAMEWORKS.index) if chosen \
            else [f for f in FRAMEWORKS if backends.get(f).missing() is None]
    for framework in frameworks:
        missing = backends.get(framework).missing()
        if missing:  # its file would be overwritten with "not installed" rows
            raise ValueError(f"--framework {framework}: {missing}")
    out = {}
    for framework in frameworks:
        names = [i.name for i in chosen or map(attention_impls.get, attention_impls.names())
                 if i.framework == framework]
        if names:
            out[framework] = names
    if chosen:
        stray = [i.name for i in chosen if i.framework not in out]
        if stray:
            raise ValueError(f"--impl {' '.join(stray)}: not a kernel of --framework {' '.join(frameworks)}")
    if not out:
        raise ValueError("no kernel to observe: none of the chosen frameworks is installed here")
    return out


def main(args) -> int:
    work = plan(args.framework, args.impl)
    machine = machine_name()
    threads = args.threads or len(os.sched_getaffinity(0))
    workload = default_workload(args.seq)
    for framework, names in work.items():
        rows = observe_all(names, workload, timeout_s=args.timeout, threads=threads, progress=not args.quiet)
        path = output_path(args.out, machine, framework)
        write_rows(path, rows)
        shown = [{c: _cell(r.get(c))[:100] for c in TABLE_COLUMNS} for r in rows]
        print(f"# {framework} {rows[0]['framework_version'] if rows else ''}: {workload.describe()}, "
              f"visible at >= {VISIBLE_SHARE:.0%} of the op time")
        print(render(shown, TABLE_COLUMNS, markdown=args.markdown))
        print(f"wrote {path}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("observability", help="per kernel: does the framework's profiler attribute its time "
                                              "to a named attention op (profiler_visible)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", nargs="+", choices=FRAMEWORKS,
                   help="default: every one installed in this environment")
    p.add_argument("--impl", nargs="+", help="only these kernels (the file keeps the others' rows)")
    p.add_argument("--out", default=os.path.join("results", "observability"))
    p.add_argument("--seq", type=int, default=SEQ_LEN, help=f"sequence length (default {SEQ_LEN})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per kernel")
    p.add_argument("--threads", type=int, help="CPU threads to pin (default: the cores this process may use)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=main)
