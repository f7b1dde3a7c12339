"""The verdict: per machine x framework x workload x length, the best forced-flash kernel against the
best native one, on paper and in production, each comparison paired round by round.

``paper``: the static steady step. The two kernels were timed in the same later rounds, seconds apart
(``run/adaptive.py``), so their ratio is taken within each round and its 99% interval is over those
per-round ratios (``core.stats.paired_ratio``): what moved the machine in a round moved both.

``answer`` (production): the USD per million useful tokens over the measured stream (the suite's
``regime_steps`` steps of a trace of real requests, ``core/traffic.py``), each kernel its cheapest
way (static, dynamic or bucketed), compile stalls and padding included (``report/streams.py``). Per
round, each kernel's stream is priced with its steady steps scaled by its step in that round, and the
ratio's interval is over those per-round ratios, widened by what the rounds do not measure again:
the compile stalls and a regime stream's steady steps, measured once per run (their history's
scatter, ``streams.cheapest_way``; a static way's stall that the rounds probed again in a fresh
process each round is paired with them instead), and the trace's windows (how far the two kernels' ratio moves
from one stretch of traffic to another). A longer stream asked for (``steps``) is modelled beyond
the measured steps, and the row says so (``production``).

Four states (``core.stats.compare_to_one``): ``forced`` or ``native`` when the interval lies wholly on
one side of 1, ``equal`` when it lies within ``1 +- margin`` (an equivalence test), else ``can't
tell``. Interpreted kernels and contended figures never win (docs/reports.md). The compile targets'
rows are ``report/compiled_verdict.py``'s; how the table is shown, ``report/verdict_display.py``'s.
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING

from attnbench.compiled_for.records import load_kept
from attnbench.core import presets, regimes
from attnbench.core.stats import Ratio, min_values, pair_rounds, paired_ratio
from attnbench.releases.table import breaks_to_cite, broken, load_table
from attnbench.report import horizon as horizons
from attnbench.report import streams
from attnbench.report.answers import CANT_TELL, EQUAL, FORCED, NATIVE, answer_of
from attnbench.report.compiled import load_compiled_records, load_max_batch
from attnbench.report.compiled_verdict import COLUMNS, FORWARD, compiled_verdicts, same_workload
from attnbench.report.horizon import Horizon
from attnbench.report.production import production_basis, stream_fields, stream_noise, window_spread
from attnbench.report.published import load_published, published_verdicts
from attnbench.report.select import newest_commit
from attnbench.report.streams import STRATEGY
from attnbench.report.tuning import TUNING_COLUMNS, tuning_columns
from attnbench.results.asv_results import load_results
from attnbench.results.noise import SCATTER_Z, is_contended
from attnbench.results.observability import load_observability

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

UNRECORDED_REGIME_STEPS = 6  # the default suite's stream, for runs that recorded no settings
MEMORY = ("device_peak_bytes", "host_profiler_peak_bytes", "compiler_peak_bytes")
# A training step's memory, one way per framework for all of its kernels (docs/metrics.md): jax's
# compiled temporaries of the jitted forward+backward, what torch's and torch_xla's autograd saves.
TRAIN_MEMORY = {"jax": "compiler_temp_bytes", "torch": "saved_for_backward_bytes",
                "torch_xla": "saved_for_backward_bytes"}
FORCED_LABEL, NATIVE_LABEL = "forced-flash", "native"  # the kernels' labels (attention_impls/base.py)
DEFAULT_MARGIN = 0.10  # "equal within +-10%", where the run recorded no margin


# -- what the measured rows say -------------------------------------------------------------------
def framework_of(impl: str) -> str:
    """The framework of a kernel, from the registry's naming (``torch-xla-...`` before ``torch-``)."""
    for prefix, name in (("torch-xla-", "torch_xla"), ("torch-", "torch"), ("jax-", "jax")):
        if impl.startswith(prefix):
            return name
    return "numpy"


def _workload(row) -> str:
    if row["suite"] == "Models":
        return f"{row['workload']} {row['phase']}"
    return FORWARD + (" fwd+bwd" if row["suite"] == "Training" else "")


def _rankable(cases) -> pd.Series:
    """The case table's rows that may win: measured alone (not contended), compiled (not
    interpreted), and not the float64 reference."""
    return ~cases["busy"] & (cases["execution"] != "interpret") & (cases["framework"] != "numpy")


