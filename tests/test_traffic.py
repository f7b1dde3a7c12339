"""Traces of real requests as stream lengths (core/traffic.py): reading, refusing, scaling, windows,
continuous batching, and the stream as a regime runs it."""

import os
import statistics

import pytest

from attnbench.core import regimes, traffic
from attnbench.core.workload import Workload


def write(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_shipped_traces_read_with_their_licence_beside_them():
    conv, code = traffic.load("azure-conv"), traffic.load("azure-code")
    assert len(conv.context) == 19366 and len(code.context) == 8819
    assert conv.generated is not None and conv.timestamps is not None
    assert min(conv.context) >= 1 and min(code.context) >= 1
    for name in ("LICENSE", "README.md"):
        assert os.path.isfile(os.path.join(traffic.TRACE_DIR, name))


@pytest.mark.parametrize("text, line, words", [
    ("", 1, "empty file"),
    ("TIMESTAMP,GeneratedTokens\n1,2\n", 1, "no ContextTokens"),
    ("ContextTokens,GeneratedTokens\n12,3\n-4,3\n", 3, "negative"),
    ("ContextTokens,GeneratedTokens\n12,3\n1.5,3\n", 3, "whole number"),
    ("ContextTokens,GeneratedTokens\n12,3\n7,x\n", 3, "whole number"),
    ("ContextTokens\n0\n", 2, "zero"),
    ("ContextTokens\n", 2, "no requests"),
])
def test_a_malformed_trace_names_its_file_and_line(tmp_path, text, line, words):
    path = write(tmp_path, text)
    with pytest.raises(traffic.TraceError) as caught:
        traffic.load(path)
    assert str(caught.value).startswith(f"{path}:{line}: ") and words in str(caught.value)
    assert isinstance(caught.value, ValueError)  # the CLI's exit 2


def test_a_missing_trace_is_an_unknown_name():
    with pytest.raises(KeyError, match="neither a file nor one of azure-conv"):
        traffic.load("no/such/trace.csv")


def test_a_one_column_file_of_lengths_is_a_trace(tmp_path):
    trace = traffic.load(write(tmp_path, "length\n5\n\n9\n"))
    assert trace.context == (5, 9) and trace.generated is None and trace.lines == (2, 4)


def test_a_request_over_the_model_context_is_named_by_its_line(tmp_path):
    trace = traffic.load(write(tmp_path, "ContextTokens,GeneratedTokens\n10,5\n90,20\n"))
    traffic.check_context(trace, 100, "prefill")  # 90 fits
    with pytest.raises(traffic.TraceError, match=r"trace.csv:3: a request of 110 tokens exceeds the model's "
                                                 r"context of 100"):
        traffic.check_context(trace, 100, "decode")


def test_scaling_maps_the_99th_percentile_to_the_maximum_and_clips_the_rest():
    trace = traffic.Trace("t", "t", tuple(range(1, 1001)), None, None, tuple(range(2, 1002)))
    stream = traffic.trace_stream(trace, "prefill", 100, batch=1, steps=1000, windows=1)
    assert stream.factor == pytest.approx(100 / 990.01, rel=1e-6)
    assert max(n for step in stream.steps for n in step) == 100
    assert stream.clipped == sum(1 for n in range(1, 1001) if -(-n * stream.factor // 1) > 100)
    assert 0 < stream.clipped <= 12
    unscaled = traffic.trace_stream(trace, "prefill", 5000, batch=1, steps=100, windows=4)
    assert unscaled.factor == 1.0 and unscaled.clipped == 0


def test_prefill_windows_take_requests_in_arrival_order_and_follow_the_trace():
    trace = traffic.load("azure-conv")
    stream = traffic.trace_stream(trace, "prefill", 1024, batch=2, steps=200, windows=8)
    assert len(stream.steps) == 200 and set(stream.window_of) == set(range(8))
    assert all(len(step) == 2 for step in stream.steps)
    assert stream.requests == 400
    assert stream.ks_distance() <= 0.05
    again = traffic.trace_stream(trace, "prefill", 1024, batch=2, steps=200, windows=8)
    assert again.steps == stream.steps  # the same for every kernel


def test_decode_is_continuous_batching_with_growing_caches():
    trace = traffic.Trace("t", "t", (10, 20, 30), (2, 1, 3), None, (2, 3, 4))
    stream = traffic.trace_stream(trace, "decode", 1000, batch=2, steps=4, windows=1)
    # slots: (10, 2 steps) and (20, 1 step); then 30 (3 steps) takes the freed slot
    assert stream.steps == ((10, 20), (11, 30), (31,), (32,))
    with pytest.raises(ValueError, match="need 5 steps"):
        traffic.trace_stream(trace, "decode", 1000, batch=2, steps=5, windows=1)


def test_decode_of_the_conversation_trace_follows_it():
    stream = traffic.trace_stream(traffic.load("azure-conv"), "decode", 1024, batch=4, steps=200, windows=8)
    assert len(stream.steps) == 200 and stream.ks_distance() <= 0.05


def test_ks_distance():
    assert traffic.ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert traffic.ks_distance([1, 1], [5, 5]) == 1.0
    with pytest.raises(ValueError):
        traffic.ks_distance([], [1])


class CountingRunner:
    """Compiles each new length once; a step takes its length in microseconds of nothing."""

    execution = "compiled"

    def __init__(self):
        self.seen = set()

    def prepare(self, length):
        pass

    def step(self, length):
        self.seen.add(length)

    def compiles(self):
        return len(self.seen)

    def compile_seconds(self):
        return 0.0

    def cache_hits(self):
        return 0


@pytest.mark.parametrize("regime, shapes", [("static", {64}), ("dynamic", {10, 64, 30}),
                                            ("bucketed", {16, 64, 32})])
def test_a_trace_step_pads_its_batch_by_the_regime(regime, shapes):
    template = Workload(batch=2, q_heads=1, head_dim=8, seq_q=64, seq_k=64, causal=True, mode="fwd")
    steps = [(10, 4), (64, 1), (30, 2)]
    result = regimes.run_regime("k", CountingRunner(), template, regime, steps, "multiple-16",
                                windows=[0, 0, 1])
    assert set(result.shapes) == shapes
    padded = {"static": 64 * 3, "dynamic": 10 + 64 + 30, "bucketed": 16 + 64 + 32}[regime]
    assert result.padding_waste == pytest.approx(1 - (14 + 65 + 32) / (2 * padded))
    assert [w["useful_tokens"] for w in result.windows()] == [14 + 65, 32]
    assert result.latency(99) >= result.latency(50) >= 0
    assert result.planned_steps == 3


def test_a_stream_budget_cuts_the_stream_and_says_how_long_it_was():
    template = Workload(batch=1, q_heads=1, head_dim=8, seq_q=64, seq_k=64, causal=True, mode="fwd")
    result = regimes.run_regime("k", CountingRunner(), template, "dynamic", [5, 6, 7, 8], budget_s=0.0)
    assert len(result.trace) == 1 and result.planned_steps == 4


def test_stream_of_uniform_is_the_labelled_synthetic_baseline():
    workload = Workload(batch=2, q_heads=1, head_dim=8, seq_q=64, seq_k=64, causal=True, mode="fwd")
    _, stream = regimes.stream_of(workload, 6, seed=0)
    assert stream.source == "uniform" and stream.label.startswith("synthetic")
    assert [step[0] for step in stream.steps] == regimes.length_stream(64, 6, 0)
    assert stream.population is None
    _, traced = regimes.stream_of(workload, 16, seed=0, traffic="azure-code", windows=4)
    assert traced.source == "azure-code" and len(traced.steps) == 16 and traced.max_len == 64


def test_a_static_stream_runs_a_spread_subset_and_counts_the_rest_at_its_steady_mean():
    template = Workload(batch=1, q_heads=1, head_dim=8, seq_q=64, seq_k=64, causal=True, mode="fwd")
    window_of = [w for w in range(4) for _ in range(5)]
    chosen = regimes.spread_steps(window_of, 8)
    assert chosen == [0, 1, 5, 6, 10, 11, 15, 16]
    runner = CountingRunner()
    result = regimes.run_regime("k", runner, template, "static", list(range(1, 21)), windows=window_of,
                                run_only=chosen)
    assert len(result.trace) == 20 and sum(t.timed for t in result.trace) == 8
    warm = [t.seconds for t in result.trace if t.timed][1:]  # the first call compiled
    assert {t.seconds for t in result.trace if not t.timed} == {statistics.fmean(warm)}
    assert result.padding_waste == pytest.approx(1 - sum(range(1, 21)) / (64 * 20))
    assert [w["useful_tokens"] for w in result.windows()] == [15, 40, 65, 90]
    with pytest.raises(ValueError, match="static"):
        regimes.run_regime("k", runner, template, "dynamic", [1, 2], run_only=[0])


def test_a_static_stream_runs_its_few_timed_steps_whatever_the_budget():
    template = Workload(batch=1, q_heads=1, head_dim=8, seq_q=64, seq_k=64, causal=True, mode="fwd")
    result = regimes.run_regime("k", CountingRunner(), template, "static", [5, 6, 7, 8], budget_s=0.0,
                                run_only=[0, 2])
    assert len(result.trace) == 4 and sum(t.timed for t in result.trace) == 2


def test_a_tuned_tile_runs_every_shorter_step_of_its_stream():
    """The kept config is checked at the stream's longest length; a shorter step runs it (a tile longer
    than the step pads, as at the defaults), where a workload of that length alone refuses it."""
    pytest.importorskip("jax")
    import attention_impls
    from attention_impls.base import Unsupported
    from attnbench.backends import here

    impl = attention_impls.get("jax-blockwise-flash").with_config((("block_q", 256), ("block_k", 512)))
    template = Workload(batch=1, q_heads=2, head_dim=16, seq_q=1024, seq_k=1024, causal=True, mode="fwd")
    runner = here.make_runner(impl, template, 0)
    for length in (37, 300):
        runner.prepare(length)
        runner.step(length)
    with pytest.raises(Unsupported, match="only pad"):
        here.make_step(impl, template.at_length(300))
