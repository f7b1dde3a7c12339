"""The verdict: per machine x framework x workload x length, the paper winner and the production winner.

``paper_winner``: the fastest steady step at static shapes. ``production_winner``: the lowest USD per
million useful tokens over a ``streams.STREAM_STEPS`` stream from the suite's length distribution, each kernel
its cheapest way (static, dynamic or bucketed), compile stalls and padding included, priced from the
measured regimes (``report/streams.py``). Compile targets show what only the compiler says; the roofline
is a bound and never ranks kernels. Interpreted kernels and contended figures never win; overlapping
intervals tie, and a tie is no flip (docs/reports.md).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import attention_impls
from attnbench.core import presets, regimes
from attnbench.core.workload import CUSTOM
from attnbench.releases.table import breaks_to_cite, broken, load_table
from attnbench.report import streams
from attnbench.report.compiled import grid as grid_lengths
from attnbench.report.compiled import load_compiled_records, load_max_batch
from attnbench.report.plots import colors_by_name, line_style, new_figure, png_bytes
from attnbench.report.render import Table
from attnbench.report.select import newest_commit
from attnbench.results.asv_results import load_results
from attnbench.results.noise import SCATTER_Z, is_contended, series_scatter
from attnbench.results.observability import load_observability
from attnbench.results.steps import noise_floors

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

UNRECORDED_REGIME_STEPS = 6  # the default suite's stream, for runs that recorded no settings
STRATEGY = {"static": "pad to max", "dynamic": "exact lengths", "bucketed": "buckets"}
FORWARD = "causal B1 H8 D64"  # the Forward and Training classes' workload
MEMORY = ("device_peak_bytes", "host_profiler_peak_bytes", "compiler_peak_bytes")
FORCED, NATIVE, CANT_TELL = "forced", "native", "can't tell"  # an answer's three states
FORCED_LABEL, NATIVE_LABEL = "forced-flash", "native"  # the kernels' labels (attention_impls/base.py)
COLUMNS = [
    "machine", "basis", "framework", "workload", "seq_len", "dtype",
    "answer", "forced", "native", "ratio", "ratio_low", "ratio_high", "ratio_of",
    "paper", "paper_ratio", "paper_low", "paper_high", "flip",
    "break_even", "break_even_low", "break_even_high", "break_even_of",
    "production_strategy", "headroom_winner", "sentence", "reasons",
]


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
        # asv's interval over a few rounds can reach below zero; a step takes no less than no time
        return max(float(lo), 0.0), float(hi)
    return float(value), float(value)


def _case_table(frame) -> pd.DataFrame:
    """One row per kernel case of each machine's newest commit (Forward, Training, Models): static
    step time and interval, memory peak, and per regime the figures ``streams.price_stream`` takes."""
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
            suite=first["suite"],
            stream_len=_stream_len(first),
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


def _stream_scatter(frame) -> dict:
    """Run-to-run relative spread of each series' steady and stalled step cost:
    ``{(machine, suite, impl, seq_len, dtype, regime, metric): sd}``, Forward's regimes and Training's
    and Models' static series alike."""
    part = frame[frame["suite"].isin(["Forward", "Training", "Models"])
                 & frame["metric"].isin(["usd_per_step", "usd_per_step_with_compiles"])]
    if part.empty:
        return {}
    part = part.assign(seq_len=part["seq_len"].fillna(-1), dtype=part["dtype"].fillna("-"),
                       regime=part["regime"].fillna("static"))
    table = series_scatter(part)
    out = {}
    for r in table.to_dict("records"):
        if r["scatter"] == r["scatter"]:
            suite = str(r["benchmark"]).split(".")[1] if "." in str(r["benchmark"]) else r["benchmark"]
            series = (r["machine"], suite, r["implementation"], r["seq_len"], r["dtype"], r["regime"])
            out[(*series, r["metric"])] = float(r["scatter"])
    return out