def _interval(row, low="ci_low", high="ci_high") -> tuple[float, float]:
    lo, hi = row.get(low), row.get(high)
    value = row["value"]
    if lo == lo and hi == hi and lo is not None and hi is not None and 0 < lo <= value <= hi:
        return float(lo), float(hi)
    return float(value), float(value)


def _rounds(row, medians: str = "round_medians_s", ids: str = "round_ids") -> dict[int, float]:
    """``{round id: median}`` of a case's later rounds (round 0, its first window, pairs with nothing:
    the kernels' first windows were minutes apart)."""
    values, keys = (row.get(c) for c in (medians, ids))
    if not isinstance(values, str) or not isinstance(keys, str):
        return {}
    pairs = zip(json.loads(keys), json.loads(values), strict=False)
    return {int(i): float(m) for i, m in pairs if int(i) > 0}


def case_table(frame) -> pd.DataFrame:
    """One row per kernel case of each machine's newest commit (Forward, Training, Models): static
    step time, interval and later rounds, memory peak, and per regime the figures
    ``streams.price_stream`` takes. The verdict, its controls, notes and picture read it: a report
    makes it once and hands it to each (``cases=``)."""
    import pandas as pd

    latest = newest_commit(frame)
    latest = latest[latest["suite"].isin(["Forward", "Training", "Models"])].copy()
    if latest.empty:
        return pd.DataFrame()
    latest["framework"] = latest["implementation"].map(framework_of)
    latest["workload_name"] = latest.apply(_workload, axis=1)
    latest["regime"] = latest["regime"].fillna("static")
    latest["seq_len"] = latest["seq_len"].fillna(-1)
    latest["dtype"] = latest["dtype"].fillna("-")
    latest["busy"] = is_contended(latest)
    keys = ["machine", "framework", "workload_name", "seq_len", "dtype", "implementation"]
    rows = []
    for key, part in latest.groupby(keys, sort=True):
        static = part[(part["regime"] == "static") & (part["metric"] == "seconds_per_step")]
        if static.empty:
            continue
        first = static.iloc[0]
        lo, hi = _interval(first)
        row = dict(zip(keys, key, strict=True))
        row.update(suite=first["suite"], stream_len=_stream_len(first), label=first["label"],
                   execution=first.get("execution"), busy=bool(part["busy"].any()),
                   step_s=float(first["value"]),
                   step_lo=lo, step_hi=hi, rounds=_rounds(first),
                   control=_rounds(first, "control_round_medians_s", "control_round_ids"),
                   config=_text(first.get("config")), config_source=_text(first.get("config_source")),
                   defaults_rounds=_rounds(first, "defaults_round_medians_s", "defaults_round_ids"),
                   margin=_float(first.get("setting_margin")))
        for metric in MEMORY:
            found = part[(part["metric"] == metric) & (part["regime"] == "static")]["value"]
            if len(found) and found.iloc[0] == found.iloc[0] and found.iloc[0] > 0:
                row.update(peak_bytes=float(found.iloc[0]), peak_source=metric)
                break
        if first["suite"] == "Training" and row["framework"] in TRAIN_MEMORY:
            found = part[(part["metric"] == TRAIN_MEMORY[row["framework"]]) & (part["regime"] == "static")]
            row["train_bytes"] = _float(found["value"].iloc[0]) if len(found) else None
        for regime in regimes.REGIMES:
            got = part[part["regime"] == regime].set_index("metric")["value"]
            got = got[~got.index.duplicated()]
            for metric in ("usd_per_step", "usd_per_step_with_compiles",
                           "usd_per_million_useful_tokens_with_compiles", "compiles", "padding_waste"):
                row[f"{regime}:{metric}"] = float(got[metric]) if metric in got else float("nan")
            row.update(stream_fields(part[part["regime"] == regime], regime))
        rows.append(row)
    return pd.DataFrame(rows)


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _float(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value else None


def _stream_len(row) -> int:
    """The longest length of a case's stream: its sequence length, or for a preset's case (Models)
    the phase's length at the run's preset size (the cache for decode)."""
    seq = row.get("seq_len")
    if seq is not None and seq == seq and seq > 0:
        return int(seq)
    size = row.get("setting_preset_size")
    try:
        size = size if isinstance(size, str) else "default"
        return presets.workload(row["workload"], row["phase"], size=size).stream_length
    except (KeyError, ValueError, TypeError):
        return 0


def stream_steps(frame) -> int:
    """The measured stream's length: the suite's recorded ``regime_steps``."""
    settings = newest_commit(frame)
    if "setting_regime_steps" in settings and settings["setting_regime_steps"].notna().any():
        return int(settings["setting_regime_steps"].dropna().max())
    return UNRECORDED_REGIME_STEPS


def _name(case) -> str:
    return f"{case['implementation']} ({case['label']})"


def _train_memory(framework: str, forced: dict | None, native: dict | None) -> dict:
    """A training row's memory beside its time: each kernel's by the framework's one way
    (``TRAIN_MEMORY``); nothing for a row without a training step."""
    values = {f"{side}_train_bytes": (case or {}).get("train_bytes") for side, case in
              (("forced", forced), ("native", native))}
    if all(v is None or v != v for v in values.values()):
        return {}
    return {**values, "train_memory_source": TRAIN_MEMORY.get(framework)}


def _best(cases: list[dict], priced: dict, label: str):
    """The cheapest kernel of ``label`` in production (the fastest on paper where none is priced)."""
    mine = [c for c in cases if c["label"] == label]
    if not mine:
        return None
    with_cost = [c for c in mine if c["implementation"] in priced]
    if with_cost:
        return min(with_cost, key=lambda c: priced[c["implementation"]]["usd"])
    return min(mine, key=lambda c: c["step_s"])


def measured_verdicts(frame, *, horizon: Horizon | None = None, fragility: list | dict | None = None,
                      margin: float | None = None, cases=None, noise=None) -> pd.DataFrame:
    """The verdict rows of the measured machines (the tidy table's newest commit per machine): per
    machine x framework x workload x length, the best forced-flash kernel against the best native
    one, on paper, at the ``horizon`` (default ``report.horizon.DEFAULT``; the row's answer), over the
    measured cold-start stream and serving (every compile amortised), each comparison paired by round
    and read in four states at ``margin`` (default: the run's recorded margin, else
    ``DEFAULT_MARGIN``); ``cases``: ``case_table(frame)`` already made; ``noise``:
    ``production.stream_noise(frame)`` already made."""
    import pandas as pd

    breaks = fragility if isinstance(fragility, list) else []
    cases = case_table(frame) if cases is None else cases
    if cases.empty:
        return pd.DataFrame(columns=COLUMNS + TUNING_COLUMNS)
    cases = cases.assign(rankable=_rankable(cases))
    measured_steps = stream_steps(frame)
    horizon = horizon or horizons.parse(None)
    scatter, floors = stream_noise(frame) if noise is None else noise
    rows = []
    group_keys = ["machine", "framework", "workload_name", "seq_len", "dtype"]
    for key, group in cases.groupby(group_keys, sort=True):
        machine, framework, workload, seq, dtype = key
        group = group.to_dict("records")
        eligible = [c for c in group if c["rankable"]]
        if not eligible:
            continue
        # a preset's length stream is its own (Models): the phase's lengths, up to the measured one
        stream_len = int(seq) if seq > 0 else int(group[0].get("stream_len") or 0)
        row = {"machine": machine, "basis": "measured", "framework": framework, "workload": workload,
               "seq_len": stream_len or None, "dtype": dtype}
        reasons = []
        per_hour = _steps_per_hour(eligible)
        steps = horizon.steps(per_hour)
        if steps is None:
            steps = measured_steps
            reasons.append(f"the trace has no request rate here: the {horizon} horizon cannot be priced, "
                           f"so the answer is the measured {measured_steps:,}-step stream's (--horizon in "
                           "steps)")
        row.update(horizon=_horizon_words(horizon, steps, per_hour), horizon_steps=steps)
        priced = {c["implementation"]: streams.cheapest_way(c, steps, scatter, floors, stream_len,
                                                            measured_steps)
                  for c in eligible if stream_len > 0}
        priced = {k: v for k, v in priced.items() if v is not None}
        forced, native = _best(eligible, priced, FORCED_LABEL), _best(eligible, priced, NATIVE_LABEL)
        row_margin = margin or next((c["margin"] for c in group if c.get("margin")), None) or DEFAULT_MARGIN
        row.update(_compare(forced, native, priced, steps, stream_len, measured_steps, row_margin, reasons))
        if row.get("ratio_of"):
            for name, at in (("cold_start", measured_steps), ("serving", horizons.SERVING_STEPS)):
                row.update(_side(name, forced, native, at, scatter, floors, stream_len, measured_steps,
                                 row_margin))
            for side, case in (("forced", forced), ("native", native)):
                row[f"{side}_cold_start_s"] = _cold_start_seconds(case, priced[case["implementation"]])
            row.update(_break_even(forced, native, priced, row, stream_len, measured_steps, reasons))
            row["holds"] = _holds(row, per_hour)
        row.update(_train_memory(framework, forced, native))
        row.update(tuning_columns(forced, native, row.get("paper"), row_margin))
        row["sentence"] = _sentence(row, forced, native, steps, row_margin)
        reasons.extend(_row_notes(group, machine, framework, workload, breaks))
        row["reasons"] = "; ".join(reasons)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS + TUNING_COLUMNS)


