"""The horizon a production answer is priced at (report/horizon.py): parsing it, a trace's request
rate, the server's compiles capped at the shapes its way can meet, and the verdict's cold-start,
serving and horizon columns with where the answer flips."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")

from attnbench.core import traffic  # noqa: E402
from attnbench.report import horizon, streams, verdict  # noqa: E402
from attnbench.report.horizon import Horizon  # noqa: E402
from tests.test_production import _stream_rows  # noqa: E402
from tests.test_verdict import MEASURED_STEPS, _case, _frame, _only  # noqa: E402


@pytest.mark.parametrize("text, expected", [
    ("24h", Horizon(24.0, "hours")), ("2.5 hours", Horizon(2.5, "hours")),
    ("1,000,000", Horizon(1e6, "steps")),
    ("1e6 steps", Horizon(1e6, "steps")), ("300", Horizon(300.0, "steps")), (None, Horizon(24.0, "hours")),
])
def test_a_horizon_is_steps_or_hours(text, expected):
    assert horizon.parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ("0", "must be more than 0"), ("-3", "must be more than 0"), ("0h", "must be more than 0"),
    ("3days", "unit must be steps or h"), ("1.5", "in steps must be a whole number"),
    ("soon", "a number of steps or hours"),
])
def test_a_bad_horizon_names_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        horizon.parse(text)


def test_hours_become_steps_at_the_rate_given_and_only_then():
    assert Horizon(2.0, "hours").steps(1000.0) == 2000
    assert Horizon(2.0, "hours").steps(None) is None
    assert Horizon(500.0, "steps").steps(None) == 500


def _trace(tmp_path, rows: str):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    return traffic.read_trace(str(path))


def test_a_traces_rate_is_its_requests_over_the_span_of_its_timestamps(tmp_path):
    trace = _trace(tmp_path, "2023-11-16 18:00:00.0,10,1\n2023-11-16 18:30:00.0,10,1\n"
                             "2023-11-16 19:00:00.0000000,10,1\n")
    assert traffic.requests_per_hour(trace) == pytest.approx(2.0)
    assert traffic.requests_per_hour(traffic.read_trace(str(_untimed(tmp_path)))) is None
    assert traffic.requests_per_hour(traffic.load("azure-conv")) == pytest.approx(19908.5, rel=1e-4)


def _untimed(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("length\n10\n20\n")
    return path


def test_a_bad_timestamp_names_its_line(tmp_path):
    trace = _trace(tmp_path, "2023-11-16 18:00:00,10,1\nyesterday,10,1\n")
    with pytest.raises(traffic.TraceError, match=r"trace.csv:3: TIMESTAMP 'yesterday' is not an ISO 8601"):
        traffic.requests_per_hour(trace)


FIGURES = dict(steady_usd=1e-6, usd_with_compiles=3e-6, usd_per_mtok=4e-3, compiles=4, max_len=1024,
               measured_steps=50, traced=True)


def test_a_server_compiles_each_shape_once_so_a_trace_streams_compiles_stop_at_its_shapes():
    possible = streams.possible_shapes("bucketed", 1024, True)
    assert possible == 8  # 1..1024 in multiples of 128
    # 4 shapes in 50 steps: twice as many in 100 steps, then no more than the 8 there are
    assert streams.price_stream(**FIGURES, regime="bucketed", steps=100, shapes=4)["compiles"] == \
        pytest.approx(8)
    far = streams.price_stream(**FIGURES, regime="bucketed", steps=10**9, shapes=4)
    assert far["compiles"] == pytest.approx(8)
    assert far["stall_usd"] == pytest.approx(50 * 2e-6 * 8 / 4)
    # without the shapes recorded it compiles on at its measured rate, as before
    assert streams.price_stream(**FIGURES, regime="bucketed", steps=10**4)["compiles"] == pytest.approx(800)


def _server_pair():
    """A forced kernel dearer over its cold start (a long compile) and cheaper serving."""
    forced = _stream_rows(_case("jax-blockwise-flash", "forced-flash", step=0.010,
                                regimes={"static": (1.0e-6, 3.0e-6, 1)}), "static")
    native = _stream_rows(_case("jax-xla", "native", step=0.012,
                                regimes={"static": (1.2e-6, 1.25e-6, 1)}), "static")
    return _frame(forced, native)


def test_the_answer_is_priced_at_the_horizon_beside_cold_start_and_serving():
    row = _only(verdict.measured_verdicts(_server_pair()), framework="jax")
    rate = traffic.requests_per_hour(traffic.load("azure-code"))
    # the default: a day of the code trace, one request a step (6 requests in 6 steps)
    assert row["horizon_steps"] == round(24 * rate)
    assert row["horizon"] == f"24 h = {round(24 * rate):,} steps"
    assert row["cold_start"] == "native" and row["cold_start_ratio"] > 1
    assert row["serving"] == "forced" and row["serving_ratio"] == pytest.approx(1.0 / 1.2, rel=0.02)
    assert row["answer"] == "forced"
    # forced pays back its compile: 6 x 2e-6 stalled against 6 x 0.05e-6, 0.2e-6 a step saved
    assert row["break_even_of"] == "jax-blockwise-flash"
    assert row["break_even"] == pytest.approx((12e-6 - 0.3e-6) / 0.2e-6, abs=2)
    assert row["holds"].startswith(f"jax-blockwise-flash cheaper from {row['break_even']:,} steps (")
    assert row["forced_cold_start_s"] > row["native_cold_start_s"] > 0


def test_at_the_measured_streams_length_the_answer_is_the_cold_starts():
    row = _only(verdict.measured_verdicts(_server_pair(), horizon=Horizon(MEASURED_STEPS, "steps")),
                framework="jax")
    assert row["answer"] == row["cold_start"] == "native"
    assert row["ratio"] == pytest.approx(row["cold_start_ratio"])


def test_a_stream_without_a_request_rate_is_priced_over_its_measured_steps_and_says_so():
    forced = _stream_rows(_case("jax-blockwise-flash", "forced-flash", step=0.010,
                                regimes={"static": (1.0e-6, 3.0e-6, 1)}), "static", traffic="uniform")
    native = _stream_rows(_case("jax-xla", "native", step=0.012,
                                regimes={"static": (1.2e-6, 1.25e-6, 1)}), "static", traffic="uniform")
    row = _only(verdict.measured_verdicts(_frame(forced, native)), framework="jax")
    assert row["horizon_steps"] == MEASURED_STEPS
    assert "the trace has no request rate here: the 24 h horizon cannot be priced" in row["reasons"]
    # a horizon in steps needs no rate
    row = _only(verdict.measured_verdicts(_frame(forced, native), horizon=Horizon(10**6, "steps")),
                framework="jax")
    assert row["horizon_steps"] == 10**6 and row["answer"] == "forced"
