"""The commands that read the results: ``verdict``, ``summary`` and ``report`` (read only)."""

from __future__ import annotations

import os
import sys
import textwrap

from attnbench.asv.suite import METRICS
from attnbench.report import horizon as horizons
from attnbench.report import series_name, short_env, spike_sentences, write_report
from attnbench.report.render import noise_sentences
from attnbench.report.select import best_native_vs_forced
from attnbench.report.verdict import (
    case_table,
    controls,
    headline,
    profiler_visibility,
    stream_steps,
    verdict_table,
)
from attnbench.report.verdict_display import (
    DISPLAY_COLUMNS,
    PUBLISHED_COLUMNS,
    SHORT_COLUMNS,
    TARGET_COLUMNS,
    control_lines,
    counts,
    display,
    notes,
    plot_stream_cost,
    published_targets,
    short,
    targets,
    terminal,
)
from attnbench.results.asv_results import load_results, ordering_note
from attnbench.results.table import cell, render
from attnbench.run import progress

SUMMARY_WIDTH = 120  # `summary` wraps its notes to a terminal this wide unless --wide


def _render(rows, columns, args) -> str:
    return render(rows, columns, markdown=getattr(args, "markdown", False))


def _rows(frame) -> list[dict]:
    return [{c: cell(v, 4) for c, v in row.items()} for row in frame.to_dict("records")]


def _margin(args) -> float | None:
    if args.margin is not None and not 0 < args.margin < 1:
        raise ValueError(f"--margin must be a fraction between 0 and 1 (0.1 for +-10%), got {args.margin:g}")
    return args.margin


def cmd_verdict(args) -> int:
    """The verdict (``attnbench/report/verdict.py``) from the results, read only: one short row per
    comparison, the compile targets', and the notes every row shares, once; ``--full`` every column
    (on paper, flip, break-even, sentence, reasons); ``--png`` also draws its picture, ``--csv``
    writes every row."""
    horizon = horizons.parse(args.horizon)
    margin = _margin(args)
    frame = load_results(args.results)
    cases = case_table(frame)  # the newest run's cases: the table, its notes, controls and picture read them
    table = verdict_table(args.results, frame, horizon=horizon, margin=margin, cases=cases)
    stream = (f"a {horizon} horizon" + (" at each trace's request rate" if horizon.unit == "hours" else "")
              + f" (beside it: cold start over the measured {stream_steps(frame):,}-step stream, and serving "
              "with every compile amortised)")
    if args.csv:
        from attnbench.core.atomic import atomic_write_text

        atomic_write_text(args.csv, table.to_csv(index=False))
    shown = table if args.all else headline(table)
    print(f"# verdict: forced flash, native, equal within the margin, or can't tell, from the 99% interval "
          f"of their paired cost per useful token over {stream} ({counts(shown)})")
    if args.full:
        rows = _rows(display(shown))
        if args.width:
            for row in rows:
                text = str(row["reasons"])
                row["reasons"] = text if len(text) <= args.width else text[: args.width - 3] + "..."
        print(_render(rows, DISPLAY_COLUMNS, args))
    else:
        print(_render(_rows(short(shown)), SHORT_COLUMNS, args))
        compiled = targets(shown)
        if not compiled.empty:
            print("\n# compile targets (nothing ran there): most tokens per chip in the largest batch that "
                  "fits (compiler); forced / native step time from the time model (predicted, not measured)")
            print(_render(_rows(compiled), TARGET_COLUMNS, args))
        chips = published_targets(shown)
        if not chips.empty:
            print("\n# the published shapes on the compile targets: compiled here, timed only by Tokamax's "
                  "authors on the chip (published)")
            print(_render(_rows(chips), PUBLISHED_COLUMNS, args))
        lines = notes(shown, profiler_visibility(args.results), frame, cases) + control_lines(
            controls(frame, margin, cases))
        if lines:
            print()
            print("\n".join(f"- {line}" for line in lines))
    if args.png:
        _write_png(args.png, plot_stream_cost(frame, steps=horizon.steps(None), cases=cases),
                   "no length stream measured: no picture")
    if args.forest:
        from attnbench.report.forest import margin_of, plot_verdict_forest

        forest = plot_verdict_forest(table, margin=margin_of(cases, margin), horizon=str(horizon))
        _write_png(args.forest, forest, "no verdict row has a ratio: no forest plot")
    return 0


def _write_png(path: str, png: bytes | None, nothing: str) -> None:
    """``png`` to ``path`` (atomically), or ``nothing`` said on stderr where there is no picture."""
    from attnbench.core.atomic import atomic_write_bytes

    if png is None:
        print(nothing, file=sys.stderr)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(path, png)


