"""Which cases the later rounds go on timing (issue 39): at each look, a case stays only while a round
would still tell something it is measured for (``adaptive.still_needed``): the two kernels of an open
forced / native pair, on paper or in production; an A/A control until it comes out equal; a static
step whose own 99% interval is wider than the plan's precision. A pair settled at a look stays
settled, and a way's stall probes stop once its production pair is settled."""

from __future__ import annotations

import pytest

from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options
from attnbench.run import adaptive
from attnbench.run.adaptive import FORCED_LABEL, NATIVE_LABEL, Member, RoundPlan, RoundValue

TEMPLATE = Workload(batch=1, q_heads=2, seq_q=256, head_dim=32, causal=True)


def _member(index, impl, label, **kw):
    return Member(index, Case(impl, TEMPLATE, Options()), label, 1, **kw)


def _series(value, rounds=16, wobble=0.01, first=None, control=None):
    """Round 0 and ``rounds`` later rounds at ``value``, alternating by ``wobble``; ``control``: an A/A
    control's second window at this factor of the first."""
    out = [RoundValue(0, value if first is None else first)]
    for r in range(1, rounds + 1):
        v = value * (1 + wobble * (-1) ** r)
        out.append(RoundValue(r, v, control_median_s=v * control(r) if control else None))
    return out


def test_a_decided_pair_is_done_and_an_open_pair_keeps_both_its_kernels():
    plan = RoundPlan(min_rounds=8, max_rounds=40)
    group = [_member(0, "jax-a", FORCED_LABEL), _member(1, "jax-b", NATIVE_LABEL),
             _member(2, "jax-c", NATIVE_LABEL)]
    # 0 vs 1: 2x apart, decided; 0 vs 2: 1.15x apart with a 20% wobble, neither decided nor equal
    values = {0: _series(0.010), 1: _series(0.020), 2: _series(0.0115, wobble=-0.2)}
    settled: set = set()
    assert adaptive.still_needed(group, values, plan, {}, settled) == {0, 2}
    assert ("paper", 0, 1) in settled and ("paper", 0, 2) not in settled
    values[2] = _series(0.020)  # now decided too: nothing left to tell
    assert adaptive.still_needed(group, values, plan, {}, settled) == set()


def test_a_pair_settled_at_a_look_stays_settled():
    plan = RoundPlan(min_rounds=8, max_rounds=40)
    group = [_member(0, "jax-a", FORCED_LABEL), _member(1, "jax-b", NATIVE_LABEL)]
    settled: set = set()
    assert adaptive.still_needed(group, {0: _series(0.010), 1: _series(0.020)}, plan, {}, settled) == set()
    # later rounds that alone could not decide do not reopen it: the look's decision stands
    wide = {0: _series(0.010, wobble=0.3), 1: _series(0.011, wobble=-0.3)}
    assert adaptive.pair_state(wide[0], wide[1], plan.margin, plan.look_confidence) == "unclear"
    assert adaptive.still_needed(group, wide, plan, {}, settled) == set()
    assert adaptive.still_needed(group, wide, plan, {}, set()) == {0, 1}


def test_an_imprecise_static_step_gets_more_rounds_only_with_a_precision():
    group = [_member(0, "jax-a", FORCED_LABEL), _member(1, "jax-b", NATIVE_LABEL)]
    values = {0: _series(0.010, wobble=0.2), 1: _series(0.030, wobble=0.01)}  # decided, 0 is wide
    assert adaptive.relative_half_width(values[0]) == pytest.approx(0.2, rel=0.05)
    assert adaptive.relative_half_width(values[1]) < 0.02
    assert adaptive.still_needed(group, values, RoundPlan(min_rounds=8, max_rounds=40), {}, set()) == set()
    precise = RoundPlan(min_rounds=8, max_rounds=40, precision=0.05)
    assert adaptive.still_needed(group, values, precise, {}, set()) == {0}
    # fewer values than carry a 99% interval: never precise yet
    assert adaptive.relative_half_width(_series(0.010, rounds=5, wobble=0.0)) == float("inf")
    # a contended round is left out of the figure, as pool_rounds leaves it out
    busy = values[1][:-1] + [RoundValue(16, 0.090, contended=True)]
    assert adaptive.relative_half_width(busy) < 0.02


