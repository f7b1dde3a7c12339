"""A static way's compile stall measured again in every round (issue 39): which ways are probed, the
probe's fresh-process first calls, the rounds that carry them (and a resumed sweep's), the production
cost a round prices from its probe, the verdict's paired interval without the stall's history term;
and a stream sample's one pass per round."""

from __future__ import annotations

import json

import pytest

from attnbench.core import records
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options
from attnbench.measure.figures import pool_rounds
from attnbench.measure.round_timing import time_interleaved
from attnbench.run import adaptive
from attnbench.run.adaptive import FORCED_LABEL, NATIVE_LABEL, Member, RoundPlan, RoundValue
from tests.conftest import FRAMEWORKS

TEMPLATE = Workload(batch=1, q_heads=2, seq_q=128, head_dim=32, causal=True)
needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")


def _static(first_call, steady=0.001, steps=200, compiles=1, status=records.OK):
    """A first-pass static stream: its first call, then ``steps - 1`` steady steps."""
    total = first_call + (steps - 1) * steady
    return {"regime": "static", "status": status, "compiles": compiles, "first_call_s": first_call,
            "regime_steps": steps, "seconds_per_step_with_compiles": total / steps,
            "stream_steady_s": steady, "seconds_per_step": steady, "useful_tokens_per_s": 1000.0 / total}


# -- which ways are probed -----------------------------------------------------------------------
def test_a_static_way_is_probed_when_its_compile_is_a_tenth_of_its_stream_and_short():
    case = Case("jax-a", TEMPLATE, Options())
    assert adaptive.stall_probed(case, _static(0.3))  # 0.3 s of 0.5 s
    assert not adaptive.stall_probed(case, _static(0.01))  # 0.01 s of 0.2 s: under a tenth
    assert not adaptive.stall_probed(case, _static(18.0))  # FlexAttention's compile: not every round
    assert not adaptive.stall_probed(case, _static(0.3, compiles=0))  # eager: nothing compiled
    assert not adaptive.stall_probed(case, _static(0.3, status=records.TIMEOUT))
    assert not adaptive.stall_probed(Case("jax-a", TEMPLATE, Options(regime="dynamic")), _static(0.3))
    first = [_static(0.3), _static(0.3)]
    cases = [case, Case("jax-b", TEMPLATE, Options())]
    labelled = [dict(first[0], label=FORCED_LABEL), dict(first[1], label=NATIVE_LABEL)]
    [group] = adaptive.groups_of(cases, labelled, [0, 1], frozenset({0}))
    assert [m.probe for m in group] == [True, False]  # only a priced way
    [alone] = adaptive.groups_of(cases, first, [0, 1], frozenset({0, 1}), probes=False)
    assert not any(m.probe for m in alone)  # a sweep in one process compiles nothing cold again


# -- the production cost a round prices ------------------------------------------------------------
def test_a_rounds_probe_replaces_the_first_passs_stall():
    record = _static(0.3)
    first_pass = adaptive.production_seconds(record, 0.001)
    assert first_pass == pytest.approx((0.299 + 0.2) / 1000)  # its stall once, 200 steady steps
    assert adaptive.production_seconds(record, 0.001, first_call=0.3) == pytest.approx(first_pass)
    assert adaptive.production_seconds(record, 0.001, first_call=0.15) < first_pass
    assert adaptive.production_seconds(record, 0.001, first_call=0.0) == pytest.approx(
        adaptive.production_seconds(record, 0.001, first_call=0.001))  # never below no stall


def test_a_group_whose_stalls_were_probed_decides_on_them():
    plan = RoundPlan(min_rounds=8, max_rounds=40, margin=0.05)
    forced = Member(0, Case("jax-a", TEMPLATE, Options()), FORCED_LABEL, 1, priced=True, probe=True)
    native = Member(1, Case("jax-b", TEMPLATE, Options()), NATIVE_LABEL, 1, priced=True, probe=True)
    # equal steady steps; the forced kernel's first pass stalled 0.1 s, the native's 0.3 s
    records_of = {0: _static(0.1), 1: _static(0.3)}

    def series(step, probe):
        return [RoundValue(0, step)] + [RoundValue(r, step * (1 + 0.01 * (-1) ** r), first_call_s=probe(r))
                                        for r in range(1, 17)]
    # the probes say the opposite of the first pass: the forced kernel's compile is the dearer one
    values = {0: series(0.001, lambda r: 0.3 + 0.01 * (r % 3)), 1: series(0.001, lambda r: 0.1)}
    assert adaptive.production_state([forced, native], values, plan, records_of) == "above"
    unprobed = [dataclass_replace(forced, probe=False), dataclass_replace(native, probe=False)]
    assert adaptive.production_state(unprobed, values, plan, records_of) == "below"


