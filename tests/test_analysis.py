"""Regression and cost-spike detection on synthetic tidy frames (fixtures live here, not in results/).

Telling a real regression from noise: series with a known step and known noise or known intervals,
contended figures, a tiny git repository whose commits change measured code or only the README,
and metric definition changes. Every expected value (uncertainties, verdicts) is worked out here by
hand from the data, not by calling the code under test.
"""

from __future__ import annotations

import math
import statistics
import subprocess

import numpy as np
import pandas as pd
import pytest

from attnbench.core import metrics
from attnbench.results import confirmations
from attnbench.results.noise import correction_exponent, correction_metric, intervals
from attnbench.results.spikes import find_cost_spikes, find_trace_spikes
from attnbench.results.steps import (
    DEFINITION_CHANGED,
    DISMISSED,
    HOST_CHANGED,
    NO_CODE_CHANGE,
    ONE_RUN,
    REGRESSION,
    UNCONFIRMED,
    WITHIN_NOISE,
    find_regressions,
    find_steps,
    noise_floor,
    to_confirm,
)

pytest.importorskip("asv")

COMMITS = [f"{i:040x}" for i in range(1, 13)]
Z99 = 2.576  # two-sided 99% of a normal distribution: asv's intervals
Z_ALERT = 3.291  # two-sided 99.9%: the band a noise step must leave (steps.ALERT_Z)
WIDEN = Z_ALERT / Z99  # an asv 99% half-width as the alert's band
MAD_NORMAL = 1 / statistics.NormalDist().inv_cdf(0.75)  # 1.4826: a normal's SD over its MAD


def level(n: int) -> float:
    """A level's uncertainty over one figure's: the median of n figures' standard error (mean's for 1-2)."""
    return 1 / math.sqrt(n) if n <= 2 else 1.2533 / math.sqrt(n)


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
                         "commit_position": position, "value": value, "case_ci_basis": "rounds",
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


def test_an_allocator_figure_alerts_only_for_a_step_that_holds_and_exceeds_a_mebibyte():
    """RSS growth moves in pages and arenas: 0 -> 8 KiB is an infinite relative step and no
    regression, even with the unit's absolute floor off; 1 -> 8 MB held for three runs on each side
    is one; the same rise in the last run alone, or overlapping the level before, is a companion."""
    from attnbench.results.steps import COMPANION

    pages = synthetic({"host_rss_growth_bytes": [0, 0, 0, 8192, 8192, 8192]}).assign(unit="bytes")
    assert find_regressions(pages).empty and find_steps(pages).empty  # below the bytes unit's 1 MiB
    [step] = find_steps(pages, min_absolute_step={}).to_dict("records")
    assert step["verdict"] == COMPANION and "two runs or more each" in step["why"]
    megabytes = synthetic({"host_rss_growth_bytes": [1e6, 1e6, 1e6, 8e6, 8e6, 8e6]}).assign(unit="bytes")
    [found] = find_regressions(megabytes).to_dict("records")
    assert found["judged"] == "allocator"
    last = synthetic({"host_rss_growth_bytes": [1e6] * 5 + [8e6]}).assign(unit="bytes")
    assert find_regressions(last).empty and set(find_steps(last)["verdict"]) == {COMPANION}
    overlap = synthetic({"host_rss_growth_bytes": [1e6, 9e6, 1e6, 8e6, 8e6, 8e6]}).assign(unit="bytes")
    assert find_regressions(overlap).empty


def test_a_step_across_a_change_of_a_setting_the_metric_depends_on_is_that_not_a_regression():
    """A cold compile cache where the runs before it were warm: compile seconds 1 -> 27 s is the
    setting, and says so; a step in a figure the setting does not touch stays a regression."""
    from attnbench.results.steps import SETTING_CHANGED

    frame = synthetic({"compile_seconds": [1.0, 1.1, 0.9, 27.0, 26.0, 27.5],
                       "compiler_temp_bytes": [1e6, 1e6, 1e6, 4e6, 4e6, 4e6]})
    frame["setting_compile_cache"] = frame["commit_position"].map(lambda p: "warm" if p < 3 else "cold")
    steps = find_steps(frame).set_index("metric")
    assert steps.loc["compile_seconds", "verdict"] == SETTING_CHANGED
    assert steps.loc["compile_seconds", "why"].endswith("compile_cache warm -> cold")
    assert steps.loc["compile_seconds", "versions_changed"] == "setting compile_cache warm -> cold"
    assert steps.loc["compiler_temp_bytes", "verdict"] == REGRESSION  # a compiler's bytes: exact
    frame["setting_compile_cache"] = frame["commit_position"].map(lambda p: None if p < 3 else "cold")
    assert find_steps(frame).set_index("metric").loc["compile_seconds", "verdict"] == SETTING_CHANGED
    assert metrics.settings_for("compile_seconds") == ("compile_cache", "workers", "threads")
    assert "compile_cache" in metrics.settings_for("seconds_per_step", "dynamic")
    assert "compile_cache" not in metrics.settings_for("seconds_per_step", "static")


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


# -- a step beyond the noise -----------------------------------------------------------------------
# ±2% noise around 1.00, then a 15% step at commit 5 (known, deterministic "noise").
NOISE_2PC = [0.02, -0.02, 0.01, -0.015, 0.0, 0.02, -0.02, 0.015, -0.01, 0.0]
STEP_AT = 5


def noisy_step(noise=NOISE_2PC, step=0.15, level=1.0):
    return [level * (1 + step * (i >= STEP_AT)) * (1 + e) for i, e in enumerate(noise)]


def hand_scatter_uncertainty(values, at):
    """What the analysis must take as the step's combined uncertainty without intervals, by hand:
    relative residuals of each side around its median, sigma = 1.4826 * MAD; the floor of this, the
    only series of its kind, 1.4826 * median |v[i]/v[i-1] - 1| / sqrt(2); each level's uncertainty
    3.291 x the larger x level, combined in quadrature."""
    before, after = np.array(values[:at]), np.array(values[at:])
    residuals = np.concatenate([before / np.median(before) - 1, after / np.median(after) - 1])
    sigma = MAD_NORMAL * np.median(np.abs(residuals))
    moves = [abs(b / a - 1) for a, b in zip(values, values[1:], strict=False)]
    floor = MAD_NORMAL * np.median(moves) / math.sqrt(2)
    sigma = max(sigma, floor)
    return math.hypot(Z_ALERT * sigma * np.median(before) * level(len(before)),
                      Z_ALERT * sigma * np.median(after) * level(len(after)))


def test_a_25_percent_step_with_2_percent_noise_is_a_regression():
    values = noisy_step(step=0.25)
    frame = synthetic({"seconds_per_step": values})
    [step] = find_steps(frame).to_dict("records")
    assert (step["commit_before"], step["commit_after"]) == (COMMITS[STEP_AT - 1], COMMITS[STEP_AT])
    assert step["verdict"] == REGRESSION
    assert step["noise_source"] == "series scatter + the machine's noise floor for the metric"
    expected = hand_scatter_uncertainty(values, STEP_AT)
    assert step["uncertainty"] == pytest.approx(expected, rel=1e-9)
    assert expected < 0.25  # ~0.18: the 25% step is beyond it
    assert step["relative_change"] == pytest.approx(0.25, abs=0.03)
    assert "held for 5 runs" in step["why"]
    assert len(find_regressions(frame)) == 1


