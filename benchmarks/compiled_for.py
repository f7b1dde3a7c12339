"""The compiled-for tier: what each target's own compiler decides, per commit; nothing is timed.

Each case is compiled ahead of time for a TPU or NVIDIA GPU this host does not have
(``attnbench/compiled_for/``): whether it compiles (``status``: 0 ok, 1 does not fit in HBM,
2 kernel refused by Mosaic/Triton/cuDNN, 3 timeout, 4 error), whether it fits, its peak and temp
memory per device, the bytes of the layout copies the compiler put around a custom kernel, and a
roofline *model* of one step (seconds and USD). These are deterministic for a commit and the
compiler versions, so their history has no noise. ``setup_cache`` compiles every case once (in a
killable worker); it needs libtpu and the CUDA plugin (``.venv-targets``, which ``make bench``
runs this class in), and everywhere else every case is n/a with the install step as its reason.
Unsupported cases (a kernel on the wrong hardware, a shape rule) are n/a with their reason.
Every benchmark is named ``track_compiled_*``: its metric names never collide with the measured
suite's (``attnbench/metrics.py``), and the reports' series are told apart by ``target`` and ``mode``.
"""

from attnbench.compiled_for import suite as tier

GRID = tier.settings()


def _track(column=None, unit="bytes", reader=None):
    def decorate(fn):
        def track(self, cache, *params):
            return reader(self.record) if reader else tier.number(self.record, column)

        track.__name__ = fn.__name__
        track.__doc__ = fn.__doc__
        track.unit = unit
        track.version = tier.VERSION
        return track

    return decorate


class CompiledFor:
    """Causal attention B1 H8 D64 compiled for a target: target x implementation x length x mode x dtype."""

    params = (tier.target_names(), tier.impl_names(), list(GRID["seqs"]), list(GRID["modes"]),
              list(GRID["dtypes"]))
    param_names = ["target", "implementation", "seq_len", "mode", "dtype"]
    timeout = 3600  # setup_cache compiles the whole grid

    def setup_cache(self):
        return tier.compile_grid(*self.params)

    def setup(self, cache, target, implementation, seq_len, mode, dtype):
        self.record = tier.record_for(cache, target, implementation, seq_len, mode, dtype)

    @_track(reader=tier.status_code, unit="status")
    def track_compiled_status(self, cache, *params):
        """0 compiled, 1 does not fit in HBM (compiler refused), 2 kernel refused, 3 timeout, 4 error."""

    @_track(reader=tier.does_not_fit, unit="does not fit")
    def track_compiled_does_not_fit(self, cache, *params):
        """1 when the peak exceeds the target's HBM per device (or the compiler refused for it)."""

    @_track("peak_bytes")
    def track_compiled_peak_bytes(self, cache, *params):
        """memory_analysis().peak_memory_in_bytes per device."""

    @_track("temp_bytes")
    def track_compiled_temp_bytes(self, cache, *params):
        """memory_analysis().temp_size_in_bytes per device."""

    @_track("inserted_copy_bytes")
    def track_compiled_inserted_copy_bytes(self, cache, *params):
        """Bytes the layout copies/transposes/pads around custom kernels write (physical, tiled)."""

    @_track("model_roofline_seconds", unit="seconds")
    def track_compiled_model_roofline_seconds(self, cache, *params):
        """Roofline lower bound of one step (a model: max of FLOPs/peak and bytes/bandwidth)."""

    @_track("model_roofline_usd", unit="USD")
    def track_compiled_model_roofline_usd(self, cache, *params):
        """The roofline bound's price at the target's on-demand price (a model)."""
