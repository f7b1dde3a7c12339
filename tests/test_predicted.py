"""The time model (``attnbench.predicted``, ``attnbench.compiled_for.hlo_cost``): the program's cost op by
op, the fit, its leave-one-shape-out score, the records' prediction columns and the verdict's ratio.

HLO fixtures are hand-written after libtpu's and XLA:GPU's text (tests/compiled_for_hlo/); the
calibration rows are made up here, with factors chosen so the expected fit is known. Nothing here
compiles or reads results/ except the last test, which fits the committed calibration table.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.compiled_for import hlo, hlo_cost
from attnbench.compiled_for.targets import load_targets
from attnbench.predicted import calibration, model
from attnbench.predicted.calibration import CalibrationError
from attnbench.predicted.predict import Calibrated, record_features
from attnbench.report.compiled_verdict import predicted_ratio

ROOT = Path(__file__).resolve().parents[1]
HLO = Path(__file__).parent / "compiled_for_hlo"
LOOP = (HLO / "tpu_chunked_loop.hlo.txt").read_text()
TPU_FLASH = (HLO / "tpu_flash.hlo.txt").read_text()
GPU = (HLO / "gpu_cudnn_triton.hlo.txt").read_text()


def cost(text, silent=0.0):
    return hlo_cost.program_cost(hlo.parse_module(text), peak_flops=1e12, bandwidth=1e9,
                                 silent_kernel_flops=silent)


# ----------------------------------------------------------------------------- the program's cost
def test_a_loop_costs_its_body_times_the_trip_count_read_from_its_condition():
    module = hlo.parse_module(LOOP)
    loop = module.entry.instructions["while.1"]
    assert hlo_cost.trip_count(loop, module.entry, module) == 4  # counter < 4, from constant 0
    program = cost(LOOP)
    one_trip = 2 * 8 * 128 * 512 * 64  # the fused dot: 2 x output x contracted (64)
    assert program.kinds["matmul"].flops == 4 * one_trip  # ignoring the count would give 1 x
    assert program.kinds["matmul"].launches == 4
    # per trip: the slice of q (8x128x64, its 64 padded to 128 lanes), all of k, the counter, the scores
    per_trip = 8 * 128 * 128 * 2 + 8 * 512 * 128 * 2 + 4 + 8 * 128 * 512 * 4
    assert program.kinds["matmul"].bytes == 4 * per_trip
    assert not program.notes


def test_xla_gpu_known_trip_count_wins_and_an_unreadable_loop_says_so():
    known = LOOP.replace("condition=%condition, body=%body",
                         'condition=%condition, body=%body, backend_config={"known_trip_count":{"n":"7"}}')
    assert cost(known).kinds["matmul"].launches == 7
    unreadable = LOOP.replace("direction=LT", "direction=NE")
    program = cost(unreadable)
    assert program.kinds["matmul"].launches == 1
    assert "trip count could not be read" in program.notes[0]


def test_a_kernel_costs_its_declared_estimate_and_a_silent_one_the_steps_flops():
    declared = cost(TPU_FLASH, silent=5.0).kinds["kernel"]
    assert declared.flops == 34896609280  # the kernel's cost_estimate, not the silent fallback
    assert declared.bytes == 16777216
    gpu = cost(GPU, silent=1000.0)
    assert gpu.kinds["kernel"].flops == 1000.0  # two silent calls share the step's FLOPs
    assert gpu.kinds["kernel"].launches == 2
    assert "no cost estimate from" in gpu.notes[0]


def test_a_conditional_costs_its_costliest_branch():
    text = """HloModule m

%skip (p.1: f32[128,128]) -> f32[128,128] {
  ROOT %p.1 = f32[128,128]{1,0} parameter(0)
}

