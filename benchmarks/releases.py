"""The release matrix (``make releases``; ``asv.releases.conf.json``, not part of ``make bench``).

One asv environment per jax release (asv's environment matrix) and per torch release this host has
(existing environments), so the HTML shows one series per release. ``Releases``: every jax and
torch kernel x two small workloads (``attnbench/releases/matrix.py``), measured once per
environment by ``setup_cache`` (``attnbench/releases/cell.py``); a cell that broke in this release
is a failed benchmark (its status and reason in the asv log and in ``results/releases/releases.csv``),
one the kernel refuses here, or of the other framework, is n/a. ``ReleasesTPU``: the forced TPU
kernels and plain XLA compiled for a v5e and a v6e by the libtpu this environment pins (n/a where
it has none).
"""

from attnbench.releases import matrix
from attnbench.releases import suite as releases


def _track(column, unit):
    def track(self, cache, *params):
        return releases.number(self.cell, column)

    track.__name__ = f"track_{column}"
    track.unit = unit
    track.version = releases.VERSION
    return track


class Releases:
    """A kernel at a workload, in this environment's release: step time and error against float64."""

    params = (releases.impl_names(), list(matrix.WORKLOADS))
    param_names = ["implementation", "workload"]
    timeout = 3600  # setup_cache measures every cell
    track_seconds_per_step = _track("seconds_per_step", "seconds")
    track_max_abs_err = _track("max_abs_err", "abs error")

    def setup_cache(self):
        return releases.measure_cells()

    def setup(self, cache, implementation, workload):
        self.cell = releases.cell_for(cache, matrix.cell_key(implementation, workload))


class ReleasesTPU:
    """A kernel compiled for a TPU by this environment's libtpu: peak HBM and layout-copy bytes."""

    params = (list(matrix.TPU_TARGETS), list(matrix.TPU_IMPLS), list(matrix.TPU_SEQS))
    param_names = ["target", "implementation", "seq_len"]
    timeout = 3600
    track_peak_bytes = _track("peak_bytes", "bytes")
    track_inserted_copy_bytes = _track("inserted_copy_bytes", "bytes")

    def setup_cache(self):
        return releases.compile_tpu_cells()

    def setup(self, cache, target, implementation, seq_len):
        self.cell = releases.cell_for(cache, releases.tpu_key(target, implementation, seq_len))
