"""``python -m attnbench releases`` (``make releases``): run the release matrix and write its table.

    python -m attnbench releases                # build what is missing, run every release, write the table
    python -m attnbench releases --collect-only # rewrite results/releases/releases.csv from the filed cells

1. Checks free disk against what is still to build (``disk_needed``) and refuses, naming both, when
   it cannot finish.
2. ``asv run --config asv.releases.conf.json``: asv builds each jax release's venv, bare and with the
   companions (one at a time: 2 cores; cached under ``.asv/releases-env``, so a second run builds
   nothing) and runs ``benchmarks/releases.py`` in it.
3. The torch releases: the venvs ``make setup`` builds and those built here under
   ``matrix.TORCH_VENV_ROOT`` (identical files hard-linked across them), run by asv as existing
   environments.
4. The libtpu axis: each jax release with a libtpu compiles its TPU cells with the others' libtpu
   (``attnbench/releases/libtpu_axis.py``).
5. What an upgrade costs in speed: every consecutive pair of releases timed in the same rounds
   (``attnbench/releases/upgrade.py``), the A/A controls and the planted 20% slowdown, into
   ``results/releases/upgrades.csv``; and the planted 40% temporaries compiled for the TPUs
   (``planted.csv``; ``memory.py`` reads the memory changes from the two tables).
6. Gathers every environment's filed cells of this commit into ``results/releases/releases.csv``
   (``matrix.COLUMNS``, written atomically), then ``asv publish`` for the HTML (``html/releases``).

Resumable: a cell already filed for the commit is not measured again, and an upgrade step's rounds
go on where they stopped. What a step builds is removed again when the build fails or the disk runs
short. Bad input (an unknown release, one this Python cannot install, a budget of 0) is one line
and exit 2, before anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys

from attnbench.core.atomic import atomic_write_text
from attnbench.releases import matrix, planted, rounds, upgrade
from attnbench.releases.cell import kernel_names
from attnbench.releases.table import grid_markdown, load_table, matrix_frame, write_table
from attnbench.run.adaptive import RoundPlan

CONFIG = "asv.releases.conf.json"
ASV_RESULTS = os.path.join("results", "releases", "asv")
TABLE = os.path.join("results", "releases", "releases.csv")
PLANTED_RESULTS = os.path.join("results", "releases", "planted")
PLANTED_TABLE = os.path.join("results", "releases", "planted.csv")
HTML = os.path.join("html", "releases")
ASV_ENV_ROOT = os.path.join(".asv", "releases-env")
LIBTPU_ROOT = os.path.join(".asv", "releases-libtpu")
# Sizes measured here (du, 2026-12-02), for the disk check: a jax venv without and with libtpu, a
# torch CUDA-build venv, a libtpu overlay; pip's cache and a margin on top.
GB_JAX_VENV, GB_JAX_TPU_VENV, GB_TORCH_VENV, GB_LIBTPU = 0.7, 1.4, 5.5, 0.75
GB_MARGIN = 2.0
# Below this while building, the build stops and removes what it made in this run.
GB_FLOOR = 1.0


def free_gb(path: str = ".") -> float:
    return shutil.disk_usage(path).free / 2**30


def asv_envs(root: str = ASV_ENV_ROOT) -> dict[str, dict]:
    """``{python path: requirements}`` of the release venvs asv has built."""
    out = {}
    for info in glob.glob(os.path.join(root, "*", "asv-env-info.json")):
        python = os.path.join(os.path.dirname(info), "bin", "python")
        with open(info) as f:
            reqs = json.load(f).get("requirements", {})
        if os.path.exists(python):
            out[python] = reqs
    return out


def configured_envs(config: str = CONFIG) -> list[dict]:
    """The requirement sets ``asv.releases.conf.json`` lists (asv's own parser: it allows comments)."""
    from asv.util import load_json

    return [entry["req"] for entry in load_json(config, js_comments=True)["include"]]


def torch_venv(version: str) -> str:
    """The venv of a torch release: ``make setup``'s, or one this command builds."""
    return matrix.TORCH_SETUP_VENVS.get(version) or os.path.join(matrix.TORCH_VENV_ROOT, f"torch-{version}")


def disk_needed(*, torch: bool = True, libtpu: bool = True) -> float:
    """GB still to build: the jax venvs asv lacks, the torch venvs and libtpu overlays not built (the
    two torch venvs of ``make setup`` are not this command's)."""
    have = list(asv_envs().values())
    need = sum(GB_JAX_TPU_VENV if "libtpu" in reqs else GB_JAX_VENV
               for reqs in configured_envs() if reqs not in have)
    need += sum(GB_TORCH_VENV for r in matrix.TORCH_RELEASES
                if torch and r.version not in matrix.TORCH_SETUP_VENVS and not built(torch_venv(r.version)))
    need += sum(GB_LIBTPU for v in matrix.LIBTPU_AXIS if libtpu and not built(libtpu_overlay(v)))
    return need


def free_disk_problem(path: str = ".", need_gb: float | None = None, **steps) -> str | None:
    """Why the matrix cannot finish on this disk (``steps``: ``disk_needed``'s), or ``None``."""
    need = disk_needed(**steps) + GB_MARGIN if need_gb is None else need_gb
    free = free_gb(path)
    if free < need:
        return (f"only {free:.1f} GB free under {os.path.abspath(path)}; the release matrix still needs "
                f"about {need:.1f} GB for what it has not built (jax venvs in {ASV_ENV_ROOT}, torch venvs in "
                f"{matrix.TORCH_VENV_ROOT}, libtpu overlays in {LIBTPU_ROOT}) and pip's cache")
    return None


def _asv(*args, env=None) -> int:
    command = [sys.executable, "-m", "asv", *args]
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    return subprocess.call(command, env=env)


def head_commit() -> str:
    return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()


BUILT = ".attnbench-built"  # written last: a venv or overlay without it is half-built


def built(path: str) -> bool:
    return os.path.exists(os.path.join(path, BUILT))


def _build(path: str, commands: list[list[str]]) -> bool:
    """Run ``commands`` to build ``path``, then mark it built. A half-built ``path`` (no mark) is
    removed first; on a failed command, free disk under ``GB_FLOOR`` after one, or an interrupt,
    ``path`` is removed again."""
    shutil.rmtree(path, ignore_errors=True)
    try:
        for command in commands:
            print("+ " + " ".join(command), file=sys.stderr, flush=True)
            failed = subprocess.call(command) != 0
            if failed or free_gb() < GB_FLOOR:
                why = "its build failed" if failed else f"the disk ran short ({free_gb():.1f} GB free)"
                print(f"attnbench releases: removing {path}: {why}", file=sys.stderr)
                shutil.rmtree(path, ignore_errors=True)
                return False
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    with open(os.path.join(path, BUILT), "w") as f:
        f.write("\n".join(" ".join(c) for c in commands) + "\n")
    return True


def build_torch_venv(version: str) -> str | None:
    """The python of torch ``version``'s venv, built here when missing (``None``: not buildable)."""
    venv = torch_venv(version)
    python = os.path.abspath(os.path.join(venv, "bin", "python"))
    if version in matrix.TORCH_SETUP_VENVS:  # make setup's: never built or removed here
        return python if os.path.exists(python) else None
    if built(venv):
        return python
    pip = [python, "-m", "pip", "install", "--quiet"]
    ok = _build(venv, [[sys.executable, "-m", "venv", venv],
                       [*pip, f"torch=={version}", "numpy", "psutil", "asv_runner==0.3.2"],
                       [*pip, "--no-deps", "-e", "."]])
    if ok and shutil.which("hardlink"):  # the torch venvs share many identical nvidia files: one copy
        subprocess.call(["hardlink", "--quiet", matrix.TORCH_VENV_ROOT], stderr=subprocess.DEVNULL)
    return python if ok else None


def libtpu_overlay(version: str) -> str:
    return os.path.join(LIBTPU_ROOT, f"libtpu-{version}")


def build_libtpu_overlay(version: str, python: str) -> str | None:
    path = libtpu_overlay(version)
    if built(path):
        return path
    ok = _build(path, [[python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", path,
                        f"libtpu=={version}"]])
    return path if ok else None


def run_libtpu_axis(env: dict, commit: str) -> None:
    """Step 4: each jax release with a pinned libtpu, compiled by each other libtpu of the matrix, in
    its venv beside the companions (so that jax 0.9.2's undeclared absl does not hide what libtpu does)."""
    by_release = sorted(asv_envs().items(), key=lambda item: matrix.version_key(item[1].get("jax", "0")))
    for python, reqs in by_release:
        pinned = reqs.get("libtpu")
        if not pinned or "chex" not in reqs:
            continue
        for version in matrix.LIBTPU_AXIS:
            if version == pinned:
                continue
            overlay = build_libtpu_overlay(version, python)
            if overlay is None:
                continue
            name = f"jax{reqs['jax']}-absl-py-chex+libtpu{version}"
            paths = [os.path.abspath(overlay), os.getcwd()]
            subprocess.call([python, "-m", "attnbench.releases.libtpu_axis", name],
                            env={**env, "ATTNBENCH_COMMIT": commit, "PYTHONPATH": os.pathsep.join(paths)})


def run_matrix(machine: str, *, torch: bool = True, libtpu: bool = True,
               asv_args: list[str] | None = None) -> str:
    """Steps 2 to 4; returns the commit measured (HEAD at the start, so a new commit does not split
    the run). A broken cell makes asv exit non-zero: expected here."""
    env = {**os.environ, "ATTNBENCH_MACHINE": machine, "ATTNBENCH_RESULTS_DIR": os.path.abspath(ASV_RESULTS),
           "JAX_PLATFORMS": "cpu", "PJRT_DEVICE": "CPU"}
    commit = head_commit()
    run = ["run", "--config", CONFIG, "--machine", machine]
    _asv("machine", "--yes", "--machine", machine, "--config", CONFIG, env=env)
    _asv(*run, "-b", r"^releases\.", *(asv_args or []), f"{commit}^!", env=env)
    for release in matrix.TORCH_RELEASES if torch else ():
        python = build_torch_venv(release.version)
        if python is None:
            print(f"torch {release.version}: {torch_venv(release.version)} is not built here (make setup "
                  "builds .venv and .venv-xla); its cells are left out", file=sys.stderr)
            continue
        _asv(*run, "-E", f"existing:{python}", "--set-commit-hash", commit, "-b", r"^releases\.Releases\.",
             *(asv_args or []), env=env)
    if libtpu:
        run_libtpu_axis(env, commit)
    return commit


def jax_side(version: str) -> upgrade.Side | None:
    """jax ``version``'s venv beside the companions (asv's), where speed is timed: its bare venv
    differs only where a module jax does not declare is missing, a packaging fault the matrix names."""
    python = next((p for p, reqs in asv_envs().items()
                   if reqs.get("jax") == version and "chex" in reqs), None)
    return upgrade.Side(version, python) if python else None


def torch_side(version: str) -> upgrade.Side | None:
    python = build_torch_venv(version)
    return upgrade.Side(version, python) if python else None


def upgrade_steps(chosen: dict[str, list[str]] | None = None, with_planted: bool = True,
                  torch: bool = True) -> tuple[list[upgrade.Step], list[str]]:
    """The upgrade steps to time, and a line for each release whose environment is not built.
    Per framework: each release (of ``chosen``, or every one) to the next; the project's pin against
    itself (the A/A control); and, for jax, the newest against its planted 20% slowdown."""
    steps, missing = [], []
    for framework, releases in (("jax", matrix.JAX_RELEASES), ("torch", matrix.TORCH_RELEASES)):
        if framework == "torch" and not torch:
            continue
        wanted = [r.version for r in releases if chosen is None or r.version in chosen.get(framework, ())]
        sides = {}
        for version in wanted:
            side = jax_side(version) if framework == "jax" else torch_side(version)
            if side is None:
                missing.append(f"{framework} {version}: its environment is not built here "
                               "(run make releases)")
            else:
                sides[version] = side
        steps += upgrade.consecutive_steps(framework, sides)
        pin = "0.10.2" if framework == "jax" else "2.13.0"
        if pin in sides:
            steps.append(upgrade.Step(framework, sides[pin], sides[pin], upgrade.CONTROL))
            if framework == "jax" and with_planted:
                slow = dataclasses.replace(sides[pin], release=planted.release_name(pin, planted.SLOW),
                                           pythonpath=(planted.overlay(planted.SLOW),))
                steps.append(upgrade.Step(framework, sides[pin], slow, upgrade.PLANTED))
    return steps, missing


def run_upgrades(commit: str, plan: RoundPlan, steps: list[upgrade.Step]) -> str:
    """Step 5: each upgrade step's rounds (resumed from this commit's rounds file), then the table."""
    path = upgrade.rounds_path(commit)
    store = upgrade.load_rounds(path)

    def save() -> None:
        atomic_write_text(path, json.dumps(store, indent=1, sort_keys=True))

    for step in steps:
        cells = [(impl, w) for impl in kernel_names(step.framework) for w in matrix.WORKLOADS]
        rounds.run_step(step, cells, plan, store, save, progress=_progress)
    return upgrade.write_table(upgrade.table_rows(store, commit))


def _progress(line: str) -> None:
    print(f"attnbench releases: {line}", file=sys.stderr, flush=True)


def run_planted_bloat(env: dict, commit: str) -> str | None:
    """Step 5's memory half: the newest jax's TPU cells compiled under the planted 40% temporaries,
    filed apart from the matrix's cells (``PLANTED_RESULTS``) and gathered into ``PLANTED_TABLE``."""
    side = jax_side(matrix.JAX_RELEASES[-1].version)
    if side is None:
        return None
    overlay = planted.overlay(planted.BLOATED)
    name = f"jax{side.release}-absl-py-chex+{planted.BLOATED}"
    subprocess.call([side.python, "-m", "attnbench.releases.libtpu_axis", name],
                    env={**env, "ATTNBENCH_COMMIT": commit,
                         "ATTNBENCH_RESULTS_DIR": os.path.abspath(PLANTED_RESULTS),
                         "PYTHONPATH": os.pathsep.join([overlay, os.getcwd()])})
    rows = filed_cells([commit], PLANTED_RESULTS)
    if not rows:
        return None
    write_table(matrix_frame(rows), PLANTED_TABLE)
    return PLANTED_TABLE


def filed_cells(commits: list[str], root: str = ASV_RESULTS) -> list[dict]:
    """Every environment's cells of ``commits``; an environment under several keeps the last's. An
    environment whose jax is not the release its name asks for (a companion's install that upgraded
    it) is left out, with a message: its cells would stand for another release."""
    by_env = {}
    for commit in commits:
        for path in sorted(glob.glob(os.path.join(root, "*", "cells", f"{commit[:8]}-*.cells"))):
            with open(path) as f:
                by_env[os.path.basename(path)[9:-len(".cells")]] = list(json.load(f).values())
    out = []
    for env, rows in by_env.items():
        asked = re.search(r"(?:^|-)jax([\d.]+)(?:-|\+|$)", env)
        found = {str(r.get("jax")) for r in rows if r.get("framework") == "jax"}
        if asked and found and found != {asked.group(1)}:
            print(f"attnbench releases: {env} holds jax {', '.join(sorted(found))}, not {asked.group(1)}: "
                  "its cells are left out", file=sys.stderr)
            continue
        out.extend(rows)
    return out


def collect(commits, root: str = ASV_RESULTS, out: str = TABLE) -> str:
    """Step 4's table from the filed cells of ``commits`` (one commit or several)."""
    commits = [commits] if isinstance(commits, str) else list(commits)
    rows = filed_cells(commits, root)
    if not rows:
        short = ", ".join(c[:8] for c in commits)
        raise ValueError(f"no release-matrix cells of commit {short} under {root}: run `make releases` first")
    write_table(matrix_frame(rows), out)
    return out


def chosen_releases(values: list[str]) -> dict[str, list[str]] | None:
    """``--release jax=0.9.2`` values by framework (``ValueError`` naming a bad one); None: all."""
    if not values:
        return None
    out: dict[str, list[str]] = {}
    for value in values:
        framework, sep, version = value.partition("=")
        if not sep or not version:
            raise ValueError(f"--release takes FRAMEWORK=VERSION (jax=0.9.2), got {value!r}")
        matrix.release(framework.strip(), version.strip())
        out.setdefault(framework.strip(), []).append(version.strip())
    return out


def main(args) -> int:
    commits = args.commit
    try:  # bad input: one line, exit 2, before anything is built or measured
        chosen = chosen_releases(args.release)
        plan = dataclasses.replace(rounds.PLAN, budget_s=args.budget)
    except ValueError as exc:
        print(f"attnbench releases: {exc}", file=sys.stderr)
        return 2
    if args.upgrades_only:
        return _upgrades_only(chosen, plan, args)
    if not args.collect_only:
        problem = free_disk_problem(torch=not args.no_torch, libtpu=not args.no_libtpu_axis)
        if problem:
            print(f"attnbench releases: {problem}", file=sys.stderr)
            return 2
        machine = args.machine or _machine_name()
        commits = [run_matrix(machine, torch=not args.no_torch, libtpu=not args.no_libtpu_axis,
                              asv_args=args.asv_arg)]
        if not args.no_upgrades:
            steps, missing = upgrade_steps(chosen, with_planted=not args.no_planted, torch=not args.no_torch)
            for line in missing:
                print(f"attnbench releases: {line}", file=sys.stderr)
            print(f"upgrade costs: {run_upgrades(commits[0], plan, steps)}")
            if not args.no_planted:
                env = {**os.environ, "ATTNBENCH_MACHINE": machine, "JAX_PLATFORMS": "cpu"}
                print(f"planted memory growth: {run_planted_bloat(env, commits[0])}")
    path = collect(commits or [head_commit()])
    print(f"release matrix: {path}")
    if not args.collect_only:
        _asv("publish", "--config", CONFIG)
        subprocess.call([sys.executable, "-m", "attnbench.offline_html", HTML])

    print(grid_markdown(load_table(path)))
    return 0


def _upgrades_only(chosen, plan: RoundPlan, args) -> int:
    """``--upgrades-only``: the rounds alone, in environments an earlier run built."""
    steps, missing = upgrade_steps(chosen, with_planted=not args.no_planted, torch=not args.no_torch)
    for line in missing:
        print(f"attnbench releases: {line}", file=sys.stderr)
    if not steps:
        print("attnbench releases: no upgrade step has both its environments built here", file=sys.stderr)
        return 2
    print(f"upgrade costs: {run_upgrades(head_commit(), plan, steps)}")
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
    p.add_argument("--no-libtpu-axis", action="store_true", help="no compiles with another release's libtpu")
    p.add_argument("--no-upgrades", action="store_true", help="no paired rounds between consecutive releases")
    p.add_argument("--no-planted", action="store_true", help="no planted slowdown or memory growth")
    p.add_argument("--upgrades-only", action="store_true",
                   help="only the paired upgrade rounds, in the environments an earlier run built")
    p.add_argument("--release", action="append", default=[], metavar="FRAMEWORK=VERSION",
                   help="time the upgrade steps between these releases only (repeatable; jax=0.9.2)")
    p.add_argument("--budget", type=float, default=rounds.PLAN.budget_s, metavar="SECONDS",
                   help=f"seconds of rounds per upgrade step (default {rounds.PLAN.budget_s:g})")
    p.add_argument(
        "--asv-arg", action="append", default=[], help="one more argument for asv run (repeatable)"
    )
    p.set_defaults(func=main)

