"""The asv suite: the same attention workloads, forced-flash vs native, across lengths and shapes.

Thin classes over ``attnbench.asv.suite``: ``setup_cache`` measures every case once per
environment and commit (through the engine, in workers: ``SuiteSize.fresh_process``) and every ``track_*``
benchmark reads one metric of that one measurement. With ``ATTNBENCH_CASE_CACHE`` set (a fleet
run), that measurement is kept one file per case and shared by every later ``asv run`` of the
same commit, so a run split into benchmark groups or restarted after a preemption measures each
case once (``attnbench/run/case_cache.py``); the first class measured then measures the other
class's cases in the same sweep, and the other class reads them (``make bench`` uses a cache that
lives for its run for just this: one set of timing-round workers per environment, not one per
class). Cases an implementation cannot run here are
skipped (``NotImplementedError`` in ``setup``: asv shows n/a) with the implementation's reason.
"""

import itertools

from attnbench.asv import sizes, suite
from attnbench.core.regimes import REGIMES

SIZE = sizes.suite_size()  # ATTNBENCH_SUITE=default|full: the lengths measured
DTYPES = sizes.suite_dtypes(SIZE)  # the size's on a CPU; float32+bfloat16 on a GPU, bfloat16 on a TPU
# Training has no dtype parameter: the suite's first, float32 on a CPU, bfloat16 on a GPU or TPU
# (FlashAttention-2 and cuDNN refuse float32; a TPU runs bfloat16 only).
TRAINING_DTYPE = DTYPES[0]


def _track(metric):
    def track(self, cache, *params):
        return metric.asv_value(self.record)

    track.__name__ = f"track_{metric.name}"
    track.unit = metric.unit
    track.version = suite.METRIC_VERSION
    return track


def with_metrics(cls):
    """Give a class one ``track_<metric>`` per row of the metric table (``attnbench/core/metrics.py``)."""
    for metric in suite.tracked_metrics():
        setattr(cls, f"track_{metric.name}", _track(metric))
    return cls


def cases_of(cls):
    """``(impl, workload, regime)`` of every parameter combination of ``cls`` that is a case
    (``cls.case_of``: ``None`` for a combination that is none, e.g. a phase a preset lacks)."""
    cases = (cls.case_of(*params) for params in itertools.product(*cls.params))
    return [case for case in cases if case is not None]


def sweep_of(cls) -> dict:
    """What ``cls``'s ``setup_cache`` hands ``measure_suite``: its cases, and with a case cache the
    other classes' cases, measured in the same sweep and handed over through the cache."""
    others = {other.__name__: other.cases() for other in MEASURED if other is not cls}
    return {"cases": cls.cases(), "benchmark": cls.__name__, "also": others, "cache": suite.run_case_cache()}


@with_metrics
class Forward:
    """Causal forward pass, B1 H8 D64: implementation x sequence length x shape regime x dtype."""

    params = (sizes.impl_names(), list(SIZE.forward_seqs), list(REGIMES), list(DTYPES))
    param_names = ["implementation", "seq_len", "regime", "dtype"]
    timeout = 3600  # setup_cache measures the whole class

    @staticmethod
    def workload(seq_len, dtype):
        return sizes.FORWARD.replace(seq_q=seq_len, seq_k=seq_len, dtype=dtype)

    @classmethod
    def cases(cls):
        return cases_of(cls)

    @classmethod
    def case_of(cls, implementation, seq_len, regime, dtype):
        return implementation, cls.workload(seq_len, dtype), regime

    def setup_cache(self):
        return suite.measure_suite(**sweep_of(Forward))

    def setup(self, cache, implementation, seq_len, regime, dtype):
        key = suite.case_key(implementation, self.workload(seq_len, dtype), regime)
        self.record = suite.record_for(cache, key)


@with_metrics
class Training:
    """Causal forward + backward, B1 H8 D64, static shapes: implementation x sequence length
    (float32 on a CPU, bfloat16 on a GPU or TPU)."""

    params = (sizes.impl_names(), list(SIZE.training_seqs))
    param_names = ["implementation", "seq_len"]
    timeout = 3600

    @staticmethod
    def workload(seq_len):
        return sizes.TRAINING.replace(seq_q=seq_len, seq_k=seq_len, dtype=TRAINING_DTYPE)

    @classmethod
    def cases(cls):
        return cases_of(cls)

    @classmethod
    def case_of(cls, implementation, seq_len):
        return implementation, cls.workload(seq_len), "static"

    def setup_cache(self):
        return suite.measure_suite(**sweep_of(Training))

    def setup(self, cache, implementation, seq_len):
        key = suite.case_key(implementation, self.workload(seq_len), "static")
        self.record = suite.record_for(cache, key)


@with_metrics
class Models:
    """Real models' attention (``python -m attnbench workloads``): implementation x preset x phase x
    shape regime, in the suite's first dtype. Each preset keeps its heads, head dim and mask; the
    lengths are the suite size's (``attnbench/core/presets.py`` SIZES: default prefill 512 tokens and
    decode 1 token x 4 ragged caches of up to 1024 keys; full and gpu: the models' own, 8k tokens and
    32k caches), and a regime's stream draws the phase's lengths as Forward's does (the cache's for
    decode). Every preset has its static stream (pad to max), so the verdict prices each; the
    other streams are the size's ``regime_presets`` and ``preset_regimes`` (default: llama-3.1-8b's
    phases and gemma-2-9b decode, exact lengths; full: every preset and regime). The
    implementations are the size's (``asv.sizes.preset_impl_names``). A phase a preset lacks (an
    encoder's decode) is n/a."""

    params = (sizes.preset_impl_names(SIZE), list(SIZE.model_presets),
              list(SIZE.model_phases), list(REGIMES))
    param_names = ["implementation", "workload", "phase", "regime"]
    timeout = 3600

    @staticmethod
    def workloads():
        return sizes.preset_workloads(SIZE, dtype=TRAINING_DTYPE)

    @classmethod
    def cases(cls):
        return cases_of(cls)

    @classmethod
    def case_of(cls, implementation, workload, phase, regime):
        found = cls.workloads().get((workload, phase))
        return None if found is None else (implementation, found, regime)

    def setup_cache(self):
        return suite.measure_suite(**sweep_of(Models))

    def setup(self, cache, implementation, workload, phase, regime):
        found = self.workloads().get((workload, phase))
        if found is None:
            raise NotImplementedError(f"{workload} has no {phase} phase")
        self.record = suite.record_for(cache, suite.case_key(implementation, found, regime))


MEASURED = (Forward, Training, Models)  # the classes whose cases one sweep can measure together
