"""The production answer measured on a trace's stream: what it rests on (measured or modelled), its
widening by the trace windows, the streams table and the length histograms (report/production.py)."""

from __future__ import annotations

import json
import math

import pytest

pd = pytest.importorskip("pandas")

from attnbench.report import production, streams, verdict, verdict_display  # noqa: E402
from attnbench.report.horizon import Horizon  # noqa: E402
from tests.test_verdict import MEASURED_STEPS, _case, _frame, _only  # noqa: E402

FIGURES = dict(steady_usd=1e-6, usd_with_compiles=3e-6, usd_per_mtok=4e-3, compiles=4, max_len=1024,
               measured_steps=50)


def test_a_trace_stream_compiles_on_at_its_measured_rate_beyond_its_steps():
    traced = streams.price_stream(**FIGURES, regime="dynamic", steps=200, traced=True)
    assert traced["compiles"] == pytest.approx(16)
    tokens = 3e-6 * 1e6 / 4e-3
    stalls = 50 * 2e-6 * 200 / 50
    assert traced["usd_per_mtok"] == pytest.approx((200 * 1e-6 + stalls) * 1e6 / (200 * tokens))
    # at its own steps it is what was measured, traced or not
    assert streams.price_stream(**FIGURES, regime="dynamic", steps=50, traced=True)["usd_per_mtok"] == \
        pytest.approx(4e-3)


def test_a_static_stream_compiles_once_whatever_its_length():
    once = streams.price_stream(**{**FIGURES, "compiles": 1}, regime="static", steps=1000, traced=True)
    assert once["compiles"] == 1
    assert once["stall_share"] == pytest.approx(100e-6 / (1000 * 1e-6 + 100e-6))


def _stream_rows(rows, regime, *, traffic="azure-code", steps=MEASURED_STEPS, planned=MEASURED_STEPS,
                 windows=(1.0, 1.0), tokens=(100, 100)):
    """``rows`` of a ``_case`` with the stream fields the sidecar records on ``regime``'s rows."""
    for row in rows:
        if row["regime"] == regime:
            row.update(traffic=traffic, regime_steps=float(steps), stream_steps_planned=float(planned),
                       window_seconds=json.dumps(list(windows)),
                       window_useful_tokens=json.dumps(list(tokens)),
                       traffic_ks=0.03, distinct_shapes=3.0, latency_p50_s=0.001, latency_p95_s=0.002,
                       latency_p99_s=0.004, longest_stall_s=0.5, stream_steps_timed=float(steps),
                       traffic_requests=float(planned))
    return rows


def _pair(**native_stream):
    forced = _stream_rows(_case("jax-blockwise-flash", "forced-flash", step=0.010,
                                regimes={"static": (1e-6, 1.1e-6, 1)}), "static",
                          windows=(1.0, 2.0, 1.0), tokens=(100, 100, 100))
    native = _stream_rows(_case("jax-xla", "native", step=0.012, regimes={"static": (1.2e-6, 1.3e-6, 1)}),
                          "static", **{"windows": (1.0, 1.0, 1.0), "tokens": (100, 100, 100),
                                       **native_stream})
    return _frame(forced, native)


def test_the_production_answer_says_it_was_measured_on_the_trace():
    table = verdict.measured_verdicts(_pair(), horizon=Horizon(MEASURED_STEPS, "steps"))
    row = _only(table, framework="jax")
    assert row["production"] == f"measured: {MEASURED_STEPS} steps of the code trace"
    assert row["production_steps"] == MEASURED_STEPS and row["production_measured"] is None
    assert verdict_display.production_short(row.to_dict()) == f"measured, {MEASURED_STEPS} steps, code trace"
    assert f"over {MEASURED_STEPS} steps of the code trace (measured)" in row["sentence"]