def _steps_per_hour(cases: list[dict]) -> float | None:
    """The steps an hour of the row's trace makes (its static stream's, else another way's; a packed
    stream's steps are fewer than the traffic's steps it prices)."""
    for case in cases:
        for regime in ("static", "dynamic", "bucketed"):
            found = horizons.steps_per_hour(case, regime)
            if found:
                return found
    return None


def _horizon_words(horizon: Horizon, steps: int, per_hour: float | None) -> str:
    """``24 h = 478,016 steps`` or ``1,000,000 steps (42 h)``: the horizon priced, in both units."""
    if horizon.unit == "hours" and horizon.steps(per_hour) is not None:
        return f"{horizon} = {steps:,} steps"
    hours = horizons.hours_text(steps, per_hour)
    return f"{steps:,} steps" + (f" ({hours})" if hours else "")


def _cold_start_seconds(case: dict, cost: dict) -> float | None:
    """The seconds a kernel's way spends compiling (and on first calls) over the horizon: what a warm
    start pays before serving, every shape it meets compiled once (``streams.price_stream``)."""
    per_step, step_s = case.get("static:usd_per_step"), case.get("step_s")
    stall = cost.get("stall_usd")
    if not per_step or per_step != per_step or not step_s or stall is None or stall != stall:
        return None
    return stall / (per_step / step_s)