def _floors(frame) -> dict:
    """The machine's noise floor of each kind of cost figure (``results.steps.noise_floors``): what a
    regime's steady step, the median of a few stream steps, is held to."""
    costs = frame[frame["metric"].isin(["usd_per_step", "usd_per_step_with_compiles"])]
    return noise_floors(costs) if len(costs) else {}


def _measured_steps(frame) -> int:
    """The measured stream's length: the suite's recorded ``regime_steps``."""
    settings = newest_commit(frame)
    if "setting_regime_steps" in settings and settings["setting_regime_steps"].notna().any():
        return int(settings["setting_regime_steps"].dropna().max())
    return UNRECORDED_REGIME_STEPS


def _name(case) -> str:
    return f"{case['implementation']} ({case['label']})"


def _mb(value) -> str:
    return f"{value / 1e6:.3g} MB" if value < 1e9 else f"{value / 1e9:.3g} GB"


def three_states(low: float, high: float) -> str:
    """``forced`` where the forced kernel's ratio to the native one is below 1 beyond its interval,
    ``native`` where above, else ``can't tell``."""
    if high < 1.0:
        return FORCED
    if low > 1.0:
        return NATIVE
    return CANT_TELL


def _reimplementation(impl: str) -> str:
    """What the kernel re-implements in its framework's own ops ("" for a vendor or library kernel)."""
    try:
        return getattr(attention_impls.get(impl), "reimplements", "") or ""
    except KeyError:
        return ""


def _best(cases: list[dict], priced: dict, label: str):
    """The cheapest kernel of ``label`` in production (the fastest on paper where none is priced)."""
    mine = [c for c in cases if c["label"] == label]
    if not mine:
        return None
    with_cost = [c for c in mine if c["implementation"] in priced]
    if with_cost:
        return min(with_cost, key=lambda c: priced[c["implementation"]]["usd"])
    return min(mine, key=lambda c: c["step_s"])


def measured_verdicts(
    frame, *, steps: int = streams.STREAM_STEPS, fragility: list | dict | None = None,
    visibility: dict | None = None
) -> pd.DataFrame:
    """The verdict rows of the measured machines (the tidy table's newest commit per machine): per
    machine x framework x workload x length, the best forced-flash kernel against the best native
    one, on paper and over a ``steps``-step stream, each comparison in three states (docs/reports.md)."""
    import pandas as pd

    visibility = visibility or {}
    breaks = fragility if isinstance(fragility, list) else []
    cases = _case_table(frame)
    if cases.empty:
        return pd.DataFrame(columns=COLUMNS)
    cases = cases.assign(rankable=_rankable(cases))
    measured_steps = _measured_steps(frame)
    scatter, floors = _stream_scatter(frame), _floors(frame)
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
        priced = {c["implementation"]: streams.cheapest_way(c, steps, scatter, floors, stream_len,
                                                            measured_steps)
                  for c in eligible if stream_len > 0}
        priced = {k: v for k, v in priced.items() if v is not None}
        forced, native = _best(eligible, priced, FORCED_LABEL), _best(eligible, priced, NATIVE_LABEL)
        reasons = []
        row.update(_compare(forced, native, priced, steps, stream_len, measured_steps, reasons))
        row["sentence"] = _sentence(row, forced, native, framework, steps)
        compared = [c["implementation"] for c in (forced, native) if c is not None]
        reasons.extend(_row_notes(eligible, group, machine, framework, workload, breaks, visibility,
                                  compared))
        row["reasons"] = "; ".join(reasons)
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _ratio_interval(ratio: float, forced: dict, native: dict) -> tuple[float, float]:
    """The 99% interval of ``forced / native`` steps from each step's own 99% interval (asv's), the two
    independent: their log half-widths add in quadrature, as the production comparison's SDs do. An
    interval reaching zero (asv's, over a few rounds) bounds the ratio by its ends alone."""
    if min(forced["step_lo"], native["step_lo"]) <= 0:
        return (forced["step_lo"] / native["step_hi"],
                forced["step_hi"] / native["step_lo"] if native["step_lo"] > 0 else math.inf)
    half = math.hypot(math.log(forced["step_hi"] / forced["step_lo"]),
                      math.log(native["step_hi"] / native["step_lo"])) / 2
    return ratio * math.exp(-half), ratio * math.exp(half)


