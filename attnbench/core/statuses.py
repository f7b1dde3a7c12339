"""How a measured case can end: the statuses of a record, and the codes of the ``status`` metric.

Its own module so that the record layout (``records.py``) and the metric table (``metrics.py``)
both read them without importing each other.
"""

from __future__ import annotations

OK = "ok"
UNSUPPORTED = "unsupported"
OOM = "oom"
TIMEOUT = "timeout"
NUMERICS_FAILED = "numerics-failed"
ERROR = "error"
STATUSES = (OK, UNSUPPORTED, OOM, TIMEOUT, NUMERICS_FAILED, ERROR)
# The ``status`` metric: 0 = ok; the rest in rising order of trouble. Unsupported never reaches a
# metric (asv shows n/a).
STATUS_CODES = {OK: 0, NUMERICS_FAILED: 1, OOM: 2, TIMEOUT: 3, ERROR: 4}
