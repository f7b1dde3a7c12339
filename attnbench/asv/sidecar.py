"""The suite's sidecar: what an asv result file cannot hold, written beside it at measurement time.

One JSON sidecar per machine x commit x environment,
``results/<machine>/sidecars/<commit8>-<env>.sidecar``: ``versions`` imported, ``host``
(``hardware/fingerprint.py``), ``settings`` (everything that changes what a number means) and, per
``case_id``, what the engine recorded when it measured it (fields: docs/suite.md). The loader
(``asv_results.load_results``) joins these to the rows, so reports show what was measured, never
what today's code would say. Fields a sidecar lacks read as unknown.

Not ``.json``: ``asv publish`` loads every ``*.json`` under ``results/`` as a result file. Legacy
``versions/<commit8>-<env>.json`` sidecars are still read, never written.
"""

from __future__ import annotations

import json
import os

from attnbench.core.atomic import atomic_write_text

FOLDER = "sidecars"
SUFFIX = ".sidecar"
LEGACY_FOLDER = "versions"
# The stream: its trace and how well its lengths follow it, what a server sees of it, each window's
# seconds and useful tokens (core/traffic.py, docs/metrics.md); the loader puts them on every row.
STREAM_FIELDS = ("traffic", "traffic_label", "traffic_ks", "traffic_scale", "traffic_clipped",
                 "traffic_requests", "regime_steps", "stream_steps_planned", "stream_steps_timed",
                 "distinct_shapes", "latency_p50_s", "latency_p95_s", "latency_p99_s", "longest_stall_s",
                 "padding_waste", "compiles", "window_seconds", "window_useful_tokens",
                 # each window warm (its stalls at the steady step), the stream's steady step, and a
                 # priced way's later rounds of its stream sample (run/adaptive.py)
                 "window_steady_seconds", "stream_steady_s", "stream_round_s", "stream_round_ids",
                 "stream_rounds", "stream_cut",
                 # a probed static way's first call, again in a fresh process every round
                 "first_call_round_s", "first_call_round_ids")
CASE_FIELDS = ("label", "execution", "platform", "device", "status", "reason", "contended",
               "contention_reason", "ci_low_s", "ci_high_s", "ci_basis", "ci_coverage", "rounds",
               "mask", "gqa", "flops",  # what a preset's case computed (Models)
               # the interval's confidence and making; each kept round's median and id, by which the
               # verdict pairs two kernels of one round; an A/A control's own windows
               "ci_confidence", "ci_method", "round_medians_s", "round_ids", "control_round_medians_s",
               "control_round_ids", "rounds_stopped", "contended_rounds",
               # the tile config each figure ran at; a tuned kernel's rounds at its defaults
               "config", "config_source", "defaults_round_medians_s", "defaults_round_ids",
               "phase_seconds",  # where the case's seconds went (results/LOG.md)
               "price_kind",  # what its price buys: a whole instance or the accelerator alone
               *STREAM_FIELDS)
ROUND_FIELDS = ("round_medians_s", "round_ids", "control_round_medians_s", "control_round_ids",
                "defaults_round_medians_s", "defaults_round_ids", "contended_rounds")
JSON_FIELDS = (*ROUND_FIELDS, "phase_seconds", "window_seconds", "window_useful_tokens",
               "window_steady_seconds", "stream_round_s", "stream_round_ids", "first_call_round_s",
               "first_call_round_ids")
TEXT_FIELDS = ("reason", "contention_reason")  # cut to MAX_REASON characters
MAX_REASON = 500


def name(commit: str, env: str) -> str:
    return f"{commit[:8]}-{env}"


def path(results_dir: str, machine: str, commit: str, env: str) -> str:
    """Where the sidecar of ``machine`` x ``commit`` x ``env`` is written."""
    return os.path.join(results_dir, machine, FOLDER, name(commit, env) + SUFFIX)


def legacy_path(results_dir: str, machine: str, commit: str, env: str) -> str:
    return os.path.join(results_dir, machine, LEGACY_FOLDER, name(commit, env) + ".json")


def case_head(suite: str | None, implementation: str, seq_len, regime: str | None) -> str:
    """``case_id`` without its dtype: ``Training|jax-xla|512|static``; a preset's case has
    ``<preset>:<phase>`` for its length (``Models|jax-xla|mistral-7b:decode|static``)."""
    length = seq_len if isinstance(seq_len, str) else int(seq_len)
    return f"{suite}|{implementation}|{length}|{regime or 'static'}"


def case_id(suite: str | None, implementation: str, seq_len, regime: str | None, dtype: str | None) -> str:
    """One case of one benchmark class: ``Forward|jax-xla|1024|static|float32``."""
    return f"{case_head(suite, implementation, seq_len, regime)}|{dtype}"


def _load(file: str) -> dict | None:
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read(results_dir: str, machine: str, commit: str, env: str) -> dict:
    """The sidecar (new location, else the legacy ``versions/`` one, which holds no cases), ``{}``
    when there is none."""
    for file in (path(results_dir, machine, commit, env), legacy_path(results_dir, machine, commit, env)):
        data = _load(file)
        if data is not None:
            return data
    return {}


def case_entry(record: dict) -> dict:
    """What a sidecar keeps of one engine record."""
    entry = {k: record.get(k) for k in CASE_FIELDS}
    for key in TEXT_FIELDS:
        if isinstance(entry[key], str) and len(entry[key]) > MAX_REASON:
            entry[key] = entry[key][:MAX_REASON] + "..."
    for key in JSON_FIELDS:  # lists and dicts, not the record's JSON text
        value = entry[key]
        entry[key] = json.loads(value) if isinstance(value, str) else value
    for key in ("ci_low_s", "ci_high_s", "ci_coverage", "ci_confidence"):  # JSON has no NaN: null
        value = entry[key]
        entry[key] = float(value) if isinstance(value, (int, float)) and value == value else None
    contended = entry["contended"]
    if isinstance(contended, str):
        contended = {"true": True, "false": False}.get(contended.strip().lower())
    entry["contended"] = None if contended is None or contended != contended else bool(contended)
    rounds = entry["rounds"]
    entry["rounds"] = int(rounds) if isinstance(rounds, (int, float)) and rounds == rounds else None
    return entry


def write(results_dir: str, machine: str, commit: str, env: str, *, versions: dict, settings: dict,
          cases: dict[str, dict], host: dict | None = None, left_out: dict[str, str] | None = None,
          time_spent: dict | None = None) -> str:
    """Write the sidecar atomically, merging ``cases`` into those recorded (asv runs each class in its
    own process and keeps skipped benchmarks' results); ``host`` fields this process could not read
    keep what was recorded. ``left_out``: ``{kernel: reason}`` the suite size kept out of its grid.
    ``time_spent``: ``{class: {phase: seconds}}`` of the sweeps that measured them (merged)."""
    file = path(results_dir, machine, commit, env)
    old = _load(file) or {}
    merged = dict(old.get("cases") or {})
    merged.update(cases)
    fingerprint = dict(old.get("host") or {})
    fingerprint.update({k: v for k, v in (host or {}).items() if v is not None or k not in fingerprint})
    spent = {**(old.get("time_spent") or {}), **(time_spent or {})}
    payload = {"commit_hash": commit, "env_name": env, "machine": machine, "versions": versions,
               "settings": settings, "host": fingerprint, "cases": merged, "left_out": left_out or {},
               "time_spent": {k: {p: round(v, 1) for p, v in d.items()} for k, d in spent.items()}}
    atomic_write_text(file, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return file