def test_a_25_percent_step_in_20_percent_noise_is_not():
    values = noisy_step(noise=[10 * e for e in NOISE_2PC], step=0.25)  # ±20%
    frame = synthetic({"seconds_per_step": values})
    assert find_regressions(frame).empty
    steps = find_steps(frame)
    assert steps.empty or set(steps["verdict"]) == {WITHIN_NOISE}


@pytest.mark.parametrize("half_width,found", [(0.20, False), (0.02, True)])
@pytest.mark.parametrize("columns", [("ci_low", "ci_high"), ("q_25", "q_75")])
def test_a_15_percent_step_against_the_figures_intervals(half_width, found, columns):
    """No scatter at all (exact levels): only the intervals asv recorded say how uncertain each
    figure is, as 99% half-widths widened to the alert's 99.9%, over levels of five figures
    (1.2533 / sqrt(5)): ±20% intervals give sqrt(0.20^2 + (0.20 * 1.15)^2) x 3.291 / 2.576 x 0.56
    = 0.22 > 0.15, not found; ±2%: 0.022, found."""
    values = [1.0] * STEP_AT + [1.15] * 5
    frame = synthetic({"seconds_per_step": values})
    frame[columns[0]] = frame["value"] * (1 - half_width)
    frame[columns[1]] = frame["value"] * (1 + half_width)
    [step] = find_steps(frame).to_dict("records")
    expected = math.hypot(half_width * 1.0, half_width * 1.15) * WIDEN * level(5)
    assert step["uncertainty"] == pytest.approx(expected)
    assert step["noise_source"].startswith("intervals")
    assert step["verdict"] == (REGRESSION if found else WITHIN_NOISE)
    assert len(find_regressions(frame)) == (1 if found else 0)


@pytest.mark.parametrize("basis", ["samples", None])
def test_an_interval_of_one_window_is_not_trusted_as_the_figures_uncertainty(basis):
    """±2% intervals over one window's samples (or from results older than the rounds) say nothing
    of run-to-run noise: no interval, so the figure is judged by its series' scatter."""
    frame = synthetic({"seconds_per_step": [1.0, 1.02, 0.98, 1.0, 1.01, 0.99]})
    frame["ci_low"], frame["ci_high"] = frame["value"] * 0.98, frame["value"] * 1.02
    frame["case_ci_basis"] = basis
    low, high, source = intervals(frame)
    assert all(v != v for v in low) and all(s is None for s in source)
    [row] = noise_floor(frame).to_dict("records")
    assert row["with_intervals"] == 0 and row["interval_half_width"] != row["interval_half_width"]
    frame["case_ci_basis"] = "rounds"  # the same intervals over rounds: these are the figures' own
    low, high, source = intervals(frame)
    assert list(source) == ["ci"] * 6 and list(low) == pytest.approx(list(frame["value"] * 0.98))
    [row] = noise_floor(frame).to_dict("records")
    assert row["with_intervals"] == 6 and row["interval_half_width"] == pytest.approx(0.02)


def test_the_interval_facing_the_other_level_is_the_one_that_counts():
    """Asymmetric intervals: before [0.99, 1.30], after [1.00, 1.16] for a rise 1.00 -> 1.15: the
    before level's upper half-width (0.30) and the after level's lower one (0.15) face each other:
    sqrt(0.30^2 + 0.15^2) x 3.291 / 2.576 x 1.2533 / sqrt(5) = 0.24 > 0.15, within the noise.
    Mirrored, 0.01 and 0.01: a regression."""
    values = [1.0] * STEP_AT + [1.15] * 5
    frame = synthetic({"seconds_per_step": values})
    frame["ci_low"] = [0.99] * STEP_AT + [1.00] * 5
    frame["ci_high"] = [1.30] * STEP_AT + [1.16] * 5
    [step] = find_steps(frame).to_dict("records")
    assert step["uncertainty"] == pytest.approx(math.hypot(0.30, 0.15) * WIDEN * level(5))
    assert step["verdict"] == WITHIN_NOISE
    frame["ci_low"] = [0.70] * STEP_AT + [1.14] * 5
    frame["ci_high"] = [1.01] * STEP_AT + [1.45] * 5
    [step] = find_steps(frame).to_dict("records")
    assert step["uncertainty"] == pytest.approx(math.hypot(0.01, 0.01) * WIDEN * level(5))
    assert step["verdict"] == REGRESSION


def test_a_higher_is_better_drop_is_judged_in_its_own_units():
    """tokens/s 1000 -> 800 (a 25% slowdown) with ±5% intervals: sqrt(50^2 + 40^2) x 3.291 / 2.576
    x 1.2533 / sqrt(5) = 46 < 200."""
    values = [1000.0] * STEP_AT + [800.0] * 5
    frame = synthetic({"tokens_per_s": values}, directions={"tokens_per_s": "higher"})
    frame["ci_low"], frame["ci_high"] = frame["value"] * 0.95, frame["value"] * 1.05
    [step] = find_steps(frame).to_dict("records")
    assert step["uncertainty"] == pytest.approx(math.hypot(50.0, 40.0) * WIDEN * level(5))
    assert step["verdict"] == REGRESSION and step["relative_change"] == pytest.approx(-0.2)


def test_a_contended_figure_is_never_a_regression():
    values = [1.0, 1.0, 1.0, 1.6, 1.6, 1.6]
    frame = synthetic({"seconds_per_step": values})
    assert len(find_regressions(frame)) == 1  # the control: uncontended, it is one
    frame["contended"] = [None, False, False, True, True, True]
    assert find_regressions(frame).empty and find_steps(frame).empty
    frame = synthetic({"seconds_per_step": [1.0, 1.0, 1.0, 1.6, 1.6, 1.0]})
    frame["contended"] = [False, False, False, True, True, False]  # a contended burst mid-series
    assert find_regressions(frame).empty


def test_a_contended_figure_is_never_a_winner():
    from attnbench.report import best_native_vs_forced

    rows = []
    for impl, label, seconds, contended in (("fast-but-busy", "native", 0.001, True),
                                            ("steady", "native", 0.002, False),
                                            ("forced", "forced-flash", 0.003, False)):
        rows.append({"machine": "cpu-2core", "env_name": "env", "commit_hash": COMMITS[0],
                     "commit_position": 0, "commit_order": 0.0, "suite": "Forward", "regime": "static",
                     "execution": "compiled", "seq_len": 256, "dtype": "float32", "implementation": impl,
                     "label": label, "metric": "seconds_per_step", "value": seconds, "status": "ok",
                     "contended": contended})
    [best] = best_native_vs_forced(pd.DataFrame(rows)).to_dict("records")
    assert best["best_native"] == "steady" and best["native_ms_per_step"] == pytest.approx(2.0)
    assert best["contended (excluded)"] == "fast-but-busy"


def test_contended_runs_have_no_trace_spikes():
    trace = pd.DataFrame({"file": "t.csv", "step": range(4), "length": [300] * 4, "padded_length": [300] * 4,
                          "compiled": [False] * 4, "seconds": [0.9, 0.01, 0.011, 0.01], "contended": True})
    assert find_trace_spikes(trace).empty
    assert len(find_trace_spikes(trace.assign(contended=None))) == 1


