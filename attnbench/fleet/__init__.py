"""Run the asv suite on a fleet of cloud machines with SkyPilot, resumably, into one asv history.

One SkyPilot task file per hardware kind (``tasks/``); see docs/fleet.md. SkyPilot is an optional
extra (``pip install -e '.[fleet]'``), never imported at module level; ``runner.py`` and
``collect.py`` never need it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

TASK_DIR = Path(__file__).resolve().parent / "tasks"
# Where a task mounts the results bucket, and the layout inside it (one folder per asv machine):
#   <bucket>/attnbench/<machine>/results/...   mirrors results/<machine>/ (asv files, sidecars, ...)
#   <bucket>/attnbench/<machine>/state/...     the case cache and the run's progress
BUCKET_MOUNT = "/attnbench-bucket"
BUCKET_PREFIX = "attnbench"


@dataclass(frozen=True)
class Kind:
    """One hardware kind of the fleet: its task file and what the run there is named and priced as."""

    name: str  # make fleet-launch KIND=<name>; the task file is tasks/<name>.yaml
    machine: str  # the asv machine name results are filed under (what `attnbench machine-name` says there)
    accel: str  # the Makefile's ACCEL build: tpu | cuda
    summary: str
    offline_priced: bool = True  # the pinned test catalog has rows for its clouds

    @property
    def task_file(self) -> Path:
        return TASK_DIR / f"{self.name}.yaml"


KINDS = {k.name: k for k in (
    Kind("tpu-v5e", "tpu-v5-lite-8", "tpu", "GCP TPU v5e, 8 chips (tpu-v5litepod-8), spot"),
    Kind("tpu-v6e", "tpu-v6-lite-8", "tpu", "GCP TPU v6e (Trillium), 8 chips (tpu-v6e-8), spot"),
    Kind("h100", "h100-80gb-hbm3", "cuda", "1x H100 80GB on AWS (p5.4xlarge) or GCP (a3-highgpu-1g), spot"),
    Kind("h200", "h200", "cuda", "H200 as the big clouds sell it: an 8-GPU machine (AWS p5en.48xlarge, "
         "GCP a3-ultragpu-8g), spot; the suite uses one of the 8 GPUs"),
    Kind("h200-neocloud", "h200", "cuda", "1x H200 from a neocloud (Nebius, RunPod), on demand",
         offline_priced=False),
    Kind("h200-ssh", "h200", "cuda", "1x H200 from your own SSH node pool (sky ssh up), no spot",
         offline_priced=False),
)}


def kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown fleet kind {name!r}; one of: {', '.join(KINDS)}") from None


def task_files() -> list[Path]:
    return sorted(TASK_DIR.glob("*.yaml"))


def sky_runtime_dir_for(catalog_dir: str | os.PathLike) -> Path:
    """A ``SKY_RUNTIME_DIR`` whose catalog is ``catalog_dir`` (``v8/<cloud>/vms.csv``), removed at exit.

    With no ``.meta/*.md5`` beside a CSV, SkyPilot treats it as user-edited and never downloads over it."""
    root = Path(tempfile.mkdtemp(prefix="attnbench-sky-"))
    atexit.register(shutil.rmtree, root, True)
    catalogs = root / ".sky" / "catalogs"
    catalogs.mkdir(parents=True)

    for version in Path(catalog_dir).iterdir():
        if version.is_dir():
            shutil.copytree(version, catalogs / version.name)
    return root
