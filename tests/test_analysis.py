"""Regression and cost-spike detection on synthetic tidy frames (fixtures live here, not in results/)."""

from __future__ import annotations

import pandas as pd
import pytest

from attnbench.analysis import find_cost_spikes, find_regressions, find_trace_spikes

pytest.importorskip("asv")

COMMITS = [f"{i:040x}" for i in range(1, 7)]


def synthetic(series: dict[str, list[float]], directions=None, versions=None) -> pd.DataFrame:
    """A tidy frame like asv_results.load_results gives: one case, one value per metric and commit."""
    directions = directions or {}
    rows = []
    for metric, values in series.items():
        for position, (commit, value) in enumerate(zip(COMMITS, values, strict=False)):
            rows.append({"machine": "cpu-2core", "env_name": "env",
                         "benchmark": f"attention.Forward.track_{metric}",
                         "implementation": "jax-blockwise-flash", "seq_len": 1024, "regime": "static",
                         "dtype": "float32", "metric": metric, "unit": "", "status": "ok",
                         "direction": directions.get(metric, "lower"), "commit_hash": commit,
                         "commit_position": position, "value": value,
                         "version_jax": (versions or {}).get(position, "0.10.2")})
    return pd.DataFrame(rows)


def test_injected_40_percent_cost_step_is_found_and_attributed():
    cost = [1.00, 1.01, 0.99, 1.40, 1.41, 1.39]
    frame = synthetic({
        "usd_per_step": [c * 1e-6 for c in cost],
        "seconds_per_step": [c * 0.01 for c in cost],  # the step got slower...
        "host_rss_growth_bytes": [1e6, 1e6, 1e6, 1.6e6, 1.6e6, 1.6e6],  # ...and hungrier
        "compiles": [1, 1, 1, 1, 1, 1],  # not a recompile story
        "tokens_per_s": [1e5 / c for c in cost],
    }, directions={"tokens_per_s": "higher"}, versions={3: "0.10.3", 4: "0.10.3", 5: "0.10.3"})
    spikes = find_cost_spikes(frame)
    assert len(spikes) == 1
    spike = spikes.iloc[0]
    assert (spike["commit_before"], spike["commit_after"]) == (COMMITS[2], COMMITS[3])
    assert spike["relative_change"] == pytest.approx(0.40, abs=0.03)
    assert spike["versions_changed"] == "jax 0.10.2 -> 0.10.3"
    moved = dict(spike["companions"])
    assert moved["host_rss_growth_bytes"] == pytest.approx(0.6)
    assert moved["seconds_per_step"] == pytest.approx(0.40, abs=0.03)
    assert "compiles" not in moved  # did not move
    assert spike["attribution"].startswith("host_rss_growth_bytes +60%")


def test_direction_is_honoured():
    drop = synthetic({"tokens_per_s": [100, 101, 99, 70, 71, 70]}, directions={"tokens_per_s": "higher"})
    rise = synthetic({"tokens_per_s": [100, 101, 99, 140, 141, 140]}, directions={"tokens_per_s": "higher"})
    found = find_regressions(drop)
    assert len(found) == 1 and found.iloc[0]["relative_change"] == pytest.approx(-0.30, abs=0.02)
    assert find_regressions(rise).empty  # faster is not a regression
    slower = synthetic({"seconds_per_step": [1, 1, 1, 2, 2, 2]})
    assert len(find_regressions(slower)) == 1
    assert find_regressions(synthetic({"seconds_per_step": [2, 2, 2, 1, 1, 1]})).empty


def test_steps_below_the_absolute_floor_of_their_unit_are_noise():
    """RSS growth moves in pages: 0 -> 8 KiB is an infinite relative step and no regression."""
    pages = synthetic({"host_rss_growth_bytes": [0, 0, 0, 8192, 8192, 8192]})
    pages["unit"] = "bytes"
    assert find_regressions(pages).empty
    assert len(find_regressions(pages, min_absolute_step={})) == 1
    megabytes = synthetic({"host_rss_growth_bytes": [1e6, 1e6, 1e6, 8e6, 8e6, 8e6]})
    megabytes["unit"] = "bytes"
    assert len(find_regressions(megabytes)) == 1


def test_a_changed_measurement_setting_is_named_like_a_version():
    frame = synthetic({"compile_seconds": [1.0, 1.1, 0.9, 27.0, 26.0, 27.5]})
    frame["setting_compile_cache"] = [float("nan")] * 3 + ["cold"] * 3
    [found] = find_regressions(frame).to_dict("records")
    assert found["versions_changed"] == "setting compile_cache unrecorded -> cold"


def test_threshold_per_metric():
    small = synthetic({"seconds_per_step": [1.0, 1.0, 1.0, 1.08, 1.08, 1.08]})
    assert len(find_regressions(small)) == 1  # default 5%
    assert find_regressions(small, thresholds={"seconds_per_step": 0.10}).empty


def test_trace_spikes_name_the_compile_steps():
    trace = pd.DataFrame({"file": "t.csv", "step": range(6), "length": [300, 300, 420, 300, 420, 300],
                          "padded_length": [300, 300, 420, 300, 420, 300],
                          "compiled": [True, False, True, False, False, False],
                          "seconds": [0.9, 0.01, 0.8, 0.011, 0.012, 0.01]})
    spikes = find_trace_spikes(trace)
    assert list(spikes["step"]) == [0, 2]
    assert set(spikes["cause"]) == {"compiled a new shape"}
    assert (spikes["times_median"] > 50).all()
