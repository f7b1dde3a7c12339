"""The verdict: per machine x framework x workload x length, the paper winner and the production winner.

``paper_winner``: the fastest steady step at static shapes. ``production_winner``: the lowest USD per
million useful tokens over a ``STREAM_STEPS`` stream from the suite's length distribution, each kernel
its cheapest way (static, dynamic or bucketed), compile stalls and padding included, priced from the
measured regimes (``price_stream``). Compile targets show what only the compiler says; the roofline
is a bound and never ranks kernels. Interpreted kernels and contended figures never win; overlapping
intervals tie, and a tie is no flip (docs/reports.md).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from attnbench.checks.observability import load_observability
from attnbench.core import regimes
from attnbench.releases.table import broken, load_table
from attnbench.report.compiled import grid as grid_lengths
from attnbench.report.compiled import load_compiled_records, load_max_batch
from attnbench.report.plots import _colors, _figure, _png, _style
from attnbench.report.render import Table
from attnbench.report.select import newest_commit
from attnbench.results.asv_results import load_results
from attnbench.results.noise import SCATTER_Z, is_contended, series_scatter

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

# The production stream: a serving or training process's first thousand steps. The measured stream
# (the suite's regime_steps, 6 by default) is far shorter, so its compile stalls would dominate.
STREAM_STEPS = 1000
BUCKET_POLICY = "multiple-128"  # the engine's default, the one the suite measures
STREAM_SEED = 0  # engine.Options.seed: the suite's streams are drawn with it
UNRECORDED_REGIME_STEPS = 6  # the default suite's stream, for runs that recorded no settings
STRATEGY = {"static": "pad to max", "dynamic": "exact lengths", "bucketed": "buckets"}
FORWARD = "causal B1 H8 D64"  # the Forward and Training classes' workload
MEMORY = ("device_peak_bytes", "host_profiler_peak_bytes", "compiler_peak_bytes")
COLUMNS = [
    "machine",
    "basis",
    "framework",
    "workload",
    "seq_len",
    "dtype",
    "paper_winner",
    "production_winner",
    "flip",
    "ratio",
    "ratio_low",
    "ratio_high",
    "ratio_of",
    "production_strategy",
    "headroom_winner",
    "reasons",
]


# -- the stream -----------------------------------------------------------------------------------
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


def price_stream(
    *,
    steady_usd: float,
    usd_with_compiles: float,
    usd_per_mtok: float,
    compiles,
    regime: str,
    max_len: int,
    measured_steps: int,
    steps: int = STREAM_STEPS,
) -> dict:
    """``usd_per_mtok`` over ``steps`` steps, expected ``compiles`` and ``stall_share``, from one measured
    stream's figures: each compile costs the stall it cost there and recurs at the measured rate per
    new shape, so ``steps == measured_steps`` gives back the measured ``usd_per_mtok``."""
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
    elif compiles <= 0:
        stalls, expected = 0.0, 0.0
    elif steps == measured_steps:  # the measured stream itself: its own shapes, not the expected ones
        stalls, expected = stall_total, float(compiles)
    else:
        rate = compiles / measured_shapes(regime, max_len, measured_steps)
        expected = rate * expected_shapes(regime, max_len, steps)
        stalls = expected * stall_total / compiles
    total = steps * steady_usd + stalls
    return {
        "usd_per_mtok": total * 1e6 / (steps * tokens),
        "compiles": expected,
        "stall_share": stalls / total if total else 0.0,
    }


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
    if lo == lo and hi == hi and lo is not None and hi is not None and lo <= value <= hi:
        return float(lo), float(hi)
    return float(value), float(value)


def _case_table(frame) -> pd.DataFrame:
    """One row per kernel case of each machine's newest commit (Forward, Training, Models): static
    step time and interval, memory peak, and per regime the figures ``price_stream`` takes."""
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
        row.update(
            label=first["label"],
            execution=first.get("execution"),
            busy=bool(part["busy"].any()),
            step_s=float(first["value"]),
            step_lo=lo,
            step_hi=hi,
        )
        for metric in MEMORY:
            found = part[(part["metric"] == metric) & (part["regime"] == "static")]["value"]
            if len(found) and found.iloc[0] == found.iloc[0] and found.iloc[0] > 0:
                row.update(peak_bytes=float(found.iloc[0]), peak_source=metric)
                break
        for regime in regimes.REGIMES:
            got = part[part["regime"] == regime].set_index("metric")["value"]
            got = got[~got.index.duplicated()]
            for metric in (
                "usd_per_step",
                "usd_per_step_with_compiles",
                "usd_per_million_useful_tokens_with_compiles",
                "compiles",
                "padding_waste",
            ):
                row[f"{regime}:{metric}"] = float(got[metric]) if metric in got else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def _stream_scatter(frame) -> dict:
    """Run-to-run relative spread of each regime series' steady and stalled step cost (the
    regimes have no interval of their own): ``{(machine, impl, seq_len, dtype, regime, metric): sd}``."""
    part = frame[
        (frame["suite"] == "Forward") & frame["metric"].isin(["usd_per_step", "usd_per_step_with_compiles"])
    ]
    if part.empty:
        return {}
    table = series_scatter(part)
    return {
        (r.machine, r.implementation, r.seq_len, r.dtype, r.regime, r.metric): float(r.scatter)
        for r in table.itertuples(index=False)
        if r.scatter == r.scatter
    }


def _production(case: dict, steps: int, scatter: dict, max_len: int, measured_steps: int) -> dict | None:
    """The kernel's cheapest way through the stream (strategy, USD per million useful tokens, its
    relative SD, compiles, stall share, padding waste); None where no regime was measured."""
    best = None
    # Too few runs for a scatter: the static step's own interval (asv's, 99%) stands in.
    fallback = math.log(case["step_hi"] / case["step_lo"]) / (2 * SCATTER_Z) if case["step_lo"] > 0 else 0.0
    for regime in regimes.REGIMES:
        figures = _stream_figures(case, regime, max_len, measured_steps)
        if figures is None:
            continue
        priced = price_stream(**figures, steps=steps)
        key = (case["machine"], case["implementation"], case["seq_len"], case["dtype"], regime)
        sd_steady = scatter.get((*key, "usd_per_step"), fallback)
        sd_stalled = scatter.get((*key, "usd_per_step_with_compiles"), fallback)
        share = priced["stall_share"]
        option = {
            "regime": regime,
            "usd": priced["usd_per_mtok"],
            "sd": math.hypot((1 - share) * sd_steady, share * sd_stalled),
            "compiles": priced["compiles"],
            "stall_share": share,
            "padding": case.get(f"{regime}:padding_waste"),
        }
        if best is None or option["usd"] < best["usd"]:
            best = option
    if best is not None:
        best["strategies"] = sum(
            case.get(f"{r}:usd_per_million_useful_tokens_with_compiles")
            == case.get(f"{r}:usd_per_million_useful_tokens_with_compiles")
            for r in regimes.REGIMES
        )
    return best


def _stream_figures(case: dict, regime: str, max_len: int, measured_steps: int) -> dict | None:
    """``price_stream``'s arguments from a kernel case's measured ``regime``; None if not measured."""
    usd = case.get(f"{regime}:usd_per_million_useful_tokens_with_compiles")
    if usd is None or usd != usd:
        return None
    return {
        "steady_usd": case[f"{regime}:usd_per_step"],
        "usd_with_compiles": case[f"{regime}:usd_per_step_with_compiles"],
        "usd_per_mtok": usd,
        "compiles": case[f"{regime}:compiles"],
        "regime": regime,
        "max_len": max_len,
        "measured_steps": measured_steps,
    }


def _cheapest_at(case: dict, steps: int, max_len: int, measured_steps: int) -> float:
    """The kernel's USD per million useful tokens over ``steps`` steps, its cheapest way."""
    options = (_stream_figures(case, r, max_len, measured_steps) for r in regimes.REGIMES)
    return min(price_stream(**f, steps=steps)["usd_per_mtok"] for f in options if f is not None)


