"""Which host each run of a machine name ran on, and where the host changed. Reads, never writes.

One machine name (``cpu-2core``, ``h200``) stands for many hosts. Two runs ran on different hosts when
both recorded a fingerprint (``hardware/fingerprint.py``) and it differs, or when the run's CPU GEMM
probe moved beyond its noise. A step across a host change is that, never a regression.
"""

from __future__ import annotations

import math

import numpy as np

from attnbench.core.host_identity import IDENTITY, identity
from attnbench.results.noise import SCATTER_Z, order_column, robust_sd

# Imported where used: pandas (the torch_xla venv has no report libraries).


def _text(value):
    """A text cell, None where it is missing (None or NaN)."""
    return value if isinstance(value, str) and value else None


def run_hosts(frame):
    """Per machine x commit (a run), oldest first: ``identity`` (its sidecar's host fingerprint, None
    where none), ``probe`` (CPU GEMM probe TFLOP/s: recorded, else float32 TFLOP/s over MFU on a CPU),
    ``probe_source``, ``probe_spread`` (best round over median - 1) and ``fingerprint`` (a dict)."""
    import pandas as pd


    columns = ["machine", "commit_hash", "order", "identity", "probe", "probe_source", "probe_spread"]
    order_col = order_column(frame) if len(frame) else "commit_position"
    if frame.empty or order_col not in frame:
        return pd.DataFrame(columns=columns)
    derived = _derived_probes(frame)
    host_cols = [f"host_{k}" for k in IDENTITY if f"host_{k}" in frame]
    rows = []
    probe_cols = [c for c in ("host_gemm_peak_tflops", "host_gemm_median_tflops") if c in frame]
    for (machine, commit), run in frame.groupby(["machine", "commit_hash"], sort=False):
        # a run's environments without a sidecar host (the compiled-for tier's) leave these empty
        recorded = {c: run[c].dropna() for c in host_cols + probe_cols}
        fingerprint = {c.removeprefix("host_"): (recorded[c].iloc[0] if len(recorded[c]) else None)
                       for c in host_cols}
        best, median = (_number(recorded[c].iloc[0]) if c in recorded and len(recorded[c]) else float("nan")
                        for c in ("host_gemm_peak_tflops", "host_gemm_median_tflops"))
        if best == best:
            probe, source = best, "recorded"
            spread = best / median - 1.0 if median == median and median > 0 else float("nan")
        else:
            probe = derived.get((machine, commit), float("nan"))
            source, spread = ("tflops / mfu" if probe == probe else None), float("nan")
        rows.append({"machine": machine, "commit_hash": commit, "order": run[order_col].min(),
                     "identity": identity(fingerprint), "fingerprint": fingerprint, "probe": probe,
                     "probe_source": source, "probe_spread": spread})
    out = pd.DataFrame(rows, columns=[*columns, "fingerprint"])
    out = out[np.isfinite(pd.to_numeric(out["order"], errors="coerce"))]
    return out.sort_values(["machine", "order"]).reset_index(drop=True)


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _derived_probes(frame) -> dict:
    """``{(machine, commit): probe TFLOP/s}`` from the float32 rows of CPU machines: TFLOP/s over MFU
    (the engine's MFU is TFLOP/s over the run's probe), the median over the run's cases."""
    import pandas as pd

    keys = [c for c in ("machine", "env_name", "commit_hash", "implementation", "seq_len", "regime")
            if c in frame]
    part = frame[(frame["metric"].isin(["tflops", "mfu"])) & (frame["status"] == "ok")]
    if "dtype" in part:
        part = part[part["dtype"] == "float32"]
    if "machine_platform" in part:
        part = part[part["machine_platform"] == "cpu"]
    if part.empty:
        return {}
    part = part.assign(suite=part["benchmark"].str.rsplit(".", n=1).str[0])
    wide = part.pivot_table(index=[*keys, "suite"], columns="metric", values="value", aggfunc="first")
    if not {"tflops", "mfu"} <= set(wide.columns):
        return {}
    peak = (pd.to_numeric(wide["tflops"]) / pd.to_numeric(wide["mfu"])).dropna()
    peak = peak[peak > 0]
    return peak.groupby(level=["machine", "commit_hash"]).median().to_dict()


