"""The measurement engine: every status, the record's columns, regimes, memory sources, writing."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import pytest

from attnbench.core import metrics, records
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options
from attnbench.measure.figures import pool_rounds
from attnbench.measure.reference_check import numerics_workload
from attnbench.run import adaptive, sweep
from attnbench.run.adaptive import RoundPlan
from attnbench.run.sweep import measure_cases, write_table
from attnbench.run.worker import Failure
from tests.cases import measure, measure_sweep
from tests.conftest import FRAMEWORKS

SMALL = Workload(batch=1, q_heads=2, seq_q=128, head_dim=32, causal=True)
FAST = Options(min_seconds=0.05, regime_steps=3)
FAST_DYNAMIC = Options(min_seconds=0.05, regime_steps=3, regime="dynamic")
needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")


@needs_jax
@pytest.mark.slow
def test_ok_record_has_every_metric_group():
    r = measure("jax-xla", SMALL, FAST)
    assert r["status"] == records.OK, r["reason"]
    assert set(r) == set(records.COLUMNS)
    assert r["label"] == "native" and r["platform"] == "cpu" and r["execution"] == "compiled"
    assert r["compile_cache"] == "cold"
    assert r["seconds_per_step"] > 0 and r["iqr_s"] >= 0 and r["samples"] >= 5
    # B1 x 128 tokens per step; causal fwd FLOPs = 4 * H2 * D32 * (128 * 129 / 2 visible pairs)
    assert r["tokens_per_s"] * r["seconds_per_step"] == pytest.approx(128)
    assert r["tflops"] * 1e12 * r["seconds_per_step"] == pytest.approx(4 * 2 * 32 * (128 * 129 // 2))
    assert (r["workload"], r["phase"], r["mask"], r["mask_density"]) == ("custom", "prefill", "causal",
                                                                         pytest.approx(129 / 256))
    assert r["dense_flops"] == 4 * 2 * 32 * 128 * 128 and r["gqa"] is None
    assert r["bytes_per_s"] * r["seconds_per_step"] == pytest.approx(r["min_bytes"])
    assert r["peak_tflops"] > 0 and r["mfu"] == pytest.approx(r["tflops"] / r["peak_tflops"])
    assert r["compiler_temp_bytes"] > 0 and r["compile_s"] > 0
    assert r["compiles"] == 1 and r["padding_waste"] > 0  # static pads the stream to the max
    assert r["numerics_ok"] is True and r["max_abs_err"] < 1e-4
    assert r["kernel_verified"] and "custom-call" in r["kernel_evidence"]
    # CPU priced per vCPU-hour from the packaged profile
    assert r["usd_per_step_on_demand"] == pytest.approx(
        r["usd_per_hour_on_demand"] / 3600 * r["seconds_per_step"])
    assert r["usd_per_million_tokens_on_demand"] == pytest.approx(
        r["usd_per_step_on_demand"] / 128 * 1e6)  # B1 x S128 tokens per step


needs_torch = pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")


@needs_torch
@pytest.mark.parametrize("name", ["torch-blockwise-flash", "torch-flex-attention", "torch-sdpa-flash"])
@pytest.mark.slow
def test_profiled_evidence_is_taken_after_the_timed_first_call(name):
    """A torch record names its kernel from a profiled run made after timing, so first_call_s
    still holds flex's compile (compiled on the step's first call)."""
    import attention_impls

    fresh = type(attention_impls.get(name))()  # flex: an empty table of compiled functions
    r = measure(fresh, SMALL, FAST)
    assert r["status"] == records.OK, r["reason"]
    assert r["kernel_verified"] and r["kernel_evidence"].startswith("profiler saw")
    if name == "torch-flex-attention":
        assert r["first_call_s"] > 20 * r["seconds_per_step"]


@needs_jax
@pytest.mark.slow
def test_dynamic_regime_compiles_per_length_and_bucketed_per_bucket(tmp_path):
    options = Options(min_seconds=0.05, regime_steps=6, trace_dir=str(tmp_path))
    dynamic = measure("jax-xla", SMALL.replace(seq_q=512, seq_k=512), options.__class__(
        **{**options.__dict__, "regime": "dynamic"}))
    assert dynamic["status"] == records.OK, dynamic["reason"]
    with open(dynamic["trace_file"]) as f:
        trace = list(csv.DictReader(f))
    assert len(trace) == 6
    distinct = {row["length"] for row in trace}
    assert dynamic["compiles"] == len(distinct)
    assert dynamic["padding_waste"] == 0
    bucketed = measure("jax-xla", SMALL.replace(seq_q=512, seq_k=512), options.__class__(
        **{**options.__dict__, "regime": "bucketed"}))
    assert bucketed["compiles"] == len({row["padded_length"] for row in csv.DictReader(
        open(bucketed["trace_file"]))})
    assert 0 < bucketed["compiles"] <= dynamic["compiles"]


def test_unsupported_is_a_status_with_the_reason():
    r = measure("jax-cudnn", SMALL, FAST)
    assert r["status"] == records.UNSUPPORTED
    assert "cuDNN needs an NVIDIA GPU" in r["reason"] or "not installed" in r["reason"]


def test_nan_kernel_is_numerics_failed_not_ok():
    r = measure("tests.stub_impls:NanKernel", SMALL, FAST)
    assert r["status"] == records.NUMERICS_FAILED
    assert r["numerics_ok"] is False and r["seconds_per_step"] > 0  # timing kept beside the failure


def test_bug_is_error_with_message():
    r = measure("tests.stub_impls:BrokenKernel", SMALL, FAST)
    assert r["status"] == records.ERROR
    assert "ZeroDivisionError: stub kernel divided by zero" in r["reason"]


def test_unknown_implementation_is_error_not_crash():
    r = measure("no-such-kernel", SMALL, FAST)
    assert r["status"] == records.ERROR and "unknown implementation" in r["reason"]


def test_memory_cap_turns_an_allocation_into_oom():
    [r] = measure_cases([Case("tests.stub_impls:HogKernel", SMALL, FAST)], memory_cap_bytes=4 * 2**30,
                        timeout_s=120, progress=False)
    assert r["status"] == records.OOM, r["reason"]


@pytest.mark.slow
def test_timeout_kills_the_case_and_the_sweep_goes_on():
    # The case after the timeout runs in a fresh worker; its framework's import is not on its clock
    # (run.worker), and its timing has no extension, so 8 s is room enough on a loaded host.
    cases = [("tests.stub_impls:SlowKernel", SMALL, "static"), ("reference-float64", SMALL, "static")]
    short = dataclasses.replace(FAST, max_extra_seconds=0.0, contention_retries=0)
    rows = measure_sweep(cases, short, timeout_s=8, progress=False)
    assert [r["status"] for r in rows] == [records.TIMEOUT, records.OK]
    assert "no result within 8 s" in rows[0]["reason"]
    assert rows[0]["impl"] == "tests.stub_impls:SlowKernel"


@pytest.mark.slow
def test_the_workers_of_one_sweep_share_one_cpu_peak():
    """Every case of a run reports MFU against the same probe, measured once."""
    from attnbench.hardware import PROBE_DIR_ENV

    cases = [("reference-float64", SMALL, "static"), ("reference-float64", SMALL.replace(seq_q=64), "static")]
    rows = measure_sweep(cases, FAST, timeout_s=120, progress=False)
    assert [r["status"] for r in rows] == [records.OK, records.OK]
    assert rows[0]["peak_tflops"] == rows[1]["peak_tflops"] > 0
    assert PROBE_DIR_ENV not in os.environ  # the run's directory is gone with the run


@pytest.mark.slow
def test_a_crashed_worker_is_an_error_record_and_the_sweep_goes_on():
    cases = [("tests.stub_impls:CrashingKernel", SMALL, "static"), ("reference-float64", SMALL, "static")]
    rows = measure_sweep(cases, FAST, timeout_s=60, progress=False, fresh_process=False)
    assert [r["status"] for r in rows] == [records.ERROR, records.OK]
    assert rows[0]["reason"] == "worker died (exit code 3)"


@needs_jax
@pytest.mark.slow
def test_materialized_softmax_memory_grows_quadratically_flash_linearly():
    """XLA's own estimate (compiler_temp_bytes): O(S^2) for jax-xla, O(S) for the blockwise kernel."""
    grow = {}
    for name in ("jax-xla", "jax-blockwise-flash"):
        small, large = (measure(name, SMALL.replace(seq_q=s, seq_k=s, q_heads=1, kv_heads=1),
                                     Options(min_seconds=0.02, regime_steps=1, numerics=False))
                        for s in (1024, 4096))
        grow[name] = large["compiler_temp_bytes"] / small["compiler_temp_bytes"]
    assert grow["jax-xla"] > 10, grow  # 4x the length: ~16x the score matrix
    assert grow["jax-blockwise-flash"] < 6, grow