def _side(name: str, forced: dict, native: dict, steps: int, scatter, floors, stream_len: int,
          measured_steps: int, margin: float) -> dict:
    """``name`` (cold start or serving): the two kernels' cost ratio over ``steps`` steps, each its
    cheapest way there, paired by round, and its state."""
    f_cost, n_cost = (streams.cheapest_way(c, steps, scatter, floors, stream_len, measured_steps)
                      for c in (forced, native))
    if f_cost is None or n_cost is None:
        return {}
    priced = _priced_ratio(forced, f_cost, native, n_cost, steps, stream_len, measured_steps, margin)
    return {name: priced["answer"], f"{name}_ratio": priced["ratio"],
            f"{name}_low": priced.get("ratio_low"), f"{name}_high": priced.get("ratio_high")}


def _holds(row: dict, per_hour: float | None) -> str:
    """At which horizons the row's answer holds. ``every horizon`` where the cold-start stream and
    serving are decided alike and the answer with them (a cost ratio (a + bH) / (c + dH) moves one
    way from its cold start to its serving as the horizon H grows); where the two kernels' ratios lie
    on either side of 1, the horizon from which the one cheaper serving is cheaper (``break_even``);
    else ``not decided at every horizon``."""
    if row.get("break_even_of") is not None and row.get("break_even_of") == row.get("break_even_of"):
        point = row.get("break_even")
        if point is None or point != point:
            return f"{row['break_even_of']} cheaper only beyond 10,000,000,000 steps"
        hours = horizons.hours_text(int(point), per_hour)
        return f"{row['break_even_of']} cheaper from {int(point):,} steps" + (f" ({hours})" if hours else "")
    if row.get("cold_start") == row.get("serving") == row.get("answer") in (FORCED, NATIVE, EQUAL):
        return "every horizon"
    return "not decided at every horizon"


