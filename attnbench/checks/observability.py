"""Does the framework's own profiler attribute a kernel's time to a named attention op?

``python -m attnbench observability`` prepares each kernel's step through its backend
(``impl.make_step``, as the measurements do), runs it once warm and once under the framework's
profiler, in a killable worker, and writes ``results/observability/<machine>-<framework>.csv``.

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
import contextlib
import csv
import dataclasses
import glob
import io
import os
import re
import sys
import tempfile
from collections import defaultdict
from importlib import metadata

import attention_impls
from attention_impls.base import Unsupported, default_scale, static_mask
from attnbench import backends
from attnbench.asv.machine import machine_name
from attnbench.backends import here, jax_steps
from attnbench.backends.torch_backend import kineto_quiet
from attnbench.core import atomic
from attnbench.core.inputs import make_inputs
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
PROFILERS = {"torch": "torch.profiler (CPU events)", "jax": "jax.profiler (XLA op events)",
             "torch_xla": "torch_xla.debug.profiler (XLA op events)"}
SEQ_LEN = 256
DEFAULT_TIMEOUT_S = 300.0


def default_workload(seq: int = SEQ_LEN) -> Workload:
    return Workload(batch=1, q_heads=8, seq_q=seq, seq_k=seq, head_dim=64, dtype="float32", causal=True,
                    mode="fwd")


# -- the decision rule ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OpTime:
    """One profiled op: its name as the profiler shows it, its self time (children excluded), and
    the names of the ops it runs inside, outermost first."""

    name: str
    seconds: float
    within: tuple[str, ...] = ()


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


# -- torch ----------------------------------------------------------------------------------------
def torch_op_times(run) -> list[OpTime]:
    """``run()`` once under ``torch.profiler``: every CPU event with its self time and parents."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile


    with kineto_quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    ops = []
    for event in prof.events():
        if event.device_type != DeviceType.CPU:
            continue
        within, parent = [], event.cpu_parent
        while parent is not None:
            within.append(parent.name)
            parent = parent.cpu_parent
        ops.append(OpTime(event.name, event.self_cpu_time_total / 1e6, tuple(reversed(within))))
    return ops


# -- XLA (jax, torch_xla): the profile's XLA op events ----------------------------------------------
HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ")


def hlo_instructions(hlo_text: str) -> dict[str, dict[str, str]]:
    """``{instruction: {"target": custom_call_target, "op_name": metadata op_name}}`` of one module."""
    out = {}
    for line in hlo_text.splitlines():
        found = HLO_INSTRUCTION.match(line)
        if not found:
            continue
        target = re.search(r'custom_call_target="([^"]+)"', line)
        op_name = re.search(r'op_name="([^"]+)"', line)
        out[found.group(1)] = {"target": target.group(1) if target else "",
                               "op_name": op_name.group(1) if op_name else ""}
    return out


def read_xplane(log_dir: str):
    """``jax.profiler.ProfileData`` of the one ``*.xplane.pb`` a trace wrote under ``log_dir``."""
    from jax.profiler import ProfileData

    found = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
    if not found:
        raise RuntimeError(f"the profiler wrote no *.xplane.pb under {log_dir}")
    return ProfileData.from_file(found[0])


@dataclasses.dataclass(frozen=True)
class XlaEvent:
    name: str  # hlo_op, with " (custom_call_target)" for a custom call
    start_ns: int
    end_ns: int
    op_name: str  # the instruction's metadata op_name (not in the profile)


def xla_events(data, modules: dict[str, dict] | None = None) -> list[list[XlaEvent]]:
    """Per profiler line, its XLA op events (those with an ``hlo_op`` stat), by start time.
    ``modules``: ``{hlo_module: hlo_instructions(...)}``, for custom-call targets and op_name."""
    lines = []
    for plane in data.planes:
        for line in plane.lines:
            events = []
            for event in line.events:
                stats = dict(event.stats)
                hlo_op = stats.get("hlo_op")
                if not hlo_op:
                    continue
                info = (modules or {}).get(stats.get("hlo_module", ""), {}).get(hlo_op, {})
                name = f"{hlo_op} ({info['target']})" if info.get("target") else str(hlo_op)
                # Whatever op naming the profile itself carries beside hlo_op counts as its name.
                shown = [str(stats[k]) for k in ("tf_op", "long_name", "name_scope") if stats.get(k)]
                if shown:
                    name += " [" + "; ".join(shown) + "]"
                events.append(XlaEvent(name, int(event.start_ns), int(event.end_ns), info.get("op_name", "")))
            if events:
                lines.append(sorted(events, key=lambda e: (e.start_ns, -e.end_ns)))
    return lines


