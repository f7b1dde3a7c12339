"""The suite measured where asv's bookkeeping does not fit, and filed with asv where it does.

On a lent accelerator the minutes are few, and asv spends many of them after measuring: it starts a
process per benchmark and parameter combination (the gpu suite with every kernel: 29 ``track_``
metrics per combination; with 27 of them, 219-233 s in a mimic of the H200 image here; docs/device.md). So
``tools/device-run.sh`` measures there without asv, and asv files the records back here:

* ``measure --into DIR`` (on the device): each measured benchmark class's ``setup_cache``, that is
  ``asv.suite.measure_suite`` with the case cache, sidecar and traces an asv run has, in the context
  asv would give it (machine, commit, the environment's stable name). DIR then holds ``cases/``
  (written as each case ends), ``results/<machine>/`` (sidecar, traces) and ``carried.json`` (written
  first: the run's names, its suite settings and the machine's facts for asv's ``machine.json``).
* ``file DIR|TARBALL`` (here): ``asv run`` in existing mode with ``ATTNBENCH_CARRIED`` naming the
  records, so every ``setup_cache`` reads them and measures nothing, and only the combinations with
  a record start a process; the results are renamed to the device's environment and merged, with the
  carried sidecar and traces, into ``results/<machine>/``.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile

from attnbench.asv import rename_env, selection, sidecar, sizes, suite
from attnbench.core import records
from attnbench.core.atomic import atomic_write_bytes, atomic_write_text
from attnbench.measure.process_env import scoped_environ
from attnbench.run import case_cache, environment
from attnbench.run.environment import CHECKOUT

# Imported where used: asv (its config reader; not on the device).

RUN = "carried.json"  # not under results/: asv publish reads every *.json there as a result


def machine_facts() -> dict[str, str]:
    """This host as asv's ``machine.json`` describes one (``asv.machine.Machine.get_defaults``),
    read with the standard library: the device has no asv."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "")
    except OSError:
        pass
    ram = ""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as fh:
            kib = next((line.split()[1] for line in fh if line.startswith("MemTotal:")), "")
        ram = str(int(kib) * 1024) if kib.isdigit() else ""  # bytes, as asv's util.get_memsize
    except OSError:
        pass
    uname = platform.uname()
    return {"os": f"{uname.system} {uname.release}", "arch": platform.machine(),
            "cpu": cpu or uname.processor,
            "num_cpu": str(os.cpu_count() or ""), "ram": ram}


def measure(into: str, machine: str, commit: str, root: str = CHECKOUT) -> int:
    """Measure the suite's cases into ``into`` as asv's ``setup_cache`` of each measured class would;
    returns how many case records were written. ``ATTNBENCH_DEADLINE`` bounds it as in asv."""
    results, cases = os.path.join(into, "results"), os.path.join(into, "cases")
    env_name = environment.asv_environment_name(root)
    os.makedirs(results, exist_ok=True)
    # The context asv gives a benchmark process: asv_context() reads the environment's name from
    # ASV_ENV_NAME, as in an asv run with the stable names of attnbench/asv/plugin.py.
    with scoped_environ(ATTNBENCH_RESULTS_DIR=results, ATTNBENCH_MACHINE=machine, ATTNBENCH_COMMIT=commit,
                        ASV_ENV_NAME=env_name, **{case_cache.CACHE_ENV: cases}):
        run = {"machine": machine, "commit": commit, "env_name": env_name,
               "settings": suite.provenance_settings(), "asv_machine": machine_facts()}
        atomic_write_text(os.path.join(into, RUN), json.dumps(run, indent=1) + "\n")
        benchmarks = selection.benchmark_module(root)
        for cls in benchmarks.MEASURED:
            suite.measure_suite(**benchmarks.sweep_of(cls))
    return len(case_cache.read_folder(cases))


def _carried_folder(source: str, scratch: str) -> str:
    """``source`` itself when a folder, else the tarball unpacked into ``scratch``."""
    if os.path.isdir(source):
        return source
    if not tarfile.is_tarfile(source):
        raise ValueError(f"{source} is neither a folder nor a tarball of tools/device-run.sh's measurements")
    with tarfile.open(source) as tar:
        tar.extractall(scratch, filter="data")
    return scratch


def _the_run(folder: str) -> dict:
    try:
        with open(os.path.join(folder, RUN), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder} is not a carried run of `attnbench.asv.carried measure` "
                         f"({RUN}: {exc})") from None


def filing_environment(settings: dict, machine: str, cases: str, results: str) -> dict[str, str]:
    """The variables under which this checkout's benchmarks have the carried run's parameters and read
    its records: its suite size, accelerator and kernels."""
    env = {sizes.SUITE_ENV: settings["suite"], "ACCEL": settings["accelerator"], "ATTNBENCH_MACHINE": machine,
           suite.CARRIED_ENV: cases, "ATTNBENCH_RESULTS_DIR": results, "ASV_PYTHONPATH": CHECKOUT}
    impls = settings.get("impls")
    env["ATTNBENCH_IMPLS"] = "" if impls in (None, "all") else impls
    return env