def paired(a: dict, b: dict) -> Ratio | None:
    """``a / b`` over the later rounds both kernels were timed in; None with none in common."""
    x, y = pair_rounds(a["rounds"], b["rounds"])
    return paired_ratio(x, y) if x else None


def _compare(forced, native, priced: dict, steps: int, stream_len: int, measured_steps: int, margin: float,
             reasons: list) -> dict:
    """The paper and production comparisons of the two kernels, the flip and the break-even."""
    out = {"forced": _name(forced) if forced else None, "native": _name(native) if native else None,
           "answer": "-", "paper": "-", "flip": "-"}
    if forced is None or native is None:
        missing = "forced-flash" if forced is None else "native"
        reasons.append(f"no {missing} kernel ranks here: nothing to compare")
        return out
    f_name, n_name = forced["implementation"], native["implementation"]
    paper = paired(forced, native)
    if paper is None or not paper.carried:
        had = paper.rounds if paper else 0
        out.update(paper=CANT_TELL, paper_ratio=forced["step_s"] / native["step_s"], paper_rounds=had)
        reasons.append(f"timed together in {had} later rounds: too few for a 99% interval (it needs "
                       f"{min_values()})")
    else:
        out.update(paper=answer_of(paper.low, paper.high, margin), paper_ratio=paper.ratio,
                   paper_low=paper.low, paper_high=paper.high, paper_rounds=paper.rounds)
    if f_name not in priced or n_name not in priced:
        reasons.append("no length stream measured here: paper only")
        return out
    f_cost, n_cost = priced[f_name], priced[n_name]
    out.update(ratio_of=f"{f_name} / {n_name}, USD per useful token",
               production_strategy=f"{f_name}: {_stream_words(f_cost)}; {n_name}: {_stream_words(n_cost)}",
               **production_basis(((forced, f_cost), (native, n_cost)), steps, measured_steps))
    priced_ratio = _priced_ratio(forced, f_cost, native, n_cost, steps, stream_len, measured_steps, margin)
    out.update({k: v for k, v in priced_ratio.items() if k not in ("once", "windows")})
    once, windows = priced_ratio.get("once", 0.0), priced_ratio.get("windows", 0.0)
    if once > 0.005:
        reasons.append(f"the interval holds ±{SCATTER_Z * once:.0%} for what one run measures once "
                       f"(compile stalls, a regime's steady steps) and ±{SCATTER_Z * windows:.0%} of it "
                       "for the trace's windows")
    settled = {FORCED, NATIVE, EQUAL}
    if out["paper"] in settled and out["answer"] in settled:
        opposite = {out["paper"], out["answer"]} == {FORCED, NATIVE}
        out["flip"] = "yes" if opposite else "no"
    else:
        out["flip"] = CANT_TELL
    if min(f_cost["strategies"], n_cost["strategies"]) == 1:
        reasons.append(f"only {STRATEGY['static']} measured at this length")
    return out


def _priced_ratio(forced: dict, f_cost: dict, native: dict, n_cost: dict, steps: int, stream_len: int,
                  measured_steps: int, margin: float) -> dict:
    """forced / native cost over ``steps`` steps, each its priced way: ``ratio``, its interval
    (``ratio_low``, ``ratio_high``) and ``answer``, and the log spreads it was widened by: ``once``
    (what one run measures once) of which ``windows`` (the trace's windows)."""
    production = _production(forced, f_cost["regime"], native, n_cost["regime"], steps, stream_len,
                             measured_steps)
    if production is None or not production.carried:
        return {"answer": CANT_TELL, "ratio": f_cost["usd"] / n_cost["usd"]}
    windows = window_spread(forced, f_cost["regime"], native, n_cost["regime"])
    # what the rounds do not measure again, and the stretches of traffic measured
    once = math.hypot(f_cost["sd_once"], n_cost["sd_once"], windows)
    low, high = production.low * math.exp(-SCATTER_Z * once), production.high * math.exp(SCATTER_Z * once)
    return {"ratio": production.ratio, "ratio_low": low, "ratio_high": high,
            "answer": answer_of(low, high, margin), "once": once, "windows": windows}