def test_two_presets_decode_traces_are_two_files_each_with_its_own_sidecar_entry(tmp_path):
    """Decode's steps all have one query (S1): a preset's trace file names its workload and phase, so
    llama-3.1-8b's and gemma-2-9b's streams neither overwrite each other nor borrow a contention flag."""
    from attnbench.asv import sidecar
    from attnbench.core.presets import workload
    from attnbench.core.records import new_record
    from attnbench.core.regimes import RegimeResult, StepTrace
    from attnbench.measure.traces import write_trace
    from attnbench.results.spikes import load_traces

    commit, env = "ab" * 20, "env"
    traces = tmp_path / "cpu-2core" / "traces" / f"{commit[:8]}-{env}"
    cases = {}
    for name, busy in (("llama-3.1-8b", False), ("gemma-2-9b", True)):
        w = workload(name, "decode", size="default")
        record = new_record(w, regime="dynamic", impl="jax-xla")
        step = StepTrace(step=0, length=w.seq_k, padded_length=w.seq_k, compiled=True, seconds=0.1,
                         compile_seconds=0.05)
        result = RegimeResult(impl="jax-xla", regime="dynamic", policy=None, max_len=w.seq_k,
                              workload=w.describe(), batch=w.batch, execution="compiled", compiles=1,
                              compile_seconds_total=0.05, compile_cache_hits=0, steady_seconds_per_step=None,
                              steady_tokens_per_s=None, steady_flops_per_s=None, total_seconds=0.1,
                              useful_tokens_per_s=w.batch / 0.1, padding_waste=0.0, padding_flops_waste=0.0,
                              shapes=(w.seq_k,), trace=[step])
        written = write_trace(result, record, str(traces))
        assert written.endswith(f"__S1__fwd__float32__{name}-decode.csv"), written
        case = sidecar.case_id("Models", "jax-xla", f"{name}:decode", "dynamic", "float32")
        cases[case] = {"contended": busy}
    sidecar.write(str(tmp_path), "cpu-2core", commit, env, versions={}, settings={}, cases=cases)
    loaded = load_traces(str(tmp_path))
    assert len(set(loaded["file"])) == 2
    busy = {f.rsplit("__", 1)[1]: c for f, c in zip(loaded["file"], loaded["contended"], strict=True)}
    assert busy == {"llama-3.1-8b-decode.csv": False, "gemma-2-9b-decode.csv": True}


# -- which code changed between the two commits -------------------------------------------------------
def _git_repo(path):
    """Commits: 0 adds the jax-xla kernel (importing a helper kernel's code), another kernel and the
    README; 1 changes the jax-xla kernel; 2 only the README; 3 only the report code; 4 the engine;
    5 only the other kernel; 6 the helper kernel jax-xla imports. Hashes, oldest first."""
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "PATH": "/usr/bin:/bin"}

    def git(*args):
        return subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True,
                              text=True).stdout

    def write(name, text):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
        git("add", name)

    git("init", "-q", "-b", "main")
    changes = [{"attention_impls/jax_xla.py": "from attention_impls.helper_tiles import tile\nA = 0\n",
                "attention_impls/helper_tiles.py": "def tile(): pass\n",
                "attention_impls/torch_sdpa_flash.py": "B = 0\n", "README.md": "# r\n",
                "attnbench/backends/here.py": "# what compare builds a step with\n"},
               {"attention_impls/jax_xla.py": "from attention_impls.helper_tiles import tile\nA = 1\n"},
               {"README.md": "# r, reworded\n"}, {"attnbench/report/render.py": "# report\n"},
               {"attnbench/measure/engine.py": "# engine\n"},
               {"attention_impls/torch_sdpa_flash.py": "B = 1\n"},
               {"attention_impls/helper_tiles.py": "def tile(): return 1\n"}]
    for i, files in enumerate(changes):
        for name, text in files.items():
            write(name, text)
        git("commit", "-q", "--no-gpg-sign", "-m", f"commit {i}")
    return git("rev-list", "--reverse", "HEAD").split()


def _series(commits, values, metric="seconds_per_step", implementation="jax-xla"):
    case = {"machine": "cpu-2core", "env_name": "env", "benchmark": f"attention.Forward.track_{metric}",
            "implementation": implementation, "seq_len": 256, "regime": "static", "dtype": "float32",
            "metric": metric, "unit": "seconds", "status": "ok", "direction": "lower"}
    return pd.DataFrame([{**case, "commit_hash": c, "commit_position": i, "value": v}
                         for i, (c, v) in enumerate(zip(commits, values, strict=True))])


def _step_at(after, n=7):
    """A series of ``n`` commits that steps from 1.0 to 1.5 at commit ``after``."""
    return [1.0] * after + [1.5] * (n - after)


def test_a_step_across_a_readme_only_commit_is_no_measured_code_change(tmp_path):
    commits = _git_repo(tmp_path)
    repo = str(tmp_path)
    # 1 -> 2 changed only README.md
    [step] = find_steps(_series(commits, _step_at(2)), repo=repo).to_dict("records")
    assert (step["commit_before"], step["commit_after"]) == (commits[1], commits[2])
    assert step["verdict"] == NO_CODE_CHANGE and step["code_changed"] == 0
    assert find_regressions(_series(commits, _step_at(2)), repo=repo).empty
    # 2 -> 3 changed only the report code: not measured either
    [step] = find_steps(_series(commits, _step_at(3)), repo=repo).to_dict("records")
    assert step["verdict"] == NO_CODE_CHANGE
    # 3 -> 4 changed the engine: a regression, naming the file and the commit that changed it
    [step] = find_regressions(_series(commits, _step_at(4)), repo=repo).to_dict("records")
    assert step["commit_after"] == commits[4] and "attnbench/measure/engine.py" in step["why"]
    assert step["commits"] == f"{commits[4][:8]} commit 4" and "held for 3 runs" in step["why"]
    # 0 -> 1 changed the kernel, but the level before it is one run: unconfirmed, naming the file
    [step] = find_steps(_series(commits, _step_at(1)), repo=repo).to_dict("records")
    assert step["verdict"] == UNCONFIRMED and "attention_impls/jax_xla.py" in step["why"]
    # without git nothing can be said about the code: a regression, and it says why
    [step] = find_regressions(_series(commits, _step_at(2))).to_dict("records")
    assert step["code_changed"] is None and "unknown" in step["why"]


def test_only_the_kernels_own_code_counts_for_its_series(tmp_path):
    commits = _git_repo(tmp_path)
    repo = str(tmp_path)
    # 4 -> 5 changed torch_sdpa_flash.py only: a regression of that kernel, nothing of jax-xla's
    [step] = find_steps(_series(commits, _step_at(5)), repo=repo).to_dict("records")
    assert step["verdict"] == NO_CODE_CHANGE and "(only: attention_impls/torch_sdpa_flash.py)" in step["why"]
    [step] = find_regressions(_series(commits, _step_at(5), implementation="torch-sdpa-flash"), repo=repo) \
        .to_dict("records")
    assert "attention_impls/torch_sdpa_flash.py" in step["why"]
    # 5 -> 6 changed the helper kernel file jax_xla.py imports: jax-xla's code changed (in the
    # series' last run only: unconfirmed, naming it), and nothing torch-sdpa-flash measures
    [step] = find_steps(_series(commits, _step_at(6)), repo=repo).to_dict("records")
    assert step["verdict"] == UNCONFIRMED and "attention_impls/helper_tiles.py" in step["why"]
    [step] = find_steps(_series(commits, _step_at(6), implementation="torch-sdpa-flash"), repo=repo) \
        .to_dict("records")
    assert step["verdict"] == NO_CODE_CHANGE