def cmd_summary(args) -> int:
    """The verdict's short table and its notes, then best native vs best forced-flash per sequence
    length, from the asv results (read only), at each machine's newest commit."""
    frame = load_results(args.results)
    note = ordering_note(frame)[1]
    if note:  # which commit is "newest" comes from git, else the commit dates asv recorded
        print(f"attnbench summary: {note}", file=sys.stderr)
    cases = case_table(frame)
    return print_summary(frame, verdict_table(args.results, frame, cases=cases), args, cases=cases)


def print_summary(frame, verdict, args, *, control=None, cases=None) -> int:
    """``summary``'s text from a loaded frame and its verdict table (``report --summary`` prints it
    from the report's own, its controls and case table too, without loading the results again)."""
    table = headline(verdict)
    width = None if getattr(args, "wide", False) else SUMMARY_WIDTH
    if not table.empty:
        rows, columns, machine = terminal(short(table))
        where = f" on {machine}" if machine else ""
        print(_wrap(f"# verdict{where}, cost per useful token over a {horizons.parse(None)} horizon at each "
                    f"trace's request rate ({counts(table)}; cold start, serving and tuning: attnbench "
                    "verdict; every column: attnbench verdict --full)", width))
        print(_render(_unique(rows), columns, args))
        control = controls(frame, cases=cases) if control is None else control
        lines = notes(table, profiler_visibility(args.results), frame, cases) + control_lines(control)
        for line in lines:
            print(_wrap(f"- {line}", width, indent="  "))
        print()
    best = best_native_vs_forced(frame)
    if best.empty:
        print("no Forward/static results to summarise")
        return 0
    names = {"seq_len": "seq", "best_native": "native", "native_ms_per_step": "native ms",
             "best_forced": "forced", "forced_ms_per_step": "forced ms",
             "forced/native cost": "forced/native USD"}
    best = best.rename(columns=names)
    columns = [c for c in ["machine", "seq", "dtype", "native", "native ms", "forced", "forced ms",
                           "forced/native USD"] if c in best]
    print(_wrap("# best native vs best forced-flash, causal fwd B1 H8 D64, static shapes, each machine's "
                "newest commit (interpreted kernels are their own category, in neither column)", width))
    print(_render(_unique(_rows(best[columns])), columns, args))
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
    with progress.ticking("report (the verdict, regressions, cost spikes, plots and tables)"):
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
    if args.summary:
        print()
        return print_summary(report.frame, report.verdict, args, control=report.controls, cases=report.cases)
    return 0


def add_results_commands(sub) -> None:
    """What the results say: the verdict, the summary, the report (all read only)."""
    p = sub.add_parser("verdict", help="forced, native, equal or can't tell, per machine, framework, "
                                       "workload, length")
    p.add_argument("--results", default="results", help="results folder (read only)")
    p.add_argument("--horizon", default=None,
                   help="the server's life between cold starts the answer is priced over: steps (1000000) "
                        "or hours of each row's trace at its own request rate (24h); default "
                        f"{horizons.DEFAULT} (docs/metrics.md says why)")
    p.add_argument("--margin", type=float, default=None,
                   help="equal within +-margin (default: the run's recorded margin, else 0.10)")
    p.add_argument("--all", action="store_true", help="also the rows with no length stream (paper only)")
    p.add_argument("--full", action="store_true", help="every column: on paper, flip, break-even, sentence, "
                   "reasons")
    p.add_argument("--width", type=int, default=None, help="with --full: characters of reasons shown")
    p.add_argument("--csv", help="also write every row to this CSV")
    p.add_argument("--png", help="also draw cost against stream length to this PNG")
    p.add_argument("--forest", help="also draw the verdict's forest plot (each row's ratio and interval) "
                                    "to this PNG")
    p.add_argument("--markdown", action="store_true")
    p.set_defaults(func=cmd_verdict)

    p = sub.add_parser("summary", help="the verdict, then best native vs forced-flash per length")
    p.add_argument("--results", default="results")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--wide", action="store_true", help=f"notes on one line each (default: wrapped to "
                   f"{SUMMARY_WIDTH} columns)")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("report", help="report (Markdown, HTML, plots, tidy tables), regressions, cost spikes")
    p.add_argument("--results", default="results", help="asv results folder (read only)")
    p.add_argument("--out", default=os.path.join("html", "report"), help="where the report is written")
    p.add_argument("--repo", help="git repository that orders the commits (default: the results' parent)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="relative step that counts as a regression, every metric (default 0.05)")
    p.add_argument("--threshold-metric", action="append", metavar="METRIC=FRACTION",
                   help="per-metric threshold, e.g. usd_per_step=0.1 (repeatable)")
    p.add_argument("--summary", action="store_true",
                   help="then print `attnbench summary` from the same results")
    p.set_defaults(func=cmd_report)