def _compare(forced, native, priced: dict, steps: int, stream_len: int, measured_steps: int,
             reasons: list) -> dict:
    """The paper and production comparisons of the two kernels, the flip and the break-even."""
    out = {"forced": _name(forced) if forced else None, "native": _name(native) if native else None,
           "answer": "-", "paper": "-", "flip": "-"}
    if forced is None or native is None:
        missing = "forced-flash" if forced is None else "native"
        reasons.append(f"no {missing} kernel ranks here: nothing to compare")
        return out
    f_name, n_name = forced["implementation"], native["implementation"]
    ratio = forced["step_s"] / native["step_s"]
    low, high = _ratio_interval(ratio, forced, native)
    out.update(paper=three_states(low, high), paper_ratio=ratio, paper_low=low, paper_high=high)
    reasons.append(f"on paper {f_name} takes {ratio:.2f}x [{_bound(low)}-{_bound(high)}] of {n_name}'s step "
                   f"({forced['step_s'] * 1e3:.3g} vs {native['step_s'] * 1e3:.3g} ms)")
    if f_name not in priced or n_name not in priced:
        reasons.append("no length stream measured here: paper only")
        return out
    f_cost, n_cost = priced[f_name], priced[n_name]
    ratio = f_cost["usd"] / n_cost["usd"]
    spread = SCATTER_Z * math.hypot(f_cost["sd"], n_cost["sd"])
    out.update(ratio=ratio, ratio_low=ratio * math.exp(-spread), ratio_high=ratio * math.exp(spread),
               ratio_of=f"{f_name} / {n_name}, USD per useful token",
               production_strategy=f"{f_name}: {_stream_words(f_cost)}; {n_name}: {_stream_words(n_cost)}")
    out["answer"] = three_states(out["ratio_low"], out["ratio_high"])
    decided = {FORCED, NATIVE}
    if out["paper"] in decided and out["answer"] in decided:
        out["flip"] = "yes" if out["paper"] != out["answer"] else "no"
    else:
        out["flip"] = CANT_TELL
    if min(f_cost["strategies"], n_cost["strategies"]) == 1:
        reasons.append(f"only {STRATEGY['static']} measured at this length")
    # Where the cheaper kernel over the measured stream is not the one over the long stream, when the
    # other pays back its compile stalls, with the steady steps' uncertainty.
    pair = ((f_name, forced), (n_name, native))
    at_steps = {k: streams.cheapest_at(c, steps, stream_len, measured_steps) for k, c in pair}
    short = {k: streams.cheapest_at(c, measured_steps, stream_len, measured_steps) for k, c in pair}
    long_win, short_win = min(at_steps, key=at_steps.get), min(short, key=short.get)
    if long_win != short_win:
        slow, fast = (forced, native) if long_win == f_name else (native, forced)
        point, early, late = streams.break_even_interval(slow, fast, priced[long_win]["sd_steady"],
                                                 priced[short_win]["sd_steady"], stream_len, measured_steps)
        out.update(break_even=point, break_even_low=early, break_even_high=late, break_even_of=long_win)
        reasons.append(f"over the measured {measured_steps}-step stream {short_win} is cheaper: {long_win} "
                       f"pays back its compile stalls after {_steps_words(point, early, late)}")
    return out


def _steps_words(point, early, late) -> str:
    """``419 steps [276-891]``, or "never within the uncertainty" where one end never pays back."""
    if point is None:
        return "no step count: never within 10,000,000 steps"
    low = f"{early:,}" if early is not None else "never"
    high = f"{late:,}" if late is not None else "never, within the uncertainty"
    return f"{point:,} steps [{low}-{high}]"


