"""Which machine and which asv run results are filed under: the machine's name (``cpu-2core``,
``h200``), found without initialising a device in this process, and asv's run context (results
folder, commit, environment). The suite, the release matrix and the profiler check read them here.
"""

from __future__ import annotations

import os
import subprocess
import sys

from attnbench import hardware
from attnbench.hardware import detection
from attnbench.run.environment import CHECKOUT, asv_environment_name
from attnbench.run.provenance import git_commit

# ``machine-name`` imports every framework and initialises its device: a slow host needs minutes.
NAME_TIMEOUT_S = 600.0
_machine: str | None = None  # this process's answer, once found


def machine_name() -> str:
    """The name results are filed under: states the accelerator (cpu-2core, h200, tpu-v5-lite-4).

    Initialises no device in this process: ``ATTNBENCH_MACHINE``, else ``cpu-<cores>core`` without a
    GPU/TPU device file, else ``machine-name`` run as a process of its own.
    """
    global _machine
    override = os.environ.get("ATTNBENCH_MACHINE")
    if override:
        return override
    if _machine is None:

        attached = detection.accelerator_present()
        if attached is None:
            _machine = f"cpu-{detection.detect_host().usable_cores}core"
        else:
            _machine = _machine_name_in_subprocess(attached)
    return _machine


def _machine_name_in_subprocess(attached) -> str:

    try:
        out = subprocess.run([sys.executable, "-m", "attnbench", "machine-name"], capture_output=True,
                             text=True, check=True, timeout=NAME_TIMEOUT_S,
                             env={k: v for k, v in os.environ.items() if k != "ATTNBENCH_MACHINE"})
        name = out.stdout.strip().splitlines()[-1]
        if name:
            return name
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        print(f"attnbench: machine-name failed ({exc}); naming the machine from its device files",
              file=sys.stderr)
    if attached.platform == "tpu":
        return f"tpu-{attached.version or 'unknown'}-{attached.count}"
    return f"gpu-{attached.count}" if attached.count else "gpu"


def detect_machine_name() -> str:
    """The machine's name as the first framework whose default device is an accelerator sees it.
    Initialises every framework's device: run it in its own process (``machine-name``)."""

    for framework in ("jax", "torch", "torch_xla"):
        try:
            device = hardware.detect_accelerator(framework)
        except Exception:  # framework missing in this env
            continue
        if device.platform != "cpu":
            slug = "".join(c if c.isalnum() else "-" for c in device.name.lower()).strip("-")
            slug = slug.replace("nvidia-", "")
            return f"{slug}-{device.count}" if device.platform == "tpu" else slug
    return f"cpu-{hardware.detect_host().usable_cores}core"


def asv_context() -> dict | None:
    """Where this asv run files its results (results dir, machine, commit, env); ``None`` outside asv.

    asv sets ``ASV_ENV_NAME`` and ``ASV_COMMIT`` only for virtualenv runs (``attnbench/asv/plugin.py``
    sets ``ASV_ENV_NAME`` for existing ones), and runs in a scratch cwd.
    """

    env = os.environ.get("ASV_ENV_NAME")
    # forkserver children inherit asv/benchmark.py's argv; a process that merely imported asv is not a run.
    in_asv = bool(sys.argv) and os.path.abspath(sys.argv[0]).endswith(os.path.join("asv", "benchmark.py"))
    if env is None and in_asv:  # an existing environment: named as the plugin names it
        env = asv_environment_name(os.environ.get("ASV_CONF_DIR", CHECKOUT))
    # ATTNBENCH_COMMIT: the run's --set-commit-hash where the tree has no .git (tools/device-run.sh)
    commit = (os.environ.get("ASV_COMMIT") or os.environ.get("ATTNBENCH_COMMIT")
              or (git_commit() if env else None))
    if not commit or not env:
        return None
    root = (os.environ.get("ATTNBENCH_RESULTS_DIR")
            or os.path.join(os.environ.get("ASV_CONF_DIR", CHECKOUT), "results"))
    return {"results_dir": root, "machine": machine_name(), "commit": commit, "env": env}


def trace_dir() -> str | None:
    """``results/<machine>/traces/<commit8>-<env>/``: the engine's per-step regime traces."""
    ctx = asv_context()
    if ctx is None:
        return None
    return os.path.join(ctx["results_dir"], ctx["machine"], "traces", f"{ctx['commit'][:8]}-{ctx['env']}")