def test_reference_beyond_its_budget_checks_on_a_proxy():
    big = Workload(batch=4, q_heads=16, seq_q=8192, head_dim=64, causal=True, mode="fwd_bwd")
    proxy = numerics_workload(big)
    assert (proxy.seq_q, proxy.batch, proxy.mode) == (512, 1, "fwd")
    assert numerics_workload(SMALL) == SMALL


def test_write_table_is_atomic_and_readable(tmp_path, monkeypatch):
    path = str(tmp_path / "records.csv")
    write_table([{"impl": "a", "seconds_per_step": 0.5}], path, {"git_commit": "abc"})
    first = open(path).read()
    assert first.splitlines()[0] == "git_commit,impl,seconds_per_step"
    # A write that fails half-way (the new table already in a file, not yet on disk) leaves the
    # previous table whole and no temp file behind. A writer that opened the target itself would
    # have replaced the old table before failing, or never failed here.
    for name, rows in (("records.csv", [{"impl": "b", "seconds_per_step": 9.0}]),
                       ("records.parquet", [{"impl": "b"}])):
        target = str(tmp_path / name)
        write_table([{"impl": "a"}], target)
        before = open(target, "rb").read()

        def disk_full(fd):
            assert os.path.getsize(f"/proc/self/fd/{fd}") > 0  # the new table was being written
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as patch:
            patch.setattr("attnbench.core.atomic.os.fsync", disk_full)
            with pytest.raises(OSError, match="No space left"):
                write_table(rows, target)
        assert open(target, "rb").read() == before
        assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def test_regime_throughput_counts_the_tokens_its_steps_really_ran():
    """A kernel at a constant 12,800 tokens/s (20 ms per 256 tokens) reads ~12,800 tokens/s in the
    dynamic regime, whose steps run 128..256 tokens. Dividing the maximum length's tokens by the
    median step (the old figure) reads 256 / (20 ms x median/256) > 12,800: 1.33x at a median of 192."""
    options = Options(regime="dynamic", min_seconds=0.05, regime_steps=8, numerics=False)
    r = measure("tests.stub_impls:LinearTimeKernel", Workload(batch=1, q_heads=1, seq_q=256,
                                                                   head_dim=8, causal=True), options)
    assert r["status"] == records.OK, r["reason"]
    # A loaded host only lengthens a sleep, so the bound below is the looser one (a run here read 0.88x);
    # the old figure read 1.33x, and counting the shortest length would read 0.67x.
    assert 0.8 * 12_800 < r["tokens_per_s"] < 1.12 * 12_800
    assert 0.8 * 12_800 < r["useful_tokens_per_s"] < 1.12 * 12_800  # dynamic: no padding, no compile
    assert r["tokens_per_s"] * r["seconds_per_step"] < 256 * 0.95  # steps were shorter than the max


