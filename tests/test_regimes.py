"""Shape regimes: the seeded length stream, bucket policies, padding arithmetic, and compile counts
that real frameworks report through ``impl.make_runner`` (jax-xla compiles; eager torch does not)."""

from __future__ import annotations

import time

import pytest

from attention_impls.base import Unsupported
from attnbench.backends import here
from attnbench.backends.base import Runner
from attnbench.core.regimes import (
    REGIMES,
    bucket,
    bucket_policy,
    length_stream,
    padded_length,
    run_regime,
    runner_template,
    trace_to_rows,
)
from attnbench.core.workload import Workload
from tests.conftest import FRAMEWORKS

needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")
needs_torch = pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")


# -- the length stream ---------------------------------------------------------------------------
def test_length_stream_is_seeded_and_in_bounds():
    a = length_stream(512, 200, seed=3)
    assert a == length_stream(512, 200, seed=3)
    assert a != length_stream(512, 200, seed=4)
    assert len(a) == 200 and all(type(n) is int for n in a)
    assert min(a) >= 256 and max(a) <= 512
    assert len(set(a)) > 50  # uniform over [256, 512], not a constant
    b = length_stream(300, 100, seed=0, low_frac=0.1)
    assert min(b) >= 30 and max(b) <= 300
    assert set(length_stream(64, 10, seed=0, low_frac=1.0)) == {64}
    assert set(length_stream(1, 5, seed=0)) == {1}
    assert set(length_stream(10, 50, seed=0, low_frac=0.0)) <= set(range(1, 11))  # never 0
    assert length_stream(64, 0, seed=0) == []


@pytest.mark.parametrize("kwargs", [dict(max_len=0, steps=3), dict(max_len=8, steps=-1),
                                    dict(max_len=8, steps=3, low_frac=1.5)])
def test_length_stream_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        length_stream(seed=0, **kwargs)


# -- bucket policies -----------------------------------------------------------------------------
@pytest.mark.parametrize("policy, cases", [
    ("multiple-128", {1: 128, 127: 128, 128: 128, 129: 256, 300: 384}),
    ("multiple-48", {1: 48, 48: 48, 49: 96}),
    ("multiple-1", {7: 7}),
    ("pow2", {1: 1, 2: 2, 3: 4, 64: 64, 65: 128, 300: 512}),
])
def test_bucket_policies_round_up(policy, cases):
    rule = bucket_policy(policy)
    assert {n: rule(n) for n in cases} == cases


def test_buckets_are_capped_at_max_len():
    assert bucket(290, "multiple-128", 300) == 300  # not 384: never more than the static shape
    assert bucket(200, "multiple-128", 300) == 256
    assert bucket(300, "pow2", 300) == 300
    assert bucket(200, "pow2", 512) == 256
    with pytest.raises(ValueError, match="outside"):
        bucket(301, "pow2", 300)


@pytest.mark.parametrize("name", ["pow3", "multiple-0", "multiple-x", "multiple", "", "Multiple-128"])
def test_bad_policy_names_the_name_and_the_valid_forms(name):
    with pytest.raises(ValueError) as err:
        bucket_policy(name)
    for words in (repr(name), "multiple-128", "pow2", "multiple-N"):
        assert words in str(err.value)


def test_padded_length_per_regime():
    assert [padded_length(200, r, 512) for r in REGIMES] == [512, 200, 256, 512]
    assert padded_length(200, "bucketed", 512, policy="pow2") == 256
    assert padded_length(200, "bucketed", 512, policy="multiple-64") == 256
    assert padded_length(129, "bucketed", 512, policy="multiple-64") == 192
    with pytest.raises(ValueError, match="regime"):
        padded_length(200, "ragged", 512)


# -- the engine on a fake framework: padding and time arithmetic by hand --------------------------
def run_fake(fake, template, *args, **kwargs):
    """``run_regime`` of a fake kernel's fresh runner."""
    return run_regime(fake.name, fake.make_runner(template, 0), template, *args, **kwargs)


def run_kernel(kernel, template, *args, **kwargs):
    """``run_regime`` of a real kernel's fresh runner, as the engine makes it."""
    runner = here.make_runner(kernel, runner_template(template, args[0] if args else kwargs["regime"]))
    return run_regime(kernel.name, runner, template, *args, **kwargs)