def _production(forced: dict, f_regime: str, native: dict, n_regime: str, steps: int, stream_len: int,
                measured_steps: int) -> Ratio | None:
    """The forced / native stream cost of each later round both were timed in, each kernel priced
    its cheapest way (``f_regime``, ``n_regime``) with that round's steady steps: a priced way's own
    stream sample where the rounds timed it (``streams.way_rounds``), else its static step in that
    round scaling the way's steady steps; the compile stalls stay the first pass's, but for a static
    way whose first call the rounds probed again (``streams.stall_rounds``): that round's."""
    f_rounds, n_rounds = streams.way_rounds(forced, f_regime), streams.way_rounds(native, n_regime)
    f_stalls, n_stalls = streams.stall_rounds(forced, f_regime), streams.stall_rounds(native, n_regime)
    common = set(f_rounds) & set(n_rounds)
    for probes in (f_stalls, n_stalls):  # a probed way pairs over the rounds its probe measured
        if len(probes) >= min_values():
            common &= set(probes)
    common = sorted(common)
    if not common:
        return None

    def cost(case: dict, regime: str, factors: dict[int, float], probes: dict[int, float], r: int) -> float:
        ran = streams.stream_figures(case, regime, stream_len, measured_steps)["measured_steps"]
        moved = streams.scaled_regime(case, regime, factors[r],
                                      probes.get(r) if len(probes) >= min_values() else None, ran)
        return streams.price_stream(**streams.stream_figures(moved, regime, stream_len, measured_steps),
                                    steps=steps)["usd_per_mtok"]

    return paired_ratio([cost(forced, f_regime, f_rounds, f_stalls, r) for r in common],
                        [cost(native, n_regime, n_rounds, n_stalls, r) for r in common])


def _break_even(forced, native, priced: dict, row: dict, stream_len, measured_steps, reasons: list) -> dict:
    """Where the kernel cheaper over the measured cold-start stream is not the one cheaper serving
    (the sides of 1 their paired ratios lie on), the horizon from which the other pays back its
    compile stalls, with the steady steps moved by their paired uncertainty."""
    cold, serving = row.get("cold_start_ratio"), row.get("serving_ratio")
    if cold is None or serving is None or cold != cold or serving != serving or (cold < 1) == (serving < 1):
        return {}
    slow, fast = (forced, native) if serving < 1 else (native, forced)
    long_win, short_win = slow["implementation"], fast["implementation"]
    low, high = row.get("paper_low"), row.get("paper_high")  # the paper pair's interval, where it carried
    # each step's share of the paired ratio's uncertainty (its 99% interval's log half-width over z)
    sd = (math.log(high / low) / (2 * SCATTER_Z * math.sqrt(2.0)) if low and high
          else priced[long_win]["sd_steady"])
    point, early, late = streams.break_even_interval(slow, fast, sd, sd, stream_len, measured_steps)
    reasons.append(f"over the measured {measured_steps}-step cold-start stream {short_win} is cheaper: "
                   f"{long_win} pays back its compile stalls after {_steps_words(point, early, late)}")
    return {"break_even": point, "break_even_low": early, "break_even_high": late, "break_even_of": long_win}


def _steps_words(point, early, late) -> str:
    """``419 steps [276-891]``, or "never within the uncertainty" where one end never pays back."""
    if point is None:
        return "no step count: never within 10,000,000,000 steps"
    low = f"{early:,}" if early is not None else "never"
    high = f"{late:,}" if late is not None else "never, within the uncertainty"
    return f"{point:,} steps [{low}-{high}]"


def ratio_text(ratio, low, high) -> str:
    """``1.19x [1.05-1.35]``, with a third decimal where two would read as 1 and hide the side."""
    def bound(value: float) -> str:
        return f"{value:.3f}" if 0.995 <= value <= 1.005 and value != 1.0 else f"{value:.2f}"

    if ratio is None or ratio != ratio:
        return "-"
    if low is None or low != low or high is None or high != high:
        return f"{ratio:.2f}x"
    return f"{ratio:.2f}x [{bound(low)}-{bound(high)}]"


