"""The compiled-for tier: what each target's own compiler decides, per commit; nothing is timed.

Each case is compiled ahead of time for a TPU or NVIDIA GPU this host does not have
(``attnbench/compiled_for/``): whether it compiles (``status``: 0 ok, 1 does not fit in HBM,
2 kernel refused by Mosaic/Triton/cuDNN, 3 timeout, 4 error), whether it fits, its peak and temp
memory per device, the bytes of the layout copies the compiler put around a custom kernel, and a
roofline *model* of one step (seconds and USD). These are deterministic for a commit and the
compiler versions, so their history has no noise. ``setup_cache`` compiles every case once (in a
killable worker); it needs libtpu and the CUDA plugin (``.venv-targets``, which ``make bench``
runs these classes in), and everywhere else every case is n/a with the install step as its reason.
Unsupported cases (a kernel on the wrong hardware, a shape rule, a mask feature it lacks) are n/a
with their reason. Every benchmark is named ``track_compiled_*``: its metric names never collide
with the measured suite's (``attnbench/core/metrics.py``), and the reports' series are told apart by
``target`` and ``mode`` (``CompiledFor``) or ``workload``, ``phase`` and ``length``
(``CompiledForModels``).
"""

from attnbench.compiled_for import suite as tier

GRID = tier.settings()
MODELS = tier.model_settings()


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


class _Tracked:
    """The figures both classes track from a compiled-for record (``self.record``, set by setup)."""

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


class CompiledFor(_Tracked):
    """Causal attention B1 H8 D64 compiled for a target: target x implementation x length x mode x dtype."""

    params = (tier.target_names(), tier.impl_names(), list(GRID["seqs"]), list(GRID["modes"]),
              list(GRID["dtypes"]))
    param_names = ["target", "implementation", "seq_len", "mode", "dtype"]
    timeout = 3600  # setup_cache compiles the whole grid

    def setup_cache(self):
        return tier.compile_grid(*self.params)

    def setup(self, cache, target, implementation, seq_len, mode, dtype):
        self.record = tier.record_for(cache, target, implementation, seq_len, mode, dtype)


class CompiledForModels(_Tracked):
    """Real models' attention compiled for a target at the models' own lengths, in bfloat16.

    target x implementation x workload (a preset of ``attnbench/core/presets.py``, with its heads, head
    dim and mask: window, softcap, packed documents) x phase x length. Prefill is one prompt of
    ``length`` tokens (batch 1); decode is one new token per sequence against caches of ``length``
    keys, for the preset's real decode batch (8, ragged: seeded cache lengths, left-padded, as
    segment ids). Prefill runs 8192 and 32768 tokens, decode 32768 and 131072 keys (training, in
    full only: 8192 and 32768 tokens packing the preset's documents). n/a, with the reason: a length
    that is not the phase's, a preset whose context is shorter than the length, an encoder's decode,
    a kernel that cannot take the mask or the shape, a kernel off its hardware (interpreted).

    Sizes (``ATTNBENCH_SUITE``; ``attnbench/compiled_for/suite.py`` ``MODELS``):

    * ``default`` (make bench; 15 compiles, under a minute on a 2-core host): tpu-v5e and h200 x
      jax-xla, jax-xla-chunked, jax-pallas-tpu-flash, jax-pallas-tpu-splash, jax-cudnn,
      jax-pallas-gpu-decode x llama-3.1-8b (GQA 4:1) prefill 32768 and decode 131072, gemma-2-9b
      (window 4096, softcap 50, head dim 256) prefill 8192 (its context); every other case is n/a
      as left out of the default size (and kernels off their hardware as interpreted);
    * ``full``: tpu-v5e, tpu-v6e and h200 x every jax kernel (interpreted ones too) x every preset
      x prefill, training and decode x every length the phase and the preset's context allow;
    * ``smoke`` (tests): jax-xla, llama-3.1-8b decode 32768, on tpu-v5e and h200.
    """

    params = (tier.model_target_names(), tier.model_impl_names(), tier.model_preset_names(),
              tier.model_phases(), tier.model_lengths())
    param_names = ["target", "implementation", "workload", "phase", "length"]
    timeout = MODELS["timeout"]  # setup_cache compiles the whole grid

    def setup_cache(self):
        return tier.compile_models_grid(*self.params)

    def setup(self, cache, target, implementation, workload, phase, length):
        self.record = tier.model_record_for(cache, target, implementation, workload, phase, length)
