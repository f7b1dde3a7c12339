"""``python -m attnbench calibrate``: fit the time model on the published device times, and score it.

    .venv-targets/bin/python -m attnbench calibrate [--resume]      # compile, join, fit, score
    python -m attnbench calibrate --check                             # fit and score the committed table

compiles each published forward row's kernel at its shape for its chip (results/compiled-for/
calibration/records.csv), joins it to the row (calibration.csv), fits the model per family
(attnbench/predicted/model.py) and writes each row's leave-one-shape-out prediction
(leave-one-out.csv), then prints the error by family and by kernel. ``--check`` compiles and writes
nothing. Nothing runs on a chip: the times are Tokamax's, the programs this host's compilers'.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

from attnbench.predicted import calibration
from attnbench.predicted.calibration import CalibrationError
from attnbench.predicted.model import FACTORS
from attnbench.predicted.predict import Calibrated
from attnbench.published.tokamax_caches import PublishedError

HELP = "fit the compile targets' time model on the published device times; print its leave-one-out error"


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", description=__doc__, help=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="fit and score the existing table; write nothing")
    p.add_argument("--resume", action="store_true",
                   help="keep the compiled records already in the records file; compile only the others")
    p.add_argument("--score-device", action="store_true",
                   help="score the compile targets' predictions against every device run under --results "
                        "(predicted / measured per row) and append the score to results/LOG.md; no compile")
    p.add_argument("--results", default="results", metavar="DIR")
    p.add_argument("--published", default="results/published/tokamax.csv", metavar="PATH")
    p.add_argument("--dir", default=calibration.DIR, metavar="DIR", help=f"default {calibration.DIR}")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_calibrate)


def _compile(args) -> list[dict]:
    import pandas as pd

    from attnbench.compiled_for import run
    from attnbench.compiled_for import targets as compile_targets
    from attnbench.compiled_for.worker import ENVIRONMENT
    from attnbench.measure.process_env import scoped_environ
    from attnbench.published import table

    published = table.read_csv(args.published)
    rows, left = calibration.usable(published)
    targets = compile_targets.load_targets()
    records_path = os.path.join(args.dir, os.path.basename(calibration.RECORDS))
    done: dict[tuple, dict] = {}
    if args.resume and os.path.exists(records_path):
        for record in pd.read_csv(records_path, keep_default_na=False, na_values=[""]).to_dict("records"):
            if record.get("status") == "ok":
                w = calibration.workload(record)
                done[calibration.case_key(record["target"], record["impl"], w)] = record
    todo = [run.Case(targets[t], k, w) for t, k, w in calibration.cases(rows)
            if calibration.case_key(t, k, w) not in done]
    print(f"{len(rows)} published rows to fit on ({', '.join(f'{n} {why}' for why, n in left.items())} "
          f"left out); {len(done)} compiled already, {len(todo)} to compile", flush=True)
    records = list(done.values())
    with scoped_environ(**ENVIRONMENT):
        for platform in sorted({c.target.platform for c in todo}):
            problem = compile_targets.environment_problem(platform)
            if problem:
                raise CalibrationError(f"cannot compile for the {platform} targets: {problem}")

        def write(_i, record):
            records.append(record)
            run.write_table(records, records_path)

        run.run_cases(todo, timeout_s=args.timeout, progress=not args.quiet, on_record=write)
    families = {name: t.family for name, t in targets.items()}
    joined = calibration.join(rows, records, families)
    calibration.write(joined, os.path.join(args.dir, os.path.basename(calibration.TABLE)))
    return joined


def score_lines(fitted: Calibrated) -> list[str]:
    """Per family: rows, the error's median and 90% range, kernel pairs ordered, the bars; per kernel."""
    lines = ["# leave-one-shape-out error, ln(predicted / published) as a factor (predicted, not measured)",
             "family | chips | rows | median |error| | 90% of errors | pairs ordered | bars | factors"]
    for name, family in fitted.families.items():
        score, lo_hi = family.score, family.score.error_range
        factors = ", ".join(f"{f}={'-' if v is None else format(v, '.3g')}"
                            for f, v in zip(FACTORS, family.fit.factors, strict=True))
        lines.append(f"{name} | {family.chips} | {len(family.rows)} | "
                     f"x{math.exp(score.median_abs_error):.2f} | "
                     f"x{math.exp(lo_hi[0]):.2f}-x{math.exp(lo_hi[1]):.2f} | "
                     f"{score.pairs_ordered}/{score.pairs} ({score.order_share:.0%}) | "
                     f"{'pass' if score.passes else 'FAIL'} | {factors}")
    errors = [abs(e) for f in fitted.families.values() for e in f.score.errors]
    pairs = sum(f.score.pairs for f in fitted.families.values())
    ordered = sum(f.score.pairs_ordered for f in fitted.families.values())
    if errors:
        lines.append(f"all | - | {len(errors)} | x{math.exp(statistics.median(errors)):.2f} | - | "
                     f"{ordered}/{pairs} ({ordered / max(pairs, 1):.0%}) | - | -")
    lines.append("")
    lines.append("family | target | kernel | rows | median of the signed errors | median of |error|")
    for name, family in fitted.families.items():
        groups: dict = {}
        for row, predicted in zip(family.rows, family.score.predicted, strict=True):
            if predicted == predicted:
                groups.setdefault((row["target"], row["kernel"]), []).append(
                    math.log(predicted / (row["median_ms"] / 1e3)))
        for (target, kernel), errors in sorted(groups.items()):
            median = statistics.median(errors)
            absolute = statistics.median(abs(e) for e in errors)
            lines.append(f"{name} | {target} | {kernel} | {len(errors)} | x{math.exp(median):.2f} | "
                         f"x{math.exp(absolute):.2f}")
    return lines


