"""Cost spikes over commits, and per-step spikes within a run. Reads, never writes.

A cost spike is a regression (``steps.find_regressions``) of a cost metric, judged by the same rules,
of a kernel some verdict can rank: interpreted kernels and the float64 reference are left out (their
cost says nothing about any hardware's choice). Each is attributed to the companion metrics that
moved across the same commits. Per-step spikes come from the engine's traces of the shape regimes:
steps at least ``factor`` times their run's median, compile stalls mostly.
"""

from __future__ import annotations

import glob
import os
import warnings

from attnbench.asv import sidecar
from attnbench.core import metrics
from attnbench.results import hosts, noise
from attnbench.results.noise import PARAMS, is_contended
from attnbench.results.steps import find_regressions, noise_floors

# Imported where used: pandas (the torch_xla venv has no report libraries).

REFERENCE = "reference-float64"  # the yardstick for correctness, not a contender


def rankable(frame):
    """Rows of kernels a verdict can rank: not interpreted, not the float64 reference."""
    interpreted = frame["category"].eq("interpreted") if "category" in frame else False
    reference = frame["implementation"].eq(REFERENCE) if "implementation" in frame else False
    return frame[~(interpreted | reference)]


def find_cost_spikes(frame, thresholds: dict | None = None, *, repo: str | None = None,
                     factors: dict | None = None, changes=None, floors: dict | None = None,
                     confirmed: dict | None = None):
    """Cost regressions (``find_regressions``) of the kernels a verdict can rank (``rankable``), each
    with the companion metrics' change across the same two commits. Run factors, host changes and
    noise floors come from the whole ``frame``: cost rows hold no step times and no probe."""
    import pandas as pd

    factors = noise.run_factors(noise.correction_shifts(frame)) if factors is None else factors
    changes = hosts.host_changes(frame) if changes is None else changes
    costs = rankable(frame[frame["metric"].isin(metrics.names("cost"))])
    floors = noise_floors(costs, factors) if floors is None else floors  # a cost's floor is of costs
    regressions = find_regressions(costs, thresholds, repo=repo, factors=factors, changes=changes,
                                   floors=floors, confirmed=confirmed)
    if regressions.empty:
        return regressions
    ok = frame[frame["status"] == "ok"]
    attributed = []
    for _, spike in regressions.iterrows():
        same = ok[(ok["machine"] == spike["machine"]) & (ok["env_name"] == spike["env_name"])]
        for param in PARAMS:
            if param in same and pd.notna(spike.get(param)):
                same = same[same[param] == spike[param]]
        same = same[same["benchmark"].str.rpartition(".")[0] == spike["benchmark"].rpartition(".")[0]]
        moved = {}
        for metric in metrics.companions():
            before = same[(same["metric"] == metric) & (same["commit_hash"] == spike["commit_before"])]
            after = same[(same["metric"] == metric) & (same["commit_hash"] == spike["commit_after"])]
            if before.empty or after.empty:
                continue
            a, b = float(before["value"].iloc[0]), float(after["value"].iloc[0])
            if a == b:
                continue
            moved[metric] = (b / a - 1.0) if a else float("inf")
        price = _price_change(same, spike)
        if price is not None:
            moved["price_per_hour"] = price
        ranked = sorted(moved.items(), key=lambda kv: -abs(kv[1]))
        attributed.append({**spike.to_dict(), "companions": ranked,
                           "attribution": "; ".join(f"{m} {v:+.0%}" for m, v in ranked[:4]
                                                    if abs(v) >= 0.02) or "no companion metric moved"})
    return pd.DataFrame(attributed)


def _price_change(same, spike):
    """Change of the hourly price implied by usd_per_step / seconds_per_step (a profile change)."""
    def hourly(commit):
        usd = same[(same["metric"] == "usd_per_step") & (same["commit_hash"] == commit)]["value"]
        sec = same[(same["metric"] == "seconds_per_step") & (same["commit_hash"] == commit)]["value"]
        if usd.empty or sec.empty or not sec.iloc[0]:
            return None
        return float(usd.iloc[0]) / float(sec.iloc[0]) * 3600

    a, b = hourly(spike["commit_before"]), hourly(spike["commit_after"])
    if a is None or b is None or abs(b / a - 1.0) < 1e-9:
        return None
    return b / a - 1.0


def load_traces(results_dir: str = "results"):
    """Every per-step trace the suite wrote (results/<machine>/traces/<commit8>-<env>/*.csv), with
    ``contended`` from the run's sidecar."""
    import pandas as pd

    frames, sidecars = [], {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*", "traces", "*", "*.csv"))):
        run_dir = os.path.basename(os.path.dirname(path))
        machine = os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path))))
        try:
            trace = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            warnings.warn(f"{path}: unreadable trace ({exc}); skipped", stacklevel=2)
            continue
        commit8, _, env = run_dir.partition("-")
        trace.insert(0, "machine", machine)
        trace.insert(1, "commit8", commit8)
        trace.insert(2, "env_name", env)
        trace["file"] = path
        trace["contended"] = _trace_contended(results_dir, machine, commit8, env, os.path.basename(path),
                                              sidecars)
        frames.append(trace)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _trace_contended(results_dir, machine, commit8, env, name, cache: dict):
    """Whether the sidecar says the case of a trace file (``impl__regime__S<n>__mode__dtype.csv``, a
    preset's with ``__<preset>-<phase>``) was timed under contention; None where it says nothing."""
    parts = name.removesuffix(".csv").split("__")
    if len(parts) not in (5, 6) or not parts[2].startswith("S") or not parts[2][1:].isdigit():
        return None
    impl, regime, seq, mode, dtype = parts[:5]
    suite, length = {"fwd": "Forward", "fwd_bwd": "Training"}.get(mode), int(seq[1:])
    if len(parts) == 6:  # a Models case: its length is <preset>:<phase> (asv.sizes.case_length)
        preset, _, phase = parts[5].rpartition("-")
        suite, length = "Models", f"{preset}:{phase}"

    if (machine, commit8, env) not in cache:
        cache[machine, commit8, env] = sidecar.read(results_dir, machine, commit8, env).get("cases") or {}
    entry = cache[machine, commit8, env].get(sidecar.case_id(suite, impl, length, regime, dtype))
    return entry.get("contended") if isinstance(entry, dict) else None


def find_trace_spikes(traces, factor: float = 2.0):
    """Steps at least ``factor`` times their run's median step: compile stalls, mostly. Runs of a
    case timed under contention (``contended``, from the sidecar) are never called spikes."""
    import pandas as pd

    if traces.empty:
        return traces
    if "contended" in traces:
        traces = traces[~is_contended(traces)]
    out = []
    for _, run in traces.groupby("file"):
        median = run["seconds"].median()
        spikes = run[run["seconds"] >= factor * median].copy()
        spikes["times_median"] = spikes["seconds"] / median
        spikes["cause"] = [("compiled a new shape" if c is True or c == "True" else
                            "padding" if p > n else "no compile or padding recorded")
                           for c, p, n in zip(spikes["compiled"], spikes["padded_length"], spikes["length"],
                                              strict=True)]
        out.append(spikes)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