def _sentence(row: dict, forced, native, framework: str, steps: int) -> str:
    """The one sentence a team can act on, for one row."""
    if forced is None or native is None:
        only = native or forced
        return (f"Only {_name(only)} ranks here: no "
                f"{'forced-flash' if forced is None else 'native'} kernel to weigh it against.")
    f_name, n_name = forced["implementation"], native["implementation"]
    what = _reimplementation(f_name)
    tiled = f"; {n_name} is a tiled online softmax too" if _is_tiled(n_name) else ""
    caveat = (f" ({f_name} is this project's {framework} re-implementation of {what}, not the GPU "
              f"kernel{tiled})" if what else "")
    if row["answer"] == "-":
        verb = {FORCED: f"On paper {f_name} is faster", NATIVE: f"On paper {n_name} is faster",
                CANT_TELL: f"On paper {f_name} and {n_name} cannot be told apart"}.get(row["paper"], "")
        return (f"{verb} ({_ratio(row, 'paper_ratio')}); no length stream measured: no production "
                f"answer.{caveat}")
    ratio = _ratio(row)
    if row["answer"] == NATIVE:
        text = (f"Use native {n_name}: forced {f_name} costs {ratio} as much per useful token over "
                f"{steps:,} steps.")
    elif row["answer"] == FORCED:
        text = f"Force {f_name}: it costs {ratio} of native {n_name}'s per useful token over {steps:,} steps."
    else:
        text = (f"Can't tell: forced {f_name} costs {ratio} of native {n_name}'s over {steps:,} steps, from "
                f"{max(0.0, 1 - row['ratio_low']):.0%} less to {max(0.0, row['ratio_high'] - 1):.0%} more; "
                "decide on memory, fragility or a longer measurement.")
    return text + caveat


def _is_tiled(impl: str) -> bool:
    try:
        return bool(attention_impls.get(impl).is_flash)
    except KeyError:
        return False


def _row_notes(eligible, group, machine, framework, workload, breaks, visibility,
               compared) -> list[str]:
    """The reasons that are true of this row's kernels: release breaks seen on this row's framework,
    target and workload, by cause (``breaks_to_cite``: never the project's adapter); the compared
    kernels' profiler visibility, said once when both share it; what was not ranked."""
    notes = []
    names = [c["implementation"] for c in eligible]
    target = _release_target(machine)
    for impl in names:
        seen = [b for b in breaks if b["impl"] == impl and b["framework"] == framework
                and b["target"] == target and _same_workload(b["workload"], workload)]
        for cause in dict.fromkeys(b["cause"] for b in seen):
            releases = ", ".join(dict.fromkeys(f"{b['framework']} {b['release']}" for b in seen
                                               if b["cause"] == cause))
            notes.append(f"{impl} broke in {releases} ({cause})")
    known = {n: visibility[n] for n in compared if n in visibility}
    if len(known) == len(compared) == 2 and len(set(known.values())) == 1:
        seen_by = "visible" if next(iter(known.values())) else "invisible"
        notes.append(f"both are {seen_by} to their framework's profiler (results/observability): "
                     "it does not tell them apart")
    else:
        notes.extend(f"{n} is {'visible' if v else 'invisible'} to its framework's profiler"
                     for n, v in known.items())
    interpreted = [c["implementation"] for c in group if c.get("execution") == "interpret"]
    busy = [c["implementation"] for c in group if c["busy"]]
    if interpreted:
        notes.append("not ranked (interpreted): " + ", ".join(interpreted))
    if busy:
        notes.append("not ranked (contended): " + ", ".join(busy))
    return notes


def _release_target(machine: str) -> str | None:
    """The release matrix's target of a verdict machine: ``cpu`` for a CPU machine, the TPU target's
    own name, none for a GPU (the matrix compiles for no GPU)."""
    if machine.startswith("cpu"):
        return "cpu"
    return machine if machine.startswith("tpu") else None