%compute (p.2: f32[128,128]) -> f32[128,128] {
  %p.2 = f32[128,128]{1,0} parameter(0)
  ROOT %dot.2 = f32[128,128]{1,0} dot(%p.2, %p.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[128,128], i: s32[]) -> f32[128,128] {
  %x = f32[128,128]{1,0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %c = f32[128,128]{1,0} conditional(%i, %x, %x), branch_computations={%skip, %compute}
}
"""
    program = cost(text)
    assert program.kinds["matmul"].flops == 2 * 128 * 128 * 128  # the dot's branch, not the first one
    assert "costliest branch" in program.notes[-1]


def test_a_tpu_batched_convolution_counts_only_the_taps_that_meet_data():
    text = """HloModule m

ENTRY %main (a: bf16[4,32,64,4096], b: bf16[4,32,64,4096]) -> f32[4,32,4096,4096] {
  %a = bf16[4,32,4096,64]{3,2,1,0} parameter(0)
  %b = bf16[4,32,64,4096]{3,2,1,0} parameter(1)
  ROOT %conv = f32[4,32,4096,4096]{2,3,1,0} convolution(%a, %b), window={size=4x32 stride=3x31 \
lhs_dilate=4x32}, dim_labels=01bf_01io->01bf
}
"""
    # 4 x 32 (batch x heads) as dilated spatial dims: one real tap each; 64 contracted
    assert cost(text).kinds["matmul"].flops == 2 * 4 * 32 * 4096 * 4096 * 64


# ------------------------------------------------------------------------------------ grid steps
def test_grid_steps_count_every_tile_or_the_causal_ones():
    assert model.grid_steps({"block_q": 128, "block_kv": 128}, batch=2, q_heads=4, seq_q=512, seq_k=512,
                            causal=False) == 2 * 4 * 16
    assert model.grid_steps({"block_q": 128, "block_kv": 128}, batch=1, q_heads=1, seq_q=512, seq_k=512,
                            causal=True) == 1 + 2 + 3 + 4
    # a query block taller than the key block sees two key blocks more per row of blocks
    assert model.grid_steps({"block_q": 256, "block_k": 128}, batch=1, q_heads=1, seq_q=512, seq_k=512,
                            causal=True) == 2 + 4
    assert model.grid_steps({}, batch=1, q_heads=1, seq_q=512, seq_k=512, causal=True) == 0
    assert model.parse_library_config("PallasMosaicTpuFlashAttention block_q=128,block_kv=256,q_layout=1") \
        == {"block_q": 128, "block_kv": 256, "q_layout": 1}
    assert model.parse_library_config("DotProductAttention no config") == {}


# ------------------------------------------------------------------------------------------- fit
def synthetic(n=40, seed=0, noise=0.0):
    """Rows whose seconds follow known factors: 2 x kernel + 3 x matmul + 1 x other + 5 us per launch."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(model.FEATURES)))
    x[:, 0] = rng.uniform(1e-4, 1e-2, n) * (np.arange(n) % 2)
    x[:, 1] = rng.uniform(1e-4, 1e-2, n) * (1 - np.arange(n) % 2)
    x[:, 2] = rng.uniform(1e-5, 1e-3, n)
    x[:, 3] = rng.integers(1, 50, n)
    seconds = x @ np.array([2.0, 3.0, 1.0, 5e-6, 0.0]) * np.exp(rng.normal(0, noise, n))
    return x, seconds


def test_the_fit_recovers_known_factors_and_leaves_unseen_features_unfitted():
    x, seconds = synthetic()
    fit = model.fit("f", x, seconds)
    assert fit.factors[0] == pytest.approx(2.0, rel=1e-3)
    assert fit.factors[1] == pytest.approx(3.0, rel=1e-3)
    assert fit.factors[3] == pytest.approx(5e-6, rel=1e-2)
    assert fit.factors[4] is None  # no row had a grid: no factor, and a program with one is not predicted
    assert fit.predict([1e-3, 0, 0, 1, 0]) == pytest.approx(2e-3 + 5e-6, rel=1e-2)
    assert fit.predict([1e-3, 0, 0, 1, 100]) is None
    assert fit.missing([1e-3, 0, 0, 1, 100]) == ["a tiled kernel's grid"]


def test_leave_one_shape_out_holds_a_shape_out_and_orders_pairs():
    x, seconds = synthetic(noise=0.05)
    groups = [i // 2 for i in range(len(seconds))]  # a kernel row and a matmul row per shape
    score = model.leave_one_shape_out("f", x, seconds, groups, groups, ["k", "m"] * (len(seconds) // 2))
    assert len(score.errors) == len(seconds)
    assert score.median_abs_error < 0.1
    assert score.pairs == len(seconds) // 2
    lo, hi = score.error_range
    assert lo < 0 < hi
    # a shape's own rows never fit its prediction: a fit on all rows predicts the noise away less well
    held = model.fit("f", x[2:], seconds[2:]).predict(x[0])
    assert score.predicted[0] == pytest.approx(held)


# ----------------------------------------------------------------------------- calibration table
def calibration_rows(n=30, family="hopper", target="h100-sxm", seed=1):
    x, seconds = synthetic(n, seed, noise=0.05)
    rows = []
    for i in range(n):
        row = dict.fromkeys(calibration.COLUMNS)
        row.update(source="test", target=target, family=family, kernel=["jax-a", "jax-b"][i % 2], batch=1,
                   q_heads=8, kv_heads=8, seq_q=512 * (1 + i // 2), seq_k=512 * (1 + i // 2), head_dim=64,
                   dtype="bfloat16", causal="True", status="ok", median_ms=seconds[i] * 1e3, flops=1e9,
                   peak_tflops=989.0)
        row.update(dict(zip(model.FEATURES, x[i], strict=True)))
        rows.append(row)
    return rows


def test_the_table_round_trips_and_a_malformed_one_names_its_fault(tmp_path):
    path = tmp_path / "calibration.csv"
    calibration.write(calibration_rows(), str(path))
    rows = calibration.read(str(path))
    assert len(rows) == 30 and rows[0]["median_ms"] > 0
    text = path.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([text[0], text[1].replace(",ok,", ",ok,", 1).replace(",1,8,8,", ",x,8,8,", 1)]))
    with pytest.raises(CalibrationError, match=r"bad.csv:2: batch is not a number: 'x'"):
        calibration.read(str(bad))
    headless = tmp_path / "headless.csv"
    headless.write_text("a,b\n1,2\n")
    with pytest.raises(CalibrationError, match="missing columns"):
        calibration.read(str(headless))
    with pytest.raises(CalibrationError, match="no such file"):
        calibration.read(str(tmp_path / "none.csv"))


def record(**fields):
    out = {"status": "ok", "batch": 1, "q_heads": 8, "kv_heads": 8, "seq_q": 4096, "seq_k": 4096,
           "causal": True, "flops": 1e12, "peak_tflops": 989.0, "chips": 1, "devices": 1,
           "library_config": None, "hlo_kernel_seconds": 1e-3, "hlo_matmul_seconds": 0.0,
           "hlo_other_seconds": 0.0, "hlo_launches": 1, "hlo_compute_bound_seconds": 1e-3,
           "hlo_memory_bound_seconds": 0.0}
    out.update(fields)
    return out


def test_a_record_gets_a_range_around_its_prediction_or_says_why_not():
    targets = load_targets()
    fitted = Calibrated(calibration_rows())
    columns = fitted.columns(record(), targets["h200"])  # Hopper: calibrated on the H100's rows
    assert columns["predicted_seconds_low"] < columns["predicted_seconds"] < columns["predicted_seconds_high"]
    assert columns["predicted_bound"] == "compute"
    assert columns["predicted_share_of_peak"] == pytest.approx(
        1e12 / (columns["predicted_seconds"] * 989e12))
    assert columns["predicted_basis"].startswith(
        "predicted: fitted on 30 published rows of h100-sxm (hopper)")
    uncalibrated = fitted.columns(record(), targets["tpu-v4"])
    assert uncalibrated["predicted_seconds"] is None
    assert "family tpu-v4 has no published device times" in uncalibrated["predicted_basis"]
    refused = fitted.columns(record(status="unsupported"), targets["h200"])
    assert refused["predicted_seconds"] is None and "did not compile" in refused["predicted_basis"]
    tiled = fitted.columns(record(library_config="Op block_q=128,block_kv=128"), targets["h200"])
    assert "a tiled kernel's grid" in tiled["predicted_basis"]  # the rows had no grid steps


def test_record_features_split_grid_steps_over_devices():
    features = record_features(record(library_config="Op block_q=128,block_kv=128", causal=False,
                                      devices=4, chips=4))
    assert features[-1] == 8 * 32 * 32 / 4


# -------------------------------------------------------------------------------------- verdict
def verdict_records(f_low, f, f_high, n_low, n, n_high, ranks=True):
    return pd.DataFrame([
        {"impl": "jax-flash", "label": "forced-flash", "status": "ok", "fits": True, "predicted_seconds": f,
         "predicted_seconds_low": f_low, "predicted_seconds_high": f_high, "predicted_ranks": ranks,
         "predicted_basis": "predicted: ..."},
        {"impl": "jax-xla", "label": "native", "status": "ok", "fits": True, "predicted_seconds": n,
         "predicted_seconds_low": n_low, "predicted_seconds_high": n_high, "predicted_ranks": ranks,
         "predicted_basis": "predicted: ..."},
    ])


def test_the_verdicts_predicted_ratio_decides_only_where_the_ranges_part():
    apart = predicted_ratio(verdict_records(1, 1.2, 1.5, 3, 4, 5))
    assert apart["predicted"] == "forced"
    assert apart["predicted_ratio"] == pytest.approx(0.3)
    assert apart["predicted_ratio_low"] == pytest.approx(1 / 5) and apart["predicted_ratio_high"] == 0.5
    assert apart["predicted_note"].startswith("Predicted, not measured: jax-flash / jax-xla = 0.30")
    overlap = predicted_ratio(verdict_records(1, 2, 4, 2, 3, 5))
    assert overlap["predicted"] == "can't tell"
    failing = predicted_ratio(verdict_records(1, 1.2, 1.5, 3, 4, 5, ranks=False))
    assert failing["predicted"] == "-" and "memory, not speed" in failing["predicted_note"]
    outside = verdict_records(1, 1.2, 1.5, 3, 4, 5)
    outside.loc[0, "predicted_basis"] = "predicted: ...; outside the calibration (seq_q != seq_k): ..."
    extrapolated = predicted_ratio(outside)
    assert extrapolated["predicted_extrapolated"] is True
    assert "extrapolated (seq_q != seq_k)" in extrapolated["predicted_note"]
    assert apart["predicted_extrapolated"] is False
    old = predicted_ratio(verdict_records(1, 1.2, 1.5, 3, 4, 5).drop(columns=["predicted_seconds"]))
    assert "before the time model" in old["predicted_note"]


# ---------------------------------------------------------------------------------- the commands
def run_cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)


def test_calibrate_check_on_a_malformed_table_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "calibration.csv").write_text("target,kernel\nh100-sxm,x\n")
    done = run_cli("calibrate", "--check", "--dir", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "not a calibration table: missing columns" in done.stderr


def test_compile_for_predict_on_an_uncalibrated_target_is_one_line_and_exit_2(tmp_path):
    done = run_cli("compile-for", "--target", "tpu-v4", "--impl", "jax-xla", "--seq", "1k", "--predict",
                   "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0
    assert "family tpu-v4 has no published device times" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing compiled, nothing written


def test_the_committed_calibration_meets_its_bars_where_the_log_says():
    """The committed table fits; each family's figures are the ones results/LOG.md reports."""
    fitted = Calibrated.load(str(ROOT / calibration.TABLE))
    assert set(fitted.families) >= {"hopper", "tpu-v5", "tpu-v6"}
    for family in fitted.families.values():
        assert len(family.score.errors) == len(family.rows)
        assert math.isfinite(family.score.median_abs_error)
    with open(ROOT / calibration.TABLE, newline="") as f:
        assert list(csv.reader(f))[0] == calibration.COLUMNS


def test_a_device_run_is_scored_row_by_row_against_the_records_predictions():
    from attnbench.report.predicted import device_scores, score_summary

    records = pd.DataFrame([
        {"target": "h200", "impl": "jax-cudnn", "seq_q": 4096, "seq_k": 4096, "mode": "fwd",
         "dtype": "bfloat16",
         "batch": 1, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "causal": True, "workload": "custom",
         "predicted_seconds": 2e-4, "predicted_seconds_low": 1e-4, "predicted_seconds_high": 3e-4,
         "predicted_basis": "predicted: fitted on 10 published rows of h100-sxm (hopper); ..."},
        {"target": "h200", "impl": "jax-xla", "seq_q": 4096, "seq_k": 4096, "mode": "fwd",
         "dtype": "bfloat16",
         "batch": 1, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "causal": True, "workload": "custom",
         "predicted_seconds": 1e-3, "predicted_seconds_low": 8e-4, "predicted_seconds_high": 1.2e-3,
         "predicted_basis": "predicted: ..."},
    ])
    cases = pd.DataFrame([
        {"machine": "h200", "framework": "jax", "implementation": "jax-cudnn", "seq_len": 4096,
         "suite": "Forward",
         "dtype": "bfloat16", "busy": False, "step_s": 2.5e-4},
        {"machine": "h200", "framework": "jax", "implementation": "jax-xla", "seq_len": 4096,
         "suite": "Forward",
         "dtype": "bfloat16", "busy": False, "step_s": 2e-3},
        {"machine": "cpu-2core", "framework": "jax", "implementation": "jax-xla", "seq_len": 4096,
         "suite": "Forward", "dtype": "bfloat16", "busy": False, "step_s": 1.0},  # no such target: left out
    ])
    scores = device_scores(cases, records)
    assert list(scores["impl"]) == ["jax-cudnn", "jax-xla"]
    assert list(scores["ratio"]) == pytest.approx([0.8, 0.5])
    assert list(scores["in_range"]) == [True, False]
    assert scores["family"].iloc[0] == "hopper"
    [line] = score_summary(scores)
    assert line.startswith("h200: 2 rows, median error x1.") and "1/2 measured times inside" in line
    assert "worst jax-xla fwd 4096 (predicted / measured 0.50)" in line


def test_a_record_beyond_the_fitted_features_is_called_an_extrapolation():
    fitted = Calibrated(calibration_rows())
    most = max(r["hlo_launches"] for r in fitted.families["hopper"].rows)
    columns = fitted.columns(record(impl="jax-a", seq_q=1024, seq_k=1024, hlo_launches=most * 10),
                             load_targets()["h200"])
    assert "outside the calibration (hlo_launches" in columns["predicted_basis"]
    inside = fitted.columns(record(impl="jax-a", seq_q=1024, seq_k=1024, hlo_kernel_seconds=1e-4,
                                  hlo_launches=1), load_targets()["h200"])
    assert "outside the calibration" not in inside["predicted_basis"]
