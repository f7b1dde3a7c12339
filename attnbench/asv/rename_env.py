"""``attnbench rename-env OLD NEW``: file an asv environment's results under another name.

Results filed under an interpreter-path name (before ``attnbench/asv/plugin.py``) would start a
second history. This moves environment ``OLD``'s result files (``env_name``, ``python``,
requirements), sidecars and trace folders on every machine to ``NEW``; nothing measured changes, and
each file is written atomically before its old name goes.
"""

from __future__ import annotations

import glob
import json
import os
import re

from attnbench.asv import sidecar
from attnbench.core.atomic import atomic_write_text
from attnbench.run.environment import NAMED


def parse_name(name: str) -> tuple[str, dict[str, str]]:
    """``existing-py3.11-jax0.10.2-libtpu0.0.42.1`` -> ``("3.11", {"jax": "0.10.2", "libtpu":
    "0.0.42.1"})``."""
    found = re.fullmatch(r"existing-py(\d+\.\d+)((?:-[a-z][a-z-]*?\d[\w.]*)*)", name)
    if not found:
        raise ValueError(f"{name!r} is not a stable existing-environment name "
                         "(existing-py<X.Y>-<dist><version>..., e.g. existing-py3.12-jax0.11.2-torch2.11.0)")
    versions = dict(re.findall(r"-([a-z][a-z-]*?)(\d[\w.]*)", found.group(2)))
    unknown = sorted(set(versions) - set(NAMED))
    if unknown:
        raise ValueError(f"{name!r} names {', '.join(unknown)}, not among {', '.join(NAMED)}")
    return found.group(1), versions


def rename_environment(results_dir: str, old: str, new: str) -> list[str]:
    """Move environment ``old``'s files under ``results_dir`` to ``new``; returns the new paths."""
    python, requirements = parse_name(new)
    moved = []
    for path in sorted(glob.glob(os.path.join(results_dir, "*", f"*-{old}.json"))):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)  # asv's bare NaN reads as float nan and is written back as NaN
        if data.get("env_name") != old:
            continue
        params = {k: v for k, v in data.get("params", {}).items() if k not in NAMED}
        params.update(python=python, **requirements)
        data.update(env_name=new, python=python, requirements=requirements, params=params)
        target = path[: -len(f"{old}.json")] + f"{new}.json"
        atomic_write_text(target, json.dumps(data, separators=(", ", ": ")) + "\n")
        os.remove(path)
        moved.append(target)
    for path in sorted(glob.glob(os.path.join(results_dir, "*", sidecar.FOLDER, f"*-{old}{sidecar.SUFFIX}"))):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        data["env_name"] = new
        target = path[: -len(f"{old}{sidecar.SUFFIX}")] + f"{new}{sidecar.SUFFIX}"
        atomic_write_text(target, json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.remove(path)
        moved.append(target)
    for path in sorted(glob.glob(os.path.join(results_dir, "*", "traces", f"*-{old}"))):
        target = path[: -len(old)] + new
        os.rename(path, target)
        moved.append(target)
    return moved
