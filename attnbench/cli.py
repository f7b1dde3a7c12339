"""Command line: ``python -m attnbench {list,matrix,run,summary,report,selfcheck,...}``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import attention_impls
from attention_impls.base import MASK_FEATURES, SEGMENT_KINDS
from attnbench.asv.machine import detect_machine_name
from attnbench.asv.rename_env import rename_environment
from attnbench.backends import here
from attnbench.checks import backward_memory, noisecheck, warmcheck
from attnbench.checks.observability import add_parser as add_observability
from attnbench.cli_results import add_results_commands
from attnbench.cli_run import add_run_command
from attnbench.cli_tune import add_tune_command
from attnbench.compiled_for.cli import add_parser as add_compile_for
from attnbench.core import presets
from attnbench.core.errors import UnknownName
from attnbench.core.workload import DTYPE_BYTES, Workload
from attnbench.predicted.cli import add_parser as add_calibrate
from attnbench.published.cli import add_parser as add_published
from attnbench.releases.run import add_parser as add_releases
from attnbench.results.table import cell, render
from attnbench.run import progress
from attnbench.run.case_cache import read_folder
from attnbench.run.compare import compare, write_json


def _impls(names: list[str] | None, frameworks: list[str] | None = None):
    impls = [attention_impls.get(n) for n in (names or attention_impls.names())]
    return [i for i in impls if not frameworks or i.framework in frameworks]


def cmd_list(args) -> int:
    """Every implementation, and whether it can run a typical workload in this environment."""
    workload = Workload(seq_q=args.seq, causal=True, dtype=args.dtype)
    rows = []
    for impl in _impls(args.impl, args.framework):
        reason = here.check(impl, workload)
        platform = None if here.framework_missing(impl) else here.platform(impl)
        if reason:
            status = f"unsupported: {reason}"
        elif impl.platform_support[platform].status == "interpret-only":
            status = f"interpret-only ({impl.platform_support[platform].note})"
        else:
            status = "runs"
        rows.append({"implementation": impl.name, "framework": impl.framework,
                     "designed for": impl.designed_for_text(), "platform": platform or "-",
                     "label": impl.label(platform) if platform else "-", "here": status})
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


def feature_matrix_rows(impls) -> list[dict]:
    """Per kernel: how it runs grouped-query heads (native, repeated or refused) and which mask
    features it declares; for segment ids, which kind (documents, ragged, or both)."""
    titles = {"window": "window", "softcap": "softcap", "segment_ids": "segment ids"}
    rows = []
    for impl in impls:
        row = {"implementation": f"`{impl.name}`", "gqa": impl.gqa}
        for feature in MASK_FEATURES:
            row[titles[feature]] = "yes" if feature in impl.supports else "no"
        if "segment_ids" in impl.supports:
            kinds = [kind for kind in SEGMENT_KINDS if kind in impl.segment_kinds]
            row[titles["segment_ids"]] = "both" if len(kinds) == len(SEGMENT_KINDS) else kinds[0]
        rows.append(row)
    return rows


def cmd_matrix(args) -> int:
    """The static implementation x platform matrix that docs/kernels.md shows (``--features``: the
    kernels' GQA and mask declarations)."""
    if args.features:
        rows = feature_matrix_rows(_impls(None))
        print(_render(rows, list(rows[0]), args))
        return 0
    rows = support_matrix_rows(_impls(None))
    print(_render(rows, ["implementation", "framework", "designed for", "cpu", "gpu", "tpu"], args))
    return 0


def cmd_workloads(args) -> int:
    """The workload catalogue: each preset's heads, head dim, mask, phases, real lengths and source."""
    rows = presets.table()
    columns = ["name", "heads", "kv_heads", "head_dim", "gqa", "mask", "phases", "lengths", "source"]
    if not args.sources:
        columns.remove("source")
    print(_render([{c: str(r[c]) for c in columns} for r in rows], columns, args))
    if not args.sources:
        print("\n(--sources: where every value comes from)")
    return 0


def cmd_rename_env(args) -> int:
    """``attnbench rename-env OLD NEW``: see ``attnbench/asv/rename_env.py``."""
    moved = rename_environment(args.results, args.old, args.new)
    for path in moved:
        print(f"wrote {path}")
    if not moved:
        print(f"no results of environment {args.old!r} under {args.results}")
    return 0


CASE_COLUMNS = ["impl", "dtype", "seq_q", "mode", "regime", "label", "execution", "status", "timer",
                "ms_per_step", "tflops", "mfu", "device_peak_bytes", "evidence_or_reason"]


def cmd_cases(args) -> int:
    """The records a case cache holds (``attnbench/run/case_cache.py``): what ran, how fast, and the
    evidence of which kernel ran (or why a case did not run). Reads only."""
    rows = []
    for r in read_folder(args.folder):
        if r.get("status") == "unsupported" and not args.all:
            continue
        seconds = r.get("seconds_per_step")
        text = r.get("kernel_evidence") if r.get("status") == "ok" else r.get("reason")
        rows.append({**{c: cell(r.get(c), 4) for c in CASE_COLUMNS},
                     "ms_per_step": cell(seconds * 1e3 if isinstance(seconds, (int, float)) else None, 4),
                     "evidence_or_reason": (str(text or "-")[:args.width])})
    hidden = "" if args.all else " (n/a cases left out: --all)"
    print(f"# {len(rows)} case record(s) in {args.folder}{hidden}")
    print(_render(rows, CASE_COLUMNS, args))
    return 0


def cmd_machine_name(args) -> int:
    """``ATTNBENCH_MACHINE``, else the name the frameworks' devices give (this process initialises
    them, so ``make bench`` runs it before asv)."""
    print(os.environ.get("ATTNBENCH_MACHINE") or detect_machine_name())
    return 0


def cmd_compare(args) -> int:
    """``attnbench compare REV_A REV_B``: see ``attnbench/run/compare.py``."""
    if not 0 < args.threshold < 1:
        raise ValueError(f"--threshold must be a fraction between 0 and 1, got {args.threshold:g}")
    template = Workload(batch=1, q_heads=8, head_dim=64, seq_q=args.seq[0], causal=True, dtype=args.dtype)
    cases = [(impl, template.replace(seq_q=seq, seq_k=seq)) for impl in args.impl for seq in args.seq]
    print(f"attnbench compare: B={args.rev_b} against A={args.rev_a}, {args.rounds} interleaved rounds, "
          f"threshold {args.threshold:.0%}")
    verdicts = compare(args.rev_a, args.rev_b, cases, rounds=args.rounds, threshold=args.threshold,
                       window_s=args.round_seconds, threads=args.threads, restart_every=args.restart_every)
    if args.json:
        write_json(verdicts, args.json)
    slower = [v for v in verdicts if v.verdict == "slower"]
    errors = [v for v in verdicts if v.verdict == "error"]
    if slower:
        cases = ", ".join(f"{v.impl} S={v.seq}" for v in slower)
        print(f"significant slowdown in {len(slower)} case(s): {cases}")
        return 1
    return 3 if errors else 0


def cmd_confirm(args) -> int:
    """``attnbench confirm``: see ``attnbench/run/confirm.py``."""
    from attnbench.cli_results import parse_thresholds
    from attnbench.run.confirm import confirm

    if args.budget is not None and not args.budget > 0:
        raise ValueError(f"--budget must be more than 0 seconds, got {args.budget:g}")
    if not 0 < args.threshold < 1:
        raise ValueError(f"--threshold must be a fraction between 0 and 1, got {args.threshold:g}")
    machine = args.machine or os.environ.get("ATTNBENCH_MACHINE") or detect_machine_name()
    with progress.ticking("confirm (the newest run's steps measured again)", budget_s=args.budget):
        entries = confirm(args.results, repo=args.repo, machine=machine,
                          thresholds=parse_thresholds(args.threshold, None), threshold=args.threshold,
                          rounds=args.rounds, budget_s=args.budget, window_s=args.round_seconds)
    counted = {}
    for entry in entries:
        counted[entry["verdict"]] = counted.get(entry["verdict"], 0) + 1
    if entries:
        print("confirm: " + ", ".join(f"{n} {verdict}" for verdict, n in sorted(counted.items()))
              + f" (written under {args.results}/{machine}/confirmations/; the report reads them)")
    return 0


def _render(rows, columns, args) -> str:
    return render(rows, columns, markdown=getattr(args, "markdown", False))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_inspection_commands(sub)
    add_results_commands(sub)
    _add_check_commands(sub)
    add_run_command(sub)
    add_tune_command(sub)

    add_compile_for(sub)  # compile-for: the compiled-for tier (attnbench/compiled_for/)
    add_published(sub)  # published: Tokamax's device timings as a table (attnbench/published/)
    add_calibrate(sub)  # calibrate: the compile targets' time model fitted on them (attnbench/predicted/)

    add_releases(sub)  # releases: the release matrix (attnbench/releases/)

    add_observability(sub)  # observability: does the framework's profiler name each kernel
    return parser


def _add_inspection_commands(sub) -> None:
    """What is here: kernels, their support, presets, the machine's name, a case cache, asv names."""
    p = sub.add_parser("list", help="implementations and whether each runs in this environment")
    p.add_argument("--impl", nargs="*", help="only these implementations")
    p.add_argument("--framework", nargs="*", help="only these frameworks (numpy, jax, torch, torch_xla)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length of the probe workload")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPE_BYTES),
                   help="dtype of the probe workload")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("matrix", help="implementation x cpu/gpu/tpu support matrix")
    p.add_argument("--features", action="store_true", help="GQA and mask features per implementation")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_matrix)

    p = sub.add_parser("machine-name", help="the name asv results are filed under here (cpu-2core, h200)")
    p.set_defaults(func=cmd_machine_name)

    p = sub.add_parser("cases", help="what a case cache's records say ran: speed, kernel evidence, reasons")
    p.add_argument("folder", help="an ATTNBENCH_CASE_CACHE folder (read only)")
    p.add_argument("--all", action="store_true", help="the n/a cases too, with their reasons")
    p.add_argument("--width", type=int, default=100, help="characters of evidence or reason shown")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_cases)

    p = sub.add_parser("workloads", help="the model presets: heads, kv heads, head dim, mask, source")
    p.add_argument("--sources", action="store_true", help="also each value's source (the model's config)")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_workloads)

    p = sub.add_parser("rename-env", help="file an asv environment's results under another (stable) name")
    p.add_argument("old", help="the name the results carry (existing-py_work_main_.venv_bin_python)")
    p.add_argument("new", help="its stable name (existing-py3.11-jax0.10.2-torch2.13.0)")
    p.add_argument("--results", default="results")
    p.set_defaults(func=cmd_rename_env)


