"""Command line: ``python -m attnbench {list,matrix,run,summary,report,selfcheck,...}``."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import os
import sys
import textwrap

import attention_impls
from attention_impls.base import MASK_FEATURES, SEGMENT_KINDS
from attnbench import hardware
from attnbench.asv.machine import detect_machine_name
from attnbench.asv.rename_env import rename_environment
from attnbench.asv.suite import METRICS
from attnbench.backends import here
from attnbench.checks import noisecheck
from attnbench.checks.observability import add_parser as add_observability
from attnbench.compiled_for.cli import add_parser as add_compile_for
from attnbench.core import presets
from attnbench.core.atomic import atomic_write_bytes, atomic_write_text
from attnbench.core.errors import UnknownName
from attnbench.core.workload import DTYPE_BYTES, PHASE_MODES, Workload
from attnbench.hardware import get_hardware_profile, load_hardware_profiles
from attnbench.hardware.dtypes import machine_dtype_problem
from attnbench.measure.engine import Case, Options
from attnbench.measure.process_env import pin_threads
from attnbench.releases.run import add_parser as add_releases
from attnbench.report import series_name, short_env, spike_sentences, write_report
from attnbench.report.render import noise_sentences
from attnbench.report.select import best_native_vs_forced
from attnbench.report.streams import STREAM_STEPS
from attnbench.report.verdict import (
    DISPLAY_COLUMNS,
    display,
    headline,
    plot_stream_cost,
    verdict_table,
)
from attnbench.results.asv_results import load_results, ordering_note
from attnbench.results.table import cell, render
from attnbench.run import provenance, resume, sweep
from attnbench.run.case_cache import read_folder
from attnbench.run.compare import compare
from attnbench.run.plan import plan


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


def parse_bytes(text: str) -> int:
    """'8G', '512M', '1.5G' or a plain byte count."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip().upper().removesuffix("B")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise ValueError(f"--memory-cap must look like 8G, 512M or a byte count, got {text!r}") from None


RUN_COLUMNS = ["impl", "workload", "phase", "mask", "seq_q", "seq_k", "gqa", "regime", "label", "execution",
               "status", "seconds_per_step", "tflops",
               "mfu", "compiler_temp_bytes", "host_rss_growth_bytes", "compiles", "compile_seconds_total",
               "padding_waste", "usd_per_step_on_demand", "usd_per_step_with_compiles_on_demand"]


def cmd_run(args) -> int:
    """A sweep outside asv: every case in a killable worker, written as a tidy table."""

    threads = args.threads or len(os.sched_getaffinity(0))
    memory_cap = parse_bytes(args.memory_cap) if args.memory_cap else None
    workloads = run_workloads(args)
    template = workloads[0]
    regimes = args.regime or (["static"] if args.workload or template.phase == "decode"
                              else ["static", "dynamic", "bucketed"])
    impls = [i.name for i in _impls(args.impl, args.framework) if not here.framework_missing(i)]
    if not impls:
        raise ValueError("no implementation of the chosen ones is installed in this environment")
    check_run_inputs(args.hardware_profile, args.dtype)  # before the first case, not after the sweep
    pin_threads(threads)  # this process too, for the no-isolation path
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out or os.path.join("results", "runs", f"{stamp}-{os.uname().nodename}")
    trace_dir = os.path.join(out_dir, "traces")

    options = Options(bucket_policy=args.bucket_policy, regime_steps=args.steps,
                      min_seconds=args.min_seconds, numerics=not args.no_numerics,
                      hardware_profile=args.hardware_profile,
                      price_per_hour=args.price_per_hour, spot_price_per_hour=args.spot_price_per_hour,
                      trace_dir=trace_dir, compile_cache=args.compile_cache, timer=args.timer)
    # Every case in a worker of its own: compile caches live per process.
    cases = [Case(name, workload, dataclasses.replace(options, regime=regime))
             for name in impls for workload in workloads for regime in regimes]
    kwargs = {"isolate": not args.no_isolate, "timeout_s": args.timeout, "memory_cap_bytes": memory_cap,
              "threads": threads}
    meta = provenance.run_metadata()
    path = os.path.join(out_dir, f"records.{args.format}")
    # --resume: attnbench/run/resume.py.

    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR: the folder of the sweep to finish")
    resume.check_args(out_dir, args, resuming=args.resume)
    kept = []
    if args.resume:
        kept, cases = resume.split(path, cases)
        print(f"resume: {len(kept)} cases already in {path}; measuring the {len(cases)} missing",
              file=sys.stderr)
    refused, admitted = plan(cases, in_process=args.no_isolate)
    # Rewritten (atomically) after every case: an interrupted sweep keeps what it measured.
    done: dict[int, dict] = dict(refused)  # by case index: a pooled record replaces its first round's

    def write(i, record):
        done[admitted[i]] = record
        resume.write_resumed(kept, [done[j] for j in sorted(done)], path, meta)

    if refused:
        resume.write_resumed(kept, [done[j] for j in sorted(done)], path, meta)
    sweep.measure_cases([cases[i] for i in admitted], progress=not args.quiet, rounds=args.rounds,
                        on_record=write, **kwargs)
    rows = [done[i] for i in sorted(done)]
    print(_render([{c: cell(r.get(c), 4) for c in RUN_COLUMNS} for r in rows], RUN_COLUMNS, args))
    if args.max_seq and args.resume and os.path.exists(os.path.join(out_dir, f"max_seq.{args.format}")):
        print("resume: max_seq table already there; not walking the lengths again", file=sys.stderr)
    elif args.max_seq:
        feasible = sweep.max_feasible_lengths(impls, template, args.max_seq, options, **kwargs)
        sweep.write_table(feasible, os.path.join(out_dir, f"max_seq.{args.format}"), meta)
        print(_render([{k: cell(v, 4) for k, v in r.items()} for r in feasible],
                      ["impl", "max_feasible_seq", "tried_up_to", "stopped_by"], args))
    print(f"wrote {path}")
    return 0


