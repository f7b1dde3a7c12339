"""The horizon a production answer is priced at: how long a server serves between two cold starts.

A server compiles its shapes once (at start, or the first time each turns up) and then serves for
as long as it lives. One cold start over 200 steps (the measured stream) prices a compile as if the
server restarted every 200 steps; over a day it is a rounding error. So the verdict prices each row
at a horizon: in steps, or in hours of the row's own trace at that trace's request rate
(``traffic.requests_per_hour``: its requests over the span of its timestamps), turned into steps
with the requests each step of the measured stream served.

The default is ``DEFAULT`` (one day): a server is commonly redeployed, and so starts cold, about
daily, and a cold start priced over less than its lifetime overstates it. ``--horizon`` sets yours.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from attnbench.core import traffic

DEFAULT = "24h"
UNITS = {"steps": "steps", "step": "steps", "h": "hours", "hour": "hours", "hours": "hours"}
_FORM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
SERVING_STEPS = 10**12  # a horizon long enough that every compile is amortised away: the serving cost


@dataclass(frozen=True)
class Horizon:
    """A horizon as the user gave it: ``value`` steps or hours."""

    value: float
    unit: str  # "steps" or "hours"

    def __str__(self) -> str:
        if self.unit == "hours":
            return f"{self.value:g} h"
        return f"{int(self.value):,} steps"

    def steps(self, steps_per_hour: float | None) -> int | None:
        """The horizon in steps: as given, or its hours at ``steps_per_hour`` (None where unknown)."""
        if self.unit == "steps":
            return int(self.value)
        if steps_per_hour is None or not steps_per_hour > 0:
            return None
        return max(1, round(self.value * steps_per_hour))


def parse(text: str | None) -> Horizon:
    """``24h``, ``2.5 hours``, ``1000000``, ``1e6 steps``: a ``Horizon``. ``ValueError`` (the CLI's exit
    2) naming what is wrong: not a number with a unit, a horizon of zero or less, an unknown unit, or a
    step count that is not whole."""
    text = DEFAULT if text is None else str(text)
    found = _FORM.match(text.replace(",", "").replace("_", ""))
    if not found:
        if re.match(r"^\s*-", text):
            raise ValueError(f"--horizon must be more than 0, got {text!r}")
        raise ValueError(f"--horizon must be a number of steps or hours (1000000, 24h), got {text!r}")
    value, unit = float(found.group(1)), found.group(2).lower() or "steps"
    if unit not in UNITS:
        raise ValueError(f"--horizon's unit must be steps or h (hours of the trace's request rate), "
                         f"got {found.group(2)!r} in {text!r}")
    unit = UNITS[unit]
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"--horizon must be more than 0, got {text!r}")
    if unit == "steps" and value != int(value):
        raise ValueError(f"--horizon in steps must be a whole number, got {text!r}")
    return Horizon(value, unit)


@functools.lru_cache(maxsize=16)
def _rate(source: str) -> float | None:
    """The requests per hour of the trace ``source`` names (None: uniform, or a file not here or
    without timestamps)."""
    if not traffic.is_trace(source):
        return None
    try:
        return traffic.requests_per_hour(traffic.load(source))
    except (OSError, ValueError):
        return None


def steps_per_hour(case: dict, regime: str) -> float | None:
    """The steps an hour of the case's trace makes: its request rate over the requests each step of
    the case's ``regime`` stream served (``traffic_requests`` over its planned steps); None where
    the stream has no trace with timestamps here, or did not record its requests."""
    rate = _rate(case.get(f"{regime}:traffic") or "")
    requests = case.get(f"{regime}:requests")
    planned = case.get(f"{regime}:planned") or case.get(f"{regime}:steps")
    if rate is None or not requests or requests != requests or not planned or planned != planned:
        return None
    return rate * float(planned) / float(requests)


def hours_text(steps: int | None, per_hour: float | None) -> str:
    """``1.2 h`` for ``steps`` at ``per_hour`` ("" where the rate is unknown)."""
    if steps is None or per_hour is None or not per_hour > 0:
        return ""
    hours = steps / per_hour
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:,.1f} h" if hours < 100 else f"{hours:,.0f} h"