def xla_op_times(lines: list[list[XlaEvent]], label=lambda e: e.name) -> list[OpTime]:
    """Self times: an event's duration less that of the XLA events nested in it on its line."""
    return [op for events in lines for op in _line_op_times(events, label)]


def _line_op_times(events: list[XlaEvent], label) -> list[OpTime]:
    ops: list[OpTime] = []
    stack: list[tuple[XlaEvent, list[float]]] = []  # open events, each with its nested events' time

    def close(until: int) -> None:
        while stack and stack[-1][0].end_ns <= until:
            event, nested = stack.pop()
            scopes = tuple(p for p in event.op_name.split("/") if p)  # the HLO's, outermost first
            ops.append(OpTime(label(event), max(0.0, (event.end_ns - event.start_ns - nested[0]) / 1e9),
                              tuple(label(e) for e, _ in stack) + scopes))

    for event in events:
        close(event.start_ns)
        if stack:
            stack[-1][1][0] += event.end_ns - event.start_ns
        stack.append((event, [0.0]))
    close(2**63)
    return ops


def jax_hlo_text(impl, workload: Workload, seed: int = 0) -> str:
    """The compiled HLO of the function ``JaxBackend.make_step`` jits for ``workload``, lowered again
    (the step keeps only its custom calls; the same function and shapes give the same names)."""
    import jax


    x = make_inputs(workload, seed)
    scale, static = default_scale(workload.head_dim, None), static_mask(workload)
    if workload.mode == "fwd":
        fn, args = jax_steps.forward(impl, workload.causal, scale, static), (x.q, x.k, x.v)
    else:
        fn, args = (jax_steps.forward_backward(impl, workload.causal, scale, static),
                    (x.q, x.k, x.v, x.do))
    args = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args + x.mask_arrays())
    hook = getattr(impl, "trace_context", None)
    with hook(here.platform(impl)) if hook else contextlib.nullcontext():
        return fn.lower(*args).compile().as_text() or ""


def profile_jax(impl, workload: Workload, step) -> tuple[list[OpTime], str]:
    import jax

    hlo = jax_hlo_text(impl, workload)
    module = re.search(r"^HloModule (\S+?),", hlo, re.MULTILINE)
    modules = {module.group(1): hlo_instructions(hlo)} if module else {}
    with tempfile.TemporaryDirectory() as log_dir:
        jax.profiler.start_trace(log_dir)
        try:
            step.run()
        finally:
            jax.profiler.stop_trace()
        lines = xla_events(read_xplane(log_dir), modules)
    return xla_op_times(lines), ""


def profile_torch_xla(impl, workload: Workload, step) -> tuple[list[OpTime], str]:
    import torch_xla.debug.profiler as xp

    with tempfile.TemporaryDirectory() as log_dir:
        xp.start_trace(log_dir)
        try:
            step.run()
        finally:
            xp.stop_trace()
        try:
            data = read_xplane(log_dir)
        except ImportError as exc:  # the xplane reader is jax's
            raise ProfileUnreadable(f"torch_xla's profiler wrote an xplane, but nothing here reads it "
                                    f"(jax.profiler.ProfileData: {exc})") from None
        lines = xla_events(data)
    return xla_op_times(lines), step.evidence()


class ProfileUnreadable(RuntimeError):
    """The framework's profiler ran, but its output cannot be read here: no verdict, this reason."""


# -- one kernel (the worker's task) ----------------------------------------------------------------
def framework_version(framework: str) -> str:
    try:
        return metadata.version(framework.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return ""


def empty_row(impl: str, framework: str, workload: Workload) -> dict:
    row = dict.fromkeys(COLUMNS, "")
    row.update(framework=framework, impl=impl, profiler=PROFILERS.get(framework, ""),
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
    profilers = {"torch": lambda step: (torch_op_times(step.run), ""),
                 "jax": lambda step: profile_jax(impl, workload, step),
                 "torch_xla": lambda step: profile_torch_xla(impl, workload, step)}
    try:
        step = here.make_step(impl, workload)
        row["execution"] = step.execution
        step.run()  # warm: the profiled step compiles nothing
        if impl.framework not in profilers:
            row["reason"] = f"no framework profiler is read for {impl.framework} kernels"
            return row
        ops, note = profilers[impl.framework](step)
    except Unsupported as exc:
        row["reason"] = f"unsupported: {exc.reason}"
        return row
    except ProfileUnreadable as exc:
        row["reason"] = str(exc)
        return row
    except Exception as exc:
        row["reason"] = f"error: {type(exc).__name__}: {exc}"[:500]
        return row
    decision = decide(ops, "torch" if impl.framework == "torch" else "xla")
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