def _sentence(row: dict, forced, native, steps: int, margin: float) -> str:
    """The one sentence a team can act on, for one row (the caveats every row shares are said once,
    ``verdict_display.notes``)."""
    if forced is None or native is None:
        only = native or forced
        return (f"Only {_name(only)} ranks here: no "
                f"{'forced-flash' if forced is None else 'native'} kernel to weigh it against.")
    f_name, n_name = forced["implementation"], native["implementation"]
    if row["answer"] == "-":
        paper = ratio_text(row.get("paper_ratio"), row.get("paper_low"), row.get("paper_high"))
        verb = {FORCED: f"On paper {f_name} is faster", NATIVE: f"On paper {n_name} is faster",
                EQUAL: f"On paper {f_name} and {n_name} are equal within ±{margin:.0%}",
                CANT_TELL: f"On paper {f_name} and {n_name} cannot be told apart"}.get(row["paper"], "")
        return f"{verb} ({paper}); no length stream measured: no production answer."
    ratio = ratio_text(row.get("ratio"), row.get("ratio_low"), row.get("ratio_high"))
    basis = str(row.get("production") or "")
    over = (basis.removeprefix("measured: ") + " (measured)" if basis.startswith("measured: ")
            else f"a horizon of {row.get('horizon') or f'{steps:,} steps'}"
            + (f" ({basis.split(': ')[0]})" if basis else ""))
    if row["answer"] == NATIVE:
        return (f"Use native {n_name}: forced {f_name} costs {ratio} as much per useful token over "
                f"{over}.")
    if row["answer"] == FORCED:
        return f"Force {f_name}: it costs {ratio} of native {n_name}'s per useful token over {over}."
    if row["answer"] == EQUAL:
        return (f"Either: forced {f_name} and native {n_name} cost the same within ±{margin:.0%} ({ratio}) "
                f"over {over}; decide on memory, fragility or what a profiler must see.")
    if row.get("ratio_low") != row.get("ratio_low") or row.get("ratio_low") is None:
        return f"Can't tell: forced {f_name} and native {n_name} were not timed in enough rounds together."
    return (f"Can't tell: forced {f_name} costs {ratio} of native {n_name}'s over {over}, from "
            f"{max(0.0, 1 - row['ratio_low']):.0%} less to {max(0.0, row['ratio_high'] - 1):.0%} more: "
            f"too wide to call it either way or equal within ±{margin:.0%}.")


def _row_notes(group, machine, framework, workload, breaks) -> list[str]:
    """What is true of this row alone: release breaks seen on its framework, target and workload, by
    cause (``breaks_to_cite``: never the project's adapter); its contended kernels. What many rows
    share (re-implementations, profiler visibility, interpreted kernels) is said once
    (``verdict_display.notes``)."""
    notes = []
    target = _release_target(machine)
    for impl in [c["implementation"] for c in group if c["rankable"]]:
        seen = [b for b in breaks if b["impl"] == impl and b["framework"] == framework
                and b["target"] == target and same_workload(b["workload"], workload)]
        for cause in dict.fromkeys(b["cause"] for b in seen):
            releases = ", ".join(dict.fromkeys(f"{b['framework']} {b['release']}" for b in seen
                                               if b["cause"] == cause))
            notes.append(f"{impl} broke in {releases} ({cause})")
    busy = [c["implementation"] for c in group if c["busy"]]
    if busy:
        notes.append("not ranked (contended): " + ", ".join(busy))
    return notes


def _release_target(machine: str) -> str | None:
    """The release matrix's target of a verdict machine: ``cpu`` for a CPU machine, the TPU target's
    own name, none for a GPU (the matrix compiles for no GPU)."""
    if machine.startswith("cpu"):
        return "cpu"
    return machine if machine.startswith("tpu") else None


def _stream_words(option: dict) -> str:
    words = [STRATEGY[option["regime"]]]
    if option["compiles"] == option["compiles"] and option["compiles"] > 0:
        count = round(option["compiles"])
        words.append(f"{count} compile{'s' if count != 1 else ''}, {option['stall_share']:.0%} of its cost")
    elif option["stall_share"] > 0.005:
        words.append(f"first call {option['stall_share']:.0%} of its cost")
    if option.get("padding") and option["padding"] == option["padding"] and option["padding"] > 0.005:
        words.append(f"{option['padding']:.0%} padding")
    return ", ".join(words)


