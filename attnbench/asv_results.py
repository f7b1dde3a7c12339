"""Read everything asv wrote under ``results/`` into one tidy pandas DataFrame. Never writes.

One row per machine x environment x commit x benchmark x parameter combination. Columns:

    machine, platform, env_name, commit_hash, commit_position, commit_date, started_at,
    suite (benchmark class), metric, benchmark, unit, direction, <one column per parameter>,
    label (forced-flash / native), value, ci_low, ci_high, status (ok / skipped / failed),
    version_<library> (from asv's requirements and the suite's versions sidecar),
    setting_<name> (measurement settings from the sidecar, e.g. setting_compile_cache), file

``commit_position`` orders commits by git history (``git rev-list --topo-order``), not by date;
commits git does not know get NaN. A damaged file, one from an older suite version, or one whose
JSON holds bare ``NaN`` (asv writes those; Python reads them) is handled: damaged files and
stale benchmarks are skipped with a warning naming the file, the rest loads.
"""

from __future__ import annotations

import ast
import functools
import glob
import itertools
import json
import os
import subprocess
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = ["machine", "platform", "env_name", "commit_hash", "commit_position", "commit_date",
          "started_at", "suite", "metric", "benchmark", "unit", "direction", "implementation", "label",
          "seq_len", "regime", "dtype", "value", "ci_low", "ci_high", "status", "file"]
COLUMNS = ("result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile")


class ResultsError(ValueError):
    """``results/`` holds nothing loadable; the message says what was looked for."""


def platform_of_machine(machine: str) -> str:
    name = machine.lower()
    if name.startswith("cpu"):
        return "cpu"
    if name.startswith("tpu"):
        return "tpu"
    return "gpu"


def history_positions(repo: str = ".") -> dict[str, int]:
    try:
        out = subprocess.run(["git", "rev-list", "--topo-order", "--reverse", "--all"], cwd=repo,
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {sha: i for i, sha in enumerate(out)}


def _directions() -> dict[str, str]:
    from attnbench.asv_suite import METRICS

    return {m.name: m.direction for m in METRICS}


def _labels() -> dict:
    import attention_impls

    return {(n, p): attention_impls.get(n).label(p) for n in attention_impls.names()
            for p in ("cpu", "gpu", "tpu")}


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@functools.lru_cache(maxsize=65536)
def _literal_text(text: str):
    """``_literal`` of one repr string, memoised: every result file repeats the same parameter values."""
    return _literal(text)


def _read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)  # accepts bare NaN, as asv writes it


def _versions_sidecar(results_dir, machine, commit, env) -> dict:
    """``version_<library>`` and ``setting_<name>`` columns from the suite's sidecar, if any."""
    path = os.path.join(results_dir, machine, "versions", f"{commit[:8]}-{env}.json")
    try:
        data = _read_json(path)
    except (OSError, ValueError):
        return {}
    return {**{f"version_{k}": v for k, v in data.get("versions", {}).items()},
            **{f"setting_{k}": v for k, v in data.get("settings", {}).items()}}


