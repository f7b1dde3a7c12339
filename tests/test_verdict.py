"""The verdict (attnbench/report/verdict.py): the stream model, the winners, ties, flips, reasons.

Synthetic tidy frames are built by hand here, with only the columns the verdict reads; the
committed results are read (never written) by the CLI and README checks at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from attnbench.report import compiled_verdict, streams, verdict, verdict_display  # noqa: E402
from attnbench.report.horizon import Horizon  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MEASURED_STEPS = 6
MAX_LEN = 1024


# -- the stream model -----------------------------------------------------------------------------
def test_expected_shapes_per_regime():
    assert streams.expected_shapes("static", MAX_LEN, 1000) == pytest.approx(1.0)
    # multiple-128 buckets over [512, 1024]: 512 (only 512 itself), 640, 768, 896, 1024
    assert set(streams.shape_shares("bucketed", MAX_LEN)) == {512, 640, 768, 896, 1024}
    assert streams.expected_shapes("bucketed", MAX_LEN, 10**6) == pytest.approx(5.0)
    assert streams.expected_shapes("dynamic", MAX_LEN, 10**7) == pytest.approx(513.0)
    assert streams.expected_shapes("dynamic", MAX_LEN, 2) == pytest.approx(2 - 1 / 513)


def test_price_stream_gives_back_the_measured_stream():
    figures = {
        "steady_usd": 1e-6,
        "usd_with_compiles": 3e-6,
        "usd_per_mtok": 4e-3,
        "compiles": 4,
        "regime": "bucketed",
        "max_len": MAX_LEN,
        "measured_steps": MEASURED_STEPS,
    }
    measured = streams.price_stream(**figures, steps=MEASURED_STEPS)
    assert measured["usd_per_mtok"] == pytest.approx(4e-3)
    assert measured["compiles"] == 4
    longer = streams.price_stream(**figures, steps=1000)
    tokens = 3e-6 * 1e6 / 4e-3
    stall = MEASURED_STEPS * (3e-6 - 1e-6) / 4
    shapes = streams.expected_shapes("bucketed", MAX_LEN, 1000)
    rate = 4 / streams.measured_shapes("bucketed", MAX_LEN, MEASURED_STEPS)
    assert longer["compiles"] == pytest.approx(rate * shapes)
    assert longer["usd_per_mtok"] == pytest.approx(
        (1000 * 1e-6 + rate * shapes * stall) * 1e6 / (1000 * tokens)
    )
    assert longer["usd_per_mtok"] < measured["usd_per_mtok"]  # stalls amortise
    assert 0 < longer["stall_share"] < measured["stall_share"]


def test_price_stream_without_compiles_is_the_steady_cost_plus_its_first_call_once():
    """An eager kernel compiles nothing, but its first call stalls (allocation, first touch): paid
    once, so over the measured stream it is the measured cost, and it amortises over a longer one."""
    flat = dict(steady_usd=1e-6, usd_with_compiles=1e-6, usd_per_mtok=2e-3, compiles=0, regime="dynamic",
                max_len=MAX_LEN, measured_steps=MEASURED_STEPS)
    priced = streams.price_stream(**flat, steps=10**5)
    assert priced["usd_per_mtok"] == pytest.approx(2e-3)
    assert priced["stall_share"] == 0.0
    stalled = {**flat, "usd_with_compiles": 2e-6, "usd_per_mtok": 4e-3}  # 6 us of first call over 6 steps
    assert streams.price_stream(**stalled, steps=MEASURED_STEPS)["usd_per_mtok"] == pytest.approx(4e-3)
    tokens = 2e-6 * 1e6 / 4e-3
    longer = streams.price_stream(**stalled, steps=1000)
    assert longer["usd_per_mtok"] == pytest.approx((1000 * 1e-6 + 6e-6) * 1e6 / (1000 * tokens))
    assert longer["stall_share"] == pytest.approx(6e-6 / (1000 * 1e-6 + 6e-6))


def test_price_stream_refuses_missing_figures():
    with pytest.raises(ValueError, match="finite USD figures"):
        streams.price_stream(
            steady_usd=float("nan"),
            usd_with_compiles=1e-6,
            usd_per_mtok=1e-3,
            compiles=1,
            regime="static",
            max_len=MAX_LEN,
            measured_steps=MEASURED_STEPS,
            steps=MEASURED_STEPS,
        )


# -- synthetic tidy frames ------------------------------------------------------------------------
# How the machine moved in each of 16 later rounds: every kernel of a round moves alike (paired).
DRIFT = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 0.75, 1.05, 0.95, 1.2, 0.85, 1.15, 0.7, 1.0, 1.1, 0.9]
ROUNDS = len(DRIFT)


def _rounds(step, spread, n=ROUNDS, seed=0):
    """``round_ids`` and ``round_medians_s`` of a case timed in the later rounds 1..n: the machine's
    drift, times the kernel's own scatter of +-``spread`` (alternating, shifted by ``seed``)."""
    medians = [step * DRIFT[r % len(DRIFT)] * (1 + spread * (-1) ** (r + seed)) for r in range(n)]
    return {"round_ids": json.dumps([0, *range(1, n + 1)]), "round_medians_s": json.dumps([step, *medians])}


