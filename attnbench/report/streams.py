"""The production stream's pricing: what a kernel costs per million useful tokens over a stream of
``steps`` steps, each way through it (static, dynamic, bucketed, packed), from its measured stream's figures,
and where two kernels break even. Values in, values out: the verdict (``report/verdict.py``) reads
the measured cases and ranks them with this.

The measured stream (the suite's ``regime_steps`` steps of a trace: 200 by default, from empty
compiler caches) is the cold-start figure; the verdict prices each row at a horizon
(``report/horizon.py``), modelled beyond the measured steps, and says so. A server compiles each
shape once in its life, so: a pad-to-max stream has one shape (its stall once, then its steady
step); a trace's dynamic or bucketed stream meets new shapes at its measured rate per step
(conservative: a trace's new shapes thin out), each compiled once, up to every shape its way can
meet (``possible_shapes``); the synthetic uniform stream's new shapes follow its uniform lengths.
The same total is what a warm start pays up front: every shape the way meets compiled before
serving.

A packed stream serves the same requests in fewer, fuller steps (``regimes.pack``): its figures are
per packed step, so they are priced per step of the stream it packed (``packed_per_step``), and its
steps served are counted in that stream's steps, so that every way prices the same traffic.
"""

from __future__ import annotations

import functools
import math

from attnbench.core import regimes
from attnbench.core.stats import min_values
from attnbench.results.noise import SCATTER_Z

STRATEGY = {"static": "pad to max", "dynamic": "exact lengths", "bucketed": "buckets",
            "packed": "packed (segment ids)"}  # each way, in words
BUCKET_POLICY = "multiple-128"  # the engine's default, the one the suite measures
STREAM_SEED = 0  # engine.Options.seed: the suite's streams are drawn with it


def shape_shares(regime: str, max_len: int, policy: str = BUCKET_POLICY) -> dict[int, float]:
    """How often each padded length turns up in the suite's stream: its lengths are uniform."""
    lengths = regimes.length_range(max_len)
    shares: dict[int, float] = {}
    for length in lengths:
        shape = regimes.padded_length(length, regime, max_len, policy)
        shares[shape] = shares.get(shape, 0.0) + 1.0 / len(lengths)
    return shares


def expected_shapes(regime: str, max_len: int, steps: int) -> float:
    """The expected number of distinct shapes among ``steps`` draws of the stream."""
    return sum(1.0 - (1.0 - p) ** steps for p in shape_shares(regime, max_len).values())


def measured_shapes(regime: str, max_len: int, steps: int) -> int:
    """The distinct shapes of the stream the suite measured (seeded: the same for every kernel)."""
    stream = regimes.length_stream(max_len, steps, STREAM_SEED)
    return len({regimes.padded_length(n, regime, max_len, BUCKET_POLICY) for n in stream})


@functools.lru_cache(maxsize=256)
def possible_shapes(regime: str, max_len: int, traced: bool) -> int:
    """The distinct padded shapes a ``regime`` stream can meet: a trace's lengths run from 1 to
    ``max_len`` (``core/traffic.py`` scales and clips them), the uniform stream's over its range."""
    lengths = range(1, max_len + 1) if traced else regimes.length_range(max_len)
    return len({regimes.padded_length(n, regime, max_len, BUCKET_POLICY) for n in lengths})


def price_stream(
    *,
    steady_usd: float,
    usd_with_compiles: float,
    usd_per_mtok: float,
    compiles,
    regime: str,
    max_len: int,
    measured_steps: int,
    steps: int,
    traced: bool = False,
    shapes=None,
) -> dict:
    """``usd_per_mtok`` over ``steps`` steps, expected ``compiles``, ``stall_share`` and ``stall_usd``
    (the compile stalls' whole cost), from one measured stream's figures: ``steps == measured_steps``
    gives back the measured ``usd_per_mtok``. Beyond it (module doc): a kernel that compiles nothing
    (eager) pays its measured first-call stall once; a static stream, its one compile once; a trace's
    other streams (``traced``) meet new shapes at their measured rate per step (``shapes``: the
    distinct shapes the measured stream met), each compiled once, up to every shape the way can meet
    (``possible_shapes``: a server compiles a shape once in its life); the uniform stream's at its
    measured rate per new shape."""
    if (
        not all(v == v and v is not None for v in (steady_usd, usd_with_compiles, usd_per_mtok))
        or usd_per_mtok <= 0
        or steps < 1
    ):
        raise ValueError("price_stream needs finite USD figures and at least one step")
    tokens = usd_with_compiles * 1e6 / usd_per_mtok  # mean useful tokens per step
    stall_total = max(0.0, measured_steps * (usd_with_compiles - steady_usd))
    if compiles is None or compiles != compiles:  # the framework does not count: keep the measured rate
        stalls = stall_total * steps / measured_steps
        expected = float("nan")
    elif compiles <= 0:  # no compile, but the first call's stall (allocation, first touch) once
        stalls, expected = stall_total, 0.0
    elif steps == measured_steps:  # the measured stream itself: its own shapes, not the expected ones
        stalls, expected = stall_total, float(compiles)
    elif regime in ("static", regimes.PACKED):  # one shape: compiled once, whatever the lengths
        stalls, expected = stall_total, float(compiles)
    elif traced and shapes is not None and shapes == shapes and shapes > 0:
        met = max(float(shapes), min(possible_shapes(regime, max_len, True) if max_len > 0 else math.inf,
                                     shapes * steps / measured_steps))
        stalls, expected = stall_total * met / shapes, compiles * met / shapes
    elif traced:  # the distinct shapes not recorded: compiling on at the measured rate, uncapped
        stalls, expected = stall_total * steps / measured_steps, compiles * steps / measured_steps
    else:
        rate = compiles / measured_shapes(regime, max_len, measured_steps)
        expected = rate * expected_shapes(regime, max_len, steps)
        stalls = expected * stall_total / compiles
    total = steps * steady_usd + stalls
    return {
        "usd_per_mtok": total * 1e6 / (steps * tokens),
        "compiles": expected,
        "stall_share": stalls / total if total else 0.0,
        "stall_usd": stalls,
    }