class FakeCompiler:
    """An implementation whose runner "compiles" (sleeps ``stall`` s) on each new length."""

    name = "fake-compiler"

    def __init__(self, stall=0.05, step=0.001, reports=True):
        self.stall, self.step_s, self.reports = stall, step, reports
        self.runners = self.calls = 0

    def make_runner(self, template, seed=0):
        self.runners += 1
        seen = set()

        def call(length):
            self.calls += 1
            if length not in seen:
                seen.add(length)
                time.sleep(self.stall)
            time.sleep(self.step_s)

        return Runner(template, "compiled", place=lambda w: w.seq_q, call=call,
                      count_compiles=(lambda: len(seen)) if self.reports else (lambda: None))


TEMPLATE = Workload(batch=2, q_heads=2, seq_q=300, head_dim=32, causal=True)


def test_padding_waste_by_hand():
    lengths = [100, 200, 300, 100]
    static = run_fake(FakeCompiler(0, 0), TEMPLATE, "static", lengths)
    assert [t.padded_length for t in static.trace] == [300] * 4
    assert static.padding_waste == pytest.approx(1 - 700 / 1200)
    bucketed = run_fake(FakeCompiler(0, 0), TEMPLATE, "bucketed", lengths)
    assert [t.padded_length for t in bucketed.trace] == [128, 256, 300, 128]
    assert bucketed.padding_waste == pytest.approx(1 - 700 / (128 + 256 + 300 + 128))
    # attention FLOPs grow with length squared: padding wastes a larger share of them (causal: the
    # template's pairs are exactly S(S+1)/2)
    def pairs(n):
        return n * (n + 1) // 2 if TEMPLATE.causal else n * n

    flops = sum(pairs(n) for n in (100, 200, 300, 100))
    padded = sum(pairs(n) for n in (128, 256, 300, 128))
    assert bucketed.padding_flops_waste == pytest.approx(1 - flops / padded)
    dynamic = run_fake(FakeCompiler(0, 0), TEMPLATE, "dynamic", lengths)
    assert dynamic.padding_waste == 0 and dynamic.padding_flops_waste == 0


def test_compile_flags_steady_time_and_stalls_in_throughput():
    lengths = [100, 200, 100, 100, 200, 300, 100]
    fake = FakeCompiler(stall=0.05, step=0.001)
    result = run_fake(fake, TEMPLATE, "dynamic", lengths)
    assert fake.runners == 1  # one runner (one compiled function) for the whole stream
    assert [t.compiled for t in result.trace] == [True, True, False, False, False, True, False]
    assert result.compiles == 3 and result.shapes == (100, 200, 300)
    assert result.total_seconds == pytest.approx(sum(t.seconds for t in result.trace))
    assert result.useful_tokens_per_s == pytest.approx(2 * sum(lengths) / result.total_seconds)
    assert result.steady_seconds_per_step < 0.04
    steady_only = result.steady_seconds_per_step * len(lengths)
    assert result.total_seconds > steady_only + 3 * 0.045  # the three stalls are in the total
    assert result.stall_seconds >= 3 * 0.045
    assert result.compile_seconds_total is None  # the fake does not time its compiles


def test_a_decode_stream_varies_its_cache_and_counts_its_queries_as_useful():
    """Decode's stream is its cache length (a serving loop's caches differ and grow): the new queries
    stay one per sequence, the useful tokens are those queries, and the padding is the cache's."""
    decode = Workload(batch=2, q_heads=2, seq_q=1, seq_k=512, head_dim=32, causal=True, ragged=True)
    seen = []

    class Caches(FakeCompiler):
        def make_runner(self, template, seed):
            runner = super().make_runner(template, seed)
            runner.place = lambda w: seen.append((w.seq_q, w.seq_k)) or w.seq_k
            return runner

    lengths = [300, 512, 300]
    result = run_fake(Caches(0, 0), decode, "bucketed", lengths)
    assert seen == [(1, 384), (1, 512)]  # each padded cache placed once, the queries fixed
    assert result.max_len == 512 and result.shapes == (384, 512)
    assert result.padding_waste == pytest.approx(1 - 1112 / (384 + 512 + 384))
    assert result.useful_tokens_per_s == pytest.approx(2 * 3 / result.total_seconds)


def test_a_framework_that_does_not_report_compiles_gets_none_flags():
    result = run_fake(FakeCompiler(0.0, 0.0, reports=False), TEMPLATE, "dynamic", [100, 100, 200])
    assert [t.compiled for t in result.trace] == [None, None, None]
    assert result.compiles is None
    assert result.steady_seconds_per_step is not None  # from the repeated length


