"""Cost spikes over commits, and per-step spikes within a run. Reads, never writes.

A cost spike is a regression (``steps.find_regressions``) of a cost metric, judged by the same rules,
of a kernel some verdict can rank: interpreted kernels and the float64 reference are left out (their
cost says nothing about any hardware's choice). Each is attributed to the companion metrics that
moved across the same commits. Per-step spikes come from the engine's traces of the shape regimes:
steps at least ``factor`` times their run's median, compile stalls mostly.
"""

from __future__ import annotations

import glob
import io
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
    ``contended`` from the run's sidecar. Plain files of one header (no quotes, a field for each
    column on every line: what the suite writes) are parsed together: a history holds thousands of
    small traces, and a parse each cost more than the rest of the analysis. Any other file is parsed
    alone, so that it cannot spill into its neighbours; one that does not parse is named and left out."""
    import pandas as pd

    together: dict[bytes, list[tuple[int, bytes]]] = {}  # header -> (file index, its rows, each led by it)
    alone, origins, sidecars = [], [], {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*", "traces", "*", "*.csv"))):
        run_dir = os.path.basename(os.path.dirname(path))
        machine = os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path))))
        try:
            with open(path, "rb") as fh:
                header, _, body = fh.read().replace(b"\r\n", b"\n").partition(b"\n")
            header.decode("utf-8")
            body.decode("utf-8")
            if not header.strip():
                raise ValueError("empty: no header")
        except (OSError, ValueError) as exc:  # ValueError: bytes that are not UTF-8, or no header
            warnings.warn(f"{path}: unreadable trace ({exc}); skipped", stacklevel=2)
            continue
        commit8, _, env = run_dir.partition("-")
        contended = _trace_contended(results_dir, machine, commit8, env, os.path.basename(path), sidecars)
        index = len(origins)
        origins.append((machine, commit8, env, path, contended))
        body = (b"\n".join(line for line in body.split(b"\n") if line) if b"\n\n" in body
                else body.rstrip(b"\n"))  # no empty lines
        lines = body.count(b"\n") + 1 if body else 0
        plain = b'"' not in header and b'"' not in body and body.count(b",") == lines * header.count(b",")
        led = (b"%d," % index + body.replace(b"\n", b"\n%d," % index)) if body else b""
        if plain:
            together.setdefault(header, []).append((index, led))
        else:
            alone.append((index, led, header))
    frames = []
    for header, files in together.items():
        try:
            frames.append(_parse_traces(header, files))
        except ValueError:  # not expected of plain files; then each alone, to name the one at fault
            alone += [(index, led, header) for index, led in files]
    for index, led, header in alone:
        try:
            frames.append(_parse_traces(header, [(index, led)]))
        except ValueError as exc:
            warnings.warn(f"{origins[index][3]}: unreadable trace ({exc}); skipped", stacklevel=2)
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    # columns as the files bring them, in the files' order (a later header's new columns after them)
    columns = ["machine", "commit8", "env_name"]
    for frame in sorted(frames, key=lambda f: f[TRACE_FILE_INDEX].min()):
        columns += [c for c in (*frame.columns, "file", "contended")
                    if c not in columns and c != TRACE_FILE_INDEX]
    traces = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    traces = traces.sort_values(TRACE_FILE_INDEX, kind="stable", ignore_index=True)  # the files' order
    where = pd.DataFrame(origins, columns=["machine", "commit8", "env_name", "file", "contended"])
    at = where.iloc[traces.pop(TRACE_FILE_INDEX).to_numpy()].reset_index(drop=True)
    for column in ("machine", "commit8", "env_name", "file", "contended"):
        traces[column] = at[column]
    return traces[columns]


def _parse_traces(header: bytes, files: list[tuple[int, bytes]]):
    """The rows of trace files that share ``header``, each led by its file's index (one CSV parse)."""
    import pandas as pd

    text = b"\n".join([TRACE_FILE_INDEX.encode() + b"," + header, *(led for _, led in files if led)])
    return pd.read_csv(io.BytesIO(text), encoding="utf-8")


TRACE_FILE_INDEX = "_file_index"


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
    # masks, not a copy of the traces without the contended runs: a history's traces are large
    clean = ~is_contended(traces) if "contended" in traces else pd.Series(True, index=traces.index)
    if not clean.any():
        return pd.DataFrame()
    seconds = traces["seconds"]
    median = seconds.where(clean).groupby(traces["file"]).transform("median")  # each run's own median step
    spiked = clean & (seconds >= factor * median)
    spikes = traces[spiked].assign(times_median=seconds[spiked] / median[spiked])
    spikes["cause"] = [("compiled a new shape" if c is True or c == "True" else
                        "padding" if p > n else "no compile or padding recorded")
                       for c, p, n in zip(spikes["compiled"], spikes["padded_length"], spikes["length"],
                                          strict=True)]
    return spikes.sort_values("file", kind="stable", ignore_index=True)  # run by run, as ever