def test_a_newest_step_confirm_cannot_measure_again_does_not_send_the_reader_to_it(tmp_path):
    """``compare`` times the static step: a compile time's step waits for the next run, and says so."""
    commits = _git_repo(tmp_path)
    repo = str(tmp_path)
    series = _series(commits, _step_at(6), metric="compile_seconds")
    [waiting] = find_steps(series, repo=repo).to_dict("records")
    assert waiting["verdict"] == UNCONFIRMED and "cannot measure again" in waiting["why"]
    assert "`attnbench confirm` measures both commits" not in waiting["why"]
    assert to_confirm(series, find_steps(series, repo=repo), "cpu-2core", repo) == []


def _confirmed(commits, verdict, ratio, low, high, implementation="jax-xla"):
    """What ``attnbench confirm`` writes for the step from commit 5 to 6 of ``_series``'s case."""
    key = confirmations.case_key("cpu-2core", "env", "Forward", implementation, 256, None, None, "float32")
    return {(*key, commits[5], commits[6]): {"verdict": verdict, "ratio": ratio, "ci_low": low,
                                               "ci_high": high, "rounds": 12}}


def test_a_newest_step_a_paired_re_measurement_confirms_is_a_regression_naming_its_commit(tmp_path):
    commits = _git_repo(tmp_path)
    repo = str(tmp_path)
    series = _series(commits, _step_at(6))
    [waiting] = find_steps(series, repo=repo).to_dict("records")
    assert waiting["verdict"] == UNCONFIRMED and "`attnbench confirm` measures both commits" in waiting["why"]
    assert [c["implementation"] for c in to_confirm(series, find_steps(series, repo=repo), "cpu-2core",
                                                    repo)] == ["jax-xla"]
    [step] = find_steps(series, repo=repo, confirmed=_confirmed(commits, "slower", 1.5, 1.46, 1.53)) \
        .to_dict("records")
    assert step["verdict"] == REGRESSION and step["commit_after"] == commits[6]
    assert "confirmed by a paired re-measurement here" in step["why"]
    assert "B/A 1.500 [1.460-1.530]" in step["why"]
    assert "attention_impls/helper_tiles.py" in step["why"]  # the measured file that changed, and its commit
    assert step["commits"].startswith(commits[6][:8])


def test_a_newest_step_the_re_measurement_finds_no_change_in_is_dismissed(tmp_path):
    commits = _git_repo(tmp_path)
    repo = str(tmp_path)
    series = _series(commits, _step_at(6))
    [step] = find_steps(series, repo=repo, confirmed=_confirmed(commits, "no change", 1.01, 0.98, 1.04)) \
        .to_dict("records")
    assert step["verdict"] == DISMISSED and "found no such step" in step["why"]
    [step] = find_steps(series, repo=repo, confirmed=_confirmed(commits, "can't tell", 1.2, 0.9, 1.6)) \
        .to_dict("records")
    assert step["verdict"] == UNCONFIRMED and "the paired re-measurement could not tell" in step["why"]
    done = _confirmed(commits, "no change", 1.01, 0.98, 1.04)
    assert to_confirm(series, find_steps(series, repo=repo, confirmed=done), "cpu-2core", repo, done) == []


def test_a_deterministic_figure_of_the_compiled_for_tier_alerts_at_once(tmp_path):
    """The compiled-for tier's figures are the compiler's word: a step in the newest run is a
    regression at once, never unconfirmed against a noise of zero."""
    commits = _git_repo(tmp_path)
    series = _series(commits, _step_at(6), metric="compiled_peak_bytes").assign(unit="bytes")
    series["value"] = series["value"] * 2**30
    [step] = find_steps(series, repo=str(tmp_path)).to_dict("records")
    assert step["judged"] == "exact" and step["verdict"] == REGRESSION


# -- a metric whose definition changed --------------------------------------------------------------
def test_a_step_across_a_definition_change_is_shown_as_such():
    """first_call_seconds became a cold compile in definitions 2: the rise at the commit where the
    sidecar's ``definitions`` setting goes from unrecorded (1) to 2 is not a regression."""
    frame = synthetic({"first_call_seconds": [0.2, 0.2, 0.2, 3.0, 3.0, 3.0]})
    frame["setting_definitions"] = [float("nan")] * 3 + ["2"] * 3
    [step] = find_steps(frame).to_dict("records")
    assert step["verdict"] == DEFINITION_CHANGED and "cold compiles" in step["why"]
    assert (step["definitions_before"], step["definitions_after"]) == ("1", "2")
    assert find_regressions(frame).empty
    # the same rise with no definition change is a regression
    frame["setting_definitions"] = "2"
    assert len(find_regressions(frame)) == 1


def test_definition_changes_cover_only_their_regimes_and_platforms():
    assert metrics.definition_changes("tokens_per_s", None, "2", regime="static") == []
    [change] = metrics.definition_changes("tokens_per_s", None, "2", regime="dynamic")
    assert "tokens their steps ran" in change.reason
    assert [c.platforms for c in metrics.definition_changes("mfu", "1", "2", platform="cpu")] == [("cpu",)]
    assert metrics.definition_changes("mfu", "1", "2", platform="gpu", regime="static") == []
    assert metrics.definition_changes("host_profiler_peak_bytes", "2", None, regime="static")  # either way
    assert metrics.definition_changes("seconds_per_step", "1", "2", regime="dynamic") == []
    assert metrics.definition_changes("first_call_seconds", "2", "2") == []
    # an MFU drop on a GPU across the same commits stays a regression
    frame = synthetic({"mfu": [0.5, 0.5, 0.5, 0.3, 0.3, 0.3]}, directions={"mfu": "higher"})
    frame["setting_definitions"] = [None] * 3 + ["2"] * 3
    frame["platform"] = "gpu"
    assert list(find_steps(frame)["verdict"]) == [REGRESSION]
    frame["platform"] = "cpu"
    assert list(find_steps(frame)["verdict"]) == [DEFINITION_CHANGED]