def run_workloads(args) -> list[Workload]:
    """The workloads ``run`` measures: a preset's or the custom template's, one per ``--seq`` (or
    ``--kv-len``); bad combinations raise ``ValueError`` naming the valid choices."""
    if args.softcap is not None and args.softcap <= 0:
        raise ValueError(f"--softcap must be a positive number, got {args.softcap}")
    if args.window is not None and not args.causal:
        raise ValueError("--window needs a causal mask (drop --no-causal): a sliding window is the last W "
                         "keys up to the query's own position")
    if args.workload:
        phase = args.phase or "prefill"
        preset = presets.get(args.workload)
        if args.mode != "fwd" or any(x is not None for x in (args.heads, args.kv_heads, args.head_dim)):
            raise ValueError(f"--workload {args.workload} fixes the heads and the mode (use --phase); drop "
                             "--heads/--kv-heads/--head-dim/--mode")
        if args.window is not None and not preset.causal:
            raise ValueError(f"--window needs a causal mask; {args.workload} is bidirectional")
        common = {"batch": args.batch, "window": args.window, "softcap": args.softcap,
                  "documents": args.documents, "layer": args.layer, "dtype": args.dtype, "size": args.size}
        if phase == "decode":
            return [presets.workload(args.workload, phase, seq=(args.seq or [None])[0], kv_len=kv, **common)
                    for kv in (args.kv_len or [None])]
        if args.kv_len:
            raise ValueError(f"--kv-len is decode's cache length; --phase {phase} runs seq x seq (use --seq)")
        return [presets.workload(args.workload, phase, seq=seq, **common) for seq in (args.seq or [None])]
    if args.layer is not None or args.size != "real":
        raise ValueError("--layer and --size pick a preset's layer and lengths: they need --workload NAME")
    phase = args.phase or ("training" if args.mode == "fwd_bwd" else "prefill")
    mode = PHASE_MODES[phase]
    base = dict(batch=args.batch or 1, q_heads=args.heads or 8, kv_heads=args.kv_heads,
                head_dim=args.head_dim or 64, dtype=args.dtype, causal=args.causal, mode=mode,
                window=args.window, softcap=args.softcap, documents=args.documents)
    if phase == "decode":
        if not args.kv_len:
            raise ValueError("--phase decode needs --kv-len N (the KV cache's length)")
        queries = (args.seq or [1])[0]
        bad = [kv for kv in args.kv_len if queries > kv]
        if bad:
            raise ValueError(f"decode runs seq={queries} new tokens against kv_len={bad[0]}: seq must not "
                             "exceed kv_len")
        return [Workload(seq_q=queries, seq_k=kv, ragged=base["batch"] > 1, **base) for kv in args.kv_len]
    if args.kv_len:
        raise ValueError(f"--kv-len is decode's cache length; --phase {phase} runs seq x seq (use --seq)")
    return [Workload(seq_q=seq, seq_k=seq, **base) for seq in (args.seq or [256, 512, 1024])]