def cheapest_way(case: dict, steps: int, scatter: dict, floors: dict, max_len: int,
                measured_steps: int) -> dict | None:
    """The kernel's cheapest way through the stream (strategy, USD per million useful tokens,
    compiles, stall share, padding waste) and the uncertainty of what one run measures once, which
    the later rounds do not measure again (``sd_once``, relative): the compile stalls (their series'
    run-to-run scatter, never below the machine's floor for that kind of figure, plus, where a
    dynamic or bucketed stream is priced beyond its steps, their extrapolation from the compiles
    measured to the stream's), and, for a dynamic or bucketed way, its
    steady steps against the same run's static step (the scatter of that ratio over the runs, never
    below its kind's median). ``sd_steady``: the steady step's run-to-run scatter (a break-even's
    uncertainty where no paired rounds exist). None where no regime was measured."""
    fallback = math.log(case["step_hi"] / case["step_lo"]) / (2 * SCATTER_Z) if case["step_lo"] > 0 else 0.0
    options = []
    for regime in regimes.REGIMES:
        figures = stream_figures(case, regime, max_len, measured_steps)
        if figures is None:
            continue
        priced = price_stream(**figures, steps=steps)
        key = (case["machine"], case["suite"], case["implementation"], case["seq_len"], case["dtype"], regime)
        machine_floor = floors.get((case["machine"], "usd_per_step"), 0.0)
        floor = floors.get((case["machine"], "usd_per_step", regime, False), machine_floor)
        sd_steady = max(scatter.get((*key, "usd_per_step"), fallback),
                        fallback if regime == "static" else floor)
        sd_stalled = max(scatter.get((*key, "usd_per_step_with_compiles"), fallback), floor)
        share = priced["stall_share"]
        measured = figures["compiles"]
        # the stall per compile, known from the measured compiles only (at least one: a first call),
        # where the price compiles on beyond the steps measured; the measured stream's own stalls are
        # its run-to-run scatter alone (price_stream charges a static, packed or eager stream's once)
        beyond = (steps > figures["measured_steps"] and regime not in ("static", regimes.PACKED)
                  and (measured or 0) > 0)  # None and NaN (uncounted) are not above 0
        extrapolated = share * sd_stalled / math.sqrt(max(1.0, measured)) if beyond else 0.0
        if stalls_in_rounds(case, regime):  # the stall measured again in every round: paired there
            sd_stalled = 0.0
        regime_sd = 0.0 if timed_in_rounds(case, regime) else max(
            scatter.get((*key, "regime/static"), 0.0), regime_floor(scatter, case["machine"], regime))
        options.append({
            "regime": regime,
            "usd": priced["usd_per_mtok"],
            "sd_once": math.hypot(share * sd_stalled, extrapolated, (1 - share) * regime_sd),
            "sd_steady": sd_steady,
            "compiles": priced["compiles"],
            "stall_share": share,
            "stall_usd": priced["stall_usd"],
            "padding": case.get(f"{regime}:padding_waste"),
        })
    if not options:
        return None
    best = min(options, key=lambda option: option["usd"])
    best["strategies"] = len(options)
    return best