def _same_workload(cell_workload: str, row_workload: str) -> bool:
    """Whether a release cell's workload (``causal-256``, ``mistral-7b-prefill-128``) is this row's kind:
    the B1 H8 D64 causal shape, or the same preset and phase."""
    cell = str(cell_workload)
    if row_workload.startswith(FORWARD):  # the matrix times the forward step only
        return row_workload == FORWARD and cell.startswith("causal")
    preset = row_workload.replace(" ", "-")
    return cell.startswith(preset)


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


# -- what the compilers say -----------------------------------------------------------------------
def compiled_verdicts(records, max_batch=None, *, fragility: list | None = None) -> pd.DataFrame:
    """Per compile target x mode x length with a max-batch search (else every grid length): which
    kernels compile and fit, the largest batch each fits, layout copies, and the roofline bound."""
    import pandas as pd

    breaks = fragility if isinstance(fragility, list) else []
    if records is None or records.empty:
        return pd.DataFrame(columns=COLUMNS)

    cases = _compiled_cases(records)
    batches = max_batch if max_batch is not None and not max_batch.empty else None
    if batches is not None:
        batches = batches.assign(  # older tables: the B1 H8 D64 shape's
            workload=batches["workload"].fillna(CUSTOM) if "workload" in batches else CUSTOM,
            phase=batches["phase"].fillna("prefill") if "phase" in batches else "prefill")
        wanted = set(zip(batches["target"], batches["workload"], batches["phase"], batches["mode"],
                         batches["seq_len"], strict=True))
        cases = cases[[k in wanted for k in zip(cases["target"], cases["workload"], cases["phase"],
                                                 cases["mode"], cases["length"], strict=True)]]
    rows = []
    keys = ["target", "workload", "phase", "mode", "length", "dtype"]
    for (target, name, phase, mode, seq, dtype), part in cases.groupby(keys, sort=True):
        real = part[(part["execution"] != "interpret") & (part["status"].isin(["ok", "does-not-fit"]))]
        if real.empty:
            continue
        reasons = []
        bound = real["model_roofline_seconds"].dropna()
        if len(bound):
            reasons.append(f"roofline bound {bound.min() * 1e3:.3g} ms at 100% of peak (a bound, not a rank)")
        refused = real[(real["status"] == "does-not-fit") | (real["fits"].astype(str) != "True")]
        for batch, impls in refused.groupby("batch", sort=True)["impl"]:  # a preset's own batch, else 1
            reasons.append(f"does not fit at batch {int(batch)}: " + ", ".join(impls))
        here = (
            batches[
                (batches["target"] == target)
                & (batches["workload"] == name)
                & (batches["phase"] == phase)
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
        reasons.extend(_compiled_visibility(real))
        workload = (f"{name} {phase}" if name != CUSTOM else
                    FORWARD + (" fwd+bwd" if mode == "fwd_bwd" else ""))
        for impl in real["impl"]:
            seen = [b for b in breaks
                    if b["impl"] == impl and b["target"] == target
                    and _same_workload(b["workload"], workload)]
            for cause in dict.fromkeys(b["cause"] for b in seen):
                releases = ", ".join(dict.fromkeys(f"{b['framework']} {b['release']}" for b in seen
                                                   if b["cause"] == cause))
                reasons.append(f"{impl} broke in {releases} ({cause}, compiled for {target})")
        rows.append(
            {
                "machine": target,
                "basis": "compiler only",
                "framework": "jax",
                "workload": workload,
                "seq_len": int(seq),
                "dtype": dtype,
                "answer": "-",
                "paper": "-",
                "flip": "-",
                "headroom_winner": headroom,
                "sentence": (f"On {target} the compiler fits the most tokens per chip with {headroom}; "
                             "nothing ran there, so which is cheaper also depends on speed, which only the "
                             "hardware measures." if headroom else
                             f"On {target} the compiler's word only: what compiles and fits, at batch 1."),
                "reasons": "; ".join(reasons),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def _compiled_cases(records) -> pd.DataFrame:
    """The compiled records a verdict row reads, with ``length`` (a decode's cache, else the
    sequence): the B1 H8 D64 grid's lengths (not a bisection's), and each preset's cases at its own
    batch. Older tables have no ``workload``: the B1 H8 D64 shape's."""
    import pandas as pd

    named = records["workload"].fillna(CUSTOM) if "workload" in records else CUSTOM
    records = records.assign(workload=named)
    phase = records["phase"] if "phase" in records else None
    records = records.assign(phase=phase.fillna("prefill") if phase is not None else "prefill")
    custom = records[(records["workload"] == CUSTOM) & (records["batch"] == 1)
                     & (records["seq_q"] == records["seq_k"])]
    custom = grid_lengths(custom)
    preset = records[records["workload"] != CUSTOM]
    both = pd.concat([custom, preset], ignore_index=True) if len(preset) else custom
    decode = both["phase"] == "decode"
    return both.assign(length=both["seq_k"].where(decode, both["seq_q"]).astype(int))


def _compiled_visibility(real) -> list[str]:
    """What a profiler on the target could name, read from the compiled program: a named custom call
    (the kernel as one op) or fused XLA ops (named by opcode); said once where every kernel agrees."""
    if "custom_calls" not in real:
        return []
    named, fused = [], []
    for r in real.to_dict("records"):
        calls = str(r.get("custom_calls") or "")
        if calls and calls not in ("none", "nan"):
            named.append(f"{r['impl']} ({calls})")
        elif calls == "none":
            fused.append(r["impl"])
    if not named and not fused:
        return []
    if not named or not fused:
        return ["from the compiled program, every kernel here is "
                + ("a named custom call" if named else "fused XLA ops a profiler names by opcode")]
    return [f"from the compiled program: named custom calls {', '.join(named)}; fused XLA ops, named by "
            f"opcode, {', '.join(fused)}"]


def _batch_words(row: dict) -> str:
    capped = str(row.get("capped")) == "True"  # the search's upper end fits: at least that
    return f"{row['impl']} {'>=' if capped else ''}{int(row['max_batch'])}"


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


def verdict_table(results_dir: str = "results", frame=None, *,
                  steps: int = streams.STREAM_STEPS) -> pd.DataFrame:
    """Every verdict row: the measured machines' first, then the compile targets'."""
    import pandas as pd

    if frame is None:
        frame = load_results(results_dir)
    fragility, visibility = release_breaks(results_dir), profiler_visibility(results_dir)
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
    return (table["basis"] == "measured") & table["ratio"].notna()


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


DISPLAY_COLUMNS = ["machine", "framework", "workload", "seq", "answer", "forced / native cost", "forced",
                   "native", "on paper", "flip", "break-even", "most headroom", "sentence", "reasons"]


def _bound(value: float) -> str:
    """An interval's end, with a third decimal where two would read as 1 and hide which side it is."""
    return f"{value:.3f}" if 0.995 <= value <= 1.005 and value != 1.0 else f"{value:.2f}"


def _ratio(r: dict, key: str = "ratio") -> str:
    """``1.19x [1.05-1.35]`` of ``r[key]`` and its interval (``ratio_low``/``_high``; the paper's
    ``paper_low``/``_high``)."""
    value = r.get(key)
    if value is None or value != value:
        return "-"
    side = key.removesuffix("_ratio")
    return f"{value:.2f}x [{_bound(r[f'{side}_low'])}-{_bound(r[f'{side}_high'])}]"


def display(table) -> pd.DataFrame:
    """The verdict as people read it: each ratio as ``1.19x [1.05-1.35]`` (the forced kernel's over
    the native one's), empty cells as ``-``."""
    import pandas as pd

    rows = []
    for r in table.to_dict("records"):
        paper = r.get("paper") or "-"
        if r.get("paper_ratio") == r.get("paper_ratio") and r.get("paper_ratio") is not None:
            paper = f"{paper}, {_ratio(r, 'paper_ratio')}"
        even = "-"
        if r.get("break_even_of") and r.get("break_even_of") == r.get("break_even_of"):
            low, high = (_cell(r.get(k)) for k in ("break_even_low", "break_even_high"))
            even = (f"{r['break_even_of']} after {_cell(r.get('break_even'))} "
                    f"[{low if low != '-' else 'never'}-{high if high != '-' else 'never'}] steps")
        rows.append({
            "machine": r["machine"], "framework": r["framework"], "workload": r["workload"],
            "seq": _cell(r["seq_len"]), "answer": _cell(r.get("answer")), "forced / native cost": _ratio(r),
            "forced": _cell(r.get("forced")), "native": _cell(r.get("native")), "on paper": paper,
            "flip": _cell(r.get("flip")), "break-even": even,
            "most headroom": _cell(r.get("headroom_winner")),
            "sentence": _cell(r.get("sentence")), "reasons": _cell(r["reasons"]),
        })
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


# -- the picture ----------------------------------------------------------------------------------
def plot_stream_cost(frame, *, steps: int = streams.STREAM_STEPS) -> bytes | None:
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
    scatter, floors = _stream_scatter(frame), _floors(frame)
    panels = []
    for (machine, framework), part in cases.groupby(["machine", "framework"], sort=True):
        seq = part["seq_len"].max()
        panels.append((machine, framework, int(seq), part[part["seq_len"] == seq]))
    fig, axes = new_figure(1, len(panels), width=4.6, height=3.6)
    colors = colors_by_name(cases["implementation"])
    grid = sorted({int(round(10 ** (k / 8))) for k in range(0, 41)} | {measured_steps, steps})
    for ax, (machine, framework, seq, part) in zip(axes[0], panels, strict=True):
        for case in part.to_dict("records"):
            costs = [streams.cheapest_at(case, m, seq, measured_steps) for m in grid]
            sd = streams.cheapest_way(case, steps, scatter, floors, seq, measured_steps)["sd"]
            width = math.exp(SCATTER_Z * sd)
            color = colors[case["implementation"]]
            cut = grid.index(measured_steps) + 1  # measured up to here; the model beyond it
            ax.plot(grid[:cut], costs[:cut], line_style(case["label"]), color=color, linewidth=1.8,
                    label=case["implementation"])
            ax.plot(grid[cut - 1:], costs[cut - 1:], line_style(case["label"]), color=color, linewidth=1.0,
                    alpha=0.5)
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
        ax.legend(fontsize=7, title="solid native, dashed forced;\nbold measured, faint modelled",
                  title_fontsize=7)
    return png_bytes(fig)


def verdict_part(table) -> dict | None:
    """The report's section ``## Verdict``: the headline rows (short columns), each row's reasons
    as a sentence, and the paper-only rows for later."""
    if table is None or table.empty:
        return None
    top = display(headline(table))
    rest = display(paper_only(table))
    shorter = display(other_lengths(table))
    short = [c for c in top.columns if c not in ("reasons", "sentence")]
    sentences = [
        f"**{r['machine']} {r['framework']} {r['workload']} {r['seq']}**: {r['sentence']} {r['reasons']}."
        for r in top.to_dict("records")
    ]
    return {
        "table": Table.of(top[short]),
        "sentences": sentences,
        "steps": f"{streams.STREAM_STEPS:,}",
        "paper_only": Table.of(rest) if not rest.empty else None,
        "other_lengths": Table.of(shorter) if not shorter.empty else None,
    }


def paper_only(table):
    """The measured rows with no length stream: a paper comparison only."""
    keep = (table["basis"] != "compiler only") & table["ratio"].isna()
    return table[keep].reset_index(drop=True)