def test_an_aa_control_stays_until_it_comes_out_equal():
    plan = RoundPlan(min_rounds=8, max_rounds=40, controls=(Case("jax-a", TEMPLATE, Options()).key,))
    group = [_member(0, "jax-a", NATIVE_LABEL)]  # alone: nothing else holds it
    noisy = {0: _series(0.010, control=lambda r: 1.0 + 0.15 * (-1) ** (r // 2))}
    assert adaptive.control_state(noisy[0], plan.margin, plan.look_confidence) == "unclear"
    assert adaptive.still_needed(group, noisy, plan, {}, set()) == {0}
    steady = {0: _series(0.010, control=lambda r: 1.0 + 0.01 * (-1) ** r)}
    settled: set = set()
    assert adaptive.still_needed(group, steady, plan, {}, settled) == set() and ("control", 0) in settled


def _faked_rounds(monkeypatch, time_group) -> list[int]:
    """``run_rounds`` with its windows from ``time_group`` and its stall probes faked (each probe a
    first call of 0.1 s); returns the list the probed rounds' ids are appended to."""
    probed_rounds: list[int] = []

    def probe(members, round_id, values, *rest):
        probed_rounds.append(round_id)
        for m in members:
            values[m.index][-1] = RoundValue(round_id, values[m.index][-1].median_s, first_call_s=0.1)
        return 0.0

    monkeypatch.setattr(adaptive, "_time_group", time_group)
    monkeypatch.setattr(adaptive, "_probe_stalls", probe)
    monkeypatch.setattr(adaptive, "Worker", lambda *a, **k: adaptive.InProcess(None))
    return probed_rounds


def test_rounds_stop_per_case_and_probes_stop_once_production_settles(monkeypatch):
    """``run_rounds`` with the windows and probes faked: a settled, precise case stops at the first
    look while an imprecise one of the same group goes on; probes run only while production is open."""
    forced = _member(0, "jax-a", FORCED_LABEL, priced=True, probe=True)
    native = _member(1, "jax-b", NATIVE_LABEL, priced=True, probe=True)
    native_wide = _member(2, "jax-c", NATIVE_LABEL)
    level = {0: 0.010, 1: 0.020, 2: 0.0105}  # 0 vs 2: too close for their wobble
    def time_group(worker, members, round_id, values, plan, *rest):
        for m in members:
            wobble = 0.25 if m.index == 2 else 0.005  # case 2's figure, and its pair with 0, stay wide
            values[m.index].append(RoundValue(round_id, level[m.index] * (1 + wobble * (-1) ** round_id)))

    probed_rounds = _faked_rounds(monkeypatch, time_group)
    records_of = {i: {"regime_steps": 100, "seconds_per_step_with_compiles": level[i] + 0.001,
                      "stream_steady_s": level[i], "seconds_per_step": level[i],
                      "useful_tokens_per_s": 100.0 / (100 * (level[i] + 0.001))} for i in (0, 1)}
    values = {i: [RoundValue(0, level[i])] for i in level}
    plan = RoundPlan(min_rounds=12, max_rounds=20, look_every=4, precision=0.05)
    stopped = adaptive.run_rounds([[forced, native, native_wide]], values, plan, records_of=records_of)
    assert stopped == {0: adaptive.STOPPED_MAX, 1: adaptive.STOPPED_SETTLED, 2: adaptive.STOPPED_MAX}
    assert [v.round for v in values[1]] == list(range(13))  # settled and precise at the first look
    assert len(values[2]) == 21 and len(values[0]) == 21  # its open pair keeps the forced kernel
    assert probed_rounds == list(range(1, 13))  # the production pair settled at round 12


def test_a_ways_stall_is_probed_sixteen_times_at_most(monkeypatch):
    """A production pair that stays open (two kernels too close to tell) keeps its rounds, but its ways'
    stall probes stop at ``PROBE_ROUNDS``."""
    forced = _member(0, "jax-a", FORCED_LABEL, priced=True, probe=True)
    native = _member(1, "jax-b", NATIVE_LABEL, priced=True, probe=True)
    def time_group(worker, members, round_id, values, *rest):
        for m in members:  # 1.02x apart with a 20% wobble: never decided, never equal
            level = 0.010 * (1.02 if m.index == 0 else 1.0)
            values[m.index].append(RoundValue(round_id, level * (1 + 0.2 * (-1) ** (round_id + m.index))))

    probed_rounds = _faked_rounds(monkeypatch, time_group)
    records_of = {i: {"regime_steps": 100, "seconds_per_step_with_compiles": 0.011, "stream_steady_s": 0.010,
                      "seconds_per_step": 0.010, "useful_tokens_per_s": 100.0 / 1.1} for i in (0, 1)}
    values = {i: [RoundValue(0, 0.010)] for i in (0, 1)}
    plan = RoundPlan(min_rounds=12, max_rounds=24, look_every=4)
    stopped = adaptive.run_rounds([[forced, native]], values, plan, records_of=records_of)
    assert stopped == {0: adaptive.STOPPED_MAX, 1: adaptive.STOPPED_MAX} and len(values[0]) == 25
    assert probed_rounds == list(range(1, adaptive.PROBE_ROUNDS + 1))


def test_a_production_pair_is_read_over_its_probed_rounds_and_spent_probes_hold_nothing():
    """A probed way's production ratio is paired over the rounds that have its probe, as the verdict
    pairs it; once a way has its ``PROBE_ROUNDS`` probes, later rounds cannot move that ratio, so an
    open production pair no longer holds its kernels."""
    plan = RoundPlan(min_rounds=8, max_rounds=40)
    forced = _member(0, "jax-a", FORCED_LABEL, priced=True, probe=True)
    native = _member(1, "jax-b", NATIVE_LABEL, priced=True, probe=True)
    group = [forced, native]
    record = {"regime_steps": 100, "seconds_per_step_with_compiles": 0.012, "stream_steady_s": 0.011,
              "seconds_per_step": 0.011, "useful_tokens_per_s": 100.0 / 1.2}
    records_of = {0: record, 1: record}

    def series(step, probe, probed_rounds):
        return [RoundValue(0, step)] + [
            RoundValue(r, step * (1 + 0.01 * (-1) ** r),
                       first_call_s=probe(r) if r <= probed_rounds else None) for r in range(1, 25)]
    # on paper 0.010 against 0.012, decided; in production the forced kernel's probed compile, 0.05 or
    # 0.55 s by turns, against a steady 0.2 s: its 100 steps' cost moves by a fifth either way
    values = {0: series(0.010, lambda r: 0.30 + 0.25 * (-1) ** r, 16), 1: series(0.012, lambda r: 0.10, 16)}
    assert adaptive.pair_state(values[0], values[1], plan.margin, plan.look_confidence) == "below"
    assert adaptive.production_state(group, values, plan, records_of) == "unclear"
    assert adaptive.probes_spent(group, values)
    settled: set = set()
    assert adaptive.still_needed(group, values, plan, records_of, settled) == set()
    assert ("production", 0, 1) not in settled  # not settled: the verdict will say can't tell
    fewer = {i: [v if v.round <= 8 else RoundValue(v.round, v.median_s) for v in values[i]] for i in values}
    assert not adaptive.probes_spent(group, fewer)  # 8 probes: more rounds would add probes
    assert adaptive.still_needed(group, fewer, plan, records_of, set()) == {0, 1}
    # the unprobed rounds do not count: the same probed rounds with 20 more quiet ones read the same
    quiet = {i: values[i] + [RoundValue(r, values[i][1].median_s) for r in range(25, 45)] for i in values}
    assert adaptive.production_state(group, quiet, plan, records_of) == "unclear"