def test_numerics_check_the_step_that_was_timed():
    r = measure("tests.stub_impls:WrongOnTheTimedPath", SMALL, FAST)
    assert r["status"] == records.NUMERICS_FAILED, r["reason"]
    assert r["numerics_ok"] is False and r["numerics_workload"].startswith("the timed step")


def test_numerics_of_a_training_step_include_its_gradients():
    r = measure("reference-float64", SMALL.replace(mode="fwd_bwd"), FAST)
    assert r["status"] == records.OK, r["reason"]
    assert r["numerics_workload"] == "the timed step (output and gradients)" and r["max_abs_err"] == 0


@needs_torch
@pytest.mark.parametrize("regime", ["static", "bucketed"])
@pytest.mark.slow
def test_every_compile_of_a_regime_is_cold(regime):
    """FlexAttention compiles through Inductor, whose FX-graph cache served the stream's compile
    when the static timing had compiled the same shape first (0.17 s reported against 13 s)."""
    import attention_impls

    fresh = type(attention_impls.get("torch-flex-attention"))()
    options = Options(regime=regime, min_seconds=0.05, regime_steps=3, numerics=False)
    r = measure(fresh, SMALL.replace(seq_q=256, seq_k=256), options)
    assert r["status"] == records.OK, r["reason"]
    assert r["compiles"] >= 1 and r["compile_cache_hits"] == 0
    assert r["first_call_compile_s"] > 0 and r["first_call_s"] >= r["first_call_compile_s"]


