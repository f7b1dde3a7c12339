"""The later timing rounds of a sweep: paired, and adaptive.

After the sweep's first pass, every static case timed in rounds (``sweep.timed_in_rounds``) joins
its **comparison group**: the cases of one framework on one workload, which a verdict row weighs
against each other. A round times every active group, its kernels back to back in one warm worker
(``measure/round_timing.py``), so the per-round ratio of two kernels cancels what moved the machine
in that round (``core.stats.paired_ratio``).

Each group gets ``min_rounds``; then, at every ``look_every`` rounds, each case stays only while a
round would still tell something it is measured for (``still_needed``): both kernels of a forced-flash /
native pair (on paper, and the priced pair in production) that is neither decided (the ratio's
interval wholly on one side of 1) nor shown equal within ``margin``; an A/A control until it comes out
equal (or, by the 1% chance a true A/A pair has, decided); a static step whose own 99% interval is
wider than ``precision``. Rounds stop at
``max_rounds`` or when ``budget_s`` is spent. Each look is made at a stricter confidence
(``look_confidence``: the confidence shared over the most looks the plan can make), so that looking
often does not make a decision easier to reach than the 99% the verdict states; a pair settled at a
look stays settled.

Values in, values out: the rounds come back as ``RoundValue`` lists per case, and the sweep pools
them (``measure.figures.pool_rounds``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable

from attnbench.core import records, stats
from attnbench.core.stats import ABOVE, BELOW, CONFIDENCE, EQUAL, check_margin, pair_rounds, paired_ratio
from attnbench.measure.engine import Case
from attnbench.measure.round_timing import first_calls, time_round
from attnbench.run.plan import preload
from attnbench.run.worker import Worker

FORCED_LABEL, NATIVE_LABEL = "forced-flash", "native"  # a kernel's label (attention_impls/base.py)
STOPPED_SETTLED, STOPPED_MAX, STOPPED_BUDGET = "settled", "max rounds", "budget spent"
STOPPED_ALONE, STOPPED_FAILED = "base rounds (nothing to weigh it against)", "failed"
ROUND_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """How a sweep spends its later timing rounds (a suite size's, or ``attnbench run``'s flags)."""

    min_rounds: int = 12  # later rounds every timed case gets
    max_rounds: int = 40
    look_every: int = 4  # rounds between two looks at a group, after min_rounds
    budget_s: float | None = None  # seconds the later rounds may take in all; None: max_rounds only
    margin: float = 0.10  # equal within +-margin settles a pair
    precision: float | None = None  # a static step's 99% relative half-width it is timed down to; None: off
    confidence: float = CONFIDENCE
    window_s: float = 0.1  # each case's window per round
    min_samples: int = 5  # blocks per kernel per round (a step of 50 ms or more: one)
    restart_every: int = 12  # rounds per worker process
    controls: tuple[str, ...] = ()  # case keys timed twice per round: an A/A pair

    def __post_init__(self):
        if self.min_rounds < 0 or self.max_rounds < self.min_rounds:
            raise ValueError(f"rounds must satisfy 0 <= min ({self.min_rounds}) <= max ({self.max_rounds})")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"the rounds' time budget must be more than 0 seconds, got {self.budget_s!r}")
        check_margin(self.margin)
        if self.precision is not None:
            stats.check_precision(self.precision)
        if self.look_every < 1 or self.restart_every < 1 or self.window_s <= 0:
            raise ValueError("look_every and restart_every must be at least 1 and window_s positive")

    @property
    def looks(self) -> int:
        """The most looks the plan can make at one group: at min_rounds, then every look_every."""
        return 1 + math.ceil((self.max_rounds - self.min_rounds) / self.look_every)

    @property
    def look_confidence(self) -> float:
        """The confidence of each look: 1 - (1 - confidence) / looks (Bonferroni), so that across
        every look a pair is wrongly settled with a chance of at most 1 - confidence."""
        return 1.0 - (1.0 - self.confidence) / self.looks


@dataclasses.dataclass(frozen=True)
class RoundValue:
    """One case's window in one round (round 0: the first pass's window)."""

    round: int
    median_s: float
    samples: tuple[float, ...] = ()
    contended: bool = False
    contention_reason: str | None = None
    control_median_s: float | None = None  # the A/A control's second window, if this case is one
    defaults_median_s: float | None = None  # the kernel at its defaults, if this case runs a tuned config
    first_call_s: float | None = None  # the round's stall probe of a probed way (``Member.probe``)


@dataclasses.dataclass(frozen=True)
class Member:
    """A timed case in its comparison group: its index in the sweep, its label and block size.
    ``priced``: the way its label's verdict prices in production (the cheapest stream per useful
    token of the group's kernels of that label, ``priced_ways``): a static case (its stream is its
    step again) or a production stream's way, which rounds time through its sample of steps."""

    index: int
    case: Case
    label: str | None
    number: int  # calls per block (the first window's)
    priced: bool = False
    probe: bool = False  # its compile stall is measured again in every round (``stall_probed``)


