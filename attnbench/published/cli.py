"""``python -m attnbench published``: Tokamax's published device timings as one table under results/.

    python -m attnbench published [--out results/published/tokamax.csv] [--check]

reads Tokamax's autotuning caches (the installed tokamax wheel's, and the repository's at one commit,
vendored in attnbench/published/data/) and writes one row per source, device, op, argument spec and
config (attnbench/published/table.py says each column). Measured by Tokamax's authors on their devices,
never here. ``--check`` reads the file already written and reports its rows per device and source,
writing nothing.
"""

from __future__ import annotations

import argparse
import sys

from attnbench.published import table, tokamax_caches
from attnbench.published.tokamax_caches import PublishedError

HELP = "the published device measurements (Tokamax's autotuning caches) as one table under results/"


def add_parser(sub) -> None:
    p = sub.add_parser("published", description=__doc__, help=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=table.DEFAULT_PATH, metavar="PATH",
                   help=f"the CSV to write, or with --check to read (default {table.DEFAULT_PATH})")
    p.add_argument("--check", action="store_true",
                   help="read the existing CSV and report its rows per device and source, without writing")
    p.set_defaults(func=cmd_published)


def device_lines(frame) -> list[str]:
    """One line per device: its rows, and how many each source gave."""
    lines = []
    for (kind, device), rows in frame.groupby(["device_kind", "device"], sort=True):
        counts = rows["source"].value_counts().sort_index()
        per_source = ", ".join(f"{source} {n}" for source, n in counts.items())
        lines.append(f"{device} ({kind}): {len(rows)} rows ({per_source})")
    return lines


def skipped_lines(readings) -> list[str]:
    """What each source left out: a source not here, keys without a result, empty files."""
    lines = []
    for reading in readings:
        label = reading.source.label
        if reading.source.missing:
            lines.append(f"{label}: {reading.source.missing}")
            continue
        lines.append(f"{label}: {reading.files} files, {len(reading.rows)} rows; skipped "
                     f"{reading.without_result} keys without a result and "
                     f"{len(reading.empty_files)} empty files")
    return lines


def _write(path: str) -> list[str]:
    readings = tokamax_caches.read_sources()
    frame = tokamax_caches.rows_frame(readings)
    table.write_csv(frame, path)
    return device_lines(frame) + skipped_lines(readings) + [f"wrote {path} ({len(frame)} rows)"]


def _check(path: str) -> list[str]:
    frame = table.read_csv(path)
    return device_lines(frame) + [f"checked {path} ({len(frame)} rows); nothing written"]


def cmd_published(args) -> int:
    """Write (or ``--check``) the table; a source or file that does not read is exit 2, one line."""
    try:
        lines = _check(args.out) if args.check else _write(args.out)
    except PublishedError as exc:
        print(f"attnbench published: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