def test_a_static_record_carries_its_samples_interval_and_machine_state():
    r = measure("reference-float64", SMALL, FAST)
    assert r["status"] == records.OK, r["reason"]
    samples = json.loads(r["timing_samples_s"])
    assert len(samples) == r["samples"] >= 5 and r["rounds"] == 1
    assert min(samples) <= r["ci_low_s"] <= r["seconds_per_step"] <= r["ci_high_s"] <= max(samples)
    assert r["contended"] in (True, False) and r["other_cpu_share"] >= 0 and r["load_1min"] >= 0


def test_rounds_pool_their_medians_and_drop_a_contended_round():
    first = {**records.new_record(), "status": records.OK, "seconds_per_step": 0.010, "tokens": 1000,
             "flops": 2e9,
             "peak_tflops": 1.0, "threads": 2, "usd_per_hour_on_demand": 3.6, "usd_per_hour_spot": 1.8,
             "price_source": "test", "cost_note": None, "device": "cpu",
             "seconds_per_step_with_compiles": 0.02, "useful_tokens_per_s": 25_000.0,
             "timing_samples_s": json.dumps([0.010] * 5), "contended": False, "contention_reason": None}
    rounds = adaptive.round_values(first)  # the first window is round 0
    quiet = adaptive.RoundValue(1, 0.012, (0.012,) * 5)
    loaded = adaptive.RoundValue(2, 0.050, (0.050,) * 5, contended=True,
                                 contention_reason="other processes used 1.00 cores (limit 0.1)")
    pooled = pool_rounds(first, [*rounds, quiet, loaded], stopped="settled")
    assert pooled["rounds"] == 2 and pooled["rounds_dropped"] == 1 and pooled["contended"] is False
    # every round is kept by id, the shared one listed: pairs keep it, the figure's own median does not
    assert json.loads(pooled["round_ids"]) == [0, 1, 2] and json.loads(pooled["contended_rounds"]) == [2]
    assert pooled["rounds_stopped"] == "settled"
    assert pooled["samples"] == 10 and 0.010 <= pooled["seconds_per_step"] <= 0.012
    assert pooled["ci_confidence"] == 0.99 and "too few values for 99%" in pooled["ci_method"]
    # Figures derived from the pooled step time, by hand: 1000 tokens per step, 2 GFLOP per step,
    # $3.60/h = $0.001/s.
    seconds = pooled["seconds_per_step"]
    assert pooled["tokens_per_s"] == pytest.approx(1000 / seconds)
    assert pooled["usd_per_step_on_demand"] == pytest.approx(0.001 * seconds)
    assert pooled["mfu"] == pytest.approx(2e9 / seconds / 1e12)
    busy = {**first, "contended": True, "contention_reason": "x"}
    every_round_loaded = pool_rounds(busy, [*adaptive.round_values(busy), loaded])
    assert every_round_loaded["contended"] is True and every_round_loaded["rounds"] == 2
    assert every_round_loaded["contention_reason"] == "contended in all 2 timing rounds, e.g. x"
    # a pooled record gives its rounds back, so a resumed sweep goes on from them
    again = adaptive.round_values(pooled)
    assert [(v.round, v.median_s, v.contended) for v in again] == [(0, 0.010, False), (1, 0.012, False),
                                                                   (2, 0.050, True)]
    assert metrics.get("seconds_per_step").asv_value(pooled) == pooled["seconds_per_step"]  # 2 rounds