def test_the_noise_floor_and_smallest_detectable_step():
    """The floor is the static series' run-to-run scatter, 1.4826 * median |v[i]/v[i-1] - 1| /
    sqrt(2) (contended figures left out; intervals are shown beside it, they do not set it), and the
    smallest step it lets through max(threshold, 3.291 x sqrt(2) x floor)."""
    values = [1.0, 1.02, 0.99, 1.01, 1.0, 0.98]
    frame = synthetic({"seconds_per_step": values})
    frame["ci_low"], frame["ci_high"] = frame["value"] * 0.97, frame["value"] * 1.03  # ±3%
    frame.loc[5, "contended"] = True  # left out: the series is the first five
    diffs = [abs(b / a - 1) for a, b in zip(values[:5], values[1:5], strict=False)]
    sigma = MAD_NORMAL * float(np.median(diffs)) / math.sqrt(2)
    [row] = noise_floor(frame).to_dict("records")
    assert row["contended"] == 1 and row["figures"] == 5 and row["with_intervals"] == 5
    assert row["interval_half_width"] == pytest.approx(0.03)
    assert row["noise_floor"] == pytest.approx(sigma) and row["alert_band"] == pytest.approx(Z_ALERT * sigma)
    assert row["smallest_detectable_step"] == pytest.approx(max(0.05, math.sqrt(2) * Z_ALERT * sigma))
    wide = synthetic({"seconds_per_step": [1.0, 1.1, 0.9, 1.05, 1.0, 0.95]})
    [row] = noise_floor(wide, {"seconds_per_step": 0.1}).to_dict("records")
    assert row["smallest_detectable_step"] > 0.1  # the noise, not the threshold, sets it


def test_a_series_too_short_for_its_own_scatter_takes_the_machines():
    """Two figures say nothing of their own noise: the machine's floor for static seconds per step
    (±10% here) decides, and a 15% step between two figures is not even a candidate: the fit's
    penalty of a breakpoint is 4 floors (steps.POTTS_GAMMA)."""
    long = synthetic({"seconds_per_step": noisy_step(noise=[5 * e for e in NOISE_2PC], step=0.0)})  # ±10%
    short = synthetic({"seconds_per_step": [1.0, 1.15]})
    short["implementation"] = "torch-sdpa-flash"
    both = pd.concat([long, short], ignore_index=True)
    assert find_regressions(both).empty
    steps = find_steps(both)
    assert steps.empty or set(steps["verdict"]) == {WITHIN_NOISE}
    alone = find_steps(short)  # no floor: asv's own fit, and no scatter of its own
    assert find_regressions(short).empty and (alone.empty or set(alone["verdict"]) != {REGRESSION})


# -- how far whole runs moved ----------------------------------------------------------------------
def test_run_shift_is_the_median_ratio_over_a_runs_static_series():
    """Five kernels, three runs: run 2 moved every kernel by +10..+30% (median +20%), run 3 came back
    and one kernel alone doubled. A dynamic-regime series and a contended figure are left out."""
    from attnbench.results.noise import run_shifts

    base = {"k1": 1.0, "k2": 2.0, "k3": 3.0, "k4": 4.0, "k5": 5.0}
    moves = [{k: 1.0 for k in base}, dict(zip(base, (1.1, 1.15, 1.2, 1.25, 1.3), strict=True)),
             {**{k: 1.0 for k in base}, "k5": 2.0}]
    rows = []
    for position, move in enumerate(moves):
        for impl, seconds in base.items():
            for regime, contended in (("static", False), ("dynamic", False)):
                rows.append({"machine": "m", "env_name": "e",
                             "benchmark": "attention.Forward.track_seconds_per_step",
                             "implementation": impl, "seq_len": 256, "regime": regime, "dtype": "float32",
                             "metric": "seconds_per_step", "status": "ok", "commit_hash": COMMITS[position],
                             "commit_position": position,
                             "value": seconds * move[impl] * (3.0 if regime == "dynamic" else 1.0),
                             "contended": contended})
    rows.append({**rows[0], "implementation": "busy", "commit_hash": COMMITS[1], "commit_position": 1,
                 "value": 99.0, "contended": True})
    shifts = run_shifts(pd.DataFrame(rows)).to_dict("records")
    assert [(s["commit_before"], s["commit_after"], s["series"]) for s in shifts] == \
        [(COMMITS[0], COMMITS[1], 5), (COMMITS[1], COMMITS[2], 5)]
    assert shifts[0]["shift"] == pytest.approx(0.2) and shifts[0]["q25"] == pytest.approx(0.15)
    # run 3 against run 2: k1..k4 back, 1/1.1 .. 1/1.25, and k5 2/1.3 = 1.54; sorted 0.80, 0.83,
    # 0.87, 0.91, 1.54: the median is k2's 1/1.15 (the one kernel that doubled does not move it)
    assert shifts[1]["shift"] == pytest.approx(1 / 1.15 - 1)


def test_one_kernels_step_is_found_against_its_run_and_a_whole_run_move_is_not_a_step():
    """Five kernels, four runs, each figure with a ±2% interval over rounds. Run 2 drifted +14%
    as a whole (the machine); in run 3 the machine is back and k1 alone is 15% slower, so k1's
    own series reads 1.0, 1.14, 1.15, 1.15: no step at 3 in the raw figures, the whole step at 3
    against its run. Against the run, nobody steps at run 2."""
    base = {"k1": 1.0, "k2": 2.0, "k3": 3.0, "k4": 4.0, "k5": 5.0}
    machine = [1.0, 1.14, 1.0, 1.0]
    rows = []
    for position, speed in enumerate(machine):
        for impl, seconds in base.items():
            value = seconds * speed * (1.15 if impl == "k1" and position >= 2 else 1.0)
            rows.append({"machine": "m", "env_name": "e",
                         "benchmark": "attention.Forward.track_seconds_per_step",
                         "implementation": impl, "seq_len": 256, "regime": "static", "dtype": "float32",
                         "metric": "seconds_per_step", "unit": "seconds", "direction": "lower",
                         "status": "ok",
                         "commit_hash": COMMITS[position], "commit_position": position, "value": value,
                         "ci_low": value * 0.98, "ci_high": value * 1.02, "case_ci_basis": "rounds"})
    frame = pd.DataFrame(rows)
    [step] = find_steps(frame).to_dict("records")
    assert step["implementation"] == "k1" and step["commit_after"] == COMMITS[2]
    assert step["relative_change"] == pytest.approx(0.15) and step["run_shift"] == pytest.approx(1 / 1.14 - 1)
    assert (step["value_before"], step["value_after"]) == pytest.approx((1.14, 1.15))  # the series' own
    assert step["verdict"] == REGRESSION
    assert "against its run, whose seconds_per_step moved -12.3%" in step["why"]
    # Without the run's factor the machine's drift is every series' noise: the floor it sets is too
    # wide to see k1's step at all.
    assert find_regressions(frame, relative_to_run=False).empty


def test_a_run_after_a_pair_too_sparse_to_compare_keeps_the_factor_before_it():
    """Runs 1-2 measured k1..k3 (run 2 +20%), runs 3-4 measured k4..k6 only (run 4 +10% on run 3):
    2 -> 3 shares no series, so run 3 keeps run 2's factor 1.2 and run 4 is 1.2 x 1.1."""
    from attnbench.results.noise import run_factors, run_shifts

    rows = []
    for position, (impls, speed) in enumerate([("k1 k2 k3", 1.0), ("k1 k2 k3", 1.2), ("k4 k5 k6", 1.0),
                                               ("k4 k5 k6", 1.1)]):
        for impl in impls.split():
            rows.append({"machine": "m", "env_name": "e",
                         "benchmark": "attention.Forward.track_seconds_per_step",
                         "implementation": impl, "seq_len": 256, "regime": "static", "dtype": "float32",
                         "metric": "seconds_per_step", "status": "ok", "commit_hash": COMMITS[position],
                         "commit_position": position, "value": speed})
    factors = run_factors(run_shifts(pd.DataFrame(rows)))
    key = ("m", "e", "attention.Forward", "seconds_per_step")
    assert [factors[(*key, COMMITS[i])].factor for i in range(4)] == pytest.approx([1.0, 1.2, 1.2, 1.32])
    assert factors[(*key, COMMITS[3])].variance == 0.0  # every series moved alike: no spread


