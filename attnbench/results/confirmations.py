"""Paired re-measurements of the newest run's steps (``attnbench confirm``, ``run/confirm.py``): the
case of a step, measured again here at the commit before the step and at the newest, interleaved
round by round. Read by the step's machine, environment, case and commits. Reads, never writes.

``results/<machine>/confirmations/<newest commit8>.confirm`` (JSON; not ``.json``, which ``asv
publish`` would load as a result file): ``{"machine", "commit_after", "threshold", "cases": [{
"commit_before", "env_name", "suite", "implementation", "seq_len", "workload", "phase", "dtype",
"ratio", "ci_low", "ci_high", "rounds", "verdict", "note", "measured_at"}]}``. ``ratio`` is the newest
commit's step time over the one before (B/A).
"""

from __future__ import annotations

import glob
import json
import os
import warnings

from attnbench.core import metrics

FOLDER, SUFFIX = "confirmations", ".confirm"
SLOWER, FASTER, NO_CHANGE = "slower", "faster", "no change"  # run/compare.py's verdicts


def path(results_dir: str, machine: str, commit_after: str) -> str:
    return os.path.join(results_dir, machine, FOLDER, f"{commit_after[:8]}{SUFFIX}")


def _text(value) -> str:
    """A key part as text: a length as its integer, a missing one as ``-``."""
    if value is None or value != value or value == "":
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def case_key(machine, env_name, suite, impl, seq_len, workload, phase, dtype) -> tuple:
    return tuple(_text(v) for v in (machine, env_name, suite, impl, seq_len, workload, phase, dtype))


def settles(metric: str, regime) -> bool:
    """Whether a paired re-measurement can settle a step of this figure: ``compare`` times a case's
    static step, so only a figure that follows the steady step (``Metric.time_exponent``: seconds,
    rates, costs) of a static case; not a compile time, a stall or a stream's figure."""
    return (metric in metrics.names() and bool(metrics.get(metric).time_exponent)
            and (not isinstance(regime, str) or regime == "static"))


def suite_of(benchmark) -> str:
    """``Forward`` of ``attention.Forward.track_seconds_per_step``."""
    parts = str(benchmark).split(".")
    return parts[1] if len(parts) > 2 else str(benchmark)


def load(results_dir: str) -> dict[tuple, dict]:
    """``{(case key..., commit_before, commit_after): entry}`` of every confirmation under
    ``results_dir``; a file that is not one is left out with a warning naming it."""
    found = {}
    for file in sorted(glob.glob(os.path.join(results_dir, "*", FOLDER, "*" + SUFFIX))):
        try:
            with open(file, encoding="utf-8") as fh:
                data = json.load(fh)
            for entry in data["cases"]:
                key = case_key(data["machine"], entry["env_name"], entry["suite"], entry["implementation"],
                               entry.get("seq_len"), entry.get("workload"), entry.get("phase"),
                               entry.get("dtype"))
                found[(*key, entry["commit_before"], data["commit_after"])] = entry
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"{file} is not a confirmation file ({exc}); left out", stacklevel=2)
    return found


def lookup(confirmed: dict | None, keys: dict, machine: str, before: str, after: str) -> dict | None:
    """The confirmation of a series' step from ``before`` to ``after`` (full commit hashes), if any."""
    if not confirmed:
        return None
    key = case_key(machine, keys.get("env_name"), suite_of(keys.get("benchmark")), keys.get("implementation"),
                   keys.get("seq_len"), keys.get("workload"), keys.get("phase"), keys.get("dtype"))
    return confirmed.get((*key, str(before), str(after)))


def words(entry: dict) -> str:
    """``B/A 1.16 [1.12-1.19] over 12 rounds`` of a confirmation."""
    return (f"the newest commit's step over the one before, B/A {entry['ratio']:.3f} "
            f"[{entry['ci_low']:.3f}-{entry['ci_high']:.3f}] (99%) over {entry['rounds']} paired rounds")