def test_a_longer_stream_or_a_cut_one_is_modelled_beyond_what_ran_and_says_so():
    longer = _only(verdict.measured_verdicts(_pair(), horizon=Horizon(1000, "steps")), framework="jax")
    assert longer["production"] == "modelled beyond the 6 measured steps: 1,000 steps of the code trace"
    assert verdict_display.production_short(longer.to_dict()) == "modelled beyond 6 of 1,000 steps"
    cut = _only(verdict.measured_verdicts(_pair(steps=3), horizon=Horizon(MEASURED_STEPS, "steps")),
                framework="jax")
    assert cut["production_measured"] == 3 and "jax-xla pad to max measured 3" in cut["production"]


def test_the_trace_windows_widen_the_production_interval():
    # the first window (the cold start: the stall term's) is left out
    forced = {"static:window_seconds": [9.0, 2.0, 1.0, 2.0], "static:window_tokens": [100, 100, 100, 100]}
    native = {"static:window_seconds": [1.0, 1.0, 1.0, 1.0], "static:window_tokens": [100, 100, 100, 100]}
    logs = [math.log(2), 0.0, math.log(2)]
    mean = sum(logs) / 3
    expected = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2 / 3)
    assert verdict.window_spread(forced, "static", native, "static") == pytest.approx(expected)
    assert verdict.window_spread(forced, "static", {}, "static") == 0.0  # nothing recorded: no widening
    steady = _only(verdict.measured_verdicts(_pair(windows=(1.0, 1.0, 1.0), tokens=(100, 100, 100))),
                   framework="jax")
    varied = _only(verdict.measured_verdicts(_pair(windows=(1.0, 1.0, 3.0), tokens=(100, 100, 100))),
                   framework="jax")
    assert varied["ratio_high"] / varied["ratio_low"] > steady["ratio_high"] / steady["ratio_low"]


def test_the_streams_table_shows_what_a_server_sees_per_kernel_and_regime():
    table = production.stream_table(_pair(steps=3, planned=6))
    assert list(table.columns) == production.STREAM_COLUMNS
    native = table[table["kernel"] == "jax-xla"].iloc[0]
    assert native["trace"] == "azure-code" and native["steps"] == "3 of 6 (cut by the stream budget)"
    assert native["p99 ms"] == "4" and native["longest stall ms"] == "500" and native["KS"] == "0.030"
    assert native["compiles"] == "1" and native["padding"] == "10%"


def test_the_length_histograms_are_drawn_for_trace_streams_only():
    frame = _pair()
    for rows in (frame,):
        rows["traffic_requests"] = float(MEASURED_STEPS)  # B1: a request per step
    png = production.plot_lengths(frame)
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    found = production.rebuilt_streams(frame)
    assert len(found) == 1 and found[0]["stream"].batch == 1 and found[0]["stream"].max_len == 1024
    assert production.plot_lengths(_frame(_case("jax-xla", "native", step=0.01))) is None


def test_the_verdict_picture_marks_measured_points_and_the_modelled_rest():
    rows = []
    for impl, label in (("jax-blockwise-flash", "forced-flash"), ("jax-xla", "native")):
        case = _case(impl, label, step=0.01,
                     regimes={"static": (1e-6, 1.1e-6, 1), "dynamic": (5e-7, 9e-7, 3)})
        rows += _stream_rows(_stream_rows(case, "static"), "dynamic")
    frame = _frame(rows)
    case = verdict.case_table(frame).iloc[0].to_dict()
    steps, costs = verdict_display.window_costs(case, "dynamic")
    assert steps == [3, 6] and len(costs) == 2 and all(c > 0 for c in costs)
    assert verdict_display.plot_stream_cost(frame)[:4] == b"\x89PNG"


def test_the_model_beyond_the_measured_steps_is_checked_on_held_out_windows():
    # 4 windows of 5 steps: the first half 10 s over 10 steps, the second 5 s: 1 s/step predicted, 0.5 ran
    assert production.held_out_error([5.0, 5.0, 2.5, 2.5], 20, 20, 4) == pytest.approx(1.0)
    # a cut stream: windows of 5 planned steps, the third cut after 2, at 2 s a step there
    assert production.held_out_error([5.0, 5.0, 4.0], 12, 20, 4) == pytest.approx(1.0 / (9 / 7) - 1)
    assert production.held_out_error([5.0], 5, 5, 1) is None
