"""A verdict's production ways timed in the paired rounds (issue 39): the stream sample a round
replays, the priced ways that join the rounds, the production pair that holds a group open, the
verdict's production ratio from the ways' own rounds, the windows priced warm, a recompiling stream
cut once it cannot be its kernel's cheapest way, and a stream's inputs cut from one draw."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attnbench.core import records, regimes
from attnbench.core.inputs import make_inputs, stream_inputs
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options
from attnbench.run import adaptive, sweep
from attnbench.run.adaptive import FORCED_LABEL, NATIVE_LABEL, Member, RoundPlan, RoundValue
from tests.conftest import FRAMEWORKS
from tests.test_regimes import FakeCompiler, run_fake

TEMPLATE = Workload(batch=1, q_heads=2, seq_q=256, head_dim=32, causal=True)
needs_torch = pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")


# -- the stream sample ---------------------------------------------------------------------------
def test_a_stream_sample_is_one_step_of_each_equal_slice_of_its_sorted_lengths():
    lengths = list(range(200, 0, -1))  # step 0 (length 200: the cold first call) is never sampled
    sample = regimes.stream_sample(TEMPLATE.replace(seq_q=200, seq_k=200), "dynamic", lengths, count=4)
    # 199 steps after the first, sorted 1..199, four slices of ~50: their middles
    assert [s.run_len for s in sample] == [25, 75, 125, 175]
    assert all(s.packed is None for s in sample)
    longer = TEMPLATE.replace(seq_q=200, seq_k=200)
    assert regimes.stream_sample(longer, "dynamic", lengths, count=4) == sample
    # fewer steps than asked: every step after the first, in length order
    assert [s.run_len for s in regimes.stream_sample(TEMPLATE, "dynamic", [9, 3, 5], count=8)] == [3, 5]
    assert regimes.stream_sample(TEMPLATE, "dynamic", [9], count=8) == ()


def test_a_stream_sample_runs_at_the_lengths_its_regime_pads_to():
    lengths = [256, 10, 100, 130, 250, 60]
    bucketed = regimes.stream_sample(TEMPLATE, "bucketed", lengths, "multiple-128", count=3)
    assert {s.run_len for s in bucketed} <= {128, 256}
    assert {s.run_len for s in regimes.stream_sample(TEMPLATE, "static", lengths, count=3)} == {256}
    packed = regimes.stream_sample(TEMPLATE, "packed", [(n,) for n in lengths], windows=[0, 0, 1, 1, 2, 2],
                                   count=8)
    assert packed and all(s.run_len == 256 and s.packed for s in packed)
    with pytest.raises(ValueError, match="count must be a positive integer"):
        regimes.stream_sample(TEMPLATE, "dynamic", lengths, count=0)
    with pytest.raises(ValueError, match="unknown regime"):
        regimes.stream_sample(TEMPLATE, "ragged", lengths)


# -- a stream's inputs ---------------------------------------------------------------------------
def test_a_stream_steps_inputs_are_the_templates_draws_cut_to_its_lengths():
    template = Workload(batch=2, q_heads=4, kv_heads=2, seq_q=64, head_dim=16, causal=True)
    full = make_inputs(template, 3)
    step = stream_inputs(template.at_length(40), template, 3)
    assert step.q.shape == (2, 40, 4, 16) and step.k.shape == (2, 40, 2, 16)
    assert step.q.flags["C_CONTIGUOUS"] and step.v.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(step.q, full.q[:, :40])
    np.testing.assert_array_equal(step.v, full.v[:, :40])
    # not the template at shorter lengths: drawn for itself
    other = template.replace(head_dim=8, seq_q=40, seq_k=40)
    np.testing.assert_array_equal(stream_inputs(other, template, 3).q, make_inputs(other, 3).q)
    longer = template.at_length(80)
    np.testing.assert_array_equal(stream_inputs(longer, template, 3).k, make_inputs(longer, 3).k)


def test_a_decode_steps_inputs_keep_their_own_ragged_caches():
    template = Workload(batch=2, q_heads=2, seq_q=1, seq_k=64, head_dim=16, causal=True, ragged=True)
    step = template.at_length(40)
    x = stream_inputs(step, template, 0)
    assert x.k.shape == (2, 40, 2, 16)
    q_ids, kv_ids = step.segment_ids()
    np.testing.assert_array_equal(x.kv_segment_ids, kv_ids)
    np.testing.assert_array_equal(x.q_segment_ids, q_ids)


# -- windows priced warm, and a recompiling stream cut ---------------------------------------------
def test_a_window_is_priced_warm_its_stalls_at_the_steady_step():
    fake = FakeCompiler(stall=0.02, step=0.001)
    result = run_fake(fake, TEMPLATE, "dynamic", [100, 100, 200, 200, 100, 100], windows=[0, 0, 1, 1, 2, 2])
    steady = result.steady_seconds_per_step
    warm = result.window_steady_seconds()
    assert len(warm) == 3
    # window 0: the first call (a stall) at the steady step, then a warm step; window 1: its compile too
    assert warm[0] == pytest.approx(steady + result.trace[1].seconds)
    assert warm[1] == pytest.approx(steady + result.trace[3].seconds)
    assert warm[2] == pytest.approx(result.trace[4].seconds + result.trace[5].seconds)
    assert max(warm) < 0.01 < sum(t.seconds for t in result.trace[:3])  # the stalls are not in them


def test_a_recompiling_stream_stops_past_its_ceiling_an_eager_one_never_does():
    lengths = list(range(10, 60))
    compiling = run_fake(FakeCompiler(stall=0.01, step=0.0), TEMPLATE, "dynamic", lengths, ceiling_s=0.03)
    assert 3 <= len(compiling.trace) <= 6 and compiling.planned_steps == len(lengths)
    eager = run_fake(FakeCompiler(stall=0.0, step=0.002, reports=False), TEMPLATE, "dynamic", lengths,
                     ceiling_s=0.01)
    assert len(eager.trace) == len(lengths)  # its compiles go uncounted: nothing recompiles


def _static_record(per_step=0.01, steps=200, first_call=0.5, planned=200):
    return {"status": records.OK, "seconds_per_step_with_compiles": per_step, "regime_steps": steps,
            "first_call_s": first_call, "stream_steps_planned": planned}


def test_a_regime_case_gets_a_quarter_more_than_its_static_streams_steps_after_the_first():
    static = Case("jax-xla", TEMPLATE, Options())
    dynamic = Case("jax-xla", TEMPLATE, Options(regime="dynamic", stream_budget_s=15.0))
    statics = {("jax-xla", TEMPLATE, ()): 0}
    cut = sweep.with_ceiling(dynamic, [_static_record()], statics)
    assert cut.options.stream_ceiling_s == pytest.approx(1.25 * (0.01 * 200 - 0.5))
    assert cut.options.stream_budget_s == 15.0  # the budget stays: whichever comes first
    assert sweep.with_ceiling(static, [_static_record()], statics) is static
    assert sweep.with_ceiling(dynamic, [{**_static_record(), "status": records.ERROR}], statics) is dynamic
    assert sweep.with_ceiling(dynamic, [_static_record(steps=50)], statics) is dynamic  # a cut static stream
    assert sweep.with_ceiling(dynamic, [None], statics) is dynamic


# -- the priced ways and the production pair -----------------------------------------------------
def _record(impl, label, regime, tokens_per_s, *, framework="jax", execution="compiled", **extra):
    return {"status": records.OK, "impl": impl, "label": label, "framework": framework, "regime": regime,
            "execution": execution, "useful_tokens_per_s": tokens_per_s, **extra}


def test_the_priced_ways_are_each_labels_cheapest_stream_per_group():
    other = TEMPLATE.replace(seq_q=128, seq_k=128)
    cases = [Case("jax-a", TEMPLATE, Options()), Case("jax-a", TEMPLATE, Options(regime="dynamic")),
             Case("jax-b", TEMPLATE, Options()), Case("jax-b", TEMPLATE, Options(regime="bucketed")),
             Case("jax-p", TEMPLATE, Options()), Case("jax-a", other, Options()),
             Case("ref", TEMPLATE, Options())]
    first = [_record("jax-a", FORCED_LABEL, "static", 100.0),
             _record("jax-a", FORCED_LABEL, "dynamic", 150.0),
             _record("jax-b", NATIVE_LABEL, "static", 120.0),
             _record("jax-b", NATIVE_LABEL, "bucketed", 90.0),
             # its interpreter's speed
             _record("jax-p", FORCED_LABEL, "static", 900.0, execution="interpret"),
             _record("jax-a", FORCED_LABEL, "static", 10.0),  # another workload: a group of its own
             _record("ref", NATIVE_LABEL, "static", 999.0, framework="numpy")]
    assert adaptive.priced_ways(cases, first) == {1: FORCED_LABEL, 2: NATIVE_LABEL, 5: FORCED_LABEL}


def _stream(per_step_first, stall_total, steps=100, tokens=1000.0):
    """A first-pass stream record: ``steps`` steps at ``per_step_first`` plus ``stall_total`` seconds."""
    total = steps * per_step_first + stall_total
    return {"regime_steps": steps, "seconds_per_step_with_compiles": total / steps,
            "stream_steady_s": per_step_first, "seconds_per_step": per_step_first,
            "useful_tokens_per_s": tokens / total}


def test_a_production_cost_is_its_stalls_once_and_every_step_at_the_rounds_value():
    record = _stream(0.01, stall_total=0.5)
    assert adaptive.production_seconds(record, 0.01) == pytest.approx((0.5 + 1.0) / 1000)
    assert adaptive.production_seconds(record, 0.02) == pytest.approx((0.5 + 2.0) / 1000)


def _group(forced_regime="static", native_regime="dynamic"):
    forced = Member(0, Case("jax-a", TEMPLATE, Options()), FORCED_LABEL, 1, priced=forced_regime == "static")
    native = Member(1, Case("jax-b", TEMPLATE, Options()), NATIVE_LABEL, 1, priced=False)
    stream = Member(2, Case("jax-b", TEMPLATE, Options(regime=native_regime)), NATIVE_LABEL, 1, priced=True)
    return [forced, native, stream]


def _values(forced_step, native_step, stream_step, rounds=16, wobble=0.02, stream_wobble=0.02):
    def series(value, wobble):
        return [RoundValue(0, value)] + [RoundValue(r, value * (1 + wobble * (-1) ** r))
                                        for r in range(1, rounds + 1)]
    return {0: series(forced_step, wobble), 1: series(native_step, -wobble),
            2: series(stream_step, stream_wobble)}


def test_a_group_stays_open_while_its_production_pair_cannot_decide():
    plan = RoundPlan(min_rounds=8, max_rounds=40, margin=0.1)
    group = _group()
    records_of = {0: _stream(0.010, 0.5), 2: _stream(0.012, 0.0)}
    # on paper forced is decided faster (0.010 vs 0.020); in production its stall makes the two meet,
    # and the stream's rounds move against the forced kernel's: too wide to say
    values = _values(0.010, 0.020, 0.015, stream_wobble=-0.15)
    assert adaptive.pair_state(values[0], values[1], plan.margin, plan.look_confidence) == "below"
    assert adaptive.production_state(group, values, plan, records_of) == "unclear"
    assert adaptive.still_needed(group, values, plan, records_of, set())
    # the two meet within the margin, round by round: equal settles it
    values = _values(0.010, 0.020, 0.015)
    assert adaptive.production_state(group, values, plan, records_of) == "equal"
    # the stream's rounds say it is dearer: production decided too, the group settles
    values = _values(0.010, 0.020, 0.030)
    assert adaptive.production_state(group, values, plan, records_of) == "below"
    assert not adaptive.still_needed(group, values, plan, records_of, set())
    # without the first pass's records the production pair holds nothing open
    assert adaptive.production_state(group, _values(0.010, 0.020, 0.015, stream_wobble=-0.15), plan,
                                     {}) == "equal"


def test_a_stream_records_rounds_come_back_for_a_resumed_sweep():
    from attnbench.measure.figures import pool_stream_rounds

    record = {"regime": "dynamic", "status": records.OK, "seconds_per_step": 0.004, "stream_steady_s": 0.004}
    pooled = pool_stream_rounds(record, [RoundValue(0, 0.004), *(RoundValue(r, 0.003 + r * 1e-5)
                                                                   for r in range(1, 9))], stopped="settled")
    assert json.loads(pooled["stream_round_ids"]) == list(range(1, 9)) and pooled["stream_rounds"] == 8
    low, mid, high = (pooled[f"stream_round_{k}"] for k in ("ci_low_s", "median_s", "ci_high_s"))
    assert low <= mid <= high
    assert pooled["seconds_per_step"] == 0.004  # the first pass's figures stay
    again = adaptive.round_values(pooled)
    assert [v.round for v in again] == list(range(0, 9)) and again[3].median_s == pytest.approx(0.00303)


# -- the round worker's stream sample, and a sweep that prices a stream by its rounds --------------
@needs_torch
def test_a_round_times_a_stream_way_by_its_samples_mean_step():
    from attnbench.measure import round_timing

    round_timing.forget()
    case = Case("torch-sdpa-math", TEMPLATE, Options(regime="dynamic", regime_steps=12, traffic="azure-code",
                                                      stream_windows=3))
    static = Case("torch-sdpa-math", TEMPLATE, Options(regime_steps=12))
    [stream, step] = round_timing.time_round([(case, 1), (static, 2)], 0.01, min_samples=2)
    assert stream["status"] == records.OK and step["status"] == records.OK
    sample = round_timing.warm_stream(case)
    assert sample.steps == len(sample.sample) == 11  # every step after the first of 12
    # its value is a mean step: the sample's steps are shorter than the static step's 256
    assert 0 < stream["median_s"] < step["median_s"] * 1.5
    round_timing.forget()


@needs_torch
@pytest.mark.slow
def test_a_sweep_times_a_priced_stream_way_in_its_rounds_and_the_rest_once():
    from tests.cases import eight_round_sweep

    cases = [(impl, TEMPLATE, regime) for regime in ("static", "dynamic")
             for impl in ("torch-blockwise-flash", "torch-sdpa-flash")]
    rows = eight_round_sweep([*cases, ("torch-sdpa-math", TEMPLATE, "dynamic")])
    assert all(r["status"] == records.OK for r in rows)
    priced = [r for r in rows if r["regime"] == "dynamic" and r.get("stream_rounds")]
    assert priced, "an eager kernel's exact lengths are its cheapest way: priced, timed in the rounds"
    for r in priced:
        assert len(json.loads(r["stream_round_s"])) == r["stream_rounds"] == 8
        assert r["stream_steady_s"] == r["seconds_per_step"]  # the first pass's figure stays
        assert len(json.loads(r["window_steady_seconds"])) == 4
    math_dynamic = rows[4]
    assert math_dynamic.get("stream_rounds") is None  # not its label's cheapest: its stream once


# -- the verdict prices a way by its own rounds ----------------------------------------------------
def test_the_verdicts_production_ratio_follows_the_priced_ways_own_rounds():
    pd = pytest.importorskip("pandas")
    from attnbench.report import streams, verdict
    from tests.test_verdict import DRIFT, ROUNDS, _case, _frame, _only

    forced = _case("jax-blockwise-flash", "forced-flash", step=0.010,
                   regimes={"static": (1e-6, 1.1e-6, 1)})
    native = _case("jax-xla", "native", step=0.012,
                   regimes={"static": (1.2e-6, 1.3e-6, 1), "dynamic": (0.6e-6, 0.7e-6, 3)})

    def with_stream_rounds(rows, factor):
        for row in rows:
            if row["regime"] == "dynamic":
                # the machine's drift of each round, as the static steps' (tests/test_verdict.py)
                row.update(stream_steady_s=0.006, stream_round_ids=json.dumps(list(range(1, ROUNDS + 1))),
                           stream_round_s=json.dumps([0.006 * factor * d for d in DRIFT]))
        return rows

    proxy = _only(verdict.measured_verdicts(_frame(forced, native)), framework="jax")
    own = _only(verdict.measured_verdicts(_frame(forced, with_stream_rounds(pd.DataFrame(native).to_dict(
        "records"), 1.0))), framework="jax")
    assert own["answer"] == proxy["answer"] and own["ratio"] == pytest.approx(proxy["ratio"], rel=0.05)
    dearer = _only(verdict.measured_verdicts(_frame(forced, with_stream_rounds(pd.DataFrame(native).to_dict(
        "records"), 2.0))), framework="jax")
    assert dearer["ratio"] < own["ratio"]  # its rounds say its steps cost twice: native dearer
    case = {"dynamic:stream_round_ids": [1, 2], "dynamic:stream_round_s": [0.002, 0.004],
            "dynamic:stream_steady_s": 0.002, "rounds": {1: 0.01, 2: 0.02}, "step_s": 0.01}
    assert streams.way_rounds(case, "dynamic") == {1: 1.0, 2: 2.0}
    assert streams.way_rounds(case, "static") == {1: 1.0, 2: 2.0}
    assert not streams.timed_in_rounds(case, "dynamic") and streams.timed_in_rounds(case, "static")
    # timed in the rounds, a way's steady steps carry no run-to-run term of their own
    priced = pd.DataFrame(with_stream_rounds(pd.DataFrame(native).to_dict("records"), 1.0))
    table = verdict.case_table(priced).to_dict("records")[0]
    history = {("cpu-test", "Forward", "jax-xla", 1024.0, "float32", "dynamic", "regime/static"): 0.3}
    timed = streams.cheapest_way(table, 6, history, {}, 1024, 6)
    bare = {k: v for k, v in table.items() if "stream_round" not in k}
    untimed = streams.cheapest_way(bare, 6, history, {}, 1024, 6)
    assert timed["regime"] == untimed["regime"] == "dynamic"
    assert timed["sd_once"] < untimed["sd_once"]
    # the stalls' scatter counts once for the stream measured; their extrapolation only beyond it
    key = ("cpu-test", "Forward", "jax-xla", 1024.0, "float32", "dynamic")
    stalls = {(*key, "usd_per_step_with_compiles"): 0.2}
    measured = streams.cheapest_way(table, 6, stalls, {}, 1024, 6)
    longer = streams.cheapest_way(table, 60, stalls, {}, 1024, 6)
    assert measured["regime"] == longer["regime"] == "dynamic"
    assert measured["sd_once"] == pytest.approx(measured["stall_share"] * 0.2)
    assert longer["sd_once"] > longer["stall_share"] * 0.2


def test_warm_windows_leave_no_window_out():
    from attnbench.report import verdict

    forced = {"static:window_steady": [2.0, 2.0, 1.0], "static:window_tokens": [100, 100, 100],
              "static:window_seconds": [9.0, 2.0, 1.0]}
    native = {"dynamic:window_steady": [1.0, 1.0, 1.0], "dynamic:window_tokens": [100, 100, 100],
              "dynamic:window_seconds": [1.0, 1.0, 1.0]}
    logs = [math.log(2), math.log(2), 0.0]
    mean = sum(logs) / 3
    expected = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2 / 3)
    assert verdict.window_spread(forced, "static", native, "dynamic") == pytest.approx(expected)