def _case(
    impl,
    label,
    *,
    step,
    lo=None,
    hi=None,
    regimes=None,
    execution="compiled",
    contended=False,
    suite="Forward",
    seq=MAX_LEN,
    peak=None,
    spread=0.01,
    rounds=ROUNDS,
    control=None,
):
    """Tidy rows of one kernel case: its static step with its later rounds (``spread``: its own
    scatter on top of the machine's drift) and, per regime, (steady USD, USD with compiles, compiles);
    USD per million useful tokens follows from 768 useful tokens per step. ``control``: the A/A
    control's second windows' scatter (None: no control)."""
    base = {
        "machine": "cpu-test",
        "env_name": "virtualenv-test",
        "commit_hash": "a" * 40,
        "commit_order": 1.0,
        "commit_position": 1.0,
        "commit_date": pd.Timestamp("2026-12-01"),
        "status": "ok",
        "suite": suite,
        "implementation": impl,
        "label": label,
        "execution": execution,
        "seq_len": float(seq),
        "dtype": "float32",
        "workload": None,
        "phase": None,
        "contended": contended,
        "setting_regime_steps": float(MEASURED_STEPS),
    }
    rows = [
        {
            **base,
            "benchmark": f"attention.{suite}.track_seconds_per_step",
            "regime": "static",
            "metric": "seconds_per_step",
            "value": step,
            "ci_low": lo or step * 0.95,
            "ci_high": hi or step * 1.05,
            **(_rounds(step, spread, rounds) if rounds else {}),
        }
    ]
    if control is not None:
        again = _rounds(step, control, rounds, seed=1)
        rows[0].update(control_round_ids=again["round_ids"], control_round_medians_s=again["round_medians_s"])
    if peak:
        rows.append(
            {
                **base,
                "benchmark": "b",
                "regime": "static",
                "metric": "host_profiler_peak_bytes",
                "value": peak,
            }
        )
    for regime, (steady, stalled, compiles) in (regimes or {}).items():
        for metric, value in (
            ("usd_per_step", steady),
            ("usd_per_step_with_compiles", stalled),
            ("usd_per_million_useful_tokens_with_compiles", stalled * 1e6 / 768),
            ("compiles", compiles),
            ("padding_waste", 0.1),
        ):
            rows.append(
                {
                    **base,
                    "benchmark": f"attention.{suite}.track_{metric}",
                    "regime": regime,
                    "metric": metric,
                    "value": value,
                    "ci_low": None,
                    "ci_high": None,
                }
            )
    return rows


def _frame(*cases):
    return pd.DataFrame([row for case in cases for row in case])


def _only(table, **where):
    part = table
    for key, value in where.items():
        part = part[part[key] == value]
    assert len(part) == 1, part
    return part.iloc[0]


def _break(impl, release, cause, target="cpu", workload="causal-256", environment="bare", evidence=""):
    return {"impl": impl, "framework": "jax", "target": target, "workload": workload, "release": release,
            "cause": cause, "status": "api-changed", "reason": "", "line": "", "environment": environment,
            "evidence": evidence}


