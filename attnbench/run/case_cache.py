"""The suite's measure-once cache, made to survive a preemption: one file per measured case.

asv keeps a class's ``setup_cache`` measurement for one ``asv run`` only, so a fleet run looping over
benchmark groups would measure each class again per group, and a preemption would lose every case.
With ``ATTNBENCH_CASE_CACHE=DIR`` each record is written atomically as its case ends and read back
instead of measured, across groups, restarts and VMs; a case killed mid-measurement has no file.

Layout: ``DIR/<machine>/<commit8>-<env>/<settings hash>/<case hash>.case``; the settings hash covers
``asv.suite.provenance_settings``, so a run with other settings never reads another's records.
Unset, a re-run measures afresh, as an edited working tree must. ``make bench`` uses a folder that
lives for one run, only to hand one sweep's records to the later classes.

A case's file is written after its first timing round and rewritten with the pooled record; a
relaunch between the two keeps the first, and its ``rounds`` column says how many were pooled.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys

from attnbench.core.atomic import atomic_write_text

CACHE_ENV = "ATTNBENCH_CASE_CACHE"
SUFFIX = ".case"


def _digest(text: str, n: int = 20) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


class CaseCache:
    """Records of one machine x commit x environment x settings, one file per case key."""

    def __init__(self, root: str, machine: str, commit: str, env: str, settings: dict):
        self.settings = settings
        fingerprint = _digest(json.dumps(settings, sort_keys=True, default=str), 12)
        self.folder = os.path.join(root, machine, f"{commit[:8]}-{env}", fingerprint)

    def path(self, key: str) -> str:
        return os.path.join(self.folder, _digest(key) + SUFFIX)

    def get(self, key: str) -> dict | None:
        path = self.path(key)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            print(f"attnbench: case cache: {path} is damaged ({exc}); measuring {key} again", file=sys.stderr)
            return None
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("record"), dict):
            print(f"attnbench: case cache: {path} does not hold {key}; measuring it again", file=sys.stderr)
            return None
        return data["record"]

    def put(self, key: str, record: dict) -> None:
        data = {"key": key, "settings": self.settings, "record": record}
        atomic_write_text(self.path(key), json.dumps(data, default=str, allow_nan=True))

    def load(self, keys) -> dict:
        out = {}
        for key in keys:
            record = self.get(key)
            if record is not None:
                out[key] = record
        return out

    def __len__(self) -> int:
        try:
            return sum(1 for n in os.listdir(self.folder) if n.endswith(SUFFIX))
        except FileNotFoundError:
            return 0


def from_env(settings: dict, context: dict) -> CaseCache | None:
    """The cache ``ATTNBENCH_CASE_CACHE`` names, or ``None`` when unset. ``context``:
    ``asv.machine.asv_context()``; ``settings``: what the records depend on."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        return None
    return CaseCache(root, context["machine"], context["commit"], context["env"], settings)


def read_folder(root: str) -> list[dict]:
    """Every record under ``root`` (any machine, commit, environment), sorted by case; damaged files
    are reported on stderr and left out. Reads only."""
    out = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*" + SUFFIX), recursive=True)):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            out.append(dict(data["record"], case_key=data["key"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"attnbench: {path} is not a case record ({exc}); left out", file=sys.stderr)
    return sorted(out, key=lambda r: (r.get("seq_q") or 0, str(r.get("mode")), str(r.get("regime")),
                                      str(r.get("impl")), str(r.get("dtype"))))
