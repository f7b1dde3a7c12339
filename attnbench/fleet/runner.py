"""The fleet job's run loop: the asv suite one benchmark group at a time, resumable after a preemption.

asv writes a machine's results file only when a whole ``asv run`` ends, and not atomically, so a
spot VM taken away mid-run would lose everything and could leave a truncated file. So the job runs,
per benchmark group and asv environment::

    asv run --bench GROUP --skip-existing-successful --machine NAME -E ENV --set-commit-hash COMMIT

and after each group checks the results files and copies them to the bucket
(``<bucket>/attnbench/<machine>/results/``). A relaunched job restores the bucket's copy, skips
the groups already done (``state/progress-<commit8>.json``) and lets asv skip benchmarks already
successful: at most the running group runs again. Measurements are never repeated: the suite's
case cache lives in the bucket too (``<bucket>/attnbench/<machine>/state/case-cache``,
``ATTNBENCH_CASE_CACHE``).

A failed group is run again while it makes progress (its case cache grew); one that fails the same
way twice is recorded and left.

Every start appends an attempt to ``results/<machine>/fleet/<commit8>.fleet`` (JSON): when, the
SkyPilot task id, where it landed, the detected machine name and the catalog price used.

Only the standard library (plus ``attnbench.core.metrics``): it runs apart from the measured venvs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.core import metrics
from attnbench.core.atomic import atomic_write_text
from attnbench.fleet import BUCKET_PREFIX

# Imported where used: sky (the fleet extra).

STOPPED_EXIT = 143  # 128 + SIGTERM: what SkyPilot and shells read as "terminated"
GROUP_TRIES = 3  # runs of one group while its case cache keeps growing


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def log(message: str) -> None:
    print(f"[attnbench fleet {_now()}] {message}", file=sys.stderr, flush=True)


def default_groups() -> list[str]:
    r"""One group per benchmark class x metric group of the metric table, then everything else.

    asv matches a parameterized benchmark as ``...track_<metric>(<params>)``, so a group ends in
    ``(\(|$)``, never a bare ``$`` (that selects nothing). The last group, ``.``, catches benchmarks a
    measured commit adds; ``--skip-existing-successful`` makes it free otherwise.
    """
    groups = []
    for cls in ("Forward", "Training"):
        for group in metrics.GROUPS:
            names = [m.name for m in metrics.METRICS if m.group == group]
            if names:
                groups.append(rf"^attention\.{cls}\.track_({'|'.join(names)})(\(|$)")
    groups.append(".")
    return groups


def result_file_ok(path: Path) -> bool:
    """An asv results file (or any JSON file) that parses to an object; other files are not judged."""
    if path.suffix not in (".json", ".fleet", ".sidecar"):
        return True
    try:
        data = json.loads(path.read_text(encoding="utf-8"))  # asv writes bare NaN: Python reads it
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict)


def session_members(sid: int) -> list[int]:
    """Every process of session ``sid`` (Linux ``/proc``).

    asv puts its forkserver and each benchmark in process groups of their own, so killing asv's
    group leaves them running; they all stay in asv's session."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # after "pid (comm)": state, ppid, pgrp, session
            members.append(int(entry))
    return members


def stop_session(sid: int, grace_s: float = 10.0) -> None:
    """SIGTERM every process of session ``sid``, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        members = session_members(sid) if os.path.isdir("/proc") else [sid]
        for pid in members:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and session_members(sid):
            time.sleep(0.2)


def copy_atomic(src: Path, dst: Path) -> None:
    """Copy through a temporary sibling and a rename: the target is the old file or the new one."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _files(root: Path):
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


@dataclass
class Runner:
    machine: str
    commit: str
    checkout: Path  # the repository at the commit (asv.conf.json, results/)
    bucket: Path | None  # the mounted bucket; None: nothing is published (a local run)
    asv: list[str]  # the asv command, e.g. [<checkout>/.venv/bin/asv]
    envs: list[str]  # asv -E specs: "existing:<python>" (the fleet) or "virtualenv:..." (asv builds)
    groups: list[str] = field(default_factory=default_groups)
    asv_args: list[str] = field(default_factory=list)
    price_file: Path | None = None  # the catalog price (prices.CatalogPrice JSON) handed to the suite
    attempt: dict = field(default_factory=dict)  # what this start records about itself
    _child: subprocess.Popen | None = None
    _stopping: bool = False

    # -- where things are -----------------------------------------------------------------------
    @property
    def results(self) -> Path:
        return self.checkout / "results" / self.machine

    @property
    def remote(self) -> Path | None:
        return None if self.bucket is None else self.bucket / BUCKET_PREFIX / self.machine

    @property
    def state(self) -> Path:
        return self.remote / "state" if self.remote else self.checkout / ".asv" / "fleet-state" / self.machine

    @property
    def case_cache(self) -> Path:
        return self.state / "case-cache"

    @property
    def progress_file(self) -> Path:
        return self.state / f"progress-{self.commit[:8]}.json"

    @property
    def provenance_file(self) -> Path:
        return self.results / "fleet" / f"{self.commit[:8]}.fleet"

    # -- the bucket -----------------------------------------------------------------------------
    def restore(self) -> None:
        """Missing or damaged local files get the bucket's copy; a damaged one with none is moved aside."""
        if self.remote is not None:
            source = self.remote / "results"
            for src in _files(source):
                dst = self.results / src.relative_to(source)
                if not dst.exists():
                    copy_atomic(src, dst)
                elif not result_file_ok(dst):
                    log(f"{dst} is damaged (a run stopped while asv wrote it); restoring the bucket's copy")
                    copy_atomic(src, dst)
        for path in _files(self.results):
            if not result_file_ok(path):
                aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
                log(f"{path} is damaged and the bucket has no copy; moved aside to {aside.name}")
                path.rename(aside)

    def publish(self) -> int:
        """Copy changed, readable results files to the bucket; returns how many were copied."""
        if self.remote is None:
            return 0
        copied = 0
        for src in _files(self.results):
            if ".damaged-" in src.name:
                continue
            if not result_file_ok(src):
                log(f"not publishing {src}: it does not parse (the bucket keeps its last good copy)")
                continue
            dst = self.remote / "results" / src.relative_to(self.results)
            if dst.exists() and dst.read_bytes() == src.read_bytes():
                continue
            copy_atomic(src, dst)
            copied += 1
        return copied

    def _load_json(self, path: Path, default):
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return default
        except (OSError, ValueError) as exc:
            log(f"{path} is unreadable ({exc}); starting it afresh")
            return default

    def _save_json(self, path: Path, data) -> None:
        atomic_write_text(str(path), json.dumps(data, indent=1, sort_keys=True))

    def record(self, **fields) -> None:
        """Update this attempt in the provenance file (results/<machine>/fleet/<commit8>.fleet)."""
        self.attempt.update(fields)
        data = self._load_json(self.provenance_file, {})
        data.update(machine=self.machine, commit=self.commit)
        attempts = [a for a in data.get("attempts", []) if a.get("id") != self.attempt["id"]]
        data["attempts"] = [*attempts, self.attempt]
        self._save_json(self.provenance_file, data)
        if self.remote is not None:  # at once: an attempt preempted before its first group is on record too
            relative = self.provenance_file.relative_to(self.results)
            copy_atomic(self.provenance_file, self.remote / "results" / relative)

    # -- asv ------------------------------------------------------------------------------------
    def child_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(ATTNBENCH_MACHINE=self.machine, ATTNBENCH_CASE_CACHE=str(self.case_cache),
                   ATTNBENCH_RESULTS_DIR=str(self.checkout / "results"))
        if self.price_file is not None:
            env["ATTNBENCH_CATALOG_PRICE"] = str(self.price_file)
        return env

    def _run(self, args: list[str]) -> int:
        if self._stopping:
            raise SystemExit(STOPPED_EXIT)
        cmd = [*self.asv, *args]
        log("$ " + " ".join(cmd))
        self._child = subprocess.Popen(cmd, cwd=self.checkout, env=self.child_env(), start_new_session=True)
        try:
            while True:
                try:
                    return self._child.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    continue
        finally:
            self._child = None
            if self._stopping:
                raise SystemExit(STOPPED_EXIT)

    def asv_run(self, group: str, env_spec: str) -> int:
        config = ["--config", str(self.checkout / "asv.conf.json")]
        where = (["-E", env_spec, "--set-commit-hash", self.commit] if env_spec.startswith("existing")
                 else ["-E", env_spec, f"{self.commit}^!"])
        return self._run(["run", *config, "--bench", group, "--skip-existing-successful",
                          "--machine", self.machine, *where, *self.asv_args])

    def cached_cases(self) -> int:
        return sum(1 for p in _files(self.case_cache) if p.suffix == ".case")

    # -- the loop -------------------------------------------------------------------------------
    def _on_signal(self, signum, _frame) -> None:
        log(f"signal {signum}: stopping (the bucket holds every finished group; a relaunch resumes)")
        self._stopping = True
        if self._child is not None:
            stop_session(self._child.pid)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.attempt.setdefault("started_utc", _now())
        self.attempt.setdefault("id", f"{self.attempt['started_utc']}-{os.uname().nodename}-{os.getpid()}")
        self.attempt.setdefault("skypilot_task_id", os.environ.get("SKYPILOT_TASK_ID"))
        cluster = os.environ.get("SKYPILOT_CLUSTER_INFO")
        self.attempt.setdefault("cluster", json.loads(cluster) if cluster else None)
        self.restore()
        self.record()
        progress = self._load_json(self.progress_file, {})
        done = progress.setdefault("groups", {})
        if self._run(["machine", "--yes", "--machine", self.machine, "--config",
                      str(self.checkout / "asv.conf.json")]) != 0:
            log("asv machine failed")
            return 1
        for i, group in enumerate(self.groups, 1):
            if group in done:
                log(f"group {i}/{len(self.groups)} {group}: done before "
                    f"(exit codes {done[group]['exit_codes']})")
                continue
            for attempt in range(1, GROUP_TRIES + 1):
                before = self.cached_cases()
                codes = [self.asv_run(group, env_spec) for env_spec in self.envs]
                self.restore()  # a file asv left damaged never reaches the bucket nor the next run
                copied = self.publish()
                grew = self.cached_cases() - before
                log(f"group {i}/{len(self.groups)} {group}: exit codes {codes}, {grew} cases measured, "
                    f"{copied} files published")
                if all(c == 0 for c in codes) or grew == 0:
                    break
                log(f"group {group} failed but measured new cases: running it again "
                    f"({attempt}/{GROUP_TRIES})")
            done[group] = {"exit_codes": codes, "finished_utc": _now()}
            self._save_json(self.progress_file, progress)
        self.record(finished_utc=_now())
        self.publish()
        failed = {g: d["exit_codes"] for g, d in done.items() if any(d["exit_codes"])}
        log(f"all {len(self.groups)} groups done; {len(failed)} with failed benchmarks"
            + (f": {failed}" if failed else ""))
        return 0


def detect_machine(checkout: Path) -> str | None:
    """What ``attnbench machine-name`` says on this VM (the frameworks' devices), in the measured venv."""
    python = checkout / ".venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNBENCH_MACHINE", "PYTHONPATH")}
    try:
        out = subprocess.run([str(python), "-m", "attnbench", "machine-name"], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=900, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"machine-name failed: {exc}")
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else None


