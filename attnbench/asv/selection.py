"""Which of the measured suite's parameter combinations each asv environment runs, and the runs.

asv starts one process per benchmark and parameter combination: 29 metrics x 168 combinations per
environment, about 10,000 processes and two minutes of ``make bench`` here, most of them n/a (the
other environment's framework, a regime at a length the suite size does not run it at, a GPU
kernel on a CPU host). ``selection`` names the combinations an environment can run, as asv ``-b``
regexes over ``name(params)``; asv records the others n/a without starting a process. The sweep
still measures or refuses every case, with its reason in the sidecar: this changes no record, only
which of asv's cells are left empty without asking. Only certain exclusions are made (a kernel the
support table marks unsupported on a CPU-only host, never a guess about a device).

``python -m attnbench.asv.selection run --machine M [--existing PY ...] [-- ASV ARGS]`` is
``make bench``'s asv step: one ``asv run`` per environment, each with its selection (a user's own
``-b`` replaces it). asv's virtualenvs run one at a time from a config of their own
(``.asv-env-<k>.conf.json``, asv.conf.json with one ``include`` entry: the same environment name,
results and history).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

import attention_impls
from attnbench.asv.sizes import (
    SuiteSize,
    accelerator_kind,
    check_user_traffic,
    suite_size,
    user_round_settings,
)
from attnbench.asv.suite import outside_suite
from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import Workload
from attnbench.run import progress

# Imported where used: asv (the main venv only).

CONF = "asv.conf.json"
MAIN_FRAMEWORKS = ("numpy", "jax", "torch")
XLA_FRAMEWORKS = ("torch_xla",)


def can_run(
    impl_name: str, workload: Workload, regime: str, frameworks: tuple[str, ...], size: SuiteSize, accel: str
) -> bool:
    """False only where the case is certainly n/a in an environment of ``frameworks`` on ``accel``
    (interpreted only counts on a CPU-only host, where the support table says so without a device)."""
    impl = attention_impls.get(impl_name)
    if impl.framework not in frameworks:
        return False
    support = impl.platform_support["cpu"].status if accel == "cpu" else None
    if support == "unsupported":
        return False
    return outside_suite(impl, workload, regime, size, interpreted=support == "interpret-only") is None


def _asv_name(benchmark: str, params: tuple) -> str:
    """asv's name of one parameter combination: its params as ``repr`` strings."""
    return f"{benchmark}({', '.join(repr(p) for p in params)})"


def selection(
    classes, frameworks: tuple[str, ...], size: SuiteSize, accel: str, module: str = "attention"
) -> list[str]:
    """One ``-b`` regex per class: its combinations that ``can_run``. A class with none gets none."""
    regexes = []
    for cls in classes:
        kept = []
        for params in itertools.product(*cls.params):
            case = cls.case_of(*params)
            if case is not None and can_run(*case, frameworks, size, accel):
                kept.append(params)
        if kept:
            regexes.append(combinations_regex(cls, kept, module))
    return regexes


def combinations_regex(cls, combinations: list[tuple], module: str = "attention") -> str:
    """An asv ``-b`` regex for every ``track_`` benchmark of ``cls`` at these parameter combinations."""
    names = "|".join(re.escape(_asv_name("X", params)[1:]) for params in combinations)
    return rf"^{module}\.{cls.__name__}\.track_\w+(?:{names})$"


def env_configs(conf: str = CONF) -> list[tuple[str, tuple[str, ...]]]:
    """``[(config path, frameworks)]``: one config per ``include`` entry of ``conf``, written beside it."""
    from asv.util import load_json  # asv's own reading of its config (JavaScript comments)

    config = load_json(conf, js_comments=True)
    out = []
    for k, entry in enumerate(config["include"]):
        path = os.path.join(os.path.dirname(os.path.abspath(conf)), f".asv-env-{k}.conf.json")
        atomic_write_text(path, json.dumps({**config, "include": [entry]}, indent=1))
        out.append((path, XLA_FRAMEWORKS if "torch-xla" in entry.get("req", {}) else MAIN_FRAMEWORKS))
    return out


def existing_frameworks(python: str) -> tuple[str, ...]:
    """What an existing interpreter measures (``asv.sizes.this_env_frameworks``, asked of it)."""
    found = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('torch_xla') is not None)"],
        capture_output=True,
        text=True,
    )
    return XLA_FRAMEWORKS if found.stdout.strip() == "True" else MAIN_FRAMEWORKS


def _user_selects(asv_args: list[str]) -> bool:
    return any(a in ("-b", "--bench") or a.startswith(("-b", "--bench=")) for a in asv_args)


