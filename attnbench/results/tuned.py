"""The tuned configs: one JSON file per machine, ``results/tuning/<machine>.tuning`` (not ``.json``, as
the sidecars are not: asv reads every ``*.json`` under ``results/`` as a result file), filed by
``attnbench tune``
(``run/tune.py``) and read by the sweep, which runs each tiled kernel at its kept config, and by the
report (a reader: this module imports nothing that measures).

An entry is one kernel x workload x release on one machine: the kept config, the defaults, every
candidate with its paired ratio to the defaults (or why it was refused or failed), how many rounds,
and when and where it was measured (docs/tuning.md). Writes are atomic and merge into the newest
file, so that a search cut short keeps every entry it finished; reading never writes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from importlib import metadata

import attention_impls
from attention_impls.base import Config, parse_config
from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import Workload

FOLDER = "tuning"
FORMAT = 1


SUFFIX = ".tuning"


def path(results_dir: str, machine: str) -> str:
    return os.path.join(results_dir, FOLDER, machine + SUFFIX)


def machines(results_dir: str) -> list[str]:
    """The machines with a tuning file under ``results_dir``."""
    folder = os.path.join(results_dir, FOLDER)
    if not os.path.isdir(folder):
        return []
    return sorted(f.removesuffix(SUFFIX) for f in os.listdir(folder) if f.endswith(SUFFIX))


@functools.cache  # a process sees one release: the sweep asks once per case
def release(framework: str) -> str:
    """``jax 0.10.2``: the framework release a config was tuned on (``?`` where not installed)."""
    try:
        version = metadata.version(framework.replace("_", "-"))
    except metadata.PackageNotFoundError:
        version = "?"
    return f"{framework} {version}"


def key(kernel: str, workload: Workload, framework_release: str) -> str:
    return f"{kernel}|{workload.describe()}|{framework_release}"


def read(results_dir: str, machine: str) -> dict:
    """``{key: entry}`` of the machine's file (``{}`` where there is none); a file that is not this
    format raises ``ValueError`` naming it."""
    file = path(results_dir, machine)
    if not os.path.exists(file):
        return {}
    with open(file, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file} is not a tuning file: {exc}") from None
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{file} is not a tuning file of format {FORMAT}")
    return entries


def write(results_dir: str, machine: str, entries: dict) -> str:
    """Merge ``entries`` into the machine's file (re-read first: another process may have added its
    own), atomically; returns its path."""
    merged = {**read(results_dir, machine), **entries}
    file = path(results_dir, machine)
    text = json.dumps({"format": FORMAT, "machine": machine, "entries": dict(sorted(merged.items()))},
                      indent=1, sort_keys=False)
    atomic_write_text(file, text + "\n")
    return file


def kept(entries: dict, kernel: str, workload: Workload, framework_release: str) -> Config | None:
    """The kept config of a kernel at a workload on a release; ``None`` where it was never tuned."""
    entry = entries.get(key(kernel, workload, framework_release))
    if entry is None or not entry.get("kept"):
        return None
    return parse_config(entry["kept"])


def tuned_case(case, entries: dict):
    """``case`` (a ``measure.engine.Case``) at its kernel's kept config where one was tuned for its
    workload on this release (``config_source`` "tuned", the defaults included when they were kept);
    a static case whose kept config is not the defaults also times the defaults in its later rounds
    (``with_defaults``). A case given a config, or of a kernel without knobs, is left as it is."""
    if case.config or not isinstance(case.impl, str) or ":" in case.impl:
        return case
    impl = attention_impls.get(case.impl)
    if impl.search_space is None:
        return case
    config = kept(entries, impl.name, case.workload, release(impl.framework))
    if config is None:
        return case
    differs = impl.search_space.check(config, impl.name) != impl.search_space.defaults
    return dataclasses.replace(case, config=config if differs else (), config_source="tuned",
                               with_defaults=differs and case.regime == "static")