def _bench_args(cases: str) -> list[str]:
    """asv ``-b`` regexes of the combinations with a carried record it can show (not n/a)."""
    carried = {r.pop("case_key"): r for r in case_cache.read_folder(cases)}
    args = []
    for cls in selection.benchmark_module(CHECKOUT).MEASURED:
        kept = []
        for params in itertools.product(*cls.params):
            case = cls.case_of(*params)
            record = carried.get(suite.case_key(*case)) if case is not None else None
            if record is not None and record.get("status") != records.UNSUPPORTED:
                kept.append(params)
        if kept:
            args += ["-b", selection.combinations_regex(cls, kept)]
    return args or ["-b", r"^$"]


def file(source: str, results_dir: str, python: str = sys.executable) -> list[str]:
    """File the carried run ``source`` under ``results_dir`` with asv; returns the paths written."""
    from asv.machine import MachineCollection
    from asv.util import load_json  # asv's own reading of its config (JavaScript comments)

    with tempfile.TemporaryDirectory(prefix="attnbench-file-") as scratch:
        folder = _carried_folder(source, os.path.join(scratch, "carried"))
        run = _the_run(folder)
        machine, commit, device_env = run["machine"], run["commit"], run["env_name"]
        cases, work = os.path.join(folder, "cases"), os.path.join(scratch, "asv")
        conf = load_json(os.path.join(CHECKOUT, "asv.conf.json"), js_comments=True)
        conf.update(repo=CHECKOUT, benchmark_dir=os.path.join(CHECKOUT, "benchmarks"),
                    results_dir=os.path.join(work, "results"), html_dir=os.path.join(work, "html"),
                    env_dir=os.path.join(work, "env"))
        conf_path = os.path.join(scratch, "asv.conf.json")
        atomic_write_text(conf_path, json.dumps(conf, indent=1))
        # The device's facts, whole (`asv machine` keeps only those that differ from this host's).
        MachineCollection.save(machine, {**(run.get("asv_machine") or {}), "machine": machine})
        asv = [python, "-m", "asv"]
        variables = filing_environment(run["settings"], machine, cases, os.path.join(work, "results"))
        with scoped_environ(**variables):
            bench = _bench_args(cases)
            code = subprocess.call([*asv, "run", "--config", conf_path, "--machine", machine,
                                    "-E", f"existing:{python}", "--set-commit-hash", commit, *bench])
        if code not in (0, 2):  # 2: some benchmark failed, which its result records
            raise RuntimeError(f"asv run exited {code} while filing {source}")
        local_env = environment.asv_environment_name(CHECKOUT, environment.probe(python))
        if local_env != device_env:
            rename_env.rename_environment(os.path.join(work, "results"), local_env, device_env)
        return _merge(os.path.join(work, "results", machine), os.path.join(folder, "results", machine),
                      os.path.join(results_dir, machine))


def _merge(asv_results: str, carried: str, target: str) -> list[str]:
    """asv's result and machine files, then the carried sidecars and traces, into ``target``; each file
    written atomically, none of ``target``'s other files touched."""
    written = []
    pairs = [(path, os.path.join(target, os.path.basename(path)))
             for path in glob.glob(os.path.join(asv_results, "*.json"))]
    for sub in (sidecar.FOLDER, "traces"):
        for path in glob.glob(os.path.join(carried, sub, "**", "*"), recursive=True):
            if os.path.isfile(path):
                pairs.append((path, os.path.join(target, os.path.relpath(path, carried))))
    for source, destination in sorted(pairs):
        with open(source, "rb") as fh:
            atomic_write_bytes(destination, fh.read())
        written.append(destination)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.asv.carried", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("measure", help="measure the suite without asv (on the device)")
    p.add_argument("--into", required=True, help="the folder to pack and carry back")
    p.add_argument("--machine", required=True)
    p.add_argument("--commit", required=True, help="the commit the results are filed under")
    p = sub.add_parser("file", help="file a carried run with asv, here")
    p.add_argument("source", help="the folder or tarball tools/device-run.sh brought back")
    p.add_argument("--results", default=os.path.join(CHECKOUT, "results"), help="default: the checkout's")
    args = parser.parse_args(argv)
    if args.command == "measure":
        count = measure(args.into, args.machine, args.commit)
        print(f"attnbench: {count} case records in {args.into}")
        return 0 if count else 1
    written = file(args.source, args.results)
    print(f"attnbench: filed {len(written)} files under {args.results}")
    for path in written:
        print(f"  {os.path.relpath(path, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