@pytest.mark.slow
def test_a_sweep_with_rounds_times_static_cases_again_and_pools_them():
    options = Options(min_seconds=0.05, regime_steps=2, numerics=False)
    plan = RoundPlan(min_rounds=2, max_rounds=2, window_s=0.02)
    rows = measure_sweep([("reference-float64", SMALL, "static"), ("reference-float64", SMALL, "dynamic")],
                         options, rounds=plan, progress=False)
    static, dynamic = rows
    assert static["rounds"] + static["rounds_dropped"] == 3  # a round another process shared is dropped
    assert len(json.loads(static["round_medians_s"])) == 3  # but kept, by id, for the pairs
    assert static["rounds_complete"] is True and static["rounds_stopped"].startswith("base rounds")
    assert dynamic["rounds"] is None  # the regime's figures come from its one stream


def test_a_sweep_cut_mid_adaptation_resumes_from_the_rounds_it_kept():
    """The sweep files each timed case after every look at its rounds (``rounds_complete`` false
    while it goes on); cut there, a sweep handed those records goes on from their rounds, numbered
    after them. A case the look stopped is filed complete: a resumed sweep leaves it out."""
    stops = RoundPlan(min_rounds=4, max_rounds=8, look_every=2, window_s=0.01)  # nothing to weigh it against
    [alone] = measure_cases([Case("reference-float64", SMALL, FAST)], rounds=stops, isolate=False,
                            on_record=lambda i, record: None, progress=False)
    assert alone["rounds_complete"] is True and json.loads(alone["round_ids"]) == [0, 1, 2, 3, 4]
    assert alone["rounds_stopped"].startswith("base rounds")
    # a precision no figure reaches: the case stays in the rounds at every look, to the most
    plan = RoundPlan(min_rounds=4, max_rounds=8, look_every=2, window_s=0.01, precision=1e-9)
    cases = [Case("reference-float64", SMALL, FAST)]
    saved = {}

    class Cut(Exception):
        pass

    def keep(i, record):
        saved[i] = record
        if record.get("rounds_complete") is False and len(json.loads(record["round_ids"])) > 1:
            raise Cut  # the process dies right after the look's records were filed

    with pytest.raises(Cut):
        measure_cases(cases, rounds=plan, isolate=False, on_record=keep, progress=False)
    cut = saved[0]
    kept = json.loads(cut["round_ids"])
    assert cut["rounds_complete"] is False and kept == [0, 1, 2, 3, 4]
    [done] = measure_cases(cases, rounds=plan, isolate=False, prior={0: cut}, progress=False)
    ids = json.loads(done["round_ids"])
    assert ids[:5] == kept and ids[5:] == [5, 6, 7, 8] and done["rounds_complete"] is True
    assert done["rounds_stopped"] == "max rounds"
    assert json.loads(done["round_medians_s"])[:5] == json.loads(cut["round_medians_s"])  # nothing lost


def test_a_sweep_stopped_before_its_rounds_gives_its_cases_their_rounds_when_resumed():
    """Ctrl-C after the first pass: the record it filed says its rounds are not done, so the case
    rejoins a resumed sweep (``asv.suite.unfinished_rounds``) and gets them; a case the rounds do not
    time is filed without the mark once they end."""
    plan = RoundPlan(min_rounds=2, max_rounds=2, window_s=0.01)
    cases = [Case("reference-float64", SMALL, FAST), Case("reference-float64", SMALL, FAST_DYNAMIC)]
    saved: dict[int, dict] = {}

    def stop_at_first(i, record):
        saved[i] = record
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        measure_cases(cases[:1], rounds=plan, isolate=False, on_record=stop_at_first, progress=False)
    assert saved[0]["rounds_complete"] is False and json.loads(saved[0]["round_ids"]) == [0]
    filed: dict[int, list] = {}
    done = measure_cases(cases, rounds=plan, isolate=False, prior={0: saved[0]}, progress=False,
                         on_record=lambda i, record: filed.setdefault(i, []).append(record))
    assert done[0]["rounds_complete"] is True and json.loads(done[0]["round_ids"]) == [0, 1, 2]
    assert filed[1][0]["rounds_complete"] is False  # the first pass's, with rounds to come
    assert "rounds_complete" not in done[1] and filed[1][-1] == done[1]  # not timed: as it was


