"""A verdict's answer, one place for its four states: a forced / native ratio's interval read against
1 and the equivalence margin (``core.stats.compare_to_one``)."""

from __future__ import annotations

from attnbench.core.stats import ABOVE, BELOW, compare_to_one
from attnbench.core.stats import EQUAL as SAME

FORCED, NATIVE, EQUAL, CANT_TELL = "forced", "native", "equal", "can't tell"  # an answer's four states
STATE = {BELOW: FORCED, ABOVE: NATIVE, SAME: EQUAL}


def answer_of(low: float, high: float, margin: float) -> str:
    """The state of a forced / native ratio's interval: ``forced`` (wholly below 1), ``native``
    (wholly above), ``equal`` (within ``1 +- margin``), else ``can't tell``."""
    return STATE.get(compare_to_one(low, high, margin), CANT_TELL)