def benchmark_module(root: str | None = None):
    """``benchmarks/attention.py`` of the checkout at ``root`` (the current folder), executed afresh:
    its parameters are read from the environment when it is executed, as in each asv process."""
    root = os.path.abspath(root or os.getcwd())
    if root not in sys.path:
        sys.path.insert(0, root)
    path = os.path.join(root, "benchmarks", "attention.py")
    spec = importlib.util.spec_from_file_location("benchmarks_attention", path)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    return suite


def _measured_classes():
    """``benchmarks/attention.py``'s measured classes, imported from the checkout."""
    return benchmark_module().MEASURED


def _bench_args(classes, frameworks) -> list[str]:
    regexes = selection(classes, frameworks, suite_size(), accelerator_kind())
    return [arg for r in regexes for arg in ("-b", r)] or ["-b", r"^$"]


def run(machine: str, existing: list[str], commit: str | None, asv_args: list[str]) -> int:
    """One ``asv run`` per environment, each with its selection unless ``asv_args`` selects; failed
    benchmarks are reported, not fatal."""
    if existing:
        runs = [(["-E", f"existing:{python}", "--set-commit-hash", commit], existing_frameworks(python),
                 python) for python in existing]
    else:
        runs = [(["--config", path, "HEAD^!"], frameworks, os.path.basename(path))
                for path, frameworks in env_configs()]
    classes = None if _user_selects(asv_args) else _measured_classes()
    for where, frameworks, name in runs:
        selected = _bench_args(classes, frameworks) if classes is not None else []
        command = [sys.executable, "-m", "asv", "run", "--machine", machine, *where, *asv_args, *selected]
        print(f"asv run ({name}): {'/'.join(frameworks)} cases", file=sys.stderr, flush=True)
        # asv captures its setup's output: the sweep's progress lines reach the terminal through a file
        with tempfile.TemporaryDirectory(prefix="attnbench-progress-") as folder:
            lines = os.path.join(folder, "progress.log")
            with progress.follow(lines):
                status = run_asv(command, env={**os.environ, progress.FILE_ENV: lines})
        if status != 0:
            print(f"asv run ({name}) reported failed benchmarks (status failed in the results); "
                  "publishing anyway", file=sys.stderr)
    return 0


ASV_STOP_S = 30.0  # how long Ctrl-C waits for asv to stop its benchmark process


def run_asv(command: list[str], env: dict) -> int:
    """``command``'s exit status. On Ctrl-C, asv (which got it too) is given ``ASV_STOP_S`` to stop the
    benchmark process it started in its own process group: that process files what it measured and
    prints the verdict so far; killed at once, asv would leave it running."""
    process = subprocess.Popen(command, env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        try:
            process.wait(timeout=ASV_STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
        raise


MEASURED_CODE = ("attention_impls", "attnbench", "benchmarks")


def uncommitted_code(repo: str = ".") -> list[str]:
    """The measured code's files that differ from HEAD: an existing environment imports the working
    tree, and its results are filed under HEAD's hash, so they must be HEAD's code."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *MEASURED_CODE],
                         cwd=repo, capture_output=True, text=True)
    return [line[3:] for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def check_inputs(existing: list[str]) -> str | None:
    """Why ``make bench`` must not start, in one line, or None: a bad budget or margin, or measured code
    that differs from the commit its results would be filed under."""
    try:
        user_round_settings()
        check_user_traffic()
    except (ValueError, KeyError) as exc:
        return str(exc)
    changed = uncommitted_code() if existing else []
    if changed:
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        return (f"the measured code differs from HEAD ({shown}): make bench measures the working tree and "
                "files it under HEAD's hash; commit (or stash) first")
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="make bench's asv step")
    r.add_argument("--machine", required=True)
    r.add_argument(
        "--existing", nargs="*", default=[], help="existing interpreters (one asv environment each)"
    )
    r.add_argument("--commit", help="--set-commit-hash for existing environments (default HEAD)")
    r.add_argument("asv_args", nargs=argparse.REMAINDER, help="-- then arguments for every asv run")
    c = sub.add_parser("check", help="make bench's inputs: the budget, the margin, the measured code")
    c.add_argument("--existing", nargs="*", default=[])
    args = p.parse_args(argv)
    if args.command == "check":
        problem = check_inputs(args.existing)
        if problem:
            print(f"make bench: {problem}", file=sys.stderr)
        return 2 if problem else 0
    extra = args.asv_args[1:] if args.asv_args[:1] == ["--"] else args.asv_args
    problem = check_inputs(args.existing)
    if problem:
        print(f"make bench: {problem}", file=sys.stderr)
        return 2
    commit = args.commit or subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    return run(args.machine, args.existing, commit, extra)


if __name__ == "__main__":
    sys.exit(main())