def write_loo(fitted: Calibrated, path: str) -> None:
    rows = []
    for family in fitted.families.values():
        for row, predicted in zip(family.rows, family.score.predicted, strict=True):
            out = {c: row.get(c) for c in calibration.IDENTITY}
            out["loo_predicted_ms"] = predicted * 1e3 if predicted == predicted else None
            out["ratio"] = out["loo_predicted_ms"] / row["median_ms"] if out["loo_predicted_ms"] else None
            rows.append(out)
    calibration.write(rows, path, [*calibration.IDENTITY, "loo_predicted_ms", "ratio"])


def score_device(results_dir: str) -> list[str]:
    """The predictions in the compile-for records against the device runs' measured cases."""
    from attnbench.report.compiled import load_compiled_records
    from attnbench.report.predicted import device_scores, score_summary
    from attnbench.report.verdict import case_table
    from attnbench.results.asv_results import load_results

    scores = device_scores(case_table(load_results(results_dir)), load_compiled_records(results_dir))
    if scores.empty:
        return []
    return score_summary(scores)


def append_log(lines: list[str], path: str) -> None:
    import datetime as dt

    from attnbench.core.atomic import atomic_write_text

    with open(path, encoding="utf-8") as f:
        text = f.read()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    entry = (f"\n## The time model scored against a device run ({stamp}, attnbench calibrate "
             "--score-device)\n\nPredicted (compile-for records) / measured (the device run's static step, "
             "the Forward class's jax kernels, B1 H8 D64 causal):\n\n"
             + "\n".join(f"- {line}" for line in lines) + "\n")
    atomic_write_text(path, text.rstrip("\n") + "\n" + entry)


def cmd_calibrate(args) -> int:
    if args.score_device:
        lines = score_device(args.results)
        if not lines:
            print("attnbench calibrate: no device run of a calibrated compile target with predicted records "
                  f"under {args.results}: nothing to score", file=sys.stderr)
            return 2
        print("\n".join(lines))
        append_log(lines, os.path.join(args.results, "LOG.md"))
        print(f"appended to {os.path.join(args.results, 'LOG.md')}")
        return 0
    table_path = os.path.join(args.dir, os.path.basename(calibration.TABLE))
    try:
        if not args.check:
            _compile(args)
        fitted = Calibrated.load(table_path)
    except (CalibrationError, PublishedError) as exc:
        print(f"attnbench calibrate: {exc}", file=sys.stderr)
        return 2
    print("\n".join(score_lines(fitted)))
    if not args.check:
        loo_path = os.path.join(args.dir, os.path.basename(calibration.LOO))
        write_loo(fitted, loo_path)
        print(f"wrote {table_path} and {loo_path}")
    return 0