def check_run_inputs(hardware_profile: str | None, dtype: str) -> None:
    """Refuse, naming the valid choices, a hardware profile that does not exist or a dtype this
    machine's accelerator cannot run (``hardware.dtypes.machine_dtype_problem``)."""
    if hardware_profile:
        try:
            get_hardware_profile(hardware_profile)
        except KeyError:
            raise ValueError(f"--hardware-profile {hardware_profile!r} is not a hardware profile; choose one "
                             f"of {', '.join(load_hardware_profiles())}") from None
    attached = hardware.accelerator_present()
    problem = machine_dtype_problem(attached.platform if attached else "cpu", dtype)
    if problem:
        raise ValueError(f"--dtype {dtype}: {problem}")


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


SUMMARY_WIDTH = 120  # `summary` fits a terminal this wide unless --wide
SUMMARY_COLUMNS = ["machine", "framework", "workload", "seq", "answer", "forced / native cost"]


def _verdict_rows(table, width: int | None) -> list[dict]:
    """The verdict's display rows, each row's reasons cut to ``width`` characters (None: all)."""
    rows = display(table).to_dict("records")
    if width:
        for row in rows:
            text = str(row["reasons"])
            row["reasons"] = text if len(text) <= width else text[: width - 3] + "..."
    return [{c: cell(row[c], 4) for c in DISPLAY_COLUMNS} for row in rows]


def cmd_verdict(args) -> int:
    """The verdict (``attnbench/report/verdict.py``) from the results, read only; ``--png`` also
    draws its picture, ``--csv`` writes every row."""
    args.stream_steps = STREAM_STEPS if args.stream_steps is None else args.stream_steps
    if args.stream_steps < 1:
        raise ValueError(f"--stream-steps must be at least 1, got {args.stream_steps}")
    frame = load_results(args.results)
    table = verdict_table(args.results, frame, steps=args.stream_steps)
    if args.csv:
        atomic_write_text(args.csv, table.to_csv(index=False))
    shown = table if args.all else headline(table)
    print(f"# verdict: forced flash or native, or can't tell, from the 99% interval of their cost per "
          f"useful token over a {args.stream_steps:,}-step stream (compile stalls, first calls and "
          "padding included); on paper: the static step alone; compile targets: the compiler's word only")
    print(_render(_verdict_rows(shown, args.width), DISPLAY_COLUMNS, args))
    if args.png:
        png = plot_stream_cost(frame, steps=args.stream_steps)
        if png is None:
            print("no length stream measured: no picture", file=sys.stderr)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(args.png)), exist_ok=True)
            atomic_write_bytes(args.png, png)
    return 0


def cmd_summary(args) -> int:
    """The verdict first, then best native vs best forced-flash per sequence length, from the asv
    results (read only): the report's tables, at each machine's newest commit."""
    frame = load_results(args.results)
    note = ordering_note(frame)[1]
    if note:  # which commit is "newest" comes from git, else the commit dates asv recorded
        print(f"attnbench summary: {note}", file=sys.stderr)
    verdict = headline(verdict_table(args.results, frame))
    width = None if args.wide else SUMMARY_WIDTH
    if not verdict.empty:
        print(_wrap("# verdict (attnbench verdict --all: every row; README \"The verdict\")", width))
        rows = _unique(_verdict_rows(verdict, None))
        print(_render(rows, DISPLAY_COLUMNS if args.wide else SUMMARY_COLUMNS, args))
        if not args.wide:  # each row's sentence and reasons, whole, wrapped to the terminal
            for row in rows:
                head = f"{row['machine']} {row['framework']} {row['workload']} {row['seq']}: "
                text = " ".join(t for t in (row["sentence"], row["reasons"]) if t != "-")
                print(_wrap(head + text, width, indent="    "))
        print()
    table = best_native_vs_forced(frame)
    if table.empty:
        print("no Forward/static results to summarise")
        return 0
    names = {"seq_len": "seq", "best_native": "native", "native_ms_per_step": "native ms",
             "best_forced": "forced", "forced_ms_per_step": "forced ms",
             "forced/native cost": "forced/native USD"}
    table = table.rename(columns=names)
    columns = [c for c in ["machine", "seq", "dtype", "native", "native ms", "forced", "forced ms",
                           "forced/native USD"] if c in table]
    rows = _unique([{c: cell(v, 4) for c, v in row.items()} for row in table[columns].to_dict("records")])
    print(_wrap("# best native vs best forced-flash, causal fwd B1 H8 D64, static shapes, each machine's "
                "newest commit (interpreted kernels are their own category, in neither column)", width))
    print(_render(rows, columns, args))
    return 0


