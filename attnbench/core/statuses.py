"""How a case can end, in one set of names: a measured case's statuses and the codes of the
``status`` metric, and a compile's in the compiled-for tier (docs/compiled-for.md).

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

# A compile for a target this host does not have (attnbench/compiled_for/classify.py): the
# program does not fit the target's memory, or a kernel's compiler refused it.
DOES_NOT_FIT = "does-not-fit"
KERNEL_REFUSED = "kernel-refused"
COMPILE_STATUSES = (OK, DOES_NOT_FIT, KERNEL_REFUSED, UNSUPPORTED, TIMEOUT, ERROR)

# A cell of the release matrix (attnbench/releases/matrix.py): the first failing stage decides it.
API_CHANGED = "api-changed"  # an import, an attribute or a call signature of the library failed
COMPILE_FAILED = "compile-failed"  # tracing, lowering or compiling raised
RUNTIME_ERROR = "runtime-error"  # compiled, then the run raised (or the worker died or timed out)
RELEASE_STATUSES = (OK, API_CHANGED, COMPILE_FAILED, NUMERICS_FAILED, RUNTIME_ERROR, UNSUPPORTED,
                    DOES_NOT_FIT)