def load_results(results_dir: str = "results", repo: str = ".") -> pd.DataFrame:
    import pandas as pd

    bench_path = os.path.join(results_dir, "benchmarks.json")
    if not os.path.exists(bench_path):
        raise ResultsError(f"no asv results under {results_dir!r} (no benchmarks.json): run `make bench` "
                           "or `asv run` first")
    benchmarks = _read_json(bench_path)
    positions, directions, labels = history_positions(repo), _directions(), _labels()
    rows = []
    files = sorted(glob.glob(os.path.join(results_dir, "*", "*.json")))
    for path in files:
        if os.path.basename(path) in ("machine.json", "benchmarks.json"):
            continue
        try:
            data = _read_json(path)
            columns = data.get("result_columns", list(COLUMNS))
            results = data["results"]
            commit, env = data["commit_hash"], data["env_name"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"{path}: unreadable asv result file ({type(exc).__name__}: {exc}); skipped",
                          stacklevel=2)
            continue
        machine = os.path.basename(os.path.dirname(path))
        versions = {f"version_{k.removeprefix('pip+')}": v for k, v in data.get("requirements", {}).items()}
        versions.update(_versions_sidecar(results_dir, machine, commit, env))
        base = {"machine": machine, "platform": platform_of_machine(machine), "env_name": env,
                "commit_hash": commit, "commit_position": positions.get(commit, float("nan")),
                "commit_date": pd.to_datetime(data.get("date"), unit="ms", utc=True),
                "file": path, **versions}
        for name, entry in results.items():
            spec = benchmarks.get(name)
            fields = dict(zip(columns, entry, strict=False))
            if spec is None or str(fields.get("version")) != str(spec.get("version")):
                warnings.warn(f"{path}: {name} is from another suite version; skipped", stacklevel=2)
                continue
            rows.extend(_expand(base, name, spec, fields, directions, labels))
    if not rows:
        raise ResultsError(f"no loadable benchmark results under {results_dir!r}")
    frame = pd.DataFrame(rows)
    for column in SCHEMA:
        if column not in frame:
            frame[column] = None
    extra = sorted(c for c in frame.columns if c not in SCHEMA)
    return frame[SCHEMA + extra]


def _expand(base, name, spec, fields, directions, labels):
    suite, _, bench = name.rpartition(".")
    metric = bench.removeprefix("track_")
    params = fields.get("params") or []
    # Parameter values are parsed once per benchmark, not once per row (literal_eval is the cost).
    literal_params = [[_literal_text(p) if isinstance(p, str) else _literal(p) for p in values]
                      for values in params]
    combos = list(itertools.product(*literal_params)) if params else [()]
    values = fields.get("result")
    values = values if params else [values]
    ci_a = fields.get("stats_ci_99_a") or [None] * len(combos)
    ci_b = fields.get("stats_ci_99_b") or [None] * len(combos)
    started = fields.get("started_at")
    param_names = spec.get("param_names", [])
    common = {**base, "suite": suite.rpartition(".")[2], "metric": metric, "benchmark": name,
              "unit": spec.get("unit"), "direction": directions.get(metric, "lower")}
    platform = base["platform"]
    n_values = len(values) if values is not None else 0
    for i, combo in enumerate(combos):
        value = values[i] if i < n_values else None
        status = "failed" if value is None else "skipped" if value != value else "ok"
        row = {**common, "value": value,
               "ci_low": ci_a[i] if i < len(ci_a) else None, "ci_high": ci_b[i] if i < len(ci_b) else None,
               "status": status, "started_at": started}
        for pname, pvalue in zip(param_names, combo, strict=False):
            row[pname] = pvalue
        impl = row.get("implementation")
        row["label"] = labels.get((impl, platform)) if impl else None
        yield row


def summary_native_vs_forced(frame) -> pd.DataFrame:
    """Best native vs best forced-flash implementation per machine and sequence length (Forward,
    static shapes), by seconds per step, with their cost per step, at the newest commit."""
    import pandas as pd

    ok = frame[(frame["status"] == "ok") & (frame["suite"] == "Forward") & (frame["regime"] == "static")]
    if ok.empty:
        return pd.DataFrame()
    newest = ok[ok["commit_position"] == ok["commit_position"].max()]
    wide = newest.pivot_table(index=["machine", "seq_len", "dtype", "implementation", "label"],
                              columns="metric", values="value", aggfunc="first").reset_index()
    out = []
    for (machine, seq, dtype), group in wide.groupby(["machine", "seq_len", "dtype"]):
        row = {"machine": machine, "seq_len": seq, "dtype": dtype}
        for label in ("native", "forced-flash"):
            part = group[group["label"] == label].dropna(subset=["seconds_per_step"])
            if part.empty:
                continue
            best = part.loc[part["seconds_per_step"].idxmin()]
            prefix = "native" if label == "native" else "forced"
            row.update({f"best_{prefix}": best["implementation"],
                        f"{prefix}_ms_per_step": best["seconds_per_step"] * 1e3,
                        f"{prefix}_usd_per_step": best.get("usd_per_step")})
        out.append(row)
    return pd.DataFrame(out)
