"""Read everything asv wrote under ``results/`` into one tidy pandas DataFrame. Never writes.

One row per machine x environment x commit x benchmark x parameter combination that holds a figure
(``status`` ok) or a failure (failed); the cells asv stored as n/a, most of every grid, are counted per
run and benchmark (``load``'s ``unmeasured``), not carried as rows. Columns: ``SCHEMA``, then
``version_<library>``, ``setting_<name>`` and ``host_<field>`` columns. What a case *was* (label,
execution, platform, device) comes from the suite's sidecar (``labels_source`` "recorded"); results
without one get today's answer for the machine's platform ("recomputed"). ``commit_order`` is the git
position when git knows every commit, else the rank of asv's commit dates (NaN with neither: such a
figure cannot be placed in a series). Result files are read by asv's own reader (``Results.load``);
files it refuses (bad JSON, another api_version, a missing key) and stale benchmarks are skipped with
a warning.
"""

from __future__ import annotations

import ast
import csv
import functools
import glob
import itertools
import json
import os
import subprocess
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import attention_impls
from attnbench.asv import sidecar
from attnbench.core import metrics

# Imported where used: pandas and asv (the torch_xla venv has no report libraries, .venv-targets no asv).

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = ["machine", "machine_platform", "platform", "env_name", "commit_hash", "commit_position",
          "commit_date", "commit_order", "commit_order_source", "started_at", "suite", "metric", "benchmark",
          "unit", "direction", "implementation", "label", "execution", "category", "device", "labels_source",
          "seq_len", "workload", "phase", "regime", "dtype", "value", "ci_low", "ci_high", "q_25", "q_75",
          "status", "contended",
          "contention_reason", "case_ci_low_s", "case_ci_high_s", "case_ci_basis", "case_ci_method", "rounds",
          "round_medians_s", "round_ids", "control_round_medians_s", "control_round_ids", "contended_rounds",
          "config", "config_source", "defaults_round_medians_s", "defaults_round_ids", "price_kind",
          "file"]
GIT, DATE, NONE = "git", "date", "none"  # commit_order_source
RECORDED, RECOMPUTED = "recorded", "recomputed"
INTERPRETED = "interpreted"


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


def _directions() -> dict[str, str | None]:
    return metrics.directions()


def _timed() -> frozenset[str]:
    return frozenset(metrics.timed())


def _labels() -> dict:
    """Today's (label, execution) of every implementation on each platform: the fallback for results
    whose sidecar recorded none. ``execution`` asks the backend, which imports no framework for it."""
    out = {}
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        for platform in ("cpu", "gpu", "tpu"):
            out[(name, platform)] = (impl.label(platform), impl.execution(platform))
    return out


def category(label, execution) -> str | None:
    """``interpreted`` for a kernel that ran in an interpreter, else its label."""
    return INTERPRETED if execution == "interpret" else label


@dataclass(frozen=True)
class _CaseCells:
    """One sidecar case as the cells its rows take: every row's, a timed metric's, the step time's.
    Made once per case: a case has a row per metric, and the JSON text of its lists is the cost."""

    every: dict
    timed: dict
    rounds: dict


def _case_cells(entry: dict) -> _CaseCells:
    every = {"label": entry.get("label"), "execution": entry.get("execution"),
             "platform": entry.get("platform"), "device": entry.get("device"), "labels_source": RECORDED,
             "config": entry.get("config") or None, "config_source": entry.get("config_source") or None,
             "price_kind": entry.get("price_kind") or None}
    # the case's stream (what a server sees of it, its trace), on each of its rows
    every.update({k: _json_list(entry.get(k)) if k in sidecar.JSON_FIELDS else entry.get(k)
                  for k in sidecar.STREAM_FIELDS})
    timed = {"contended": entry.get("contended"), "contention_reason": entry.get("contention_reason"),
             "case_ci_low_s": entry.get("ci_low_s"), "case_ci_high_s": entry.get("ci_high_s"),
             "case_ci_basis": entry.get("ci_basis"), "case_ci_method": entry.get("ci_method"),
             "rounds": entry.get("rounds")}
    rounds = {k: _json_list(entry.get(k)) for k in sidecar.ROUND_FIELDS}
    return _CaseCells(every, timed, rounds)


def _case_index(cases) -> tuple[dict, dict]:
    """Sidecar cases (``_CaseCells``) by full id, and by id without dtype (``sidecar.case_head``, for
    Training, which has no dtype parameter: only where one dtype was measured)."""
    full, partial = {}, {}
    for cid, entry in (cases or {}).items():
        if not isinstance(entry, dict):
            continue
        full[cid] = cells = _case_cells(entry)
        head, _, dtype = cid.rpartition("|")
        partial[head] = None if head in partial else (cells, dtype)
    return full, partial