def test_bad_arguments_fail_before_anything_runs():
    fake = FakeCompiler()
    with pytest.raises(ValueError, match="pow3"):
        run_fake(fake, TEMPLATE, "static", [100], policy="pow3")
    with pytest.raises(ValueError, match="regime"):
        run_fake(fake, TEMPLATE, "ragged", [100])
    with pytest.raises(ValueError, match="max_len=300"):
        run_fake(fake, TEMPLATE, "dynamic", [100, 301])
    assert fake.calls == 0  # no step ran


def test_trace_rows_leave_cost_to_the_engine():
    result = run_fake(FakeCompiler(0, 0), TEMPLATE, "bucketed", [100, 290], policy="pow2")
    rows = trace_to_rows(result)
    got = [(r["length"], r["padded_length"], r["tokens"]) for r in rows]
    assert got == [(100, 128, 200), (290, 300, 580)]
    assert all(r["usd"] is None and r["regime"] == "bucketed" and r["policy"] == "pow2" for r in rows)
    assert set(rows[0]) >= {"impl", "step", "compiled", "seconds", "usd"}


# -- real frameworks ------------------------------------------------------------------------------
def impl(name):
    import attention_impls

    return attention_impls.get(name)


SMALL = Workload(batch=1, q_heads=2, seq_q=256, head_dim=32, causal=True)
SHAPE_REGIMES = ("static", "dynamic", "bucketed")  # the ways that pad, each a length per step
# A stream with repeats: 7 seeded lengths in [128, 256], then three of them again.
STREAM = length_stream(256, 7, seed=11) + length_stream(256, 7, seed=11)[:3]


def first_occurrences(values):
    seen, flags = set(), []
    for v in values:
        flags.append(v not in seen)
        seen.add(v)
    return flags


@pytest.fixture(scope="module")
def jax_regimes():
    return {r: run_kernel(impl("jax-xla"), SMALL, r, STREAM, policy="multiple-64") for r in SHAPE_REGIMES}


@needs_jax
@pytest.mark.slow
def test_jax_compiles_once_per_shape_in_each_regime(jax_regimes):
    static, dynamic, bucketed = (jax_regimes[r] for r in SHAPE_REGIMES)
    assert len(set(STREAM)) == 7
    assert static.compiles == 1 and static.shapes == (256,)
    assert dynamic.compiles == len(set(STREAM))
    buckets = {bucket(n, "multiple-64", 256) for n in STREAM}
    assert bucketed.compiles == len(buckets) == len(bucketed.shapes) and len(buckets) >= 2
    for result in (static, dynamic, bucketed):
        padded = [t.padded_length for t in result.trace]
        assert [t.compiled for t in result.trace] == first_occurrences(padded)
        assert result.execution == "compiled"
        assert 0 < result.compile_seconds_total < result.total_seconds


@needs_jax
def test_jax_throughput_pays_for_its_compile_stalls(jax_regimes):
    for result in jax_regimes.values():
        tokens = SMALL.batch * sum(STREAM)
        assert result.useful_tokens_per_s == pytest.approx(tokens / result.total_seconds)
        assert result.total_seconds > result.steady_seconds_per_step * len(STREAM)
        assert result.stall_seconds > 0
    static, dynamic, _ = (jax_regimes[r] for r in SHAPE_REGIMES)
    assert dynamic.padding_waste == 0 < static.padding_waste
    assert dynamic.total_seconds > static.total_seconds  # 7 compiles cost more than padding here


@needs_jax
def test_jax_runner_reuses_one_jit_for_fwd_bwd():
    runner = here.make_runner(impl("jax-xla"), SMALL.replace(mode="fwd_bwd", causal=False))
    counts = []
    for length in (64, 64, 96, 64):
        runner.prepare(length)
        runner.step(length)
        counts.append(runner.compiles())
    assert counts == [1, 1, 2, 2]
    assert runner.compile_seconds() > 0


@needs_jax
def test_pallas_interpret_runner_runs_in_its_context_and_refuses_unaligned_lengths():
    runner = here.make_runner(impl("jax-pallas-tpu-flash"), SMALL.replace(head_dim=64))
    assert runner.execution == "interpret"
    for length in (128, 256, 128):
        runner.step(length)  # outside force_tpu_interpret_mode this would raise on CPU
    assert runner.compiles() == 2
    with pytest.raises(Unsupported, match="multiple of the 128"):
        runner.prepare(200)


@needs_torch
def test_eager_torch_never_compiles():
    result = run_kernel(impl("torch-sdpa-math"), SMALL, "dynamic", STREAM)
    assert result.compiles == 0 and result.compile_seconds_total == 0.0
    assert all(t.compiled is False for t in result.trace)
    assert result.execution == "eager" and result.stall_seconds == 0