def test_fast_on_paper_slow_in_production_is_a_flip():
    # forced: 10 ms steps, but each compile stalls 30x a step's cost; native: 12 ms, cheap compiles
    forced = _case(
        "jax-forced",
        "forced-flash",
        step=0.010,
        regimes={"dynamic": (1.0e-6, 1.0e-6 + 30e-6, 6), "static": (1.4e-6, 1.4e-6 + 5e-6, 1)},
    )
    native = _case(
        "jax-native",
        "native",
        step=0.012,
        regimes={"bucketed": (1.1e-6, 1.2e-6, 4), "static": (1.3e-6, 1.32e-6, 1)},
        spread=0.0,
    )
    from attnbench.releases.table import breaks_to_cite

    breaks = breaks_to_cite([
        _break("jax-forced", "0.9.2", "packaging"), _break("jax-forced", "0.6.2", "adapter"),
        _break("jax-forced", "0.7.2", "capability"), _break("jax-forced", "0.7.2", "packaging",
                                                            environment="libtpu 0.0.37"),
        _break("jax-forced", "0.8.2", "api-changed", target="tpu-v5e")])
    table = verdict.measured_verdicts(_frame(forced, native), horizon=Horizon(1000, "steps"),
                                      fragility=breaks)
    row = _only(table, framework="jax")
    assert (row["forced"], row["native"]) == ("jax-forced (forced-flash)", "jax-native (native)")
    # on paper: 16 paired rounds; the machine moved each round by -30%..+30%, both kernels alike, and
    # the forced kernel's own +-1% is all the per-round ratio keeps: 0.833x, within 0.82..0.85
    assert row["paper"] == "forced" and row["paper_rounds"] == 16
    assert row["paper_ratio"] == pytest.approx(10 / 12, rel=0.011)
    assert 0.82 < row["paper_low"] <= row["paper_ratio"] <= row["paper_high"] < 0.85
    assert row["answer"] == "native" and 1 < row["ratio_low"] <= row["ratio"] <= row["ratio_high"]
    assert row["flip"] == "yes"  # both decided, in opposite directions
    assert row["ratio_of"] == "jax-forced / jax-native, USD per useful token"
    assert "jax-native: buckets" in row["production_strategy"]
    assert row["sentence"].startswith("Use native jax-native: forced jax-forced costs ")
    assert "jax-forced broke in jax 0.9.2 (packaging)" in row["reasons"]
    assert "0.6.2" not in row["reasons"]  # the project's adapter is no kernel's fragility
    assert "0.7.2" not in row["reasons"]  # an old release's missing feature, another libtpu: no break
    assert "0.8.2" not in row["reasons"]  # seen on another target
    assert "profiler" not in row["reasons"]  # said once, in the notes
    notes = verdict_display.notes(table, {"jax-forced": False, "jax-native": True})
    assert "invisible to their framework's profiler: jax-forced; visible: jax-native" in " ".join(notes)


def test_a_win_is_a_win_equal_is_equal_and_a_wide_interval_cannot_tell():
    """The same two kernels: production costs 2x apart; 2% apart, paired tightly (equal within the
    margin); and 2% apart with each kernel scattering +-30% on its own (too wide for either)."""
    def pair(forced_usd, spread=0.01, margin=None):
        forced = _case("torch-f", "forced-flash", step=0.010, regimes={"static": (forced_usd, forced_usd, 0)},
                       spread=spread)
        native = _case("torch-n", "native", step=0.010, regimes={"static": (1e-6, 1e-6, 0)}, spread=0.0)
        return _only(verdict.measured_verdicts(_frame(forced, native), margin=margin), framework="torch")

    win = pair(0.5e-6)
    assert win["answer"] == "forced" and win["ratio_high"] < 1
    assert win["sentence"].startswith("Force torch-f: it costs 0.50x")
    equal = pair(1.02e-6)
    assert equal["answer"] == "equal" and 0.9 <= equal["ratio_low"] and equal["ratio_high"] <= 1.1
    assert equal["paper"] == "equal" and equal["flip"] == "no"
    assert equal["sentence"].startswith("Either: forced torch-f and native torch-n cost the same within ±10%")
    assert pair(1.02e-6, margin=0.01)["answer"] == "native"  # within +-1%? no: 1.02 [1.01-1.03] is above 1
    wide = pair(1.02e-6, spread=0.3)
    assert wide["ratio_low"] < 0.9 and wide["ratio_high"] > 1.1
    assert wide["answer"] == "can't tell" and wide["flip"] == "can't tell"
    assert wide["sentence"].startswith("Can't tell: forced torch-f costs ")
    assert "too wide to call it either way or equal within ±10%" in wide["sentence"]


