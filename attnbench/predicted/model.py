"""The time model: a step's seconds predicted from its compiled program, calibrated per chip family.

    predicted = a_kernel x kernel seconds + a_matmul x matmul seconds + a_other x other seconds
                + c_launch x launches + c_step x grid steps

The seconds are the compiled program's op-by-op roofline (``attnbench.compiled_for.hlo_cost``: each
op at ``max(FLOPs / peak, bytes / bandwidth)``, loops times their trip counts, kernels at their
declared cost), summed per kind of op. The five factors (``FACTORS``) are fitted per target family
(each TPU generation; Hopper-class GPUs) on the published device times, all kernels together: ``a_``
is the inverse of the efficiency that kind of op reaches, ``c_`` a fixed cost per launch and per
grid step of a tiled kernel. No factor belongs to one kernel. The fit minimises the squared log
error, factors never below zero (``scipy.optimize.least_squares`` over their logarithms).

Its error is measured, not assumed: every published row is predicted by a fit made without it and
without the other rows of its shape (``leave_one_shape_out``); the range a prediction carries is the
5th to 95th percentile of those errors in its family.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

FEATURES = ("hlo_kernel_seconds", "hlo_matmul_seconds", "hlo_other_seconds", "hlo_launches", "grid_steps")
FACTORS = ("a_kernel", "a_matmul", "a_other", "c_launch_s", "c_grid_step_s")
# What a factor of the fit needs a calibration row to have: without one, a program with that feature
# cannot be predicted (a family calibrated on XLA programs only says nothing of a kernel's efficiency).
NEEDS = dict(zip(FEATURES, ("a kernel (custom call)", "an XLA matmul", "an XLA op besides matmuls",
                            "a launch", "a tiled kernel's grid"), strict=True))
RANGE_QUANTILES = (0.05, 0.95)  # the range a prediction carries: 90% of the leave-one-out errors
# A family whose leave-one-out figures miss either bar never reaches the verdict (issue 54's bars).
MEDIAN_ERROR_BAR = math.log(1.5)
ORDER_BAR = 0.80
SHAPE_KEY = ("batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal")  # both dtypes held out


# ------------------------------------------------------------------------------- grid steps
def block_sizes(config: dict) -> tuple[int, int] | None:
    """(query block, key block) of a tiled kernel's config (Tokamax's names); None without tiles."""
    q = config.get("block_q")
    k = config.get("block_kv", config.get("block_k"))
    if isinstance(q, int) and isinstance(k, int) and q > 0 and k > 0:
        return q, k
    return None


def grid_steps(config: dict, *, batch: int, q_heads: int, seq_q: int, seq_k: int, causal: bool) -> int:
    """How many (query block, key block) tiles a flash kernel visits: every one, or with a causal
    mask (top-left, as Tokamax's) only those holding a kept pair. 0 for a kernel without tiles."""
    blocks = block_sizes(config)
    if blocks is None:
        return 0
    bq, bk = blocks
    nq, nk = math.ceil(seq_q / bq), math.ceil(seq_k / bk)
    if not causal:
        per_head = nq * nk
    else:  # q block i's last row is (i + 1) * bq - 1; it sees keys up to there
        per_head = sum(min(nk, ((i + 1) * bq - 1) // bk + 1) for i in range(nq))
    return batch * q_heads * per_head


def parse_library_config(text) -> dict:
    """``Op block_q=128,block_kv=128`` (a record's ``library_config``, one op) as a dict; {} if none."""
    if not isinstance(text, str) or " " not in text or ";" in text:
        return {}
    out = {}
    for item in text.split(" ", 1)[1].split(","):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            continue
    return out


# -------------------------------------------------------------------------------------- fit
@dataclass
class Fit:
    """One family's factors (``FACTORS`` order; ``None``: no calibration row had that feature)."""

    family: str
    factors: list[float | None]
    rows: int

    def predict(self, features) -> float | None:
        """Seconds for one program's ``FEATURES`` (None when it needs a factor the fit lacks)."""
        total = 0.0
        for value, factor in zip(features, self.factors, strict=True):
            if value and value > 0:
                if factor is None:
                    return None
                total += factor * value
        return total if total > 0 else None

    def missing(self, features) -> list[str]:
        """What the program has that no calibration row had."""
        return [NEEDS[name] for name, value, factor in zip(FEATURES, features, self.factors, strict=True)
                if value and value > 0 and factor is None]


def fit(family: str, features: np.ndarray, seconds: np.ndarray) -> Fit:
    """Factors >= 0 minimising sum(ln(predicted / seconds)^2) over the rows."""
    from scipy.optimize import least_squares, nnls

    features = np.asarray(features, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    used = [j for j in range(features.shape[1]) if np.any(features[:, j] > 0)]
    x = features[:, used]
    scale = np.array([np.median(col[col > 0]) for col in x.T])  # factors of order 1 for the solver
    xs = x / scale
    start, _ = nnls(xs / seconds[:, None], np.ones(len(seconds)))  # relative error, linear: a start
    floor = 1e-6 * max(start.max(), 1e-3)
    theta0 = np.log(np.maximum(start, floor))

    def residuals(theta):
        return np.log(np.maximum(xs @ np.exp(np.clip(theta, -60.0, 60.0)), 1e-300)) - np.log(seconds)

    theta = least_squares(residuals, theta0, method="lm" if len(seconds) > len(used) else "trf").x
    factors: list[float | None] = [None] * features.shape[1]
    for j, value in zip(used, np.exp(theta) / scale, strict=True):
        factors[j] = float(value)
    return Fit(family, factors, len(seconds))


@dataclass
class Score:
    """A family's leave-one-shape-out errors: ``errors`` are ln(predicted / published) per row."""

    family: str
    errors: np.ndarray
    predicted: np.ndarray  # each row's leave-one-out prediction (NaN: its fit could not predict it)
    pairs: int = 0
    pairs_ordered: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def median_abs_error(self) -> float:
        return float(np.median(np.abs(self.errors))) if len(self.errors) else math.nan

    @property
    def order_share(self) -> float:
        return self.pairs_ordered / self.pairs if self.pairs else math.nan

    @property
    def error_range(self) -> tuple[float, float]:
        """The (5th, 95th) percentile of ln(predicted / published)."""
        if not len(self.errors):
            return math.nan, math.nan
        lo, hi = np.quantile(self.errors, RANGE_QUANTILES)
        return float(lo), float(hi)

    @property
    def passes(self) -> bool:
        """Both of issue 54's bars: median error within 1.5x, and 80% of kernel pairs ordered."""
        return (len(self.errors) > 0 and self.median_abs_error <= MEDIAN_ERROR_BAR
                and not math.isnan(self.order_share) and self.order_share >= ORDER_BAR)


def leave_one_shape_out(family: str, features: np.ndarray, seconds: np.ndarray, groups: list,
                        pair_keys: list, kernels: list) -> Score:
    """Each row predicted by a fit on the family's other shapes; then the kernel pairs' order.

    ``groups``: each row's shape (held out together); ``pair_keys``: the rows that compete (same
    chip, shape and dtype); ``kernels``: each row's kernel."""
    features = np.asarray(features, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    predicted = np.full(len(seconds), np.nan)
    for group in dict.fromkeys(groups):
        held = np.array([g == group for g in groups])
        if held.all():
            continue
        model = fit(family, features[~held], seconds[~held])
        for i in np.flatnonzero(held):
            value = model.predict(features[i])
            predicted[i] = value if value is not None else np.nan
    ok = ~np.isnan(predicted)
    score = Score(family, np.log(predicted[ok] / seconds[ok]), predicted)
    if (~ok).any():
        score.notes.append(f"{int((~ok).sum())} rows not predictable without their shape")
    by_key: dict = {}
    for i, key in enumerate(pair_keys):
        if ok[i]:
            by_key.setdefault(key, []).append(i)
    for rows in by_key.values():
        for a in range(len(rows)):
            for b in range(a + 1, len(rows)):
                i, j = rows[a], rows[b]
                if kernels[i] == kernels[j] or seconds[i] == seconds[j]:
                    continue
                score.pairs += 1
                score.pairs_ordered += (predicted[i] < predicted[j]) == (seconds[i] < seconds[j])
    return score