def test_a_run_of_one_kernel_has_no_shift_of_its_own():
    """Run 1 measured three kernels, run 2 (``ATTNBENCH_IMPLS=k1``) only k1, 25% slower at each of its
    four lengths: its series all moved, but together they are k1, not the machine, so 1 -> 2 gets no
    shift of its own (a kept row) and k1's step is judged whole; two kernels moving alike are the run."""
    from attnbench.results.noise import run_shifts

    rows = []
    for position, impls in enumerate(("k1 k2 k3", "k1")):
        for impl in impls.split():
            for seq in (128, 256, 512, 1024):
                rows.append({"machine": "m", "env_name": "e",
                             "benchmark": "attention.Forward.track_seconds_per_step",
                             "implementation": impl, "seq_len": seq, "regime": "static", "dtype": "float32",
                             "metric": "seconds_per_step", "status": "ok", "commit_hash": COMMITS[position],
                             "commit_position": position, "value": seq * (1.25 if position else 1.0)})
    [kept] = run_shifts(pd.DataFrame(rows)).to_dict("records")
    assert kept["kept"] is True and kept["shift"] == 0.0 and kept["series"] == 4  # the factor before it
    two = [dict(r, implementation=f"k{i}") for r in rows if r["commit_position"] == 1 for i in (1, 2)]
    both = [r for r in rows if r["commit_position"] == 0] + two
    [moved] = run_shifts(pd.DataFrame(both)).to_dict("records")  # two kernels (torch_xla's): the run
    assert moved["shift"] == pytest.approx(0.25) and moved["kept"] is False


def test_a_newest_run_too_sparse_to_compare_keeps_the_factor_before_it():
    """Runs 1-2 measured k1..k3 (run 2 +20%), run 3 only k1 (a planted slowdown run with
    ATTNBENCH_IMPLS): run 3 has no shift of its own and keeps run 2's factor, not 1.0."""
    from attnbench.results.noise import run_factors, run_shifts

    rows = []
    for position, (impls, speed) in enumerate([("k1 k2 k3", 1.0), ("k1 k2 k3", 1.2), ("k1", 1.5)]):
        for impl in impls.split():
            for seq in (256, 512, 1024):
                rows.append({"machine": "m", "env_name": "e",
                             "benchmark": "attention.Forward.track_seconds_per_step",
                             "implementation": impl, "seq_len": seq, "regime": "static", "dtype": "float32",
                             "metric": "seconds_per_step", "status": "ok", "commit_hash": COMMITS[position],
                             "commit_position": position, "value": speed})
    shifts = run_shifts(pd.DataFrame(rows))
    assert shifts["kept"].tolist() == [False, True]
    factors = run_factors(shifts)
    key = ("m", "e", "attention.Forward", "seconds_per_step")
    assert [factors[(*key, COMMITS[i])].factor for i in range(3)] == pytest.approx([1.0, 1.2, 1.2])
    only_kept = run_factors(shifts[shifts["kept"]])
    assert only_kept == {}  # a class with no measured shift has no chain of its own


def test_cost_spikes_are_judged_against_the_run_of_the_whole_results():
    """The cost rows hold no step times of their own: their run factors come from the whole frame's
    seconds per step, so k1's cost spike lands on the commit that slowed it, as its steps do."""
    rows = []
    for position, speed in enumerate([1.0, 1.14, 1.0, 1.0]):
        for k, seconds in enumerate((1.0, 2.0, 3.0, 4.0, 5.0), start=1):
            value = seconds * speed * (1.15 if k == 1 and position >= 2 else 1.0)
            for metric, scale in (("seconds_per_step", 1.0), ("usd_per_step", 1e-4)):
                rows.append({"machine": "m", "env_name": "e",
                             "benchmark": f"attention.Forward.track_{metric}",
                             "implementation": f"k{k}", "seq_len": 256, "regime": "static",
                             "dtype": "float32", "metric": metric, "unit": "", "direction": "lower",
                             "status": "ok",
                             "commit_hash": COMMITS[position], "commit_position": position,
                             "value": value * scale, "ci_low": value * scale * 0.98,
                             "ci_high": value * scale * 1.02, "case_ci_basis": "rounds"})
    [spike] = find_cost_spikes(pd.DataFrame(rows)).to_dict("records")
    assert (spike["implementation"], spike["commit_after"]) == ("k1", COMMITS[2])
    assert spike["relative_change"] == pytest.approx(0.15)


# -- a different host is not a regression (the same code on a faster or slower machine) ------------
# Every figure a run gives, as the engine derives it from its step time: the rates are the inverse of
# the time-like figures, MFU is TFLOP/s over the run's own CPU probe (which moves with the host),
# memory and counts do not move with the host at all.
FLOPS, TOKENS, PRICE = 1e9, 256, 1e-4  # per step; USD per second


def _run_rows(position, seconds: dict, *, probe=0.2, host="cpu A", first_call=2.0, compile_s=1.5):
    rows = []
    for impl, t in seconds.items():
        figures = {"seconds_per_step": t, "tokens_per_s": TOKENS / t, "tflops": FLOPS / t / 1e12,
                   "mfu": FLOPS / t / 1e12 / probe, "first_call_seconds": first_call * t,
                   "compile_seconds": compile_s * t, "usd_per_step": PRICE * t,
                   "usd_per_step_with_compiles": PRICE * (t + compile_s * t),
                   "useful_tokens_per_s": 0.8 * TOKENS / t, "host_rss_growth_bytes": 4e6, "compiles": 3.0}
        for metric, value in figures.items():
            m = metrics.get(metric)
            timed = metric in ("seconds_per_step", "tokens_per_s", "tflops", "mfu", "usd_per_step")
            rows.append({"machine": "cpu-2core", "machine_platform": "cpu", "env_name": "e",
                         "benchmark": f"attention.Forward.track_{metric}", "implementation": impl,
                         "seq_len": 1024, "regime": "static", "dtype": "float32", "metric": metric,
                         "unit": m.unit, "direction": m.direction, "status": "ok",
                         "commit_hash": COMMITS[position], "commit_position": position, "value": value,
                         # ±2% intervals over rounds where the engine gives samples
                         "ci_low": value * 0.98 if timed else float("nan"),
                         "ci_high": value * 1.02 if timed else float("nan"),
                         "case_ci_basis": "rounds" if timed else None,
                         "host_cpu_model": host, "host_logical_cores": 2,
                         "host_gemm_peak_tflops": probe, "host_gemm_median_tflops": probe * 0.99})
    return rows


BASE = {"k1": 0.010, "k2": 0.020, "k3": 0.030, "k4": 0.040, "k5": 0.050}


