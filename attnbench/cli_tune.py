"""``python -m attnbench tune``: each tiled kernel's candidate configs measured at the suite's workloads
on this machine, the kept one filed under ``results/tuning/<machine>.tuning`` (``run/tune.py``,
``results/tuned.py``; docs/tuning.md).

    python -m attnbench tune                       # every tiled kernel of this environment, what is missing
    python -m attnbench tune --impl jax-blockwise-flash --force --rounds 16
    python -m attnbench tune --budget 60           # make bench: only what is missing, within 60 s
    python -m attnbench tune --list                # what the file holds (reads only)

Resumable and atomic like the sweep: each group (a kernel at a workload) is filed as it ends, so a
search cut short keeps what it finished and the next one goes on from there.
"""

from __future__ import annotations

import os
import sys
import time

import attention_impls
from attnbench.asv.machine import CHECKOUT, machine_name
from attnbench.asv.sizes import this_env_frameworks
from attnbench.backends import here
from attnbench.results import tuned
from attnbench.results.table import cell, render
from attnbench.run import plan, tune


def suite_groups(names: list[str] | None) -> list[tuple[str, object]]:
    """``(kernel, workload)`` of every static case of the asv suite (its size: ``ATTNBENCH_SUITE``) whose
    kernel has tile knobs and whose framework this environment measures, in the suite's order."""
    if CHECKOUT not in sys.path:  # the suite's own classes, beside the package: the workloads it measures
        sys.path.insert(0, CHECKOUT)
    from benchmarks import attention

    impls = [attention_impls.get(n) for n in names] if names else None
    for impl in impls or ():
        if impl.search_space is None:
            raise ValueError(f"{impl.name} has no tile knobs to tune; the tiled kernels: "
                             + ", ".join(n for n in attention_impls.names()
                                         if attention_impls.get(n).search_space is not None))
    wanted = {i.name for i in impls} if impls else None
    out = []
    for cls in attention.MEASURED:
        for kernel, workload, regime in cls.cases():
            impl = attention_impls.get(kernel)
            if regime != "static" or impl.search_space is None or (wanted and kernel not in wanted):
                continue
            if impl.framework not in this_env_frameworks() or here.framework_missing(impl) \
                    or (kernel, workload) in out:
                continue
            out.append((kernel, workload))
    return out


def cmd_tune(args) -> int:
    results_dir, machine = args.results, args.machine or machine_name()
    if args.budget is not None and not args.budget > 0:
        raise ValueError(f"--budget must be more than 0 seconds, got {args.budget!r}")
    entries = tuned.read(results_dir, machine)
    if args.list:
        return _list(entries, machine)
    plan_ = tune.TunePlan(rounds=args.rounds)
    groups = suite_groups(args.impl)
    releases = {f: tuned.release(f) for f in {attention_impls.get(k).framework for k, _ in groups}}

    def key_of(kernel, workload) -> str:
        return tuned.key(kernel, workload, releases[attention_impls.get(kernel).framework])

    todo = [(k, w) for k, w in groups if args.force or key_of(k, w) not in entries]
    # What the suite would refuse here, and a kernel only an interpreter runs here (its speed says
    # nothing of its tiles), are not tuned: the same check the sweep asks. They are filed with the
    # reason, so that the next run asks no more.
    if todo:
        answers = plan.ask_in_worker(plan._support_of_each, [plan_case(k, w) for k, w in todo])
        skipped, failed = {}, set()
        for (kernel, workload), answer in zip(todo, answers, strict=True):
            why = not_tuned_reason(answer)
            if answer.get("error"):  # the check itself failed: said, not filed (the next run asks again)
                print(f"tune: {kernel} {workload.describe()}: {answer['error']}", file=sys.stderr)
                failed.add((kernel, workload))
            elif why:
                release = releases[attention_impls.get(kernel).framework]
                skipped[key_of(kernel, workload)] = {
                    "kernel": kernel, "workload": workload.describe(), "release": release, "machine": machine,
                    "kept": None, "defaults": None, "why": why, "candidates": []}
        if skipped:
            tuned.write(results_dir, machine, skipped)
        todo = [(k, w) for k, w in todo if (k, w) not in failed and key_of(k, w) not in skipped]
    print(f"tune: {machine}: {len(groups)} tiled kernel x workload groups, {len(groups) - len(todo)} "
          f"already tuned or refused here, {len(todo)} to measure", file=sys.stderr)
    began, done = time.perf_counter(), 0
    for kernel, workload in todo:
        if args.budget is not None and time.perf_counter() - began >= args.budget:
            break
        impl = attention_impls.get(kernel)
        entry = tune.tune_group(kernel, workload, plan_, threads=len(os.sched_getaffinity(0)),
                                preload=(impl.framework,))
        entry["release"], entry["machine"] = releases[impl.framework], machine
        tuned.write(results_dir, machine, {key_of(kernel, workload): entry})
        done += 1
        print(f"tune: {tune.summary_line(entry)}", file=sys.stderr)
    left = len(todo) - done
    spent = time.perf_counter() - began
    print(f"tune: {done} group(s) measured in {spent:.0f} s"
          + (f"; {left} left for the next `make tune` (budget {args.budget:g} s spent)" if left else ""),
          file=sys.stderr)
    return 0


def not_tuned_reason(answer: dict) -> str | None:
    """Why a group is not tuned here (the support check's answer), or ``None``."""
    if answer.get("reason"):
        return f"not tuned here: {answer['reason']}"
    if answer.get("execution") == "interpret":
        return ("not tuned here: it runs only in an interpreter on this host, whose speed says nothing "
                "of its tiles")
    return None


def plan_case(kernel: str, workload):
    from attnbench.measure.engine import Case

    return Case(kernel, workload)


def _list(entries: dict, machine: str) -> int:
    rows = [{"kernel": e["kernel"], "workload": e["workload"], "release": e.get("release", "?"),
             "kept": e["kept"] or "-", "defaults": e["defaults"] or "-", "candidates": len(e["candidates"]),
             "why": e["why"]} for e in entries.values()]
    print(f"# results/tuning/{machine}.tuning: {len(rows)} tuned groups")
    columns = ["kernel", "workload", "release", "kept", "defaults", "candidates", "why"]
    print(render([{c: cell(r[c]) for c in columns} for r in rows], columns) if rows else "(none)")
    return 0


def add_tune_command(sub) -> None:
    p = sub.add_parser("tune", help="measure each tiled kernel's candidate tile configs here and keep the "
                       "fastest (results/tuning/<machine>.tuning)")
    p.add_argument("--impl", nargs="+", help="only these kernels (each must have tile knobs)")
    p.add_argument("--force", action="store_true", help="measure groups the file already holds again")
    p.add_argument("--budget", type=float, help="start no new group after this many seconds (default: none)")
    p.add_argument("--rounds", type=int, default=tune.TunePlan.rounds,
                   help=f"paired rounds per group (default {tune.TunePlan.rounds})")
    p.add_argument("--results", default="results", help="the results folder (default results)")
    p.add_argument("--machine", help="the machine name to file under (default: this machine's)")
    p.add_argument("--list", action="store_true", help="print what the file holds and measure nothing")
    p.set_defaults(func=cmd_tune)
