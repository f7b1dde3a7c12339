"""The suite's measure-once cache, made to survive a preemption: one file per measured case.

``benchmarks/attention.py`` measures every case of a class once, in ``setup_cache``, and asv hands
that one measurement to all of the class's ``track_*`` benchmarks. asv keeps it for one ``asv run``
only: a fleet run that loops over benchmark groups (``asv run --bench GROUP``, one run each) would
measure the whole class again for every group, and a preemption in the middle of ``setup_cache``
would lose every case it had measured.

With ``ATTNBENCH_CASE_CACHE=DIR`` set (the fleet run points it at the results bucket), each case's
record is written, atomically, to its own file as soon as the case ends, and ``setup_cache`` reads
the cases already there instead of measuring them again: every ``asv run`` of the same machine,
commit, environment and suite settings shares one measurement per case, across groups, job
restarts and new VMs. A case killed mid-measurement has no file and is measured on the next run.

Layout: ``DIR/<machine>/<commit8>-<env>/<settings hash>/<case hash>.case`` (JSON: the case key, the
settings, the record). The settings hash covers everything ``asv_suite.provenance_settings`` records
(suite size, lengths, dtypes, timing budget, compile-cache policy, implementation subset, threads):
a run with other settings never reads another's records. A damaged file is reported and measured
again. Unset (a plain ``asv run``), nothing changes: a local re-run of a commit measures afresh, as
an edited working tree must be.

``make bench`` points it at a folder of its own that lives for one run, for the hand-over alone:
the first class's ``setup_cache`` measures the other classes' cases in the same sweep (``also``), so
one set of timing-round workers serves the whole suite in each environment, and the later classes
read their records instead of measuring. Nothing outlives the run, so a re-run still measures afresh.

Timing rounds (``SUITES[...]["rounds"]``): a case's file is written when its first round ends and
rewritten with the pooled record when the later rounds end. A run stopped between the two keeps the
first round's record, and a relaunch does not time that case again: its ``rounds`` column says how
many rounds the figure pooled.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from attnbench.results.atomic import atomic_write_text

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


def from_env(settings: dict | None = None, context: dict | None = None) -> CaseCache | None:
    """The cache ``ATTNBENCH_CASE_CACHE`` names for this asv run, or ``None`` (unset, or not in asv).

    ``context``: machine, commit and env (default ``asv_suite.asv_context()``); ``settings``: default
    ``asv_suite.provenance_settings()``.
    """
    root = os.environ.get(CACHE_ENV)
    if not root:
        return None
    from attnbench.asv import suite as asv_suite

    context = asv_suite.asv_context() if context is None else context
    if context is None:
        return None
    settings = asv_suite.provenance_settings() if settings is None else settings
    return CaseCache(root, context["machine"], context["commit"], context["env"], settings)


def measure_cases(cases, suite: str | None = None, *, cache: CaseCache | None = None, measure=None,
                  also: dict | None = None) -> dict:
    """``asv_suite.measure_cases`` that measures only the cases the cache lacks, writing each one to
    the cache as it ends; ``{case key: record}`` for every case, as ``asv_suite.measure_cases``.

    ``also``: ``{class: cases}`` of the suite's other classes. With a cache, the ones it lacks are
    measured in the same sweep (one set of timing-round workers for all, ``asv_suite.measure_cases``)
    and the cache hands them to their own class's ``setup_cache``, which then measures nothing.
    Without a cache nothing could hand them on, so they are left to their class.

    ``cache``: default ``from_env()`` (no cache: plain ``asv_suite.measure_cases``). ``measure``:
    ``(cases, suite=..., on_record=..., also=...)``, default ``asv_suite.measure_cases`` (tests pass
    a fake).
    """
    from attnbench.asv import suite as asv_suite

    cache = from_env() if cache is None else cache
    measure = asv_suite.measure_cases if measure is None else measure
    if cache is None:
        return measure(cases, suite=suite)
    keys = [asv_suite.case_key(name, workload, regime) for name, workload, regime in cases]
    done = cache.load(keys)
    missing = [case for case, key in zip(cases, keys, strict=True) if key not in done]
    others = {}
    for other_suite, other_cases in (also or {}).items():
        other_keys = [asv_suite.case_key(*case) for case in other_cases]
        have = cache.load(other_keys)
        lacking = [case for case, key in zip(other_cases, other_keys, strict=True) if key not in have]
        if lacking:
            others[other_suite] = lacking
    if missing or others:
        together = "".join(f", with {len(c)} {s} cases" for s, c in others.items())
        print(f"attnbench: case cache {cache.folder}: {len(done)} of {len(cases)} {suite or ''} cases "
              f"already measured, measuring {len(missing)}{together}", file=sys.stderr)
        written = set()

        def persist(key, record):  # as each case ends, before the next one starts
            cache.put(key, record)
            written.add(key)

        measured = measure(missing, suite=suite, on_record=persist, also=others)
        for key, record in measured.items():  # the cases decided without a worker too
            if key not in written:
                cache.put(key, record)
        done.update((key, measured[key]) for key in keys if key in measured)
    if done and len(missing) < len(cases):  # the sidecar names every case, also those measured earlier
        asv_suite.write_sidecar({suite: cases}, done)
    return {key: done[key] for key in keys if key in done}


def read_folder(root: str) -> list[dict]:
    """Every record under ``root`` (any machine, commit, environment), sorted by case; damaged files
    are reported on stderr and left out. Reads only."""
    import glob

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