def _history(last_factor: float, *, slow: str | None = None, slowdown: float = 1.0, host_b: bool = False,
             runs_after: int = 1):
    """Five runs of unchanged kernels on one host, then ``runs_after`` on a host ``last_factor`` times
    as slow (its probe moving with it), optionally with one kernel ``slowdown`` times slower on top."""
    rows = []
    for position in range(5):
        rows += _run_rows(position, BASE, probe=0.2 * (1.0, 1.01, 0.99, 1.0, 1.01)[position])
    last = {k: v * last_factor * (slowdown if k == slow else 1.0) for k, v in BASE.items()}
    for position in range(5, 5 + runs_after):
        rows += _run_rows(position, last, probe=0.2 / last_factor, host="cpu B" if host_b else "cpu A")
    return pd.DataFrame(rows)


@pytest.mark.parametrize("factor", [1 / 1.6, 1.5])
def test_the_same_code_on_a_uniformly_faster_or_slower_host_reports_nothing(factor):
    """A 1.6x faster and a 1.5x slower host, same fingerprint fields but the probe: no regression in
    any figure. The steady step's figures all move by the factor and are judged against their run:
    no step at all. The compile and first-call figures (and the costs and rates built on them) are
    not corrected by any run's shift: they step with the host, and the probe that moved with it says
    so ("host changed"). MFU, already over the run's own probe, does not move at all."""
    frame = _history(factor)
    thresholds = dict.fromkeys(metrics.names(), 0.1)
    steps = find_steps(frame, thresholds)
    steady = {m.name for m in metrics.METRICS if m.time_exponent}
    assert steps.empty or (set(steps["verdict"]) <= {HOST_CHANGED} and not set(steps["metric"]) & steady)
    unrecorded = frame.drop(columns=[c for c in frame if c.startswith("host_")])  # older sidecars
    assert find_regressions(unrecorded, thresholds).empty  # the probe, read back from TFLOP/s over MFU
    mfu = frame[frame["metric"] == "mfu"].groupby("commit_position")["value"].first().to_numpy()
    assert mfu == pytest.approx([0.5 / p for p in (1.0, 1.01, 0.99, 1.0, 1.01, 1.0)])  # k1's, 0.1/0.2


def test_a_real_slowdown_of_one_kernel_on_the_same_host_is_flagged():
    """k3 20% slower for two runs, nothing else moved, same host: its time-like figures step +20%
    (rates -1/6), beyond their ±2% intervals; the run as a whole did not move (median of the five
    ratios is 1). Seen in the last run only, the same step waits for the next run (unconfirmed)."""
    thresholds = dict.fromkeys(metrics.names(), 0.1)
    once = find_steps(_history(1.0, slow="k3", slowdown=1.2), thresholds)
    assert set(once["verdict"]) == {UNCONFIRMED} and set(once["implementation"]) == {"k3"}
    frame = _history(1.0, slow="k3", slowdown=1.2, runs_after=2)
    found = find_regressions(frame, thresholds)
    assert set(found["implementation"]) == {"k3"}
    by_metric = found.set_index("metric")
    assert by_metric.loc["seconds_per_step", "relative_change"] == pytest.approx(0.2)
    assert by_metric.loc["tokens_per_s", "relative_change"] == pytest.approx(1 / 1.2 - 1)
    assert by_metric.loc["mfu", "relative_change"] == pytest.approx(1 / 1.2 - 1)
    assert by_metric.loc["seconds_per_step", "run_shift"] == pytest.approx(0.0)
    assert (found["host_changed"] == False).all()  # noqa: E712


def test_steps_across_a_host_change_are_shown_as_such_and_never_regress():
    """The sixth run on another CPU (fingerprint cpu_model A -> B), 1.5x slower, and k3 20% slower on
    top: every step there is "host changed", none a regression or a cost spike, and the history holds
    two hosts."""
    from attnbench.results.hosts import host_changes, hosts_table
    from attnbench.results.steps import HOST_CHANGED

    frame = _history(1.5, slow="k3", slowdown=1.2, host_b=True)
    thresholds = dict.fromkeys(metrics.names(), 0.1)
    steps = find_steps(frame, thresholds)
    assert len(steps) and set(steps["verdict"]) == {HOST_CHANGED}
    assert steps.iloc[0]["why"].startswith("the two runs ran on different hosts: cpu_model cpu A -> cpu B")
    assert find_regressions(frame, thresholds).empty and find_cost_spikes(frame, thresholds).empty
    [table] = hosts_table(frame).to_dict("records")
    assert (table["runs"], table["fingerprinted"], table["hosts"], table["host_changes"]) == (6, 6, 2, 1)
    changes = host_changes(frame)
    assert changes["changed"].tolist() == [False] * 4 + [True]
    # the probe alone also tells: 0.2 -> 0.133 is -33%, far beyond its run-to-run band (successive
    # moves +1%, -2%, +1%, +1%: median 1.0% x 1.4826 x 2.576 = 3.8%)
    assert changes.iloc[-1]["probe_move"] == pytest.approx(1 / 1.5 / 1.01 - 1)
    assert changes.iloc[-1]["probe_noise"] == pytest.approx(2.576 * 1.4826 * 0.0101, rel=0.05)
    same_cpu = _history(1.5)
    assert "CPU GEMM probe" in host_changes(same_cpu).iloc[-1]["why"]
    # runs from before the sidecar recorded a host (no host_* values) beside newer ones: the probe
    # (TFLOP/s over MFU for those) still tells, and the fingerprints only compare where both exist
    mixed = frame.copy()
    early = mixed["commit_position"] < 3
    for column in [c for c in mixed if c.startswith("host_")]:
        mixed[column] = mixed[column].where(~early)  # NaN, as the loader leaves a missing field
    changes = host_changes(mixed)
    assert changes["changed"].tolist() == [False] * 4 + [True]
    assert "cpu_model cpu A -> cpu B" in changes.iloc[-1]["why"]
    [table] = hosts_table(mixed).to_dict("records")
    assert (table["fingerprinted"], table["hosts"]) == (3, 2)
    # a run's other environment without a sidecar host (the compiled-for tier's) does not hide it
    tier = frame[frame["commit_position"] == 5].assign(env_name="compiled-for")
    tier = tier.assign(**{c: float("nan") for c in tier if c.startswith("host_")})
    [table] = hosts_table(pd.concat([tier, frame], ignore_index=True)).to_dict("records")
    assert (table["fingerprinted"], table["hosts"]) == (6, 2)


def test_cost_spikes_see_the_host_change_of_the_whole_results():
    """Runs from before the host fingerprint: only the probe (TFLOP/s over MFU, rows the cost rows
    lack) tells that the sixth run is on a 1.5x slower host. k3's cost step there is "host changed"
    in ``find_steps`` and so no cost spike either, though the cost rows alone hold no probe."""
    from attnbench.results.steps import HOST_CHANGED

    frame = _history(1.5, slow="k3", slowdown=1.2)
    frame = frame.drop(columns=[c for c in frame if c.startswith("host_")])
    thresholds = dict.fromkeys(metrics.names(), 0.1)
    steps = find_steps(frame, thresholds)
    cost = steps[steps["metric"] == "usd_per_step"]
    assert len(cost) == 1 and cost.iloc[0]["verdict"] == HOST_CHANGED
    assert find_cost_spikes(frame, thresholds).empty