def _json_list(value) -> str | None:
    """A sidecar's list as the tidy table keeps it: JSON text (one cell), None where absent."""
    return json.dumps(value) if isinstance(value, list) else None


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@functools.lru_cache(maxsize=65536)
def _literal_text(text: str):
    """``_literal`` of one repr string, memoised: every result file repeats the same parameter values."""
    return _literal(text)


def _benchmarks(path: str) -> dict:
    """``benchmarks.json`` by benchmark name, read as ``asv.benchmarks.Benchmarks.load`` reads it (asv's
    reader and api_version check). Not through ``Benchmarks`` itself: that needs asv's Config and
    expands every parameter combination for a selection the loader never makes."""
    from asv.benchmarks import Benchmarks
    from asv.util import UserError, load_json

    try:
        return load_json(path, api_version=Benchmarks.api_version)
    except UserError as exc:
        raise ResultsError(f"{path}: asv cannot read it ({exc})") from exc


def _setting(value):
    """A setting as one scalar cell (lists joined), so that the analysis can compare it."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return value


def _sidecar(results_dir, machine, commit, env) -> tuple[dict, dict]:
    """(``version_<library>``, ``setting_<name>`` and ``host_<field>`` columns, case index) from the
    suite's sidecar."""
    data = sidecar.read(results_dir, machine, commit, env)
    columns = {**{f"version_{k}": v for k, v in (data.get("versions") or {}).items()},
               **{f"setting_{k}": _setting(v) for k, v in (data.get("settings") or {}).items()},
               **{f"host_{k}": _setting(v) for k, v in (data.get("host") or {}).items()}}
    return columns, _case_index(data.get("cases"))


@dataclass(frozen=True)
class Tidy:
    """What ``load`` read: ``frame``, one row per measured cell (``status`` ok or failed), and
    ``unmeasured``, the cells of each run's parameter grid that hold nothing (n/a), counted:
    machine, env_name, commit_hash, benchmark, cells."""

    frame: pd.DataFrame
    unmeasured: pd.DataFrame


UNMEASURED_COLUMNS = ["machine", "env_name", "commit_hash", "benchmark", "cells"]


def load_results(results_dir: str = "results", repo: str = ".") -> pd.DataFrame:
    """The tidy table of ``results_dir``: ``load(...).frame``."""
    return load(results_dir, repo).frame


def load(results_dir: str = "results", repo: str = ".") -> Tidy:
    import pandas as pd
    from asv.results import Results
    from asv.util import UserError

    bench_path = os.path.join(results_dir, "benchmarks.json")
    if not os.path.exists(bench_path):
        raise ResultsError(f"no asv results under {results_dir!r} (no benchmarks.json): run `make bench` "
                           "or `asv run` first")
    benchmarks = _benchmarks(bench_path)
    positions, directions, labels, timed = history_positions(repo), _directions(), _labels(), _timed()
    parts, unmeasured = [], []  # a frame per result file: a file's row dicts live only while it is read
    files = sorted(glob.glob(os.path.join(results_dir, "*", "*.json")))
    for path in files:
        if os.path.basename(path) in ("machine.json", "benchmarks.json"):
            continue
        try:
            # No machine_name check: the machine is the file's folder, whatever its params name
            result = Results.load(path)
        except (UserError, OSError, ValueError, TypeError, AttributeError, IndexError) as exc:
            # UserError: asv refuses it (bad JSON, another api_version, a missing key); the others: bytes
            # that are not UTF-8, or JSON that is not shaped like a result file
            warnings.warn(f"{path}: unreadable asv result file ({type(exc).__name__}: {exc}); skipped",
                          stacklevel=2)
            continue
        commit, env = result.commit_hash, result.env_name
        machine = os.path.basename(os.path.dirname(path))
        # asv 0.6.6 has no public accessor for a result's requirements (params mixes in machine.json's
        # fields): the attribute Results.save writes them from
        versions = {f"version_{k.removeprefix('pip+')}": v for k, v in result._requirements.items()}
        recorded, cases = _sidecar(results_dir, machine, commit, env)
        versions.update(recorded)
        base = {"machine": machine, "machine_platform": platform_of_machine(machine), "env_name": env,
                "commit_hash": commit, "commit_position": positions.get(commit, float("nan")),
                "commit_date": pd.to_datetime(result.date, unit="ms", utc=True),
                "file": path, **versions}
        current = result.get_result_keys(benchmarks)  # asv's check: in benchmarks.json, same version
        rows = []
        for name in result.get_all_result_keys():  # the file's order
            if name not in current:
                warnings.warn(f"{path}: {name} is from another suite version; skipped", stacklevel=2)
                continue
            measured, empty = _expand(base, name, benchmarks[name], result, directions, labels, cases, timed)
            rows.extend(measured)
            if empty:
                unmeasured.append((machine, env, commit, name, empty))
        if rows:
            parts.append(pd.DataFrame(rows, dtype=object))  # typed once, whole (``_typed``)
    if not parts:
        raise ResultsError(f"no loadable benchmark results under {results_dir!r}")
    frame = _typed(pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0])
    missing = [c for c in SCHEMA if c not in frame]
    if missing:  # at once: one column at a time would cut the table into a block each
        frame = pd.concat([frame, pd.DataFrame(dict.fromkeys(missing), index=frame.index, dtype=object)],
                          axis=1)
    _order_commits(frame)
    _apply_conditions(frame, read_conditions(results_dir), timed)
    # True / False / None (unrecorded, or a metric contention cannot move): never NaN
    frame["contended"] = frame["contended"].map(lambda v: v if isinstance(v, bool) else None).astype(object)
    extra = sorted(c for c in frame.columns if c not in SCHEMA)
    return Tidy(frame[SCHEMA + extra], pd.DataFrame(unmeasured, columns=UNMEASURED_COLUMNS))