def _add_check_commands(sub) -> None:
    """The pull-request gate and the harness' own benchmarks."""
    p = sub.add_parser("compare", help="two revisions measured interleaved here: B/A per case, 99%% "
                                       "interval, verdict; exit 1 on a significant slowdown")
    p.add_argument("rev_a")
    p.add_argument("rev_b")
    p.add_argument("--impl", nargs="+", default=["torch-sdpa-flash", "jax-xla"])
    p.add_argument("--seq", nargs="+", type=int, default=[1024])
    p.add_argument("--rounds", type=int, default=12, help="interleaved A/B rounds per case (default 12)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="smallest slowdown that fails the gate, and the margin of 'no change' (default 0.05)")
    p.add_argument("--round-seconds", type=float, default=0.1,
                   help="each revision's window per case and round")
    p.add_argument("--restart-every", type=int, default=4,
                   help="fresh worker processes for both revisions every this many rounds (default 4)")
    p.add_argument("--json", help="also write the verdicts to this JSON file")
    p.add_argument("--threads", type=int, help="CPU threads to pin (default: the cores this process may use)")
    p.add_argument("--dtype", default="float32")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("confirm", help="measure the newest run's steps again, paired against the commit "
                       "before each (a regression, or dismissed)")
    p.add_argument("--results", default="results")
    p.add_argument("--repo", default=".", help="the git repository of the commits")
    p.add_argument("--machine", help="whose newest run (default: this machine's name)")
    p.add_argument("--threshold", type=float, default=0.10,
                   help="the report's threshold, and the margin of 'no change' (default 0.10)")
    p.add_argument("--rounds", type=int, default=12, help="interleaved rounds per case (default 12)")
    p.add_argument("--round-seconds", type=float, default=0.1, help="each commit's window per case and round")
    p.add_argument("--budget", type=float, help="seconds the measuring may take (default: no limit)")
    p.set_defaults(func=cmd_confirm)

    p = sub.add_parser("selfcheck-report", help="benchmark the results loader and analysis on 100k rows")
    p.set_defaults(func=lambda args: importlib.import_module("attnbench.checks.selfcheck_report").main())

    p = sub.add_parser("noisecheck", help="benchmark: can this machine tell a real regression from noise "
                       "(A/A, 15%% slowdown, contention), in a throw-away clone",
                       description=noisecheck.__doc__.split("\n\n")[0])
    noisecheck.add_arguments(p)
    p.set_defaults(func=noisecheck.command)

    p = sub.add_parser("backward-memory", help="check: how the blockwise ports' training memory grows with "
                       "the length (jax compiled temporaries, torch bytes saved for backward)",
                       description=backward_memory.__doc__.split("\n\n")[0])
    backward_memory.add_arguments(p)
    p.set_defaults(func=backward_memory.command)
    p = sub.add_parser("warmcheck", help="benchmark: do the warm round workers bias a figure (warm / fresh "
                       "process, interleaved, 99%% interval)", description=warmcheck.__doc__.split("\n\n")[0])
    warmcheck.add_arguments(p)
    p.set_defaults(func=warmcheck.command)

    p = sub.add_parser("selfcheck", help="benchmark the engine: speed and agreement with bare loops")
    p.set_defaults(func=lambda args: importlib.import_module("attnbench.checks.selfcheck").main())


def main(argv: list[str] | None = None) -> int:
    # Before torch loads: kineto prints a start/stop line per profiler session otherwise.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, UnknownName) as exc:  # bad input: say what is wrong, no traceback
        print(f"attnbench: error: {exc}", file=sys.stderr)
        return 2  # any other exception (a bare KeyError too) is a bug: its traceback, exit 1