def _wrap(text: str, width: int | None, indent: str = "") -> str:
    """``text`` wrapped to ``width`` columns, whole (None: one line)."""
    return text if width is None else textwrap.fill(text, width, subsequent_indent=indent,
                                                    break_long_words=False, break_on_hyphens=False)


def _unique(rows: list[dict]) -> list[dict]:
    """``rows`` without repeats (one case seen twice, e.g. in two environments of one commit)."""
    seen, out = set(), []
    for row in rows:
        key = tuple(sorted(row.items()))
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def parse_thresholds(default: float, pairs: list[str] | None) -> dict[str, float]:
    """``--threshold`` for every metric, then ``--threshold-metric metric=0.1`` overrides."""
    names = [m.name for m in METRICS]
    thresholds = dict.fromkeys(names, default)
    for pair in pairs or []:
        metric, sep, value = pair.partition("=")
        if not sep or metric not in thresholds:
            raise ValueError(f"--threshold-metric takes METRIC=FRACTION with METRIC one of {names}, "
                             f"got {pair!r}")
        try:
            thresholds[metric] = float(value)
        except ValueError:
            raise ValueError(f"--threshold-metric {pair!r}: {value!r} is not a number") from None
    return thresholds


def cmd_report(args) -> int:
    """Markdown/HTML report, plots and tidy tables from the asv results; prints what regressed."""
    thresholds = parse_thresholds(args.threshold, args.threshold_metric)
    report = write_report(args.results, args.out, repo=args.repo, thresholds=thresholds)
    regressions, spikes = report.regressions, report.cost_spikes
    shown = 20  # the rest are in the report and its regressions.csv / cost_spikes.csv
    if report.ordering:  # commits git does not know: ordered by date, or (WARNING) not at all
        print(f"attnbench report: {report.ordering}", file=sys.stderr)

    if report.noise is not None and not report.noise.empty:
        for sentence in noise_sentences(report.noise):
            print(f"noise floor: {sentence}")
    steps = report.steps if report.steps is not None else regressions.iloc[0:0]
    if not steps.empty and (steps["verdict"] != "regression").any():
        print("steps not called regressions: " + ", ".join(
            f"{verdict} {n}" for verdict, n in steps[steps["verdict"] != "regression"]["verdict"]
            .value_counts().items()) + " (steps.csv)")
    if regressions.empty:
        print("no regressions detected" + (" (the commits could not be ordered: see the warning)"
                                           if (report.ordering or "").startswith("WARNING") else ""))
    else:
        by_metric = regressions["metric"].value_counts()
        print(f"{len(regressions)} regression(s) (" + ", ".join(f"{m} {n}" for m, n in by_metric.items())
              + f"), largest {min(shown, len(regressions))}:")
        largest = regressions.reindex(regressions["relative_change"].abs().sort_values(ascending=False).index)
        for _, r in largest.head(shown).iterrows():
            print(f"  {r['machine']} {short_env(r['env_name'])} {r['benchmark']} [{series_name(r)}]: "
                  f"{r['value_before']:.4g} -> {r['value_after']:.4g} ({r['relative_change']:+.1%}) "
                  f"{str(r['commit_before'])[:8]} -> {str(r['commit_after'])[:8]}")
    if spikes.empty:
        print("no cost spikes detected")
    else:
        print(f"{len(spikes)} cost spike(s)" + (f", largest {shown}:" if len(spikes) > shown else ":"))
        largest = spikes.reindex(spikes["relative_change"].abs().sort_values(ascending=False).index)
        for sentence in spike_sentences(largest.head(shown)):
            print(f"  {sentence.replace('`', '')}")
    print(f"report: {report.markdown}")
    print(f"        {report.html} (self-contained), plots and tidy.csv/tidy.parquet in {report.out_dir}")
    return 0