def _typed(frame):
    """``frame`` (every column objects) with numbers, flags and times typed as pandas would type them,
    and text left as Python objects, a missing one NaN. Not pyarrow strings: the analysis takes
    thousands of small selections of this wide table, and pyarrow takes each text column's part in a
    call of its own; and the rows share their text (names, versions, settings), which pyarrow would
    copy into every cell."""
    import numpy as np
    import pandas as pd

    columns = {}
    for name in frame.columns:
        column = frame[name]
        if pd.api.types.infer_dtype(column, skipna=True) == "string":
            columns[name] = column.where(column.notna(), np.nan)
        else:  # pandas' inference over the values, as a table made of the rows at once would do
            columns[name] = pd.Series(column.tolist(), index=column.index, name=name)
    return pd.DataFrame(columns)  # a block per dtype


CONDITIONS = "conditions.csv"
SHARED_LOAD = ("load", "shared")  # a run that shared the machine: its timed figures count as contended


def read_conditions(results_dir: str) -> list[dict]:
    """``results/conditions.csv``: what is known of committed runs that their sidecars did not record
    (machine, commit prefix, setting, value, source), from ``results/README.md``; [] without it."""
    path = os.path.join(results_dir, CONDITIONS)
    try:
        with open(path, encoding="utf-8") as fh:
            lines = [line for line in fh if not line.startswith("#")]
    except FileNotFoundError:
        return []
    rows = list(csv.DictReader(lines))
    for row in rows:
        if not all(row.get(k) for k in ("machine", "commit", "setting", "value")):
            raise ResultsError(f"{path}: every row needs machine, commit, setting and value: {row}")
    return rows


def _apply_conditions(frame, conditions: list[dict], timed) -> None:
    """Fill, in place, the ``setting_<name>`` cells a run's sidecar left empty, and mark the timed
    figures of a run that shared the machine contended; ``conditions`` names what was filled."""
    for name in ("conditions", "contended", "contention_reason"):  # text cells, whatever pandas inferred
        frame[name] = frame[name].astype(object) if name in frame else None
    for row in conditions:
        where = ((frame["machine"] == row["machine"])
                 & frame["commit_hash"].astype(str).str.startswith(row["commit"]))
        if not where.any():
            continue
        if (row["setting"], row["value"]) == SHARED_LOAD:
            hit = where & frame["metric"].isin(timed) & (frame["contended"] != True)  # noqa: E712
            frame.loc[hit, "contended"] = True
            frame.loc[hit, "contention_reason"] = row.get("source") or "the run shared the machine"
        else:
            column = f"setting_{row['setting']}"
            frame[column] = frame[column].astype(object) if column in frame else None
            hit = where & frame[column].isna()
            frame.loc[hit, column] = _setting_value(row["value"])
        noted = frame.loc[where, "conditions"].fillna("")
        frame.loc[where, "conditions"] = noted + (noted.ne("").map({True: "; ", False: ""})) + \
            f"{row['setting']}={row['value']} ({CONDITIONS})"


def _setting_value(text: str):
    """A condition's value as a sidecar would have recorded it: a number where it reads as one."""
    try:
        return float(text)
    except ValueError:
        return text


def _order_commits(frame) -> None:
    """Fill ``commit_order`` and ``commit_order_source`` (in place): git order when git knows every
    commit, else the commit dates asv recorded, ties broken by git position and hash."""
    import pandas as pd

    commits = (frame.groupby("commit_hash", sort=False)
               .agg(position=("commit_position", "first"), date=("commit_date", "first")))
    if len(commits) and commits["position"].notna().all():
        order, source = commits["position"].astype(float), GIT
    else:
        dated = commits[commits["date"].notna()].reset_index()
        dated = dated.sort_values(["date", "position", "commit_hash"], na_position="last")
        order = pd.Series(range(len(dated)), index=dated["commit_hash"], dtype=float)
        order = order.reindex(commits.index)
        source = DATE
    frame["commit_order"] = frame["commit_hash"].map(order)
    frame["commit_order_source"] = frame["commit_order"].notna().map({True: source, False: NONE})


