"""``python -m attnbench releases`` (``make releases``): run the release matrix and write its table.

    python -m attnbench releases                # build what is missing, run every release, write the table
    python -m attnbench releases --collect-only # rewrite results/releases/releases.csv from the filed cells

1. Checks free disk (``MIN_FREE_GB``) before asv builds anything.
2. ``asv run --config asv.releases.conf.json``: asv builds each jax release's venv (one at a time:
   2 cores; cached under ``.asv/releases-env``, so a second run builds nothing) and runs
   ``benchmarks/releases.py`` in it.
3. The torch releases: the same benchmarks in the venvs this host already has (``TORCH_VENVS``), as
   existing environments (skipped, with a note, where a venv is not built).
4. Gathers every environment's filed cells of this commit into ``results/releases/releases.csv``
   (``matrix.COLUMNS``, written atomically), then ``asv publish`` for the HTML (``html/releases``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

from attnbench.releases.table import grid_markdown, load_table, matrix_frame, write_table

CONFIG = "asv.releases.conf.json"
ASV_RESULTS = os.path.join("results", "releases", "asv")
TABLE = os.path.join("results", "releases", "releases.csv")
HTML = os.path.join("html", "releases")
# Five jax release venvs and pip's wheel cache take several GB: refuse below twice what they need.
MIN_FREE_GB = 7.0
TORCH_VENVS = {"2.13.0": ".venv", "2.9.0": ".venv-xla"}  # the torch releases this host has, by venv


def free_disk_problem(path: str = ".", need_gb: float = MIN_FREE_GB) -> str | None:
    free = shutil.disk_usage(path).free / 2**30
    if free < need_gb:
        return (
            f"only {free:.1f} GB free under {os.path.abspath(path)}; the release matrix needs about "
            f"{need_gb:g} GB for its venvs (.asv/releases-env) and pip's cache"
        )
    return None


def _asv(*args, env=None) -> int:
    command = [sys.executable, "-m", "asv", *args]
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    return subprocess.call(command, env=env)


def head_commit() -> str:
    return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()


def run_matrix(machine: str, *, torch: bool = True, asv_args: list[str] | None = None) -> str:
    """Steps 2 and 3; returns the commit measured (HEAD at the start, so a new commit does not split
    the run). A broken cell makes asv exit non-zero: expected here."""
    env = {**os.environ, "ATTNBENCH_MACHINE": machine, "ATTNBENCH_RESULTS_DIR": os.path.abspath(ASV_RESULTS),
           "JAX_PLATFORMS": "cpu", "PJRT_DEVICE": "CPU"}
    commit = head_commit()
    run = ["run", "--config", CONFIG, "--machine", machine]
    _asv("machine", "--yes", "--machine", machine, "--config", CONFIG, env=env)
    _asv(*run, "-b", r"^releases\.", *(asv_args or []), f"{commit}^!", env=env)
    for version, venv in TORCH_VENVS.items() if torch else ():
        python = os.path.abspath(os.path.join(venv, "bin", "python"))
        if not os.path.exists(python):
            print(f"torch {version}: {venv} is not built here (make setup builds it); its cells are left out",
                  file=sys.stderr)
            continue
        _asv(*run, "-E", f"existing:{python}", "--set-commit-hash", commit, "-b", r"^releases\.Releases\.",
             *(asv_args or []), env=env)
    return commit


def filed_cells(commits: list[str], root: str = ASV_RESULTS) -> list[dict]:
    """Every environment's cells of ``commits``; an environment under several keeps the last's."""
    by_env = {}
    for commit in commits:
        for path in sorted(glob.glob(os.path.join(root, "*", "cells", f"{commit[:8]}-*.cells"))):
            with open(path) as f:
                by_env[os.path.basename(path)[9:]] = list(json.load(f).values())
    return [row for rows in by_env.values() for row in rows]


def collect(commits, root: str = ASV_RESULTS, out: str = TABLE) -> str:
    """Step 4's table from the filed cells of ``commits`` (one commit or several)."""
    commits = [commits] if isinstance(commits, str) else list(commits)
    rows = filed_cells(commits, root)
    if not rows:
        short = ", ".join(c[:8] for c in commits)
        raise ValueError(f"no release-matrix cells of commit {short} under {root}: run `make releases` first")
    write_table(matrix_frame(rows), out)
    return out


def main(args) -> int:
    commits = args.commit
    if not args.collect_only:
        problem = free_disk_problem()
        if problem:
            print(f"attnbench releases: {problem}", file=sys.stderr)
            return 2
        machine = args.machine or _machine_name()
        commits = [run_matrix(machine, torch=not args.no_torch, asv_args=args.asv_arg)]
    path = collect(commits or [head_commit()])
    print(f"release matrix: {path}")
    if not args.collect_only:
        _asv("publish", "--config", CONFIG)
        subprocess.call([sys.executable, "-m", "attnbench.offline_html", HTML])

    print(grid_markdown(load_table(path)))
    return 0


def _machine_name() -> str:
    return subprocess.check_output([sys.executable, "-m", "attnbench", "machine-name"], text=True).strip()


def add_parser(sub) -> None:
    p = sub.add_parser(
        "releases",
        help="the kernels over several jax, libtpu and torch releases (make releases)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--collect-only",
        action="store_true",
        help="only rewrite the table from the cells already filed for the commit",
    )
    p.add_argument(
        "--commit",
        nargs="+",
        help="the commits whose cells to gather (default HEAD; a later one wins per environment)",
    )
    p.add_argument("--machine", help="asv machine name (default: attnbench machine-name)")
    p.add_argument("--no-torch", action="store_true", help="the jax releases only")
    p.add_argument(
        "--asv-arg", action="append", default=[], help="one more argument for asv run (repeatable)"
    )
    p.set_defaults(func=main)