def cmd_compare(args) -> int:
    """``attnbench compare REV_A REV_B``: see ``attnbench/run/compare.py``."""
    template = Workload(batch=1, q_heads=8, head_dim=64, seq_q=args.seq[0], causal=True, dtype=args.dtype)
    print(f"attnbench compare: B={args.rev_b} against A={args.rev_a}, {args.rounds} interleaved rounds, "
          f"threshold {args.threshold:.0%}")
    verdicts = compare(args.rev_a, args.rev_b, args.impl, args.seq, template=template, rounds=args.rounds,
                       threshold=args.threshold, min_seconds=args.min_seconds, threads=args.threads,
                       restart_every=args.restart_every)
    slower = [v for v in verdicts if v.verdict == "slower"]
    errors = [v for v in verdicts if v.verdict == "error"]
    if slower:
        cases = ", ".join(f"{v.impl} S={v.seq}" for v in slower)
        print(f"significant slowdown in {len(slower)} case(s): {cases}")
        return 1
    return 3 if errors else 0


def _render(rows, columns, args) -> str:
    return render(rows, columns, markdown=getattr(args, "markdown", False))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_inspection_commands(sub)
    _add_results_commands(sub)
    _add_check_commands(sub)
    _add_run_command(sub)

    add_compile_for(sub)  # compile-for: the compiled-for tier (attnbench/compiled_for/)

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