def test_too_few_paired_rounds_cannot_carry_the_interval():
    forced = _case("jax-f", "forced-flash", step=0.005, regimes={"static": (0.5e-6, 0.5e-6, 1)}, rounds=5)
    native = _case("jax-n", "native", step=0.010, regimes={"static": (1e-6, 1e-6, 1)}, rounds=5)
    row = _only(verdict.measured_verdicts(_frame(forced, native)), framework="jax")
    assert row["paper"] == "can't tell" and row["answer"] == "can't tell" and pd.isna(row["ratio_low"])
    assert "timed together in 5 later rounds: too few for a 99% interval (it needs 8)" in row["reasons"]


def test_a_kernel_against_itself_comes_out_equal():
    """The A/A control: a kernel timed twice in each round, compared as a row compares two kernels."""
    frame = _frame(_case("jax-xla", "native", step=0.010, spread=0.02, control=0.02,
                         regimes={"static": (1e-6, 1e-6, 1)}))
    [row] = verdict.controls(frame).to_dict("records")
    assert row["kernel"] == "jax-xla" and row["rounds"] == 16 and row["answer"] == "equal"
    assert 0.9 <= row["ratio_low"] <= 1.0 <= row["ratio_high"] <= 1.1
    assert verdict_display.control_lines(verdict.controls(frame))[0].endswith("equal within ±10%")
    assert verdict.controls(_frame(_case("jax-xla", "native", step=0.01))).empty  # no control timed


def test_interpreted_and_contended_kernels_never_win():
    fastest_interpreted = _case(
        "jax-pallas-x", "forced-flash", step=0.001, execution="interpret", regimes={"static": (1e-8, 1e-8, 1)}
    )
    fastest_contended = _case(
        "jax-busy", "native", step=0.002, contended=True, regimes={"static": (1e-8, 1e-8, 1)}
    )
    slow = _case("jax-xla", "native", step=0.02, regimes={"static": (1e-6, 1.1e-6, 1)})
    frame = _frame(fastest_interpreted, fastest_contended, slow)
    table = verdict.measured_verdicts(frame)
    row = _only(table, framework="jax")
    assert row["native"] == "jax-xla (native)" and pd.isna(row["forced"]) and row["answer"] == "-"
    assert row["sentence"].startswith("Only jax-xla (native) ranks here: no forced-flash kernel")
    assert "not ranked (contended): jax-busy" in row["reasons"]
    assert "Not ranked anywhere, as they run in an interpreter here: jax-pallas-x." in \
        verdict_display.notes(table, frame=frame)


def test_the_float64_reference_gets_no_verdict_row_and_no_line_in_the_picture():
    reference = _case("reference-float64", "reference", step=0.0001, regimes={"dynamic": (1e-9, 1e-9, 1)})
    assert verdict.measured_verdicts(_frame(reference)).empty
    assert verdict_display.plot_stream_cost(_frame(reference)) is None


def test_no_stream_is_a_paper_only_row():
    frame = _frame(_case("torch-a", "native", step=0.01), _case("torch-b", "forced-flash", step=0.02))
    table = verdict.measured_verdicts(frame)
    row = _only(table, framework="torch")
    assert row["paper"] == "native" and row["answer"] == "-" and row["flip"] == "-"
    assert "no length stream measured" in row["sentence"]
    assert verdict.headline(table).empty and len(verdict.paper_only(table)) == 1