def catalog_price(task_file: Path, market: str, out: Path) -> tuple[Path | None, str | None]:
    """The catalog price for where this job landed, written to ``out``; else ``(None, why)``."""
    info = os.environ.get("SKYPILOT_CLUSTER_INFO")
    if not info:
        return None, "not under SkyPilot (no SKYPILOT_CLUSTER_INFO): prices from the hardware profiles"
    try:
        cluster = json.loads(info)
        import sky

        from attnbench.hardware import catalog_prices as prices

        cloud = str(cluster["cloud"]).lower()
        task = sky.Task.from_yaml(str(task_file))
        matching = [r for r in task.resources if r.cloud is not None and str(r.cloud).lower() == cloud]
        if not matching:
            return None, f"the task names no resources on {cloud}"
        [(accelerator, count)] = matching[0].accelerators.items()
        price = prices.lookup(accelerator, int(count), cloud, region=cluster.get("region"),
                              zone=cluster.get("zone"), market=market)
    except Exception as exc:  # no SkyPilot, no catalog, no row: the profiles stay the fallback
        return None, f"no catalog price ({type(exc).__name__}: {exc}): prices from the hardware profiles"
    atomic_write_text(str(out), price.to_json())
    return out, None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Its options, on ``python -m attnbench.fleet run``'s parser and on this module's own."""
    parser.add_argument("--machine", required=True, help="the asv machine name (fixed per kind)")
    parser.add_argument("--commit", required=True, help="the commit measured (full sha)")
    parser.add_argument("--checkout", required=True, type=Path, help="the repository at that commit")
    parser.add_argument("--bucket", type=Path, help="the mounted results bucket (omit: publish nothing)")
    parser.add_argument("--asv", nargs="+", help="asv command (default: <checkout>/.venv/bin/asv)")
    parser.add_argument("--env", action="append", dest="envs", metavar="SPEC",
                        help="asv -E spec, repeatable (default: existing:<checkout>/.venv/bin/python and "
                             "existing:<checkout>/.venv-xla/bin/python)")
    parser.add_argument("--group", action="append", dest="groups", metavar="REGEX",
                        help="benchmark group (asv --bench regex), repeatable "
                             "(default: class x metric group)")
    parser.add_argument("--task", type=Path, help="the task file: price the run from SkyPilot's catalog")
    parser.add_argument("--market", default=os.environ.get("ATTNBENCH_MARKET", "spot"),
                        choices=("spot", "on-demand"))
    parser.add_argument("--check-machine", action="store_true",
                        help="ask the frameworks which accelerator this is before measuring; stop if none")
    parser.add_argument("asv_args", nargs="*", help="more asv run arguments (after --)")


def command(args: argparse.Namespace) -> int:
    checkout = args.checkout.resolve()
    envs = args.envs or [f"existing:{checkout / '.venv' / 'bin' / 'python'}",
                         f"existing:{checkout / '.venv-xla' / 'bin' / 'python'}"]
    runner = Runner(machine=args.machine, commit=args.commit, checkout=checkout, bucket=args.bucket,
                    asv=args.asv or [str(checkout / ".venv" / "bin" / "asv")], envs=envs,
                    groups=args.groups or default_groups(), asv_args=args.asv_args)
    runner.attempt["started_utc"] = _now()
    if args.check_machine:
        detected = detect_machine(checkout)
        runner.attempt["detected_machine"] = detected
        if detected is None or detected.startswith("cpu-"):
            log(f"the frameworks see no accelerator here (machine-name: {detected!r}): the accelerator "
                f"build or its driver is broken; not filing CPU numbers under {args.machine!r}")
            return 3
        if detected != args.machine:
            log(f"the frameworks name this machine {detected!r}; results are filed under the kind's fixed "
                f"name {args.machine!r} (recorded in the .fleet file)")
    if args.task is not None:
        runner.state.mkdir(parents=True, exist_ok=True)
        out = runner.state / f"price-{runner.attempt['started_utc'].replace(':', '')}.json"
        runner.price_file, why = catalog_price(args.task, args.market, out)
        runner.attempt["price"] = json.loads(out.read_text()) if runner.price_file else None
        runner.attempt["price_note"] = why
        if why:
            log(why)
    return runner.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.fleet run", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
