"""Command line: ``python -m attnbench {list,matrix,bench}``."""

from __future__ import annotations

import argparse
import os
import sys

from attnbench.workload import Workload

DEFAULT_SEQS = (256, 512, 1024)


def _impls(names: list[str] | None, frameworks: list[str] | None = None):
    import attention_impls

    impls = [attention_impls.get(n) for n in (names or attention_impls.names())]
    return [i for i in impls if not frameworks or i.framework in frameworks]


class Footnotes:
    """Long reasons printed once under the table, referenced as [n] in it."""

    def __init__(self):
        self.notes: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.notes:
            self.notes.append(text)
        return f"[{self.notes.index(text) + 1}]"

    def render(self) -> str:
        return "\n".join(f"[{i}] {note}" for i, note in enumerate(self.notes, 1))


def cmd_list(args) -> int:
    """Every implementation, and whether it can run a typical workload in this environment."""
    workload = Workload(seq_q=args.seq, causal=True)
    rows = []
    for impl in _impls(args.impl, args.framework):
        reason = impl.check(workload)
        platform = None if impl.framework_missing() else impl.platform()
        if reason:
            here = f"unsupported: {reason}"
        elif impl.platform_support[platform].status == "interpret-only":
            here = f"interpret-only ({impl.platform_support[platform].note})"
        else:
            here = "runs"
        rows.append({"implementation": impl.name, "framework": impl.framework,
                     "designed for": impl.designed_for_text(), "platform": platform or "-",
                     "label": impl.label(platform) if platform else "-", "here": here})
    print(f"# {workload.describe()}")
    print(_render(rows, ["implementation", "framework", "designed for", "platform", "label", "here"], args))
    return 0


def support_matrix_rows(impls) -> list[dict]:
    rows = []
    for impl in impls:
        row = {"implementation": f"`{impl.name}`", "framework": impl.framework,
               "designed for": impl.designed_for_text()}
        for platform in ("cpu", "gpu", "tpu"):
            support = impl.platform_support[platform]
            text = support.status
            if support.status != "runs":
                text += f": {support.note}"
            elif support.status == "runs":
                text += f" ({impl.label(platform)})"
            row[platform] = text
        rows.append(row)
    return rows


def cmd_matrix(args) -> int:
    """The static implementation x platform matrix that the README shows."""
    rows = support_matrix_rows(_impls(None))
    print(_render(rows, ["implementation", "framework", "designed for", "cpu", "gpu", "tpu"], args))
    return 0


def cmd_bench(args) -> int:
    """A small sweep of every implementation runnable here; prints one table."""
    from attnbench.timing import time_step

    rows, notes = [], Footnotes()
    impls = [i for i in _impls(args.impl, args.framework) if not i.framework_missing()]
    for impl in impls:
        for seq in args.seq:
            workload = Workload(batch=1, q_heads=args.heads, seq_q=seq, head_dim=args.head_dim,
                                dtype=args.dtype, causal=args.causal, mode=args.mode)
            row = {"implementation": impl.name, "seq": seq}
            reason = impl.check(workload)
            if reason:
                rows.append({**row, "status": f"unsupported {notes.ref(reason)}"})
                continue
            platform = impl.platform()
            if impl.execution(platform) == "interpret" and seq > args.max_interpret_seq:
                rows.append({**row, "status": f"skipped: interpreted kernel above {args.max_interpret_seq}"})
                continue
            try:
                step = impl.make_step(workload)
                t = time_step(step.run, min_seconds=args.min_seconds)
            except Exception as exc:  # one failing case never stops the sweep
                rows.append({**row, "status": f"error {notes.ref(f'{type(exc).__name__}: {exc}'[:500])}"})
                continue
            rows.append({**row, "platform": platform, "label": impl.label(platform),
                         "execution": step.execution, "first call s": f"{t.first_call_s:.3f}",
                         "ms/step": f"{t.median_s * 1e3:.3f}", "IQR %": f"{100 * t.relative_iqr:.1f}",
                         "TFLOP/s": f"{workload.flops / t.median_s / 1e12:.4f}",
                         "tokens/s": f"{workload.tokens / t.median_s:,.0f}", "status": "ok"})
            print(f"  {impl.name} S={seq}: {rows[-1].get('ms/step', '-')} ms", file=sys.stderr)
    w = Workload(batch=1, q_heads=args.heads, seq_q=args.seq[0], head_dim=args.head_dim,
                 dtype=args.dtype, causal=args.causal, mode=args.mode)
    print(f"# sweep: {w.describe().replace(f'S{args.seq[0]}', 'S' + '/'.join(map(str, args.seq)))}")
    print(_render(rows, ["implementation", "seq", "platform", "label", "execution", "first call s",
                         "ms/step", "IQR %", "TFLOP/s", "tokens/s", "status"], args))
    if notes.notes:
        print(notes.render())
    return 0


def _render(rows, columns, args) -> str:
    from attnbench.table import render

    return render(rows, columns, markdown=getattr(args, "markdown", False))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="implementations and whether each runs in this environment")
    p.add_argument("--impl", nargs="*", help="only these implementations")
    p.add_argument("--framework", nargs="*", help="only these frameworks (numpy, jax, torch, torch_xla)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length of the probe workload")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("matrix", help="implementation x cpu/gpu/tpu support matrix")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("bench", help="small sweep of every runnable implementation, printed as a table")
    p.add_argument("--impl", nargs="*", help="only these implementations")
    p.add_argument("--framework", nargs="*", help="only these frameworks (numpy, jax, torch, torch_xla)")
    p.add_argument("--seq", type=int, nargs="+", default=list(DEFAULT_SEQS))
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--mode", default="fwd", choices=["fwd", "fwd_bwd"])
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--min-seconds", type=float, default=0.3, help="steady-state time budget per case")
    p.add_argument("--max-interpret-seq", type=int, default=512,
                   help="longest sequence for kernels that only run in an interpreter here")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Before torch loads: kineto prints a start/stop line per profiler session otherwise.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError) as exc:  # bad input: say what is wrong, no traceback
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2