def test_each_figure_is_corrected_by_the_run_shift_of_its_own_kind():
    """The steady step's figures follow seconds per step's shift (rates inversely); MFU on a CPU
    (already over the run's probe) its own metric's; compile, first-call and with-compiles figures
    none (they mix compiling with a step, unlike any run's shift); memory and counts none."""
    assert (correction_metric("tokens_per_s", "cpu"), correction_exponent("tokens_per_s", "cpu")) == \
        ("seconds_per_step", -1)
    assert correction_metric("mfu", "cpu") == "mfu" and correction_exponent("mfu", "cpu") == 1
    assert (correction_metric("mfu", "gpu"), correction_exponent("mfu", "gpu")) == ("seconds_per_step", -1)
    for metric in ("first_call_seconds", "compile_seconds", "useful_tokens_per_s",
                   "usd_per_step_with_compiles"):
        assert correction_metric(metric, "cpu") is None and correction_exponent(metric, "cpu") == 0
    for metric in ("host_rss_growth_bytes", "compiles", "compiler_temp_bytes", "max_abs_error"):
        assert correction_metric(metric, "cpu") is None and correction_exponent(metric, "cpu") == 0


def test_an_allocator_figure_that_flips_between_levels_never_alerts():
    """Resident growth as one kernel's committed series read: 2.1 MB for six runs, then ~0, 2.1, ~0,
    ~0, and 2.1 again. The last rise holds two runs on each side, but to a level the series had
    already reached: the allocator, not the code. A series that was flat and rose once to a level it
    never reached keeps its step."""
    from attnbench.results.steps import COMPANION

    low, high = 8192.0, 2.1e6
    flips = [high] * 6 + [low, high, low, low] + [high] * 2
    frame = synthetic({"host_rss_growth_bytes": flips}).assign(unit="bytes")
    steps = find_steps(frame)
    assert len(steps) and set(steps["verdict"]) == {COMPANION}
    flat = synthetic({"host_rss_growth_bytes": [1e6, 1e6, 1e6, 1e6, 8e6, 8e6, 8e6]}).assign(unit="bytes")
    assert len(find_regressions(flat)) == 1


def test_a_one_run_excursion_is_no_step():
    """1.0 for three runs, 0.6 for one (a fast outlier), 1.0 again: the way back is no regression; nor
    is a way back to 1.05 (within the 5% threshold of where it was) or to 0.9 (better than before)."""
    frame = synthetic({"seconds_per_step": [1.0, 1.0, 1.0, 0.6, 1.0, 1.0, 1.0]})
    frame["ci_low"], frame["ci_high"] = frame["value"] * 0.99, frame["value"] * 1.01
    steps = find_steps(frame)
    back = steps[steps["commit_after"] == COMMITS[4]].iloc[0]
    assert back["verdict"] == ONE_RUN and back["why"].startswith("a one-run excursion")
    assert find_regressions(frame).empty
    for back_to in (1.05, 0.9):
        other = synthetic({"seconds_per_step": [1.0, 1.0, 1.0, 0.6, back_to, back_to, back_to]})
        other["ci_low"], other["ci_high"] = other["value"] * 0.99, other["value"] * 1.01
        assert find_regressions(other).empty
    stays = synthetic({"seconds_per_step": [1.0, 1.0, 1.0, 0.6, 1.4, 1.4, 1.4]})
    stays["ci_low"], stays["ci_high"] = stays["value"] * 0.99, stays["value"] * 1.01
    assert len(find_regressions(stays)) == 1  # 0.6 -> 1.4 lands 40% above where it was: a step


def test_only_a_static_step_and_what_follows_it_measure_the_rounds_code():
    """The later rounds pool a static case's step time and the figures that follow it (its twins
    too); a first-pass figure was measured before any round ran."""
    from attnbench.results import code

    rounds_file = "attnbench/run/adaptive.py"
    for metric in ("seconds_per_step", "tokens_per_s", "mfu", "mfu_shortfall", "usd_per_step"):
        assert code.pooled_from_rounds(metric, "static")
    for metric, regime in (("latency_p99_seconds", "packed"), ("compiles", "static"),
                           ("first_call_seconds", "static"), ("seconds_per_step", "dynamic")):
        assert not code.pooled_from_rounds(metric, regime)
        assert not code.measures(rounds_file, framework="torch", modules=None, compiled_for=False,
                                 rounds=code.pooled_from_rounds(metric, regime))
    assert code.pooled_from_rounds(None, None) and code.pooled_from_rounds("no-such-metric", "packed")
    assert code.measures("attnbench/measure/engine.py", framework="torch", modules=None, compiled_for=False,
                         rounds=False)  # the first pass's own code is measured by every figure


# -- the report's shortcuts hold to what they replace -----------------------------------------------
@pytest.mark.parametrize("deviations", [[0.01, -0.03, 0.02, 0.0], [5.0], [-1.0, 1.0, 2.0, float("nan")], [],
                                        list(np.random.default_rng(7).normal(0, 0.05, 101))])
def test_robust_sd_is_scipys_median_absolute_deviation_about_zero(deviations):
    import warnings

    from scipy.stats import median_abs_deviation

    from attnbench.results.noise import robust_sd

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # scipy warns on an empty sample; the value is what is compared
        want = float(median_abs_deviation(np.asarray(deviations, dtype=float), center=lambda v, axis: 0.0,
                                          scale="normal"))
    got = robust_sd(deviations)
    assert got == want or (math.isnan(got) and math.isnan(want))


def test_traces_are_parsed_together_as_each_alone_and_a_broken_one_is_named_and_left_out(tmp_path):
    """Files of one header are parsed in one go: the rows, their columns (a newer header's new ones
    after the older's) and their order are those of each file read alone; a file that does not parse
    is left out with a warning naming it, and the others are kept."""
    from attnbench.results.spikes import load_traces

    folder = tmp_path / "cpu-2core" / "traces" / "abcdef12-env"
    folder.mkdir(parents=True)
    old = "impl,regime,step,length,padded_length,compiled,seconds\n"
    new = "impl,regime,step,length,padded_length,compiled,compile_seconds,seconds\n"
    files = {"a__dynamic__S128__fwd__float32.csv":
             old + "a,dynamic,0,100,128,True,0.5\na,dynamic,1,90,128,False,0.1\n",
             "b__dynamic__S128__fwd__float32.csv": new + "b,dynamic,0,64,128,True,0.3,0.4\n",
             "c__dynamic__S128__fwd__float32.csv": old + "c,dynamic,0,50,64,False,0.2\n"}
    for name, text in files.items():
        (folder / name).write_text(text)
    alone = pd.concat([pd.read_csv(folder / name) for name in sorted(files)], ignore_index=True)
    traces = load_traces(str(tmp_path))
    assert list(traces.columns) == ["machine", "commit8", "env_name", *alone.columns[:6], "seconds", "file",
                                    "contended", "compile_seconds"]
    pd.testing.assert_frame_equal(traces[list(alone.columns)], alone)
    assert list(traces["file"].str.rsplit("/", n=1).str[1].str[0]) == ["a", "a", "b", "c"]
    # an open quote: parsed with the others it would swallow the files after it
    (folder / "b0__dynamic__S128__fwd__float32.csv").write_text(old + 'b0,dynamic,"0,1,2,3,4,5\n')
    with pytest.warns(UserWarning, match=r"b0__dynamic__S128__fwd__float32.csv: unreadable trace"):
        kept = load_traces(str(tmp_path))
    pd.testing.assert_frame_equal(kept, traces)