ROUND_BLOCK_FRACTION = 4  # a round's blocks are a quarter of the first window's (about 5 ms, not 20)


def _number(case: Case, record: dict) -> int:
    """Calls per block in a round: a quarter of the first window's (blocks of about 5 ms: more of them
    per round, so a burst of the host's other tenants spoils fewer of them)."""
    return max(1, int(record.get("steps_per_sample") or 1) // ROUND_BLOCK_FRACTION)


def group_key(case: Case, record: dict) -> tuple:
    """The comparison group of a case: its framework and its workload (a verdict row)."""
    return record.get("framework"), case.workload


def groups_of(cases: list[Case], first: list[dict], timed: list[int],
              priced: frozenset[int] = frozenset(), probes: bool = True) -> list[list[Member]]:
    """The timed cases by comparison group, in first-seen order; ``priced``: the cases' indices
    ``priced_ways`` chose; ``probes``: whether a priced static way's stall may be probed (a sweep
    in one process cannot compile anything cold again)."""
    out: dict[tuple, list[Member]] = {}
    for i in timed:
        record = first[i]
        number = _number(cases[i], record) if cases[i].regime == "static" else 1
        member = Member(i, cases[i], record.get("label"), number, priced=i in priced,
                        probe=probes and i in priced and stall_probed(cases[i], record))
        out.setdefault(group_key(cases[i], record), []).append(member)
    return list(out.values())


def stream_cost(record: dict) -> float | None:
    """A case's first-pass stream in seconds per useful token, compile stalls included (the figure a
    verdict ranks ways by; a price per hour only scales it); None where its stream did not run."""
    rate = record.get("useful_tokens_per_s")
    return 1.0 / rate if record.get("status") == records.OK and rate and rate > 0 else None


def priced_ways(cases: list[Case], first: list[dict]) -> dict[int, str]:
    """In each comparison group, per label (forced-flash, native), the case whose first-pass stream
    cost least per useful token, stalls and padding included: the kernel and way the verdict's
    production answer prices for that label. ``{index: label}``; interpreted kernels (whose speed is
    their interpreter's) and the float64 reference are left out, as the verdict leaves them out, and
    so is a stream that was cut (its price is of fewer steps: from the ceiling on, not the cheapest)."""
    best: dict[tuple, tuple[float, int]] = {}
    for i, (case, record) in enumerate(zip(cases, first, strict=True)):
        label = record.get("label") if record else None
        price = stream_cost(record) if record else None
        if (price is None or label not in (FORCED_LABEL, NATIVE_LABEL) or record.get("stream_cut")
                or record.get("execution") == "interpret" or record.get("framework") == "numpy"):
            continue
        key = (*group_key(case, record), label)
        if key not in best or price < best[key][0]:
            best[key] = (price, i)
    return {i: key[-1] for key, (_, i) in best.items()}


PROBE_SHARE = 0.10  # a static way's compile stall worth probing: this share of its stream's cost
PROBE_MAX_S = 2.0  # and a first call this short (FlexAttention's 18 s compile is not repeated per round)
# A way's probes at most: twice the 8 a 99% interval needs. A probe is a process start and two compiles
# (3-8 s a round here), and at 9b16b70 a close row kept torch_xla's probes going for 40 rounds (181 s)
# (results/LOG.md, "Rounds sized per case").
PROBE_ROUNDS = 16


def first_pass_stall(record: dict) -> tuple[float, float]:
    """``(stall seconds, stream seconds)`` of a record's first-pass stream: what it spent beyond its
    steady steps (the compile stalls, measured once), and all it spent."""
    steps = int(record.get("regime_steps") or 0)
    total = float(record["seconds_per_step_with_compiles"]) * steps
    steady = record.get("stream_steady_s") or record["seconds_per_step"]
    return max(0.0, total - steps * float(steady)), total


def stall_probed(case: Case, record: dict) -> bool:
    """Whether a priced static way's compile stall is measured again in every round (a stall probe,
    ``round_timing.first_calls``): it compiled, its stall is at least ``PROBE_SHARE`` of its stream's
    cost, and its first call took at most ``PROBE_MAX_S``. Otherwise its stall stays the first pass's,
    with its history's scatter (``report/streams.cheapest_way``)."""
    if case.regime != "static" or not (record.get("compiles") or 0) > 0 or record.get("status") != records.OK:
        return False
    first = record.get("first_call_s")
    if first is None or first != first or first > PROBE_MAX_S or not record.get("useful_tokens_per_s"):
        return False
    stall, total = first_pass_stall(record)
    return total > 0 and stall / total >= PROBE_SHARE


def production_seconds(record: dict, per_step: float, first_call: float | None = None) -> float:
    """The record's stream in seconds per useful token with its steady steps at ``per_step``: its
    compile stalls (the first pass's, or ``first_call`` beyond one step at ``per_step``: a round's
    probe of a static way) plus every step at ``per_step``, over the useful tokens it served."""
    steps = int(record.get("regime_steps") or 0)
    stall, total = first_pass_stall(record)
    if first_call is not None:
        stall = max(0.0, first_call - per_step)
    tokens = float(record["useful_tokens_per_s"]) * total
    return (stall + steps * per_step) / tokens


def later(values: list[RoundValue]) -> dict[int, float]:
    """``{round: median}`` of the later rounds, those another process shared included: what moved the
    machine in a round moved both kernels of a pair alike, so a pair's ratio keeps them (a figure's
    own median does not). Round 0 is not paired: its windows were minutes apart."""
    return {v.round: v.median_s for v in values if v.round > 0}


def pair_state(forced: list[RoundValue], native: list[RoundValue], margin: float, confidence: float) -> str:
    """``core.stats.compare_to_one`` of the paired ratio forced / native at ``confidence``."""
    a, b = pair_rounds(later(forced), later(native))
    if not a:
        return "unclear"
    return paired_ratio(a, b, confidence).against_one(margin)


def production_state(group: list[Member], values: dict[int, list[RoundValue]], plan: RoundPlan,
                     records_of: dict[int, dict]) -> str:
    """The priced pair's paired production ratio (forced / native seconds per useful token, each
    round's steady steps at that round's value: ``production_seconds``) against 1, at the look's
    confidence; ``EQUAL`` (nothing to hold the group open) where the group has no priced pair or
    its records are not at hand."""
    priced = {m.label: m for m in group if m.priced}
    f, n = priced.get(FORCED_LABEL), priced.get(NATIVE_LABEL)
    if f is None or n is None or f.index not in records_of or n.index not in records_of:
        return EQUAL
    fv = {v.round: v for v in values[f.index] if v.round > 0}
    nv = {v.round: v for v in values[n.index] if v.round > 0}
    common = sorted(set(fv) & set(nv))
    for member, mine in ((f, fv), (n, nv)):  # a probed way: over the rounds with a probe, as the verdict
        probed = {r for r, v in mine.items() if v.first_call_s is not None}
        if member.probe and probed:
            common = [r for r in common if r in probed]
    if not common:
        return "unclear"

    def seconds(member: Member, value: RoundValue) -> float:
        probed = value.first_call_s if member.probe else None
        return production_seconds(records_of[member.index], value.median_s, probed)

    return paired_ratio([seconds(f, fv[r]) for r in common], [seconds(n, nv[r]) for r in common],
                        plan.look_confidence).against_one(plan.margin)


SETTLING = frozenset({BELOW, ABOVE, EQUAL})


def control_state(values: list[RoundValue], margin: float, confidence: float) -> str:
    """An A/A control's paired ratio (its second window over its first, round by round) against 1."""
    a = [v.control_median_s for v in values if v.round > 0 and v.control_median_s]
    b = [v.median_s for v in values if v.round > 0 and v.control_median_s]
    return paired_ratio(a, b, confidence).against_one(margin) if a else "unclear"


def relative_half_width(values: list[RoundValue], confidence: float = CONFIDENCE) -> float:
    """The 99% relative half-width of a static step's figure over these rounds, as ``pool_rounds``
    makes it (the uncontended rounds' medians, all of them if none is; round 0 included); infinite
    with fewer values than carry the confidence."""
    clean = [v for v in values if not v.contended] or values
    if len(clean) < stats.min_values(confidence):
        return math.inf
    return stats.estimate([list(v.samples) or [v.median_s] for v in clean], confidence).relative_half_width


def still_needed(group: list[Member], values: dict[int, list[RoundValue]], plan: RoundPlan,
                 records_of: dict[int, dict], settled_pairs: set[tuple]) -> set[int]:
    """The members of ``group`` that more rounds would still tell something: both kernels of each
    forced-flash / native pair of its static steps (on paper) and of its priced pair (production)
    that is neither decided nor equal within the margin at the look's confidence; an A/A control
    until it is settled; a static member whose own figure's 99% interval is wider than
    ``plan.precision``. A pair settled at a look joins ``settled_pairs`` and stays settled (the
    decision a sequential test stops on stands)."""
    out: set[int] = set()
    statics = [m for m in group if m.case.regime == "static"]
    for f, n in itertools.product([m for m in statics if m.label == FORCED_LABEL],
                                  [m for m in statics if m.label == NATIVE_LABEL]):
        key = ("paper", f.index, n.index)
        if key not in settled_pairs:
            if pair_state(values[f.index], values[n.index], plan.margin, plan.look_confidence) in SETTLING:
                settled_pairs.add(key)
            else:
                out |= {f.index, n.index}
    key = _production_pair(group)
    if None not in key and key not in settled_pairs:
        if production_state(group, values, plan, records_of) in SETTLING:
            settled_pairs.add(key)
        elif not probes_spent(group, values):  # spent: more rounds cannot move its probed rounds' ratio
            out |= set(key[1:])
    for m in statics:
        key = ("control", m.index)
        if m.case.key in plan.controls and key not in settled_pairs:
            if control_state(values[m.index], plan.margin, plan.look_confidence) in SETTLING:
                settled_pairs.add(key)
            else:
                out.add(m.index)
        if plan.precision is not None and relative_half_width(values[m.index]) > plan.precision:
            out.add(m.index)
    return out


def probes_spent(group: list[Member], values: dict[int, list[RoundValue]]) -> bool:
    """Whether a probed way of the group's priced pair has its ``PROBE_ROUNDS`` probes: the production
    ratio is paired over the probed rounds (``production_state``, as the verdict), so later rounds
    cannot move it."""
    return any(m.priced and m.probe and _probes(values[m.index]) >= PROBE_ROUNDS for m in group)


def production_settled(group: list[Member], settled_pairs: set[tuple]) -> bool:
    """Whether the group's priced pair was settled at a look (its stall probes can stop)."""
    return _production_pair(group) in settled_pairs


def _production_pair(group: list[Member]) -> tuple:
    """``("production", forced index, native index)`` of the group's priced ways (None where a label
    has none): the key ``still_needed`` files a settled production pair under."""
    priced = {m.label: m.index for m in group if m.priced}
    return "production", priced.get(FORCED_LABEL), priced.get(NATIVE_LABEL)


def has_pairs(group: list[Member]) -> bool:
    labels = {m.label for m in group}
    return FORCED_LABEL in labels and NATIVE_LABEL in labels


def round_values(record: dict) -> list[RoundValue]:
    """The rounds a record holds: its first window alone (round 0), or, once pooled, every round
    (``round_ids`` with ``round_medians_s``, those in ``contended_rounds`` flagged, and an A/A
    control's second windows)."""
    if record.get("regime") not in (None, "static"):  # a production stream's way: its sample's rounds
        kept = zip(_floats(record.get("stream_round_ids")), _floats(record.get("stream_round_s")),
                   strict=False)
        return [RoundValue(0, float(record.get("stream_steady_s") or record["seconds_per_step"]))] + [
            RoundValue(int(i), m) for i, m in kept]
    medians, ids = _floats(record.get("round_medians_s")), _floats(record.get("round_ids"))
    if not ids or len(ids) != len(medians):  # a first pass only: its window is round 0
        samples = tuple(_floats(record.get("timing_samples_s")))
        return [RoundValue(0, float(record["seconds_per_step"]), samples, bool(record.get("contended")),
                           record.get("contention_reason"))]
    controls = dict(zip(_floats(record.get("control_round_ids")),
                        _floats(record.get("control_round_medians_s")), strict=False))
    defaults = dict(zip(_floats(record.get("defaults_round_ids")),
                        _floats(record.get("defaults_round_medians_s")), strict=False))
    probes = dict(zip(_floats(record.get("first_call_round_ids")),
                      _floats(record.get("first_call_round_s")), strict=False))
    busy = set(_floats(record.get("contended_rounds")))
    return [RoundValue(int(i), m, contended=i in busy, control_median_s=controls.get(i),
                       defaults_median_s=defaults.get(i), first_call_s=probes.get(i))
            for i, m in zip(ids, medians, strict=True)]


class InProcess:
    """``Worker``'s ``call`` answered in this process (a sweep without workers, ``--no-isolate``)."""

    def __init__(self, task):
        self.task = task

    def call(self, args, timeout_s, preload=(), deadline=None):
        return self.task(*args), None

    def close(self) -> None:
        pass


def run_rounds(groups: list[list[Member]], values: dict[int, list[RoundValue]], plan: RoundPlan, *,
               threads: int | None = None, preload: tuple[str, ...] = (), deadline: float | None = None,
               first_round: int = 1, done_rounds: int = 0, in_process: bool = False,
               on_look: Callable[[dict[int, str]], None] | None = None,
               spent: dict[str, float] | None = None,
               records_of: dict[int, dict] | None = None) -> dict[int, str]:
    """Time ``groups`` in later rounds (appending to ``values``, by case index) until each is settled,
    at ``max_rounds``, or out of budget or time; returns why each case's rounds stopped.

    ``first_round``: the id of the next round (a resumed sweep goes on after its last one);
    ``done_rounds``: later rounds the groups already had. ``on_look(stopped)`` after every look, so
    that an interrupted sweep keeps its rounds. ``spent``: filled with where the rounds' seconds went
    (worker starts, building steps, windows). ``records_of``: the first pass's records by case
    index, which price a group's production pair (``production_state``)."""
    stopped: dict[int, str] = {}
    settled_pairs: set[tuple] = set()
    active = [g for g in groups if g]
    started = time.time()
    worker = InProcess(time_round) if in_process else Worker(time_round, threads=threads)
    failures: dict[int, int] = {}
    tally = {"build_s": 0.0, "window_s": 0.0, "probe_s": 0.0}
    rounds_here = 0
    try:
        for r in range(done_rounds + 1, plan.max_rounds + 1):
            out_of_time = _out_of_time(plan, started, deadline)
            if out_of_time or not active:
                break
            if rounds_here and rounds_here % plan.restart_every == 0:
                worker.close()  # no figure rests on one process
            rounds_here += 1
            round_id = first_round + (r - done_rounds - 1)
            order = active if r % 2 else active[::-1]
            for group in order:
                members = [m for m in (group if r % 2 else group[::-1]) if m.index not in stopped]
                if not members:
                    continue
                _time_group(worker, members, round_id, values, plan, preload, deadline, failures, stopped,
                            tally)
            # a way's stall is probed while its group's production pair is open (it is what decides
            # it), PROBE_ROUNDS times at most
            probed = [m for g in order if has_pairs(g) and not production_settled(g, settled_pairs)
                      for m in g if m.probe and m.index not in stopped
                      and _probes(values[m.index]) < PROBE_ROUNDS]
            if probed and not in_process:
                tally["probe_s"] += _probe_stalls(probed if r % 2 else probed[::-1], round_id, values,
                                                  threads, deadline)
            if r >= plan.min_rounds and (r - plan.min_rounds) % plan.look_every == 0:
                first_look = r == plan.min_rounds
                for group in active:
                    needed = still_needed(group, values, plan, records_of or {}, settled_pairs)
                    why = STOPPED_SETTLED if has_pairs(group) or not first_look else STOPPED_ALONE
                    _stop([m for m in group if m.index not in needed], why, stopped)
                active = [g for g in active if any(m.index not in stopped for m in g)]
                if on_look:
                    on_look(dict(stopped))
        why = STOPPED_BUDGET if _out_of_time(plan, started, deadline) and active else STOPPED_MAX
        for group in active:
            _stop(group, why, stopped)
    finally:
        worker.close()
        if spent is not None:
            spent.update({"rounds": float(rounds_here),
                          "round worker starts": getattr(worker, "start_seconds", 0.0),
                          "round builds": tally["build_s"], "round windows": tally["window_s"],
                          "stall probes": tally["probe_s"],
                          "later rounds": time.time() - started})
    return stopped


def _time_group(worker, members: list[Member], round_id: int, values: dict, plan: RoundPlan,
                preload: tuple[str, ...], deadline: float | None, failures: dict[int, int],
                stopped: dict[int, str], tally: dict[str, float]) -> None:
    jobs = [(m.case, m.number) for m in members]
    controls = tuple(m.case.key for m in members if m.case.key in plan.controls)
    answers, failure = worker.call((jobs, plan.window_s, plan.min_samples, controls, round_id % 2 == 1),
                                   ROUND_TIMEOUT_S, preload=preload, deadline=deadline)
    if failure is not None:  # the worker died or hung: this round of the group is lost
        answers = [{"key": m.case.key, "status": failure.status, "reason": failure.reason} for m in members]
    for member, answer in zip(members, answers, strict=True):
        for key in ("build_s", "window_s"):
            tally[key] += answer.get(key) or 0.0
        if answer.get("status") != records.OK:
            failures[member.index] = failures.get(member.index, 0) + 1
            if failures[member.index] >= 2:  # twice: it will not time here, leave it out
                stopped[member.index] = f"{STOPPED_FAILED}: {answer.get('reason')}"
            continue
        values[member.index].append(RoundValue(
            round=round_id, median_s=answer["median_s"], samples=tuple(_floats(answer.get("samples"))),
            contended=bool(answer.get("contended")), contention_reason=answer.get("contention_reason"),
            control_median_s=answer.get("control_median_s"),
            defaults_median_s=answer.get("defaults_median_s")))


def _probe_stalls(members: list[Member], round_id: int, values: dict, threads: int | None,
                  deadline: float | None) -> float:
    """The round's stall probe: the probed ways' first calls again, cold, in a fresh process
    (``round_timing.first_calls``), each put on the member's value of this round; returns the seconds
    it took, the process' start included. A probe that fails leaves the round without it (the
    verdict pairs a probed way's production over the rounds that have one)."""
    began = time.perf_counter()
    with Worker(first_calls, threads=threads) as probe:
        frameworks = tuple(sorted({f for m in members for f in preload(m.case.impl)}))
        answers, failure = probe.call(([m.case for m in members],), ROUND_TIMEOUT_S, preload=frameworks,
                                      deadline=deadline)
    if failure is None:
        for member, answer in zip(members, answers, strict=True):
            mine = values[member.index]
            if answer.get("status") == records.OK and mine and mine[-1].round == round_id:
                mine[-1] = dataclasses.replace(mine[-1], first_call_s=answer["first_call_s"])
    return time.perf_counter() - began


def _probes(values: list[RoundValue]) -> int:
    return sum(1 for v in values if v.first_call_s is not None)


def _floats(raw) -> list[float]:
    if raw is None or raw != raw:
        return []
    return [float(x) for x in (json.loads(raw) if isinstance(raw, str) else raw)]


def _stop(group: list[Member], why: str, stopped: dict[int, str]) -> None:
    for member in group:
        stopped.setdefault(member.index, why)


def _out_of_time(plan: RoundPlan, started: float, deadline: float | None) -> bool:
    now = time.time()
    if deadline is not None and deadline - now <= 1.0:
        return True
    return plan.budget_s is not None and now - started >= plan.budget_s