def ordering_note(frame) -> tuple[str, str | None]:
    """(``git``/``date``/``none``, a sentence or None): how the commits of ``frame`` are ordered; the
    sentence is None when git ordered them all, and a warning with ``none``."""
    if "commit_order_source" not in frame or frame.empty:
        return GIT, None
    commits = frame.drop_duplicates("commit_hash")
    total = len(commits)
    unknown_git = int(commits["commit_position"].isna().sum())
    unordered = commits[commits["commit_order"].isna()]
    if len(unordered):
        names = ", ".join(sorted(str(c)[:8] for c in unordered["commit_hash"])[:10])
        return NONE, (f"WARNING: {len(unordered)} of {total} commit(s) cannot be ordered: git does not know "
                      f"them (results outside a git checkout, or --repo not the repository that made them) "
                      f"and their result files record no commit date ({names}). Their figures are left "
                      "out of regression and cost-spike detection.")
    if unknown_git:
        return DATE, (f"{unknown_git} of {total} commit(s) are unknown to git here (results outside the "
                      "git checkout that made them, or --repo not set to it): commits are ordered by the "
                      "commit dates asv recorded in each result file, and which code changed between "
                      "two commits cannot be checked.")
    return GIT, None


def _expand(base, name, spec, result, directions, labels, cases=({}, {}),
            timed=frozenset()) -> tuple[list, int]:
    """(the rows of benchmark ``name`` in ``result``, an ``asv.results.Results``; how many cells of its
    parameter grid hold nothing). A cell asv stored as NaN (n/a: the case was not run there, or the
    kernel refused it) is counted, not made a row: most of a grid is such cells."""
    suite, _, bench = name.rpartition(".")
    suite = suite.rpartition(".")[2]
    metric = bench.removeprefix("track_")
    # The run's own parameters, not benchmarks.json's: the suite's size sets them, under one version.
    params = result.get_result_params(name)
    # Parameter values are parsed once per benchmark, not once per row (literal_eval is the cost).
    literal_params = [[_literal_text(p) if isinstance(p, str) else _literal(p) for p in values]
                      for values in params]
    combos = list(itertools.product(*literal_params))
    # One entry per combination, None where the run has none (both lists are as long as combos)
    values = result.get_result_value(name, params)
    stats = [s or {} for s in result.get_result_stats(name, params)]  # asv's 99% interval, quartiles
    is_timed = metric in timed
    started = result.started_at[name]
    param_names = spec.get("param_names", [])
    common = {**base, "suite": suite, "metric": metric, "benchmark": name,
              "unit": spec.get("unit"), "direction": directions.get(metric, "lower")}
    machine_platform = base["machine_platform"]
    full, partial = cases
    rows, unmeasured = [], 0
    for combo, value, stat in zip(combos, values, stats, strict=True):
        if value is not None and value != value:
            unmeasured += 1
            continue
        status = "failed" if value is None else "ok"
        row = {**common, "value": value, "ci_low": stat.get("ci_99_a"), "ci_high": stat.get("ci_99_b"),
               "q_25": stat.get("q_25"), "q_75": stat.get("q_75"), "status": status, "started_at": started}
        for pname, pvalue in zip(param_names, combo, strict=False):
            row[pname] = pvalue
        impl = row.get("implementation")
        if not impl:
            row["label"] = None
            rows.append(row)
            continue
        entry = None
        seq_len = row.get("seq_len")
        if row.get("workload") and row.get("phase"):  # Models: a preset and phase fix the length
            seq_len = f"{row['workload']}:{row['phase']}"
        if full and isinstance(seq_len, (int, str)):
            head = sidecar.case_head(suite, impl, seq_len, row.get("regime"))
            if row.get("dtype") is not None:
                entry = full.get(f"{head}|{row['dtype']}")
            else:
                found = partial.get(head)
                entry = found[0] if found is not None else None
        if entry is not None:
            row.update(entry.every)
            if is_timed:  # how far the case's timing can be trusted
                row.update(entry.timed)
            if metric == "seconds_per_step":  # the rounds, by id: the verdict pairs kernels with them
                row.update(entry.rounds)
        else:
            label, execution = labels.get((impl, machine_platform), (None, None))
            row.update(label=label, execution=execution, platform=machine_platform, labels_source=RECOMPUTED)
        row["category"] = category(row["label"], row["execution"])
        rows.append(row)
    return rows, unmeasured