def dataclass_replace(member, **changes):
    import dataclasses

    return dataclasses.replace(member, **changes)


def test_a_rounds_probes_are_kept_and_come_back_for_a_resumed_sweep():
    record = dict(_static(0.3), timing_samples_s="[0.001]", tokens=128, flops=1e6)
    rounds = [RoundValue(0, 0.001)] + [RoundValue(r, 0.001, first_call_s=0.2 + r / 100) for r in range(1, 9)]
    rounds[4] = RoundValue(4, 0.001)  # a probe that failed: the round stays, without one
    pooled = pool_rounds(record, rounds, stopped="settled")
    assert json.loads(pooled["first_call_round_ids"]) == [1, 2, 3, 5, 6, 7, 8]
    assert json.loads(pooled["first_call_round_s"])[0] == pytest.approx(0.21)
    again = adaptive.round_values(pooled)
    assert [v.first_call_s for v in again][:5] == [None, pytest.approx(0.21), pytest.approx(0.22),
                                                 pytest.approx(0.23), None]
    assert pool_rounds(record, [RoundValue(0, 0.001)])["first_call_round_s"] is None


# -- the probe itself ----------------------------------------------------------------------------
@needs_jax
def test_a_probe_times_each_static_ways_first_call_cold_and_a_failure_alone():
    from attnbench.measure.round_timing import first_calls

    good = Case("jax-xla", TEMPLATE, Options())
    bad = Case("tests.stub_impls:NoSuchImpl", TEMPLATE, Options())
    [one, broken, two] = first_calls([good, bad, good])
    assert one["status"] == two["status"] == records.OK and broken["status"] != records.OK
    assert "NoSuchImpl" in broken["reason"]
    # the same shape twice in one process compiles twice: each call is on a fresh runner, cold
    assert one["first_call_s"] > 0 and two["first_call_s"] > 0
    assert abs(one["first_call_s"] - two["first_call_s"]) < 5 * max(one["first_call_s"], two["first_call_s"])


@needs_jax
@pytest.mark.slow
def test_a_sweep_probes_its_priced_static_ways_stalls_in_every_round():
    from tests.cases import eight_round_sweep

    rows = eight_round_sweep([(impl, TEMPLATE, "static") for impl in ("jax-blockwise-flash", "jax-xla")])
    assert all(r["status"] == records.OK for r in rows)
    for row in rows:  # 16 steps of a millisecond after a compile of a tenth of a second: probed
        probes = json.loads(row["first_call_round_s"])
        assert json.loads(row["first_call_round_ids"]) == list(range(1, 9)) and len(probes) == 8
        assert all(p > row["seconds_per_step"] for p in probes)  # each one compiled


# -- a stream sample's pass ------------------------------------------------------------------------
def test_a_run_not_kept_timing_stops_once_done_while_the_others_fill_the_window():
    calls = {"fast": 0, "pass": 0}

    def fast():
        calls["fast"] += 1

    def one_pass():
        calls["pass"] += 1
        t = __import__("time").perf_counter()
        while __import__("time").perf_counter() - t < 0.06:
            pass

    fast_t, pass_t = time_interleaved([fast, one_pass], numbers=[1, 1], min_seconds=0.05, min_samples=5,
                                      keep_timing=[True, False])
    assert len(pass_t.samples_s) == 1 and calls["pass"] == 2  # the warm-up call and its one block
    assert len(fast_t.samples_s) >= 5
    kept = time_interleaved([fast, one_pass], numbers=[1, 1], min_seconds=0.05, min_samples=5)
    assert len(kept[1].samples_s) == len(kept[0].samples_s) >= 5  # kept: one block per cycle