def test_only_static_ok_cases_of_kernels_that_do_not_run_in_an_interpreter_get_timing_rounds():
    from attnbench.run.sweep import timed_in_rounds

    ok = {"status": records.OK, "timing_samples_s": "[0.01, 0.011]", "execution": "compiled"}
    static = Case("jax-xla", SMALL, FAST)
    assert timed_in_rounds(static, ok)
    assert timed_in_rounds(static, {**ok, "execution": "eager"})
    assert not timed_in_rounds(static, {**ok, "execution": "interpret"})  # the interpreter's time
    assert not timed_in_rounds(Case("jax-xla", SMALL, Options(regime="dynamic")), ok)  # one stream, no rounds
    assert not timed_in_rounds(static, {**ok, "status": records.TIMEOUT})
    assert not timed_in_rounds(static, {**ok, "timing_samples_s": None})


@needs_jax
@pytest.mark.slow
def test_a_sweep_with_rounds_leaves_an_interpreted_kernel_at_its_one_window():
    options = Options(min_seconds=0.05, regime_steps=2, numerics=False)
    [interpreted] = measure_sweep([("jax-pallas-tpu-flash", SMALL, "static")], options,
                                  rounds=RoundPlan(min_rounds=2, max_rounds=2), progress=False)
    assert interpreted["status"] == records.OK and interpreted["execution"] == "interpret"
    assert interpreted["rounds"] == 1 and interpreted["ci_basis"] == "samples"


@needs_jax
@pytest.mark.slow
def test_the_later_rounds_share_compiler_caches_that_live_for_the_rounds_only(monkeypatch):
    import glob
    import os

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    seen = []  # at each worker start: the jax cache folder, and how many files it holds
    real = adaptive.Worker

    class Spy(real):
        def start(self, preload=(), deadline=None):
            folder = os.environ.get("JAX_COMPILATION_CACHE_DIR")
            seen.append((folder, folder and len(glob.glob(os.path.join(folder, "*")))))
            return super().start(preload, deadline)

    monkeypatch.setattr(adaptive, "Worker", Spy)
    options = Options(min_seconds=0.05, regime_steps=2, numerics=False)
    plan = RoundPlan(min_rounds=4, max_rounds=4, restart_every=2, window_s=0.02)
    [row] = measure_cases([Case("jax-xla", SMALL, options)], rounds=plan, progress=False)
    assert len(seen) == 2 and row["rounds"] + row["rounds_dropped"] == 5  # two round workers, four rounds
    assert len({folder for folder, _ in seen}) == 1 and seen[1][1] > 0  # one cache: written, then read
    assert not os.path.exists(seen[0][0]) and "JAX_COMPILATION_CACHE_DIR" not in os.environ


def test_a_fresh_worker_imports_the_cases_framework_before_its_clock_starts(monkeypatch):
    calls = []

    class Recording:
        threads = None

        def __init__(self, task, **kwargs):
            pass

        def call(self, args, timeout_s, preload=(), deadline=None):
            calls.append((preload, deadline))
            return None, Failure(records.TIMEOUT, "stub")

        def close(self):
            pass

    monkeypatch.setattr(sweep, "Worker", Recording)
    rows = measure_cases([Case("reference-float64", SMALL, FAST), Case("no-such-kernel", SMALL, FAST)],
                         timeout_s=1, deadline=1e12, progress=False)
    assert calls[0][0] == ("numpy",)
    assert calls[1][0] == ()  # the record says the name is unknown, not the preload
    assert calls[1][1] == 1e12  # the run's deadline holds the worker's start too
    assert [r["status"] for r in rows] == [records.TIMEOUT] * 2 and rows[1]["impl"] == "no-such-kernel"