def test_a_short_stream_winner_gets_its_break_even_with_its_interval():
    # forced: cheaper steps, a 200-step-sized compile; native: dearer steps, no compile
    forced = _case(
        "torch-xla-forced",
        "forced-flash",
        step=0.010,
        lo=0.0099,
        hi=0.0101,
        regimes={"static": (1.0e-6, 1.0e-6 + 200e-6 / MEASURED_STEPS, 1)},
    )
    native = _case(
        "torch-xla-native",
        "native",
        step=0.015,
        lo=0.0149,
        hi=0.0151,
        regimes={"static": (1.5e-6, 1.5e-6, 0)},
        spread=0.0,
    )
    row = _only(verdict.measured_verdicts(_frame(forced, native), horizon=Horizon(1000, "steps")),
                framework="torch_xla")
    assert row["answer"] == "forced" and row["cold_start"] == "native" and row["serving"] == "forced"
    # the forced kernel catches up when 1e-6 * n + 200e-6 < 1.5e-6 * n: from n = 401 on; the paired
    # steps' uncertainty (their per-round ratio's, about +-1%) moves that a little either way
    assert row["break_even"] == 401 and row["break_even_of"] == "torch-xla-forced"
    assert row["break_even_low"] < 401 < row["break_even_high"] < 500
    assert ("torch-xla-native is cheaper: torch-xla-forced pays back its compile stalls after 401 steps ["
            in row["reasons"])
    assert row["holds"] == "torch-xla-forced cheaper from 401 steps"  # no trace here: no hours


def test_a_break_even_within_the_noise_says_never_within_the_uncertainty():
    """Steady steps 1.0 vs 1.1 us with ±20% intervals: the forced kernel may be the dearer per step, and
    then it never pays back its compile."""
    def case(steady, stalled, compiles):
        figures = (("usd_per_step", steady), ("usd_per_step_with_compiles", stalled),
                   ("usd_per_million_useful_tokens_with_compiles", stalled * 1e6 / 768),
                   ("compiles", compiles))
        return {f"static:{m}": v for m, v in figures}

    forced, native = case(1.0e-6, 11e-6, 1), case(1.1e-6, 1.1e-6, 0)
    point, early, late = streams.break_even_interval(forced, native, 0.2 / 2.576, 0.2 / 2.576, MAX_LEN,
                                                     MEASURED_STEPS)
    assert point is not None and early < point and late is None
    assert verdict._steps_words(point, early, late).endswith("-never, within the uncertainty]")


def test_break_even_never_within_the_limit():
    cheap = {
        f"static:{m}": v
        for m, v in (
            ("usd_per_step", 1e-6),
            ("usd_per_step_with_compiles", 1e-6),
            ("usd_per_million_useful_tokens_with_compiles", 1e-6 * 1e6 / 768),
            ("compiles", 0),
        )
    }
    dear = {
        **cheap,
        "static:usd_per_step": 2e-6,
        "static:usd_per_step_with_compiles": 3e-6,
        "static:usd_per_million_useful_tokens_with_compiles": 3e-6 * 1e6 / 768,
        "static:compiles": 1,
    }
    assert streams.break_even_steps(dear, cheap, MAX_LEN, MEASURED_STEPS, limit=10**5) is None


# -- compile targets ------------------------------------------------------------------------------
def _record(impl, label, seq, *, status="ok", fits=True, copies=0, execution="compiled"):
    return {
        "target": "tpu-v5e",
        "impl": impl,
        "label": label,
        "seq_q": seq,
        "seq_k": seq,
        "batch": 1,
        "mode": "fwd",
        "dtype": "bfloat16",
        "status": status,
        "fits": fits,
        "execution": execution,
        "inserted_copy_bytes": copies,
        "model_roofline_seconds": 0.0223,
    }


