"""The metric table (attnbench/core/metrics.py) is the one place a metric is declared.

Pinned here, with the expected values written out independently of the table: the asv benchmark
names, units and version (so that the committed history under results/ continues), the record's
columns and units, the cost metrics and the companions of cost-spike attribution. Then one row
added to the table (monkeypatched) must show up in the record, the asv suite, the loader's
directions, the analysis and the report, and a malformed row must be refused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnbench.asv import sizes as asv_sizes
from attnbench.asv import suite as asv_suite
from attnbench.core import metrics, records
from attnbench.core.metrics import Metric

ROOT = Path(__file__).resolve().parents[1]

# track_<name> -> asv unit, as the asv history under results/ recorded them (METRIC_VERSION "1")
ASV_UNITS = {
    "seconds_per_step": "seconds", "tokens_per_s": "tokens/s", "seconds_per_million_tokens": "seconds",
    "tflops": "TFLOP/s", "seconds_per_pflop": "seconds", "mfu": "fraction", "mfu_shortfall": "fraction",
    "bytes_per_s": "bytes/s", "seconds_per_gb": "seconds", "first_call_seconds": "seconds",
    "compile_seconds": "seconds", "first_call_compile_seconds": "seconds",
    "compiles": "count",
    "padding_waste": "fraction", "useful_tokens_per_s": "tokens/s",
    "seconds_per_million_useful_tokens": "seconds", "device_peak_bytes": "bytes",
    "compiler_temp_bytes": "bytes", "compiler_peak_bytes": "bytes", "host_profiler_peak_bytes": "bytes",
    "host_rss_growth_bytes": "bytes", "usd_per_step": "USD", "usd_per_step_with_compiles": "USD",
    "usd_per_million_tokens": "USD", "usd_per_million_useful_tokens_with_compiles": "USD",
    "max_abs_error": "abs error", "status": "code",
    # what a server sees of a stream (issue 41): new benchmarks, no history renamed
    "latency_p99_seconds": "seconds", "longest_stall_seconds": "seconds",
    # a training step's bytes saved for backward (issue 58): a new benchmark
    "saved_for_backward_bytes": "bytes",
}
HIGHER = {"tokens_per_s": "seconds_per_million_tokens", "tflops": "seconds_per_pflop",
          "mfu": "mfu_shortfall", "useful_tokens_per_s": "seconds_per_million_useful_tokens",
          "bytes_per_s": "seconds_per_gb"}
COST = ("usd_per_step", "usd_per_step_with_compiles", "usd_per_million_tokens",
        "usd_per_million_useful_tokens_with_compiles")
COMPANIONS = {"seconds_per_step", "tokens_per_s", "compiles", "compile_seconds", "first_call_seconds",
              "padding_waste", "device_peak_bytes", "compiler_temp_bytes", "compiler_peak_bytes",
              "host_profiler_peak_bytes", "host_rss_growth_bytes", "latency_p99_seconds",
              "longest_stall_seconds", "saved_for_backward_bytes"}
MEMORY = ("device_peak_bytes", "compiler_temp_bytes", "compiler_peak_bytes", "saved_for_backward_bytes",
          "host_profiler_peak_bytes", "host_rss_growth_bytes")


def _tracks(cls) -> dict[str, tuple[str, str]]:
    return {name.removeprefix("track_"): (getattr(cls, name).unit, getattr(cls, name).version)
            for name in dir(cls) if name.startswith("track_")}


# -- what the table gives today --------------------------------------------------------------------
def test_asv_benchmarks_keep_their_names_units_and_version():
    from benchmarks.attention import Forward, Models, Training

    expected = {name: (unit, "1") for name, unit in ASV_UNITS.items()}
    assert metrics.METRIC_VERSION == asv_suite.METRIC_VERSION == "1"
    assert _tracks(Forward) == expected
    assert _tracks(Training) == expected
    assert _tracks(Models) == expected
    for higher, twin in HIGHER.items():
        assert metrics.get(higher).twin == twin and metrics.get(twin).direction == "lower"
    assert {m.name for m in metrics.METRICS if m.direction == "higher"} == set(HIGHER)


def test_committed_asv_history_matches_the_suite():
    """results/benchmarks.json (what asv recorded) has exactly these benchmarks, units and versions:
    a renamed or re-unit-ed metric would start a new history there."""
    from benchmarks.attention import Forward, Models, Training

    path = ROOT / "results" / "benchmarks.json"
    if not path.is_file():
        pytest.fail("results/benchmarks.json is missing: the committed asv history is part of the project")
    recorded = {name: (spec["unit"], str(spec["version"]))
                for name, spec in json.loads(path.read_text()).items() if name.startswith("attention.")}
    ours = {f"attention.{cls.__name__}.track_{metric}": value
            for cls in (Forward, Training, Models) for metric, value in _tracks(cls).items()}
    assert ours == recorded


def test_every_record_is_built_from_the_one_schema():
    """The record's columns are ``records.LAYOUT``'s, each metric column with its metric's unit;
    everything that writes or reads a record names columns of it."""
    from attnbench.asv import sidecar
    from attnbench.cli_run import RUN_COLUMNS
    from attnbench.core.workload import Workload
    from attnbench.run import resume

    assert list(records.new_record()) == records.COLUMNS == list(records.UNITS)
    assert len(set(records.COLUMNS)) == len(records.COLUMNS)
    assert all(records.UNITS[column] == unit for column, unit in metrics.column_units().items())
    assert all(isinstance(unit, str) for unit in records.UNITS.values())
    workload = Workload(batch=1, q_heads=4, kv_heads=2, seq_q=64, head_dim=16, causal=True, window=8)
    filled = records.new_record(workload, status=records.OK)
    assert filled["q_heads"] == 4 and filled["window"] == 8 and filled["status"] == "ok"
    assert filled["flops"] == workload.flops and filled["workload"] == workload.name
    with pytest.raises(KeyError, match="not a record column: secs_per_step"):
        records.new_record(secs_per_step=1.0)
    for readers in (sidecar.CASE_FIELDS, resume.IDENTITY, RUN_COLUMNS):
        assert set(readers) <= set(records.COLUMNS), set(readers) - set(records.COLUMNS)


def test_analysis_and_report_read_their_metric_sets_from_the_table():
    from attnbench.results.asv_results import _directions

    assert metrics.names("cost") == COST
    assert set(metrics.companions()) == COMPANIONS
    assert metrics.names("memory") == MEMORY
    directions = _directions()
    assert set(directions) == set(ASV_UNITS)
    assert {m for m, d in directions.items() if d == "higher"} == set(HIGHER)
    assert directions["status"] == "lower"  # 0 ok, then rising trouble: a rise is a regression


def test_derived_metrics_read_the_record():
    record = {"tflops": 0.5, "mfu": 0.25, "useful_tokens_per_s": 2e5, "status": records.OOM,
              "usd_per_step_on_demand": 3e-7, "max_abs_err": 1e-6}
    value = {m.name: m.value(record) for m in metrics.METRICS}
    assert value["seconds_per_pflop"] == pytest.approx(2e-3)
    assert value["mfu_shortfall"] == pytest.approx(0.75)
    assert value["seconds_per_million_useful_tokens"] == pytest.approx(5.0)
    assert value["status"] == 2.0
    assert value["usd_per_step"] == 3e-7 and value["max_abs_error"] == 1e-6
    assert math.isnan(value["seconds_per_step"]) and math.isnan(value["tokens_per_s"])


# -- one new row shows up everywhere ---------------------------------------------------------------
SCRATCH = Metric("scratch_bytes", "scratch_bytes", "bytes", "lower", "memory", companion=True)
FEE = Metric("usd_per_request", "usd_per_request_on_demand", "USD", "lower", "cost")


@pytest.fixture
def extra_rows(monkeypatch):
    monkeypatch.setattr(metrics, "METRICS", [*metrics.METRICS, SCRATCH, FEE])
    return SCRATCH, FEE


def test_a_new_row_adds_a_record_column_and_an_asv_benchmark(extra_rows):
    from benchmarks.attention import with_metrics

    units = records.units()
    assert list(units)[:len(records.UNITS)] == list(records.UNITS)  # the others keep their place
    assert list(units)[len(records.UNITS):] == ["scratch_bytes", "usd_per_request_on_demand"]
    assert units["scratch_bytes"] == "bytes" and units["usd_per_request_on_demand"] == "USD"

    assert [m.name for m in asv_suite.tracked_metrics()][-2:] == ["scratch_bytes", "usd_per_request"]

    @with_metrics
    class Probe:
        pass

    track = Probe.track_scratch_bytes
    assert (track.unit, track.version) == ("bytes", "1")
    probe = Probe()
    probe.record = {"scratch_bytes": 4096}
    assert track(probe, None) == 4096.0
    assert Probe.track_usd_per_request.unit == "USD"


def test_a_new_row_reaches_the_loader_analysis_and_report(extra_rows):
    import pandas as pd

    from attnbench.report import plots
    from attnbench.results.asv_results import _directions
    from attnbench.results.spikes import find_cost_spikes

    assert _directions()["scratch_bytes"] == "lower"
    assert "scratch_bytes" in metrics.companions() and "usd_per_request" in metrics.names("cost")

    def rows(metric, values):
        return [{"machine": "cpu-2core", "env_name": "env", "benchmark": f"attention.Forward.track_{metric}",
                 "suite": "Forward", "implementation": "jax-xla", "label": "native", "seq_len": 1024,
                 "regime": "static", "dtype": "float32", "metric": metric, "unit": "", "status": "ok",
                 "direction": "lower", "commit_hash": f"{i:040x}", "commit_position": i,
                 "commit_date": pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(hours=i), "value": v}
                for i, v in enumerate(values)]

    frame = pd.DataFrame(rows("usd_per_request", [1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
                         + rows("scratch_bytes", [1e6, 1e6, 1e6, 3e6, 3e6, 3e6]))
    [spike] = find_cost_spikes(frame).to_dict("records")  # a regression of the new cost metric...
    assert spike["metric"] == "usd_per_request"
    assert spike["attribution"] == "scratch_bytes +200%"  # ...attributed to the new companion

    memory = frame[frame["metric"] == "scratch_bytes"]
    assert plots.plot_memory(memory) is not None  # a memory panel for the new source


def test_without_the_row_the_report_and_analysis_ignore_that_metric():
    import pandas as pd

    from attnbench.report import plots
    from attnbench.results.spikes import find_cost_spikes

    frame = pd.DataFrame([{"machine": "m", "env_name": "e", "benchmark": "attention.Forward.track_x",
                           "suite": "Forward", "implementation": "jax-xla", "label": "native",
                           "seq_len": 1024, "regime": "static", "dtype": "float32", "metric": metric,
                           "unit": "", "status": "ok", "direction": "lower", "commit_hash": f"{i:040x}",
                           "commit_position": i, "commit_date": pd.Timestamp("2026-01-01", tz="UTC"),
                           "value": v}
                          for metric in ("usd_per_request", "scratch_bytes")
                          for i, v in enumerate([1.0, 1.0, 1.0, 2.0, 2.0, 2.0])])
    assert find_cost_spikes(frame).empty
    assert plots.plot_memory(frame) is None


# -- a malformed table is refused ------------------------------------------------------------------
@pytest.mark.parametrize("row, message", [
    (Metric("speed", "speed", "tokens/s", "higher", "throughput"), "needs a lower-is-better twin"),
    (Metric("speed", "speed", "tokens/s", "higher", "throughput", twin="seconds_per_step_x"),
     "needs a lower-is-better twin"),
    (Metric("slowness", "slowness", "seconds", "lower", "timing", twin="seconds_per_step"),
     "only a higher-is-better metric has a twin"),
    (Metric("odd", "odd", "seconds", "sideways", "timing"), "direction must be one of"),
    (Metric("odd", "odd", "seconds", "lower", "vibes"), "group 'vibes'"),
    (Metric("odd", "odd", "", "lower", "timing"), "has no unit"),
    (Metric("seconds_per_step", "other", "seconds", "lower", "timing"), "appears twice"),
    (Metric("odd", "seconds_per_step", "fraction", "lower", "timing"), "gives column 'seconds_per_step'"),
])
def test_malformed_rows_are_refused(row, message):
    with pytest.raises(ValueError, match=message):
        metrics.check([*metrics.METRICS, row])


def test_a_record_column_placed_as_a_metric_needs_its_row(monkeypatch):
    table = list(metrics.METRICS)
    monkeypatch.setattr(metrics, "METRICS", [m for m in table if m.name != "compiles"])
    with pytest.raises(ValueError, match="places 'compiles' as a metric column"):
        records.units()
    clash = Metric("price", "usd_per_hour_spot", "USD/h", "lower", "cost")
    monkeypatch.setattr(metrics, "METRICS", [*table, clash])
    with pytest.raises(ValueError, match="mark it METRIC"):
        records.units()


def test_a_direction_of_none_is_never_a_regression():
    import pandas as pd

    from attnbench.results.steps import find_regressions

    rows = [{"machine": "m", "env_name": "e", "benchmark": "attention.Forward.track_x", "metric": "x",
             "unit": "", "status": "ok", "direction": direction, "commit_hash": f"{i:040x}",
             "commit_position": i, "value": v}
            for direction in ("lower", None) for i, v in enumerate([1.0, 1.0, 1.0, 3.0, 3.0, 3.0])]
    frame = pd.DataFrame(rows)
    assert len(find_regressions(frame[frame["direction"] == "lower"])) == 1
    assert find_regressions(frame[frame["direction"].isna()]).empty


# -- the suite size: ATTNBENCH_SUITE, with ATTNBENCH_PROFILE as a deprecated alias ------------------
def test_suite_size_is_read_from_attnbench_suite(monkeypatch, capsys):
    monkeypatch.delenv("ATTNBENCH_PROFILE", raising=False)
    monkeypatch.delenv("ATTNBENCH_SUITE", raising=False)
    assert asv_sizes.suite_name() == "default"
    assert asv_sizes.suite_size() is asv_sizes.SIZES["default"]
    monkeypatch.setenv("ATTNBENCH_SUITE", "full")
    assert asv_sizes.suite_size().forward_seqs[-1] == 8192
    monkeypatch.setenv("ATTNBENCH_PROFILE", "smoke")  # the new name wins, silently
    assert asv_sizes.suite_name() == "full"
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ATTNBENCH_SUITE", "huge")
    sizes = r"\['default', 'full', 'gpu', 'smoke'\]"
    with pytest.raises(ValueError, match=rf"ATTNBENCH_SUITE must be one of {sizes}"):
        asv_sizes.suite_size()


def test_attnbench_profile_still_works_with_one_deprecation_line(monkeypatch, capsys):
    monkeypatch.delenv("ATTNBENCH_SUITE", raising=False)
    monkeypatch.setenv("ATTNBENCH_PROFILE", "smoke")
    monkeypatch.setattr(asv_sizes, "_warned_deprecated", False)
    assert asv_sizes.suite_size() is asv_sizes.SIZES["smoke"]
    assert asv_sizes.suite_name() == "smoke"
    err = capsys.readouterr().err
    assert err == "attnbench: ATTNBENCH_PROFILE is deprecated, use ATTNBENCH_SUITE=smoke\n"


def test_a_metric_that_follows_the_step_time_gives_asv_its_round_medians():
    from attnbench.core import metrics

    medians = [0.008, 0.0085, 0.009, 0.0095, 0.01, 0.0105, 0.011, 0.0115, 0.0125]
    record = {"seconds_per_step": 0.01, "tokens_per_s": 1000.0, "status": "ok", "rounds": 9,
              "round_medians_s": json.dumps(medians)}
    seconds = metrics.get("seconds_per_step").asv_value(record)
    tokens = metrics.get("tokens_per_s").asv_value(record)
    assert seconds == {"samples": medians, "number": 1}
    # 1000 tokens/s at the median step: 10 tokens per step, so 1250 tokens/s at 8 ms
    assert tokens["number"] == 1 and tokens["samples"][0] == pytest.approx(1250.0)
    assert metrics.get("status").asv_value(record) == 0.0  # a metric that does not follow the time
    assert metrics.get("seconds_per_step").asv_value({**record, "round_medians_s": None}) == 0.01


def test_asv_gets_samples_only_where_they_carry_its_99_percent_interval():
    from attnbench.core import metrics

    # Seven rounds cannot carry a 99% interval (their range covers 98.4%): asv's fallback for them, a
    # Laplace posterior, reached below zero, so asv gets the value alone. One window's samples are
    # not independent: the value alone too.
    seven = {"seconds_per_step": 0.01, "status": "ok", "rounds": 7,
             "round_medians_s": json.dumps([0.009, 0.0095, 0.01, 0.01, 0.0105, 0.011, 0.012])}
    assert metrics.get("seconds_per_step").asv_value(seven) == 0.01
    one_window = {"seconds_per_step": 0.01, "status": "ok", "rounds": 1,
                  "round_medians_s": json.dumps([0.01]), "timing_samples_s": json.dumps([0.009] * 20)}
    assert metrics.get("seconds_per_step").asv_value(one_window) == 0.01
    eight = {**seven, "rounds": 8, "round_medians_s": json.dumps([0.009, 0.0095, 0.01, 0.01, 0.0105, 0.011,
                                                                  0.012, 0.0098])}
    assert len(metrics.get("seconds_per_step").asv_value(eight)["samples"]) == 8