def _add_results_commands(sub) -> None:
    """What the results say: the verdict, the summary, the report (all read only)."""
    p = sub.add_parser("verdict", help="paper vs production winner per machine, framework, workload, length")
    p.add_argument("--results", default="results", help="results folder (read only)")
    p.add_argument("--stream-steps", type=int, default=None,
                   help="the production stream's length in steps (default: streams.STREAM_STEPS, 1000)")
    p.add_argument("--all", action="store_true", help="also the rows with no length stream (paper only)")
    p.add_argument("--width", type=int, default=None, help="characters of reasons shown (default: all)")
    p.add_argument("--csv", help="also write every row to this CSV")
    p.add_argument("--png", help="also draw cost against stream length to this PNG")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_verdict)

    p = sub.add_parser("summary", help="the verdict, then best native vs forced-flash per length")
    p.add_argument("--results", default="results")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--wide", action="store_true", help=f"every column on one line (default: {SUMMARY_WIDTH} "
                   "columns, sentences wrapped)")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("report", help="report (Markdown, HTML, plots, tidy tables), regressions, cost spikes")
    p.add_argument("--results", default="results", help="asv results folder (read only)")
    p.add_argument("--out", default=os.path.join("html", "report"), help="where the report is written")
    p.add_argument("--repo", help="git repository that orders the commits (default: the results' parent)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="relative step that counts as a regression, every metric (default 0.05)")
    p.add_argument("--threshold-metric", action="append", metavar="METRIC=FRACTION",
                   help="per-metric threshold, e.g. usd_per_step=0.1 (repeatable)")
    p.set_defaults(func=cmd_report)


def _add_check_commands(sub) -> None:
    """The pull-request gate and the harness' own benchmarks."""
    p = sub.add_parser("compare", help="two revisions measured interleaved here: B/A per case, 95%% "
                                       "interval, verdict; exit 1 on a significant slowdown")
    p.add_argument("rev_a")
    p.add_argument("rev_b")
    p.add_argument("--impl", nargs="+", default=["torch-sdpa-flash", "jax-xla"])
    p.add_argument("--seq", nargs="+", type=int, default=[1024])
    p.add_argument("--rounds", type=int, default=10, help="interleaved A/B rounds per case (default 10)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="smallest slowdown that fails the gate, as a fraction (default 0.05)")
    p.add_argument("--min-seconds", type=float, default=0.2, help="timing budget per measurement")
    p.add_argument("--restart-every", type=int, default=2,
                   help="fresh worker processes for both revisions every this many rounds (default 2)")
    p.add_argument("--threads", type=int, help="CPU threads to pin (default: the cores this process may use)")
    p.add_argument("--dtype", default="float32")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("selfcheck-report", help="benchmark the results loader and analysis on 100k rows")
    p.set_defaults(func=lambda args: importlib.import_module("attnbench.checks.selfcheck_report").main())

    p = sub.add_parser("noisecheck", help="benchmark: can this machine tell a real regression from noise "
                       "(A/A, 15%% slowdown, contention), in a throw-away clone",
                       description=noisecheck.__doc__.split("\n\n")[0])
    noisecheck.add_arguments(p)
    p.set_defaults(func=noisecheck.command)

    p = sub.add_parser("selfcheck", help="benchmark the engine: speed and agreement with bare loops")
    p.set_defaults(func=lambda args: importlib.import_module("attnbench.checks.selfcheck").main())


def _add_run_command(sub) -> None:
    """The measurement sweep outside asv."""
    p = sub.add_parser("run", help="measurement sweep (timing, memory, regimes, numerics, cost) to a table")
    p.add_argument("--impl", nargs="*", help="only these implementations")
    p.add_argument("--framework", nargs="*", help="only these frameworks (numpy, jax, torch, torch_xla)")
    p.add_argument("--workload", help="a model preset (python -m attnbench workloads): its heads, head dim "
                   "and mask; the options below override it")
    p.add_argument("--phase", choices=("prefill", "training", "decode"),
                   help="prefill (forward), training (forward + backward), decode (queries vs a KV cache)")
    p.add_argument("--seq", type=int, nargs="+", help="max length per case (decode: new query tokens, "
                   "default 1); default 256 512 1024, or the preset's")
    p.add_argument("--kv-len", type=int, nargs="+", help="decode: the KV cache's length per case")
    p.add_argument("--window", type=int, help="sliding window of W keys (causal only)")
    p.add_argument("--softcap", type=float, help="logit soft cap C: C * tanh(score / C) before the mask")
    p.add_argument("--documents", type=int,
                   help="documents packed per sequence (segment ids; seeded lengths)")
    p.add_argument("--layer", choices=presets.LAYERS,
                   help="a preset that alternates local (windowed) and global layers (gemma-2-9b): which "
                   "one (default local)")
    p.add_argument("--size", choices=("real", "default"), default="real",
                   help="a preset's lengths: the model's own (real) or the 2-core CPU suite's (default)")
    p.add_argument("--regime", nargs="+", choices=["static", "dynamic", "bucketed"],
                   help="shape regimes (default all three; static only for a preset or decode; "
                        "decode's streams vary its cache length)")
    p.add_argument("--bucket-policy", default="multiple-128", help="multiple-N or pow2")
    p.add_argument("--steps", type=int, default=8, help="steps in each regime's length stream")
    p.add_argument("--batch", type=int, help="sequences per step (default 1; a preset's decode: its own)")
    p.add_argument("--heads", type=int, help="query heads (default 8)")
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, help="default 64")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--mode", default="fwd", choices=["fwd", "fwd_bwd"])
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--min-seconds", type=float, default=0.3, help="steady-state timing budget per case")
    p.add_argument("--rounds", type=int, default=1,
                   help="timing rounds of every static case, spread over the run and pooled (default 1)")
    p.add_argument("--timer", choices=("wall", "cuda-events", "device"), default="wall",
                   help="static timing: wall clock around blocking calls (every backend), or CUDA events "
                        "around each call with L2 flushed first (torch on a CUDA GPU, as do_bench); "
                        "device: CUDA events where the backend has them here, else wall")
    p.add_argument("--compile-cache", choices=("cold", "warm"), default="cold",
                   help="cold (default): each case compiles with empty on-disk compiler caches; "
                        "warm: with whatever torch Inductor's / jax's caches already hold")
    p.add_argument("--threads", type=int, help="CPU threads to pin (default: the cores this process may use)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case before it is killed")
    p.add_argument("--memory-cap", help="address-space cap per worker, e.g. 8G (hits become status oom)")
    p.add_argument("--max-seq", type=int, nargs="*", help="also find the largest feasible length among these")
    p.add_argument("--hardware-profile", help="hardware profile name "
                   "(see attnbench/hardware/hardware_profiles.toml)")
    p.add_argument("--profile", dest="hardware_profile", help=argparse.SUPPRESS)  # deprecated alias
    p.add_argument("--price-per-hour", type=float, help="USD per hour for the device, overriding the profile")
    p.add_argument("--spot-price-per-hour", type=float)
    p.add_argument("--no-numerics", action="store_true", help="skip the float64 reference check")
    p.add_argument("--no-isolate", action="store_true", help="measure in this process (no timeout/cap)")
    p.add_argument("--out", help="output folder (default results/runs/<UTC stamp>-<host>)")
    p.add_argument("--resume", action="store_true",
                   help="finish the sweep in --out: measure only the cases missing from its records, "
                        "keeping the rows there unchanged (attnbench/run/resume.py)")
    p.add_argument("--format", choices=["csv", "parquet"], default="csv")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_run)


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