def regime_floor(scatter: dict, machine: str, regime: str) -> float:
    """The median scatter of a regime's steady step against its run's static step over the machine's
    series (0 where none has three runs)."""
    found = sorted(v for k, v in scatter.items()
                   if k[0] == machine and k[5] == regime and k[6] == "regime/static")
    return found[len(found) // 2] if found else 0.0


def stream_figures(case: dict, regime: str, max_len: int, measured_steps: int) -> dict | None:
    """``price_stream``'s arguments from a kernel case's measured ``regime``; None if not measured.
    ``measured_steps``: the suite's stream, where the case does not say how many steps its ran (a
    stream cut by its budget ran fewer)."""
    usd = case.get(f"{regime}:usd_per_million_useful_tokens_with_compiles")
    if usd is None or usd != usd:
        return None
    ran = case.get(f"{regime}:steps")
    ran = float(ran) if ran is not None and ran == ran and ran > 0 else float(measured_steps)
    per = packed_per_step(case, regime, measured_steps)  # 1 but for a packed stream
    steady, stalled = case[f"{regime}:usd_per_step"], case[f"{regime}:usd_per_step_with_compiles"]
    rebased = steady + stall_per_step(case, regime)
    if stalled and rebased != stalled:  # the stall on the rounds' steady step (stall_per_step)
        usd, stalled = usd * rebased / stalled, rebased
    return {
        "steady_usd": steady * per,
        "usd_with_compiles": stalled * per,
        "usd_per_mtok": usd,
        "compiles": case[f"{regime}:compiles"],
        "regime": regime,
        "max_len": max_len,
        "measured_steps": int(ran) if per == 1.0 else max(1, round(ran / per)),
        "traced": is_traced(case, regime),
        "shapes": case.get(f"{regime}:shapes"),
    }


def stall_per_step(case: dict, regime: str) -> float:
    """The stream's compile stalls per step, in USD: what it cost beyond its own steady steps. A
    static stream's steady figure is the rounds' (its step in ``usd_per_step``), not the 16 steps its
    stream timed, so its stall is taken against the stream's own steady step (``stream_steady_s``)
    where recorded: against the rounds' figure, a round figure above the stream's ate the stall
    (torch-xla-blockwise-flash's 1 s fwd+bwd compile read as 2% of its stream, not 17%)."""
    steady, stalled = case.get(f"{regime}:usd_per_step"), case.get(f"{regime}:usd_per_step_with_compiles")
    if steady is None or stalled is None or steady != steady or stalled != stalled:
        return 0.0
    own, step = case.get(f"{regime}:stream_steady_s"), case.get("step_s")
    if regime == "static" and own and own == own and step and step > 0:
        return max(0.0, stalled - steady * own / step)
    return max(0.0, stalled - steady)


def packed_per_step(case: dict, regime: str, measured_steps: int) -> float:
    """The steps a ``regime`` stream ran per step of the stream it was made of: a packed stream's
    planned steps over the suite's ``measured_steps`` (module doc); 1 for every other way, or where
    the case did not record its planned steps."""
    planned = case.get(f"{regime}:planned")
    if regime != regimes.PACKED or not measured_steps or planned is None or not planned > 0:
        return 1.0
    return float(planned) / measured_steps


def is_traced(case: dict, regime: str) -> bool:
    """Whether the case's ``regime`` stream took its lengths from a trace (not the uniform baseline)."""
    source = case.get(f"{regime}:traffic")
    return isinstance(source, str) and source not in ("", "uniform")


def modelled_beyond(case: dict, regime: str, steps: int, measured_steps: int) -> int | None:
    """The steps the case's ``regime`` stream measured where ``steps`` asks for more (its price beyond
    them is modelled); None where every step priced was measured. A static stream's untimed steps
    count as measured: they are its one call again, on the same inputs (``regimes.run_regime``)."""
    figures = stream_figures(case, regime, 0, measured_steps)
    if figures is None:
        return None
    ran = figures["measured_steps"]
    return ran if steps > ran else None


def cheapest_at(case: dict, steps: int, max_len: int, measured_steps: int) -> float:
    """The kernel's USD per million useful tokens over ``steps`` steps, its cheapest way."""
    options = (stream_figures(case, r, max_len, measured_steps) for r in regimes.REGIMES)
    return min(price_stream(**f, steps=steps)["usd_per_mtok"] for f in options if f is not None)


def break_even_steps(
    slow_start: dict, fast_start: dict, max_len: int, measured_steps: int, limit: int = 10**10
) -> int | None:
    """The stream length from which ``slow_start`` (cheaper per step, dearer to compile) costs less
    than ``fast_start``; None when it never does within ``limit`` steps."""

    def cheaper(steps: int) -> bool:
        return cheapest_at(slow_start, steps, max_len, measured_steps) < cheapest_at(
            fast_start, steps, max_len, measured_steps
        )

    hi = measured_steps
    while not cheaper(hi):
        if hi >= limit:
            return None
        hi *= 2
    lo = max(1, hi // 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cheaper(mid) else (mid, hi)
    return hi


def way_rounds(case: dict, regime: str) -> dict[int, float]:
    """``{round: factor}``: each later round's steady step of the case's ``regime`` way over the one
    its stream measured. A way the rounds timed through its stream sample (a priced way,
    ``run/adaptive.py``) has its own: the round's mean sampled step over the stream's steady step.
    Any other way follows the case's static step: that round's over the static figure."""
    ids, values = case.get(f"{regime}:stream_round_ids"), case.get(f"{regime}:stream_round_s")
    steady = case.get(f"{regime}:stream_steady_s")
    if regime != "static" and isinstance(ids, list) and isinstance(values, list) and steady and steady > 0:
        return {int(i): float(v) / float(steady) for i, v in zip(ids, values, strict=False) if v and v > 0}
    return {r: v / case["step_s"] for r, v in case["rounds"].items()}


def stall_rounds(case: dict, regime: str) -> dict[int, float]:
    """``{round: seconds}``: a probed static way's first call, measured again in a fresh process in
    each later round (``run/adaptive.py``, "stall probes"); empty for any other way."""
    ids, values = case.get(f"{regime}:first_call_round_ids"), case.get(f"{regime}:first_call_round_s")
    if regime != "static" or not isinstance(ids, list) or not isinstance(values, list):
        return {}
    return {int(i): float(v) for i, v in zip(ids, values, strict=False) if v and v > 0}


def stalls_in_rounds(case: dict, regime: str) -> bool:
    """Whether the rounds measured the way's compile stall again (enough rounds for a 99% interval):
    then the stall is paired round by round, and its history's scatter adds nothing."""
    return len(stall_rounds(case, regime)) >= min_values()


def timed_in_rounds(case: dict, regime: str) -> bool:
    """Whether the rounds timed the case's ``regime`` way itself (enough rounds for a 99% interval):
    then its steady steps are paired round by round, and what its stream measured once against the
    static step adds no uncertainty of its own."""
    values = case.get(f"{regime}:stream_round_s")
    return regime == "static" or (isinstance(values, list) and len(values) >= min_values())


def scaled_steady(case: dict, factor: float) -> dict:
    """``case`` with every regime's steady step cost times ``factor`` and its stalls unchanged."""
    out = dict(case)
    for regime in regimes.REGIMES:
        out = scaled_regime(out, regime, factor)
    return out


def scaled_regime(case: dict, regime: str, factor: float, first_call_s: float | None = None,
                  steps: int | None = None) -> dict:
    """``case`` with ``regime``'s steady step cost times ``factor`` and its stalls unchanged (the
    stalled cost moves by the same amount; tokens per step stay), or, given a round's probed
    ``first_call_s`` of a static way whose stream ran ``steps`` steps, that first call's excess over
    the round's step spread over them."""
    out = dict(case)
    steady, stalled = case.get(f"{regime}:usd_per_step"), case.get(f"{regime}:usd_per_step_with_compiles")
    per_mtok = case.get(f"{regime}:usd_per_million_useful_tokens_with_compiles")
    if not all(v is not None and v == v for v in (steady, stalled, per_mtok)) or not stalled:
        return out
    stall = stall_per_step(case, regime)  # the stream's stall per step stays
    if first_call_s is not None and steps and case.get("step_s"):
        step_s = case["step_s"] * factor  # this round's step, in seconds
        stall = max(0.0, first_call_s - step_s) / steps * (steady / case["step_s"])
    moved = steady * factor + stall
    out[f"{regime}:usd_per_step"] = steady * factor
    out[f"{regime}:usd_per_step_with_compiles"] = moved
    out[f"{regime}:stream_steady_s"] = None  # its stall now rests on this round's steady step
    out[f"{regime}:usd_per_million_useful_tokens_with_compiles"] = per_mtok * moved / stalled
    return out


def break_even_interval(slow_start: dict, fast_start: dict, sd_slow: float, sd_fast: float, max_len: int,
                        measured_steps: int) -> tuple[int | None, int | None, int | None]:
    """``break_even_steps`` and its 99% interval: with the steady steps each moved by their uncertainty,
    toward each other (the earliest) and apart (the latest, None: never within ``limit``)."""
    point = break_even_steps(slow_start, fast_start, max_len, measured_steps)
    def apart(sign: int) -> int | None:
        return break_even_steps(scaled_steady(slow_start, math.exp(sign * SCATTER_Z * sd_slow)),
                                scaled_steady(fast_start, math.exp(-sign * SCATTER_Z * sd_fast)), max_len,
                                measured_steps)

    early, late = apart(-1), apart(+1)
    return point, early, late