def host_changes(frame, hosts=None):
    """Each machine's consecutive runs and whether the host changed (``changed``, ``why``): both
    fingerprints recorded and different, or the CPU GEMM probe moved beyond ``probe_noise`` (from the
    machine's probe scatter or the runs' own round spreads; no probe test under three moves)."""
    import pandas as pd

    hosts = run_hosts(frame) if hosts is None else hosts
    columns = ["machine", "commit_before", "commit_after", "changed", "why", "probe_move", "probe_noise"]
    rows = []
    for machine, runs in hosts.groupby("machine", sort=True):
        probe = runs["probe"].to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            moves = probe[1:] / probe[:-1] - 1.0
        known = moves[np.isfinite(moves)]
        scatter_band = SCATTER_Z * robust_sd(known) if len(known) >= 3 else float("nan")
        records = runs.to_dict("records")
        for a, b, move in zip(records, records[1:], moves, strict=False):
            spreads = (x if x == x else 0.0 for x in (a["probe_spread"], b["probe_spread"]))
            own = SCATTER_Z * math.hypot(*spreads)
            noise = max(scatter_band, own) if scatter_band == scatter_band else float("nan")
            why = []
            if _text(a["identity"]) and _text(b["identity"]) and a["identity"] != b["identity"]:
                before, after = a["fingerprint"], b["fingerprint"]
                why += [f"{k} {before.get(k)} -> {after.get(k)}" for k in before
                        if before.get(k) != after.get(k)]
            if move == move and noise == noise and abs(move) > noise:
                why.append(f"CPU GEMM probe {a['probe']:.3g} -> {b['probe']:.3g} TFLOP/s ({move:+.1%}, "
                           f"beyond its noise ±{noise:.1%})")
            rows.append({"machine": machine, "commit_before": a["commit_hash"],
                         "commit_after": b["commit_hash"], "changed": bool(why), "why": "; ".join(why),
                         "probe_move": move, "probe_noise": noise})
    return pd.DataFrame(rows, columns=columns)


def host_periods(changes) -> dict:
    """``{(machine, commit): (period, why)}``: each machine's runs numbered by host period, with why
    the period's host differs."""
    periods, current = {}, {}
    for row in changes.to_dict("records"):
        machine = row["machine"]
        period = periods.setdefault((machine, row["commit_before"]), (current.get(machine, 0), ""))[0]
        if row["changed"]:
            period += 1
        current[machine] = period
        periods[(machine, row["commit_after"])] = (period, row["why"] if row["changed"] else "")
    return periods


def hosts_table(frame, changes=None, hosts=None):
    """Per machine: ``runs``, ``fingerprinted``, ``hosts`` (1 + host changes), ``host_changes`` and
    ``probe_noise``. ``hosts``, ``changes``: ``run_hosts`` and ``host_changes`` if already computed."""
    import pandas as pd

    hosts = run_hosts(frame) if hosts is None else hosts
    changes = host_changes(frame, hosts) if changes is None else changes
    rows = []
    for machine, runs in hosts.groupby("machine", sort=True):
        mine = changes[changes["machine"] == machine]
        rows.append({"machine": machine, "runs": len(runs),
                     "fingerprinted": int(runs["identity"].map(_text).notna().sum()),
                     "hosts": 1 + int(mine["changed"].sum()), "host_changes": int(mine["changed"].sum()),
                     "probe_noise": float(mine["probe_noise"].median()) if len(mine) else float("nan")})
    return pd.DataFrame(rows, columns=["machine", "runs", "fingerprinted", "hosts", "host_changes",
                                       "probe_noise"])


def host_change_text(before: tuple, after: tuple, periods: dict, machine: str) -> str:
    """Why the host differs between two runs' host periods (``host_periods``); "" for the same host."""
    if before[0] == after[0]:
        return ""
    whys = [why for (m, _), (period, why) in periods.items()
            if m == machine and before[0] < period <= after[0] and why]
    return "; ".join(dict.fromkeys(whys)) or "host changed"