# -- the verdict pairs a probed stall ---------------------------------------------------------------
def test_the_verdict_prices_a_probed_ways_stall_from_its_rounds():
    pd = pytest.importorskip("pandas")
    from attnbench.report import streams, verdict
    from tests.test_verdict import DRIFT, ROUNDS, _case, _frame, _only

    # one millisecond a step, 768 useful tokens: a stream of 6 steps whose stall is half its cost
    forced = _case("jax-blockwise-flash", "forced-flash", step=0.010, regimes={"static": (1e-6, 2e-6, 1)})
    native = _case("jax-xla", "native", step=0.010, regimes={"static": (1e-6, 2e-6, 1)})

    def probed(rows, first_call):
        out = pd.DataFrame(rows).to_dict("records")
        for row in out:
            row.update(first_call_round_ids=json.dumps(list(range(1, ROUNDS + 1))),
                       first_call_round_s=json.dumps([first_call * d for d in DRIFT]))
        return out

    def row(f, n):
        return _only(verdict.measured_verdicts(_frame(f, n)), framework="jax")

    plain = row(forced, native)
    same = row(probed(forced, 0.07), probed(native, 0.07))
    dearer = row(probed(forced, 0.13), probed(native, 0.07))
    # the first pass's stall (0.06 s over 6 steps of 0.01 s) and a probe of 0.07 s (0.06 s beyond
    # the step) price alike; a forced probe of 0.13 s doubles its stall: a third dearer
    assert same["ratio"] == pytest.approx(plain["ratio"], rel=0.02)
    assert dearer["ratio"] == pytest.approx(1.5 * same["ratio"], rel=0.05)
    assert dearer["answer"] == "native"
    table = verdict.case_table(pd.DataFrame(probed(forced, 0.07))).to_dict("records")[0]
    assert sorted(streams.stall_rounds(table, "static")) == list(range(1, ROUNDS + 1))
    assert streams.stall_rounds(table, "dynamic") == {} and streams.stalls_in_rounds(table, "static")
    # probed in every round, the stall's history adds nothing; unprobed, it does
    key = ("cpu-test", "Forward", "jax-blockwise-flash", 1024.0, "float32", "static")
    history = {(*key, "usd_per_step_with_compiles"): 0.2}
    bare = verdict.case_table(pd.DataFrame(forced)).to_dict("records")[0]
    assert streams.cheapest_way(table, 6, history, {}, 1024, 6)["sd_once"] == 0.0
    unprobed = streams.cheapest_way(bare, 6, history, {}, 1024, 6)
    assert unprobed["sd_once"] == pytest.approx(0.5 * 0.2, rel=0.05)


def test_a_static_streams_stall_is_taken_against_its_own_steady_step():
    from attnbench.report import streams

    # the rounds' step (12 ms) above the 16 steps the stream timed (10 ms): the stall is the first
    # call beyond the stream's own steady step, not beyond the rounds' figure
    case = {"step_s": 0.012, "static:usd_per_step": 12e-6, "static:stream_steady_s": 0.010,
            "static:usd_per_step_with_compiles": (1.0 + 199 * 0.010) / 200 * 1e-3,
            "static:usd_per_million_useful_tokens_with_compiles": 1.0, "static:compiles": 1}
    assert streams.stall_per_step(case, "static") == pytest.approx((1.0 - 0.010) / 200 * 1e-3)
    without = {k: v for k, v in case.items() if k != "static:stream_steady_s"}
    assert streams.stall_per_step(without, "static") == pytest.approx(
        case["static:usd_per_step_with_compiles"] - 12e-6)  # what it was: 2 ms a step ate 0.4 s
    figures = streams.stream_figures(case, "static", 256, 200)
    assert figures["usd_with_compiles"] - figures["steady_usd"] == pytest.approx((1.0 - 0.010) / 200 * 1e-3)
    moved = streams.scaled_regime(case, "static", 1.0)
    assert streams.stream_figures(moved, "static", 256, 200)["usd_with_compiles"] == pytest.approx(
        figures["usd_with_compiles"])  # scaled by 1: the same stream, its stall counted once
