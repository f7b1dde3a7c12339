"""A compiled-for record's predicted time: the family's fit applied to its program, with its range.

``Calibrated`` holds, per family, the fit on every calibration row and the leave-one-shape-out score.
``columns(record)`` gives a record's ``predicted_`` columns, or leaves them empty and says why in
``predicted_basis``: a family without calibration rows, a program with an op kind no calibration row
had, a record that did not compile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from attnbench.predicted import calibration, model

PREDICTED_COLUMNS = ("predicted_seconds", "predicted_seconds_low", "predicted_seconds_high",
                     "predicted_bound", "predicted_share_of_peak", "predicted_ranks", "predicted_basis")


@dataclass
class Family:
    fit: model.Fit
    score: model.Score
    rows: list[dict]

    @property
    def chips(self) -> str:
        return ", ".join(sorted({r["target"] for r in self.rows}))

    @cached_property
    def kernels(self) -> set[str]:
        return {r["kernel"] for r in self.rows}

    @cached_property
    def most(self) -> list[float]:
        """Each of ``FEATURES`` at its largest among the rows."""
        return [max((r[name] or 0.0) for r in self.rows) for name in model.FEATURES]

    def outside(self, record: dict, features: list[float]) -> list[str]:
        """How ``record`` (its ``features``) differs from every calibration row: an extrapolation, said
        in its basis."""
        out = []
        if record.get("impl") not in self.kernels:
            out.append(f"{record.get('impl')} is not among the kernels fitted on")
        if int(record.get("seq_q") or 0) != int(record.get("seq_k") or 0):
            out.append("seq_q != seq_k")
        for column, words in (("window", "a window"), ("softcap", "a soft cap"), ("documents", "documents")):
            value = record.get(column)
            if value is not None and value == value and value not in ("", 0):
                out.append(words)
        for name, value, most in zip(model.FEATURES, features, self.most, strict=True):
            if value > most * 1.001:  # beyond by more than the rounding of a sum
                out.append(f"{name} {value:.3g} beyond the fitted rows' {most:.3g}")
        lengths = [r["seq_q"] for r in self.rows]
        if lengths and not min(lengths) <= int(record.get("seq_q") or 0) <= max(lengths):
            out.append(f"length beyond the fitted {int(min(lengths))}-{int(max(lengths))}")
        return out

    def basis(self) -> str:
        lo, hi = self.score.error_range
        state = "passes" if self.score.passes else "FAILS"
        return (f"predicted: fitted on {len(self.rows)} published rows of {self.chips} ({self.fit.family}); "
                f"leave-one-shape-out median error x{math.exp(self.score.median_abs_error):.2f}, "
                f"90% of errors x{math.exp(lo):.2f}-x{math.exp(hi):.2f}, kernel pairs ordered "
                f"{self.score.pairs_ordered}/{self.score.pairs}: {state} issue 54's bars")


class Calibrated:
    """The families fitted on one calibration table."""

    def __init__(self, rows: list[dict], source: str = calibration.TABLE):
        self.source = source
        self.families: dict[str, Family] = {}
        for family in sorted({r["family"] for r in rows if r["family"]}):
            mine = calibration.fitted_rows(rows, family)
            if len(mine) < len(model.FACTORS) + 1:
                continue
            features, seconds, groups, pair_keys, kernels = calibration.arrays(mine)
            self.families[family] = Family(model.fit(family, features, seconds),
                                           model.leave_one_shape_out(family, features, seconds, groups,
                                                                     pair_keys, kernels), mine)

    @classmethod
    def load(cls, path: str = calibration.TABLE) -> Calibrated:
        return cls(calibration.read(path), path)

    def family_for(self, target) -> Family | None:
        return self.families.get(getattr(target, "family", "") or "")

    def why_not(self, target) -> str | None:
        """Why ``target`` (a ``Target``) gets no prediction; None when its family is calibrated."""
        if self.family_for(target) is not None:
            return None
        family = getattr(target, "family", "") or "none"
        return (f"no prediction: family {family} has no published device times to calibrate on "
                f"({self.source}; calibrated: {', '.join(self.families) or 'none'})")

    def columns(self, record: dict, target) -> dict:
        """The record's ``predicted_`` columns (every one, empty ones ``None``)."""
        out = dict.fromkeys(PREDICTED_COLUMNS)
        why = self.why_not(target)
        if why:
            out["predicted_basis"] = why
            return out
        if record.get("status") != "ok":
            out["predicted_basis"] = "no prediction: the program did not compile"
            return out
        if record.get("execution") == "interpret":
            out["predicted_basis"] = ("no prediction: an interpreted kernel's program is the interpreter's "
                                      "XLA ops, not the kernel")
            return out
        if record.get("mode") == "fwd_bwd":
            out["predicted_basis"] = ("no prediction: the calibration holds forward programs only (a "
                                      "published backward time is the backward's share, which no program "
                                      "compiled here is)")
            return out
        family = self.family_for(target)
        features = record_features(record)
        seconds = family.fit.predict(features)
        if seconds is None:
            missing = family.fit.missing(features)
            out["predicted_basis"] = (f"no prediction: the program has {', '.join(missing)}, which no "
                                      f"calibration row of {family.fit.family} had" if missing else
                                      "no prediction: the record holds no program cost (hlo_ columns)")
            return out
        lo, hi = family.score.error_range
        # error = ln(predicted / published): the truth lies at predicted / exp(error)
        outside = family.outside(record, features)
        out.update(predicted_seconds=seconds, predicted_seconds_low=seconds / math.exp(hi),
                   predicted_seconds_high=seconds / math.exp(lo),
                   predicted_bound=bound(record, family.fit, features),
                   predicted_ranks=family.score.passes,
                   predicted_basis=family.basis() + (f"; outside the calibration ({'; '.join(outside)}): its "
                                                     "error there is not measured" if outside else ""))
        flops, peak = record.get("flops"), record.get("peak_tflops")
        chips = record.get("chips") or 1
        if flops and peak:
            out["predicted_share_of_peak"] = flops / chips / (seconds * peak * 1e12)
        return out


def record_features(record: dict) -> list[float]:
    """A record's ``FEATURES``: its ``hlo_`` columns and the grid steps of the config it was built at."""
    config = model.parse_library_config(record.get("library_config"))
    shape = {k: int(record.get(k) or 0) for k in ("batch", "q_heads", "seq_q", "seq_k")}
    causal = str(record.get("causal")) == "True"
    steps = model.grid_steps(config, **shape, causal=causal) if all(shape.values()) else 0
    if record.get("devices") and record.get("chips") and int(record["devices"]) > 1:
        steps /= int(record["devices"])  # each device visits its own heads' tiles
    return [float(record.get(f) or 0.0) for f in model.FEATURES[:-1]] + [float(steps)]


def bound(record: dict, fit: model.Fit, features: list[float]) -> str:
    """What most of the predicted time is: ``overhead`` where the fitted launch and grid-step costs
    outweigh the fitted op kinds, else ``compute`` or ``memory``, whichever side of the ops' own
    rooflines (unweighted) holds more of their time."""
    weights = [f or 0.0 for f in fit.factors]
    kinds = sum(w * v for w, v in zip(weights[:3], features[:3], strict=True))
    overhead = sum(w * v for w, v in zip(weights[3:], features[3:], strict=True))
    compute = float(record.get("hlo_compute_bound_seconds") or 0.0)
    memory = float(record.get("hlo_memory_bound_seconds") or 0.0)
    if overhead > kinds:
        return "overhead"
    return "compute" if compute >= memory else "memory"