def controls(frame, margin: float | None = None, cases=None) -> pd.DataFrame:
    """The A/A controls of each machine's newest run: a kernel timed twice in each of its rounds
    (``SuiteSize.controls``), compared with itself as a verdict row compares two kernels. Each must
    come out ``equal``; ``forced`` or ``native`` would be a measurement that invents differences.
    ``cases``: ``case_table(frame)`` already made."""
    import pandas as pd

    rows = []
    cases = case_table(frame) if cases is None else cases
    for case in cases.to_dict("records") if not cases.empty else []:
        if not case["control"]:
            continue
        own = {r: m for r, m in case["rounds"].items() if r in case["control"]}
        x, y = pair_rounds(case["control"], own)
        ratio = paired_ratio(x, y)
        used = margin or case.get("margin") or DEFAULT_MARGIN
        state = answer_of(ratio.low, ratio.high, used) if ratio.carried else CANT_TELL
        rows.append({"machine": case["machine"], "framework": case["framework"],
                     "workload": case["workload_name"],
                     "seq_len": int(case["seq_len"]), "kernel": case["implementation"], "ratio": ratio.ratio,
                     "ratio_low": ratio.low, "ratio_high": ratio.high, "rounds": ratio.rounds,
                     "answer": {FORCED: "second window faster", NATIVE: "first window faster"}.get(state,
                                                                                                     state),
                     "margin": used})
    return pd.DataFrame(rows, columns=["machine", "framework", "workload", "seq_len", "kernel", "ratio",
                                       "ratio_low", "ratio_high", "rounds", "answer", "margin"])


# -- the inputs outside the tidy table ------------------------------------------------------------
def release_breaks(results_dir: str) -> list[dict]:
    """The release matrix's breaks a verdict cites (``releases.table.breaks_to_cite``), each with its
    cause and evidence."""
    path = os.path.join(results_dir, "releases", "releases.csv")
    return breaks_to_cite(broken(load_table(path))) if os.path.exists(path) else []


def profiler_visibility(results_dir: str) -> dict[str, bool]:
    """``{impl: profiler_visible}`` from ``results/observability`` where it was recorded."""
    table = load_observability(results_dir)
    if table.empty:
        return {}
    known = table[table["profiler_visible"].astype(str).isin(["True", "False"])]
    return {r.impl: str(r.profiler_visible) == "True" for r in known.itertuples(index=False)}


def verdict_table(results_dir: str = "results", frame=None, *, horizon: Horizon | None = None,
                  margin: float | None = None, cases=None, records=None, noise=None) -> pd.DataFrame:
    """Every verdict row: the measured machines' first, then the compile targets'; ``cases``:
    ``case_table(frame)`` already made; ``records``: ``load_compiled_records`` already read;
    ``noise``: ``production.stream_noise(frame)`` already made."""
    import pandas as pd

    if frame is None:
        frame = load_results(results_dir)
    fragility = release_breaks(results_dir)
    measured = measured_verdicts(frame, horizon=horizon, fragility=fragility, margin=margin, cases=cases,
                                 noise=noise)
    records = load_compiled_records(results_dir) if records is None else records
    compiled = compiled_verdicts(records, load_max_batch(results_dir), fragility=fragility,
                                 tuning=load_kept(results_dir))
    published = published_verdicts(records, load_published(results_dir))  # the aligned shapes' rows
    parts = [p for p in (measured, compiled, published) if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS + TUNING_COLUMNS)


def headline(table) -> pd.DataFrame:
    """The rows the report opens with: measured rows with a production verdict, and each compile
    target's longest searched length per workload; ``paper_only`` and ``other_lengths`` hold the rest."""
    if table.empty:
        return table
    return table[_measured_stream(table) | _longest_compiled(table)].reset_index(drop=True)


def _measured_stream(table):
    return (table["basis"] == "measured") & table["ratio"].notna()


def _longest_compiled(table):
    searched = (table["basis"] == "compiler only") & table["headroom_winner"].notna()
    longest = table[searched].groupby(["machine", "workload"])["seq_len"].transform("max")
    return searched & (table["seq_len"] == longest.reindex(table.index))


def other_lengths(table) -> pd.DataFrame:
    """The compile targets' searched rows at their shorter lengths."""
    searched = (table["basis"] == "compiler only") & table["headroom_winner"].notna()
    return table[searched & ~_longest_compiled(table)].reset_index(drop=True)


def paper_only(table):
    """The measured rows with no length stream: a paper comparison only."""
    keep = (table["basis"] == "measured") & table["ratio"].isna()
    return table[keep].reset_index(drop=True)