def test_compile_targets_speak_of_memory_never_of_speed():
    records = pd.DataFrame(
        [
            _record("jax-xla", "native", 65536, status="does-not-fit", fits=False),
            _record("jax-pallas-tpu-flash", "forced-flash", 65536, copies=470e6),
            _record("jax-pallas-tpu-splash", "forced-flash", 65536, copies=336e6),
            _record("jax-pallas-gpu-mha", "forced-flash", 65536, execution="interpret"),
        ]
    )
    batches = pd.DataFrame(
        [
            {
                "target": "tpu-v5e",
                "impl": "jax-pallas-tpu-flash",
                "mode": "fwd",
                "dtype": "bfloat16",
                "seq_len": 65536,
                "max_batch": 17,
                "capped": False,
                "inserted_copy_bytes_at_max": 8.93e9,
                "peak_bytes_at_max": 15.2e9,
            },
            {
                "target": "tpu-v5e",
                "impl": "jax-pallas-tpu-splash",
                "mode": "fwd",
                "dtype": "bfloat16",
                "seq_len": 65536,
                "max_batch": 19,
                "capped": False,
            },
            {
                "target": "tpu-v5e",
                "impl": "jax-xla",
                "mode": "fwd",
                "dtype": "bfloat16",
                "seq_len": 65536,
                "max_batch": None,
                "capped": None,
            },
        ]
    )
    table = compiled_verdict.compiled_verdicts(records, batches)
    row = _only(table, machine="tpu-v5e")
    assert row["basis"] == "compiler only"
    assert row["answer"] == "-" and pd.isna(row["forced"])
    assert row["sentence"].startswith("On tpu-v5e the compiler fits the most tokens per chip with "
                                      "jax-pallas-tpu-splash")
    assert row["headroom_winner"] == "jax-pallas-tpu-splash"
    assert "largest batch: jax-pallas-tpu-splash 19, jax-pallas-tpu-flash 17" in row["reasons"]
    assert "does not fit at batch 1: jax-xla" in row["reasons"]
    assert (
        "jax-pallas-tpu-flash fits 0.89x the tokens per chip of jax-pallas-tpu-splash, and its layout "
        "copies write 8.93 GB per step there" in row["reasons"]
    )
    without_search = compiled_verdict.compiled_verdicts(records, None)
    assert (
        "forced-flash jax-pallas-tpu-flash: layout copies +470 MB at batch 1"
        in _only(without_search, machine="tpu-v5e")["reasons"]
    )
    assert verdict.headline(without_search).empty  # no batch search: not in the headline
    assert "a bound, not a rank" in row["reasons"]
    assert "jax-pallas-gpu-mha" not in row["reasons"]  # the interpreter's memory says nothing
    assert len(verdict.headline(table)) == 1


def test_a_preset_decode_is_its_own_compiled_row_at_its_cache_length():
    """A preset's records (batch 8, one query against its cache) are a row of their own, named for the
    preset and phase at the cache's length, never folded into the B1 H8 D64 grid."""
    decode = [{**_record(impl, label, 1), "seq_k": 131072, "batch": 8, "workload": "llama-3.1-8b",
               "phase": "decode", "mask": "causal"}
              for impl, label in (("jax-xla", "native"), ("jax-pallas-tpu-ragged-paged", "forced-flash"))]
    records = pd.DataFrame([_record("jax-xla", "native", 4096), *decode])
    batches = pd.DataFrame([{"target": "tpu-v5e", "impl": impl, "workload": "llama-3.1-8b", "phase": "decode",
                             "mode": "fwd", "dtype": "bfloat16", "seq_len": 131072, "max_batch": n,
                             "capped": False}
                            for impl, n in (("jax-xla", 3), ("jax-pallas-tpu-ragged-paged", 12))])
    table = compiled_verdict.compiled_verdicts(records, batches)
    row = _only(table, workload="llama-3.1-8b decode")
    assert row["seq_len"] == 131072 and row["headroom_winner"] == "jax-pallas-tpu-ragged-paged"
    assert "largest batch: jax-pallas-tpu-ragged-paged 12, jax-xla 3" in row["reasons"]
    assert len(table) == 1  # the B1 H8 D64 record has no batch search here: no row
    both = compiled_verdict.compiled_verdicts(records, None)
    assert set(both["workload"]) == {"llama-3.1-8b decode", compiled_verdict.FORWARD}


def test_a_forced_reimplementation_is_named_as_the_projects_own_once():
    """A win of jax-blockwise-flash is this project's port of the GPU algorithm winning, not the GPU
    kernel; the notes say so once (``reimplements`` on the kernel), not every row."""
    forced = _case("jax-blockwise-flash", "forced-flash", step=0.010, regimes={"static": (0.5e-6, 0.5e-6, 0)})
    native = _case("jax-xla", "native", step=0.010, regimes={"static": (1e-6, 1e-6, 0)})
    table = verdict.measured_verdicts(_frame(forced, native))
    row = _only(table, framework="jax")
    assert row["answer"] == "forced" and "re-implementation" not in row["sentence"]
    notes = verdict_display.notes(table)
    assert ("jax-blockwise-flash is this project's jax re-implementation of FlashAttention-2's GPU "
            "algorithm (default tiles 128x128, FA2's)") in notes[0]
    plain = _case("jax-pallas-tpu-splash", "forced-flash", step=0.010,
                  regimes={"static": (0.5e-6, 0.5e-6, 0)})
    assert not any("re-implementation" in n for n in verdict_display.notes(
        verdict.measured_verdicts(_frame(plain, native))))


