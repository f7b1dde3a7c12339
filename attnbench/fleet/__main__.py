"""``python -m attnbench.fleet {validate,plan,price,launch,collect,run}``: the fleet's commands.

``--catalog DIR`` (a folder holding ``v8/<cloud>/vms.csv``, e.g. ``tests/data/skypilot_catalog``)
makes SkyPilot read that catalog copy and never download one: validation and prices offline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from attnbench import fleet
from attnbench.fleet import runner
from attnbench.fleet.collect import collect
from attnbench.fleet.launch import launch
from attnbench.fleet.validate import TaskInvalid, validate_task
from attnbench.hardware import catalog_prices as prices

# Imported where used: sky (the fleet extra).


def _use_catalog(args) -> None:
    """Point SkyPilot at ``--catalog`` (before it is imported: it fixes its catalog folder at import)."""
    if getattr(args, "catalog", None):
        if "sky" in sys.modules:
            raise RuntimeError("--catalog must be applied before SkyPilot is imported")
        os.environ["SKY_RUNTIME_DIR"] = str(fleet.sky_runtime_dir_for(args.catalog))


def _need_sky() -> None:
    try:
        import sky  # noqa: F401
    except ImportError:
        raise ValueError("SkyPilot is not installed here: pip install -e '.[fleet]' (make fleet-deps)") \
            from None


def _money(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def cmd_validate(args) -> int:
    _use_catalog(args)
    _need_sky()

    failed = 0
    for path in args.files or fleet.task_files():
        try:
            report = validate_task(path, offline=not args.online)
        except TaskInvalid as exc:
            print(f"INVALID {exc}")
            failed += 1
            continue
        best = report.cheapest
        where = "no priced option checked"
        if best:
            where = (f"cheapest {best.cloud}/{best.region} {best.instance_type} "
                     f"{best.accelerator}:{best.count} {_money(best.billed_usd_per_hour)} USD/h "
                     f"{report.market}")
        print(f"ok {path}: machine {report.machine}, ACCEL={report.accel}, {where}")
        for line in report.unchecked:
            print(f"   not checked: {line}")
        for line in report.infeasible:
            print(f"   not offered: {line}")
    return 1 if failed else 0


def cmd_plan(args) -> int:
    """Every kind's launchable options from the catalog, cheapest first, and what a run costs."""
    _use_catalog(args)
    _need_sky()

    print(f"| kind | asv machine | cloud/region | machine | USD/h on demand | USD/h spot | billed | "
          f"USD per {args.hours:g} h run |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in fleet.KINDS.values():
        report = validate_task(kind.task_file, offline=not args.online)
        options = sorted(report.options,
                         key=lambda o: (o.billed_usd_per_hour is None, o.billed_usd_per_hour or 0))
        for o in options:
            billed = o.billed_usd_per_hour
            print(f"| {kind.name} | {report.machine} | {o.cloud}/{o.region} | {o.instance_type} "
                  f"{o.accelerator}:{o.count} | {_money(o.on_demand_usd_per_hour)} | "
                  f"{_money(o.spot_usd_per_hour)} | "
                  f"{report.market} | {_money(None if billed is None else billed * args.hours)} |")
            for note in o.notes:
                print(f"|  |  |  | note: {note} |  |  |  |  |")
        for line in report.unchecked:
            print(f"| {kind.name} | {report.machine} | not checked | {line} |  |  |  |  |")
    return 0


def cmd_price(args) -> int:
    _use_catalog(args)
    _need_sky()

    price = prices.lookup(args.accelerator, args.count, args.cloud, region=args.region, zone=args.zone,
                          market=args.market)
    text = price.to_json()
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


def cmd_launch(args) -> int:
    _need_sky()

    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=True).stdout.strip()
    envs = dict(pair.split("=", 1) for pair in args.env or [])
    return launch(fleet.kind(args.kind), commit, args.bucket, envs, dry_run=args.dry_run)


def cmd_collect(args) -> int:
    report = collect(args.source, args.results, args.machine)
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for name in report.copied:
        print(f"copied  {name}")
    for name in report.merged:
        print(f"merged  {name}")
    print(f"fleet-collect: {report.summary()} into {args.results}/")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attnbench.fleet", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def catalog(p):
        p.add_argument("--catalog", help="a SkyPilot catalog copy (folder with v8/<cloud>/vms.csv): offline")
        p.add_argument("--online", action="store_true", help="let SkyPilot download catalogs it lacks")

    p = sub.add_parser("validate", help="task files: SkyPilot's schema, then a feasible, priced option")
    p.add_argument("files", nargs="*", type=Path, help="default: every attnbench/fleet/tasks/*.yaml")
    catalog(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="each kind's options and prices from the catalog")
    p.add_argument("--hours", type=float, default=2.0, help="a run's length, for its cost (default 2)")
    catalog(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("price", help="one machine's catalog price (JSON), as a fleet run records it")
    p.add_argument("--accelerator", required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--cloud", required=True)
    p.add_argument("--region")
    p.add_argument("--zone")
    p.add_argument("--market", default="spot", choices=("spot", "on-demand"))
    p.add_argument("--out")
    catalog(p)
    p.set_defaults(func=cmd_price)

    p = sub.add_parser("launch", help="check credentials, then sky jobs launch a kind's task")
    p.add_argument("--kind", required=True, choices=list(fleet.KINDS))
    p.add_argument("--bucket", required=True, help="results bucket name (created by SkyPilot if missing)")
    p.add_argument("--commit", help="commit to measure (default: HEAD)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="more task envs, e.g. ATTNBENCH_SUITE=default")
    p.add_argument("--dry-run", action="store_true", help="check and print the command, launch nothing")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("collect", help="bring the fleet's results back and merge them into results/")
    p.add_argument("--from", dest="source", required=True, help="gs://BUCKET, s3://BUCKET or a local folder")
    p.add_argument("--results", default="results")
    p.add_argument("--machine", action="append", help="only these machines")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("run", help="the job's resumable loop (on the fleet VM; see runner.py)",
                       description=runner.__doc__.split("\n")[0])
    runner.add_arguments(p)
    p.set_defaults(func=runner.command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"attnbench fleet: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