def _measured_steps(frame) -> int:
    """The measured stream's length: the suite's recorded ``regime_steps``."""
    settings = newest_commit(frame)
    if "setting_regime_steps" in settings and settings["setting_regime_steps"].notna().any():
        return int(settings["setting_regime_steps"].dropna().max())
    return UNRECORDED_REGIME_STEPS


def break_even_steps(
    slow_start: dict, fast_start: dict, max_len: int, measured_steps: int, limit: int = 10**7
) -> int | None:
    """The stream length from which ``slow_start`` (cheaper per step, dearer to compile) costs less
    than ``fast_start``; None when it never does within ``limit`` steps."""

    def cheaper(steps: int) -> bool:
        return _cheapest_at(slow_start, steps, max_len, measured_steps) < _cheapest_at(
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


def _overlap(a_lo, a_hi, b_lo, b_hi) -> bool:
    return a_lo <= b_hi and b_lo <= a_hi


def _name(case) -> str:
    return f"{case['implementation']} ({case['label']})"


def _mb(value) -> str:
    return f"{value / 1e6:.3g} MB" if value < 1e9 else f"{value / 1e9:.3g} GB"


def _kernel_notes(impl: str, fragility: dict, visibility: dict) -> list[str]:
    notes = []
    if fragility.get(impl):
        notes.append(f"{impl} broke in {fragility[impl]}")
    visible = visibility.get(impl)
    if visible is False:
        notes.append(f"{impl} is invisible to its framework's profiler")
    return notes


def measured_verdicts(
    frame, *, steps: int = STREAM_STEPS, fragility: dict | None = None, visibility: dict | None = None
) -> pd.DataFrame:
    """The verdict rows of the measured machines (the tidy table's newest commit per machine)."""
    import pandas as pd

    fragility, visibility = fragility or {}, visibility or {}
    cases = _case_table(frame)
    if cases.empty:
        return pd.DataFrame(columns=COLUMNS)
    cases = cases.assign(rankable=_rankable(cases))
    measured_steps = _measured_steps(frame)
    scatter = _stream_scatter(frame)
    rows = []
    group_keys = ["machine", "framework", "workload_name", "seq_len", "dtype"]
    for key, group in cases.groupby(group_keys, sort=True):
        machine, framework, workload, seq, dtype = key
        group = group.to_dict("records")
        excluded = [c for c in group if c["busy"]]
        interpreted = [c for c in group if c.get("execution") == "interpret"]
        eligible = [c for c in group if c["rankable"]]
        if not eligible:
            continue
        row = {
            "machine": machine,
            "basis": "measured",
            "framework": framework,
            "workload": workload,
            "seq_len": int(seq) if seq > 0 else None,
            "dtype": dtype,
        }
        paper = min(eligible, key=lambda c: c["step_s"])
        row["paper_winner"] = _name(paper)
        reasons = []
        ties = [
            c
            for c in eligible
            if c is not paper and _overlap(c["step_lo"], c["step_hi"], paper["step_lo"], paper["step_hi"])
        ]
        if ties:
            reasons.append("on paper within noise of " + ", ".join(c["implementation"] for c in ties))
        priced = {
            c["implementation"]: _production(c, steps, scatter, int(seq), measured_steps)
            for c in eligible
            if seq > 0
        }
        priced = {k: v for k, v in priced.items() if v is not None}
        if not priced:
            row.update(flip="-", production_winner=None)
            reasons.append("no length stream measured here: paper only")
        else:
            by_impl = {c["implementation"]: c for c in eligible}
            order = sorted(priced, key=lambda k: priced[k]["usd"])
            prod_name = order[0]
            prod, winner = priced[prod_name], by_impl[prod_name]
            row["production_winner"] = _name(winner)
            row["production_strategy"] = f"{STRATEGY[prod['regime']]}, {prod['usd']:.3g} USD/Mtok"
            other = (
                paper["implementation"]
                if paper["implementation"] != prod_name
                else (order[1] if len(order) > 1 else None)
            )
            if other is not None and other in priced:
                o = priced[other]
                ratio, spread = o["usd"] / prod["usd"], SCATTER_Z * math.hypot(o["sd"], prod["sd"])
                row.update(
                    ratio=ratio,
                    ratio_low=ratio * math.exp(-spread),
                    ratio_high=ratio * math.exp(spread),
                    ratio_of=f"{other} / {prod_name}",
                )
            if prod_name == paper["implementation"]:
                row["flip"] = "no"
            elif any(t["implementation"] == prod_name for t in ties) or row.get("ratio_low", 0) <= 1:
                row["flip"] = "within noise"
            else:
                row["flip"] = "yes"
            if prod_name != paper["implementation"] and paper["implementation"] in priced:
                p = priced[paper["implementation"]]
                reasons.append(
                    f"{paper['label']} {paper['implementation']}: fastest step "
                    f"({paper['step_s'] * 1e3:.3g} vs {winner['step_s'] * 1e3:.3g} ms) but "
                    f"{p['usd'] / prod['usd']:.2f}x the cost over {steps:,} steps "
                    f"({_stream_words(p)}; {prod_name}: {_stream_words(prod)})"
                )
            if prod["strategies"] == 1:
                reasons.append(f"only {STRATEGY['static']} measured at this length")
            short_winner = min(
                priced, key=lambda k: _cheapest_at(by_impl[k], measured_steps, int(seq), measured_steps)
            )
            if short_winner != prod_name:
                steps_even = break_even_steps(winner, by_impl[short_winner], int(seq), measured_steps)
                reasons.append(
                    f"over the measured {measured_steps}-step stream {short_winner} is cheapest: "
                    f"{prod_name} pays back its compile stalls after {steps_even:,} steps"
                )
        if priced and prod_name != paper["implementation"]:
            peaks = [(c["implementation"], c.get("peak_bytes")) for c in (paper, winner)]
            if all(b == b and b for _, b in peaks) and max(b for _, b in peaks) > 1.5 * min(
                b for _, b in peaks
            ):
                reasons.append("peak " + " vs ".join(f"{n} {_mb(b)}" for n, b in peaks))
        for impl in dict.fromkeys([paper["implementation"]] + ([prod_name] if priced else [])):
            reasons.extend(_kernel_notes(impl, fragility, visibility))
        if interpreted:
            reasons.append("not ranked (interpreted): " + ", ".join(c["implementation"] for c in interpreted))
        if excluded:
            reasons.append("not ranked (contended): " + ", ".join(c["implementation"] for c in excluded))
        row["reasons"] = "; ".join(reasons)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _stream_words(option: dict) -> str:
    words = [STRATEGY[option["regime"]]]
    if option["compiles"] == option["compiles"] and option["compiles"] > 0:
        count = round(option["compiles"])
        words.append(f"{count} compile{'s' if count != 1 else ''}, {option['stall_share']:.0%} of its cost")
    if option.get("padding") and option["padding"] == option["padding"] and option["padding"] > 0.005:
        words.append(f"{option['padding']:.0%} padding")
    return ", ".join(words)


# -- what the compilers say -----------------------------------------------------------------------
def compiled_verdicts(records, max_batch=None, *, fragility: dict | None = None) -> pd.DataFrame:
    """Per compile target x mode x length with a max-batch search (else every grid length): which
    kernels compile and fit, the largest batch each fits, layout copies, and the roofline bound."""
    import pandas as pd

    fragility = fragility or {}
    if records is None or records.empty:
        return pd.DataFrame(columns=COLUMNS)

    grid = grid_lengths(records[(records["batch"] == 1) & (records["seq_q"] == records["seq_k"])])
    batches = max_batch if max_batch is not None and not max_batch.empty else None
    if batches is not None:
        wanted = set(zip(batches["target"], batches["mode"], batches["seq_len"], strict=True))
        grid = grid[
            [(t, m, s) in wanted for t, m, s in zip(grid["target"], grid["mode"], grid["seq_q"], strict=True)]
        ]
    rows = []
    for (target, mode, seq, dtype), part in grid.groupby(["target", "mode", "seq_q", "dtype"], sort=True):
        real = part[(part["execution"] != "interpret") & (part["status"].isin(["ok", "does-not-fit"]))]
        if real.empty:
            continue
        reasons = []
        bound = real["model_roofline_seconds"].dropna()
        if len(bound):
            reasons.append(f"roofline bound {bound.min() * 1e3:.3g} ms at 100% of peak (a bound, not a rank)")
        refused = real[(real["status"] == "does-not-fit") | (real["fits"].astype(str) != "True")]
        if len(refused):
            reasons.append("does not fit: " + ", ".join(refused["impl"]))
        here = (
            batches[
                (batches["target"] == target)
                & (batches["mode"] == mode)
                & (batches["seq_len"] == seq)
                & batches["impl"].isin(real["impl"])
                & batches["max_batch"].notna()
            ]
            if batches is not None
            else None
        )
        headroom = None
        if here is None or here.empty:  # no batch search: the copies at batch 1
            for r in real[real["inserted_copy_bytes"].fillna(0) > 0].itertuples(index=False):
                reasons.append(f"{r.label} {r.impl}: layout copies +{_mb(r.inserted_copy_bytes)} at batch 1")
        else:
            here = here.sort_values("max_batch", ascending=False)
            best = here["max_batch"].max()
            headroom = ", ".join(here[here["max_batch"] == best]["impl"])
            reasons.append("largest batch: " + ", ".join(_batch_words(r) for r in here.to_dict("records")))
            winner = here.iloc[0]["impl"]
            for r in here.to_dict("records"):
                # Copy bytes are what the inserted copies write per step, not memory live at once.
                copies = r.get("inserted_copy_bytes_at_max") or 0
                if r["max_batch"] < best and copies > 0:
                    reasons.append(
                        f"{r['impl']} fits {r['max_batch'] / best:.2f}x the tokens per chip of {winner}, "
                        f"and its layout copies write {_mb(copies)} per step there"
                    )
        for impl in real["impl"]:
            reasons.extend(n for n in _kernel_notes(impl, fragility, {}) if n not in reasons)
        rows.append(
            {
                "machine": target,
                "basis": "compiler only",
                "framework": "jax",
                "workload": FORWARD + (" fwd+bwd" if mode == "fwd_bwd" else ""),
                "seq_len": int(seq),
                "dtype": dtype,
                "paper_winner": None,
                "production_winner": None,
                "flip": "-",
                "headroom_winner": headroom,
                "reasons": "; ".join(reasons),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _batch_words(row: dict) -> str:
    capped = str(row.get("capped")) == "True"  # the search's upper end fits: at least that
    return f"{row['impl']} {'>=' if capped else ''}{int(row['max_batch'])}"


# -- the inputs outside the tidy table ------------------------------------------------------------
def release_fragility(results_dir: str) -> dict[str, str]:
    """``{impl: "jax 0.9.2 (api-changed), ..."}`` from the release matrix, where it broke."""
    path = os.path.join(results_dir, "releases", "releases.csv")
    if not os.path.exists(path):
        return {}
    out: dict[str, list[str]] = {}
    for cell in broken(load_table(path)):
        text = f"{cell['framework']} {cell['release']} ({cell['status']})"
        out.setdefault(cell["impl"], [])
        if text not in out[cell["impl"]]:
            out[cell["impl"]].append(text)
    return {impl: ", ".join(texts) for impl, texts in out.items()}


def profiler_visibility(results_dir: str) -> dict[str, bool]:
    """``{impl: profiler_visible}`` from ``results/observability`` where it was recorded."""
    table = load_observability(results_dir)
    if table.empty:
        return {}
    known = table[table["profiler_visible"].astype(str).isin(["True", "False"])]
    return {r.impl: str(r.profiler_visible) == "True" for r in known.itertuples(index=False)}


def verdict_table(results_dir: str = "results", frame=None, *, steps: int = STREAM_STEPS) -> pd.DataFrame:
    """Every verdict row: the measured machines' first, then the compile targets'."""
    import pandas as pd

    if frame is None:
        frame = load_results(results_dir)
    fragility, visibility = release_fragility(results_dir), profiler_visibility(results_dir)
    measured = measured_verdicts(frame, steps=steps, fragility=fragility, visibility=visibility)
    compiled = compiled_verdicts(
        load_compiled_records(results_dir), load_max_batch(results_dir), fragility=fragility
    )
    parts = [p for p in (measured, compiled) if not p.empty]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def headline(table) -> pd.DataFrame:
    """The rows the report opens with: measured rows with a production verdict, and each compile
    target's longest searched length per workload; ``paper_only`` and ``other_lengths`` hold the rest."""
    if table.empty:
        return table
    return table[_measured_stream(table) | _longest_compiled(table)].reset_index(drop=True)


def _measured_stream(table):
    return (table["basis"] == "measured") & table["production_winner"].notna()


def _longest_compiled(table):
    searched = (table["basis"] == "compiler only") & table["headroom_winner"].notna()
    longest = table[searched].groupby(["machine", "workload"])["seq_len"].transform("max")
    return searched & (table["seq_len"] == longest.reindex(table.index))


def other_lengths(table) -> pd.DataFrame:
    """The compile targets' searched rows at their shorter lengths."""
    searched = (table["basis"] == "compiler only") & table["headroom_winner"].notna()
    return table[searched & ~_longest_compiled(table)].reset_index(drop=True)


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value) or value == "":
        return "-"
    return str(int(value)) if isinstance(value, float) else str(value)


DISPLAY_COLUMNS = [
    "machine",
    "framework",
    "workload",
    "seq",
    "paper winner",
    "production winner",
    "flip",
    "ratio",
    "ratio of",
    "most headroom",
    "reasons",
]


def display(table) -> pd.DataFrame:
    """The verdict as people read it: the ratio as ``1.19x [1.05-1.35]``, empty cells as ``-``."""
    import pandas as pd

    rows = []
    for r in table.to_dict("records"):
        ratio = "-"
        if r.get("ratio") == r.get("ratio") and r.get("ratio") is not None:
            ratio = f"{r['ratio']:.2f}x [{r['ratio_low']:.2f}-{r['ratio_high']:.2f}]"
        rows.append(
            {
                "machine": r["machine"],
                "framework": r["framework"],
                "workload": r["workload"],
                "seq": _cell(r["seq_len"]),
                "paper winner": _cell(r["paper_winner"]),
                "production winner": _cell(r["production_winner"]),
                "flip": r["flip"],
                "ratio": ratio,
                "ratio of": _cell(r.get("ratio_of")),
                "most headroom": _cell(r.get("headroom_winner")),
                "reasons": _cell(r["reasons"]),
            }
        )
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


# -- the picture ----------------------------------------------------------------------------------
def plot_stream_cost(frame, *, steps: int = STREAM_STEPS) -> bytes | None:
    """USD per million useful tokens against the stream's length, per framework, at each measured
    machine's longest length stream: each kernel its cheapest way, with its uncertainty band and the
    verdict's stream length marked. Where two lines cross, the cheaper kernel changes."""
    cases = _case_table(frame)
    if cases.empty:
        return None
    cases = cases[cases["dynamic:usd_per_million_useful_tokens_with_compiles"].notna() & _rankable(cases)]
    if cases.empty:
        return None
    measured_steps = _measured_steps(frame)
    scatter = _stream_scatter(frame)
    panels = []
    for (machine, framework), part in cases.groupby(["machine", "framework"], sort=True):
        seq = part["seq_len"].max()
        panels.append((machine, framework, int(seq), part[part["seq_len"] == seq]))
    fig, axes = _figure(1, len(panels), width=4.6, height=3.6)
    colors = _colors(cases["implementation"])
    grid = sorted({int(round(10 ** (k / 8))) for k in range(0, 41)} | {measured_steps, steps})
    for ax, (machine, framework, seq, part) in zip(axes[0], panels, strict=True):
        for case in part.to_dict("records"):
            costs = [_cheapest_at(case, m, seq, measured_steps) for m in grid]
            sd = _production(case, steps, scatter, seq, measured_steps)["sd"]
            width = math.exp(SCATTER_Z * sd)
            color = colors[case["implementation"]]
            ax.plot(grid, costs, _style(case["label"]), color=color, label=case["implementation"])
            ax.fill_between(
                grid,
                [c / width for c in costs],
                [c * width for c in costs],
                color=color,
                alpha=0.12,
                linewidth=0,
            )
        ax.axvline(measured_steps, color="grey", linewidth=0.8, linestyle=":")
        ax.axvline(steps, color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(
            f"stream length, steps (dotted: measured {measured_steps}, verdict {steps:,})", fontsize=8
        )
        ax.set_ylabel("USD per million useful tokens")
        ax.set_title(f"{machine} {framework}, lengths up to {seq}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, title="solid native, dashed forced", title_fontsize=7)
    return _png(fig)


def verdict_part(table) -> dict | None:
    """The report's section ``## Verdict``: the headline rows (short columns), each row's reasons
    as a sentence, and the paper-only rows for later."""
    if table is None or table.empty:
        return None
    top = display(headline(table))
    rest = display(paper_only(table))
    shorter = display(other_lengths(table))
    short = [c for c in top.columns if c not in ("reasons", "ratio of")]
    sentences = [
        f"**{r['machine']} {r['framework']} {r['workload']} {r['seq']}**: {r['reasons']}"
        for r in top.to_dict("records")
        if r["reasons"] != "-"
    ]
    return {
        "table": Table.of(top[short]),
        "sentences": sentences,
        "steps": f"{STREAM_STEPS:,}",
        "paper_only": Table.of(rest) if not rest.empty else None,
        "other_lengths": Table.of(shorter) if not shorter.empty else None,
    }


def paper_only(table):
    """The measured rows with no length stream: a paper winner only."""
    keep = (table["basis"] != "compiler only") & table["production_winner"].isna()
    return table[keep].reset_index(drop=True)