# -- the committed results ------------------------------------------------------------------------
def _committed() -> bool:
    return (ROOT / "results" / "benchmarks.json").is_file()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_cli_refuses_a_bad_horizon_in_one_line():
    done = _cli("verdict", "--horizon", "0")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["attnbench: error: --horizon must be more than 0, got '0'"]


@pytest.mark.skipif(not _committed(), reason="needs the committed results/")
@pytest.mark.slow
def test_readme_verdict_is_the_commands_output_on_the_committed_results(tmp_path, committed_results):
    """On git's copy of results/ (a local make bench files its run beside the committed ones). The
    forest plot is the verdict CSV's intervals, and the README's copy of it is the one drawn now."""
    from attnbench.report import forest

    png, forest_png, csv = tmp_path / "verdict.png", tmp_path / "forest.png", tmp_path / "verdict.csv"
    done = _cli("verdict", "--results", str(committed_results), "--markdown", "--width", "0",
                "--png", str(png), "--forest", str(forest_png), "--csv", str(csv))
    assert done.returncode == 0, done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- verdict:start -->\n(.*?)<!-- verdict:end -->", readme, re.S)
    assert block, "README.md has no verdict block"
    shown = [line for line in block.group(1).splitlines() if line.startswith("|")]
    assert shown == table, "README's verdict differs from `attnbench verdict --markdown` on results/"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = forest.rows_in_png(forest_png.read_bytes())
    rows = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    measured = [r for r in drawn if r["evidence"] == forest.MEASURED]
    assert len(measured) == int((rows["basis"].eq("measured") & rows["ratio"].notna()).sum()) > 0
    for row in drawn:  # each drawn interval is its verdict row's, in the CSV
        keys = ["machine", "basis", "framework", "workload", "seq_len", "dtype"]
        [match] = rows[(rows[keys].astype(str) == pd.Series({k: str(row[k]) for k in keys})).all(axis=1)] \
            .to_dict("records")
        state, ratio, low, high = forest.SOURCE[row["evidence"]]
        assert (row["state"], row["ratio"], row["low"], row["high"]) == \
            (match[state], match[ratio], match[low], match[high]), row["label"]
    assert "](docs/verdict-forest.png)" in readme
    committed = forest.rows_in_png((ROOT / "docs" / "verdict-forest.png").read_bytes())
    assert committed == drawn, "docs/verdict-forest.png is not drawn from results/: run `make verdict`"


def test_a_training_row_shows_each_kernels_training_memory_by_its_frameworks_one_way():
    """torch: the bytes saved for backward, beside time; a forward row shows none."""
    from attnbench.report import verdict_display

    def case(impl, label, saved, suite):
        rows = _case(impl, label, step=0.010, regimes={"static": (1e-6, 1e-6, 0)}, suite=suite)
        if saved is not None:
            rows.append({**rows[0], "benchmark": "b", "metric": "saved_for_backward_bytes", "value": saved,
                         "ci_low": None, "ci_high": None})
        return rows

    table = verdict.measured_verdicts(_frame(case("torch-f", "forced-flash", 16 * 2**20, "Training"),
                                             case("torch-n", "native", 4 * 2**20, "Training")))
    row = _only(table, framework="torch")
    assert (row["forced_train_bytes"], row["native_train_bytes"]) == (16 * 2**20, 4 * 2**20)
    assert row["train_memory_source"] == "saved_for_backward_bytes"
    shown = verdict_display.short(table).iloc[0]["training memory"]
    assert shown == "16.0 / 4.0 MiB saved for backward"
    forward = verdict.measured_verdicts(_frame(case("torch-f", "forced-flash", 16 * 2**20, "Forward"),
                                               case("torch-n", "native", 4 * 2**20, "Forward")))
    assert verdict_display.short(forward).iloc[0]["training memory"] == "-"
