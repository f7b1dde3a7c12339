"""How the verdict is shown: the short table (one row per comparison: the answer, the ratio with its
interval, the two kernels), the full one (paper, flip, break-even, sentence, reasons), the notes every
row shares said once, the A/A controls, and the picture of cost against the stream's length.

The README's and ``attnbench summary``'s verdict is the short table and the notes; the report adds
the full table and each row's sentence (``verdict_part``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attention_impls
from attnbench.report import horizon as horizons
from attnbench.report import streams
from attnbench.report.plots import colors_by_name, line_style, new_figure, png_bytes
from attnbench.report.production import stream_noise, traffic_name
from attnbench.report.render import Table
from attnbench.report.verdict import (
    CANT_TELL,
    EQUAL,
    FORCED,
    NATIVE,
    _rankable,
    case_table,
    headline,
    other_lengths,
    paper_only,
    ratio_text,
    stream_steps,
)
from attnbench.results.noise import SCATTER_Z

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

# "answer" and its cost are at the horizon (report/horizon.py); cold start over the measured stream,
# serving with every compile amortised, and the horizon from which the answer holds beside them.
SHORT_COLUMNS = ["machine", "framework", "workload", "seq", "answer", "forced / native cost", "cold start",
                 "serving", "holds", "forced", "native", "training memory", "tuning"]
# The terminal's short table (``attnbench summary``, ``make bench``'s last lines): the answer and its
# kernels in at most 120 columns; production and tuning are in ``attnbench verdict`` and ``--full``.
TERMINAL_COLUMNS = ["machine", "framework", "workload", "seq", "answer", "forced/native cost", "forced",
                    "native"]
TARGET_COLUMNS = ["target", "workload", "seq", "most headroom", "predicted forced / native"]
# The compile targets at the published shapes (report/published.py): the fastest published figure.
PUBLISHED_COLUMNS = ["target", "shape", "published on this chip (fastest first; not measured here)", "source",
                     "predicted forced / native"]
DISPLAY_COLUMNS = ["machine", "framework", "workload", "seq", "answer", "forced / native cost", "horizon",
                   "cold start", "serving", "holds", "production", "forced", "native", "training memory",
                   "cold-start s",
                   "on paper", "flip", "break-even", "most headroom", "published",
                   "forced config", "native config", "on paper at defaults", "tuning", "sentence", "reasons"]


def cell(value) -> str:
    if value is None or (isinstance(value, float) and value != value) or value == "":
        return "-"
    return str(int(value)) if isinstance(value, float) else str(value)


def answer_text(r: dict) -> str:
    """``equal (±10%)`` for an equal answer, the state itself otherwise."""
    answer = cell(r.get("answer"))
    return f"{answer} (±{_margin(r):.0%})" if answer == EQUAL else answer


def _margin(r: dict) -> float:
    sentence = str(r.get("sentence") or "")
    for token in sentence.split("±")[1:2]:  # the row's own margin, as its sentence states it
        try:
            return float(token.split("%")[0]) / 100
        except ValueError:
            pass
    return 0.10


def _kernel(name) -> str:
    """A kernel's name without its label (the column says which side it is)."""
    return cell(name).split(" (")[0]


def display(table) -> pd.DataFrame:
    """The verdict as people read it, every column: ratios as ``1.19x [1.05-1.35]`` (the forced
    kernel's over the native one's), empty cells as ``-``."""
    import pandas as pd

    rows = []
    for r in table.to_dict("records"):
        paper = cell(r.get("paper"))
        if r.get("paper_ratio") == r.get("paper_ratio") and r.get("paper_ratio") is not None:
            paper = f"{paper}, {ratio_text(r['paper_ratio'], r.get('paper_low'), r.get('paper_high'))}"
        even = "-"
        if r.get("break_even_of") and r.get("break_even_of") == r.get("break_even_of"):
            low, high = (cell(r.get(k)) for k in ("break_even_low", "break_even_high"))
            even = (f"{r['break_even_of']} after {cell(r.get('break_even'))} "
                    f"[{low if low != '-' else 'never'}-{high if high != '-' else 'never'}] steps")
        rows.append({
            "machine": r["machine"], "framework": r["framework"], "workload": r["workload"],
            "seq": cell(r["seq_len"]), "answer": answer_text(r),
            "forced / native cost": ratio_text(r.get("ratio"), r.get("ratio_low"), r.get("ratio_high")),
            "horizon": cell(r.get("horizon")), "cold start": side_text(r, "cold_start"),
            "serving": side_text(r, "serving"), "holds": cell(r.get("holds")),
            "production": production_short(r), "cold-start s": cold_start_text(r),
            "forced": cell(r.get("forced")), "native": cell(r.get("native")),
            "training memory": train_memory_text(r), "on paper": paper,
            "flip": cell(r.get("flip")), "break-even": even, "most headroom": cell(r.get("headroom_winner")),
            "published": cell(r.get("published")),
            "forced config": cell(r.get("forced_config")), "native config": cell(r.get("native_config")),
            "on paper at defaults": _at_defaults(r), "tuning": cell(r.get("tuning")),
            "sentence": cell(r.get("sentence")), "reasons": cell(r["reasons"]),
        })
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


def side_text(r: dict, side: str) -> str:
    """``forced 0.32x``: a row's answer and forced / native cost over its cold start or serving."""
    answer, ratio = cell(r.get(side)), r.get(f"{side}_ratio")
    if answer == "-" or ratio is None or ratio != ratio:
        return answer
    return f"{answer} {ratio:.2f}x"


TRAIN_MEMORY_WORDS = {"compiler_temp_bytes": "compiled temporaries",
                      "saved_for_backward_bytes": "saved for backward"}


def train_memory_text(r: dict) -> str:
    """``16.1 / 4.0 MiB saved for backward``: a training row's memory, forced / native, and how its
    framework measures it (report/verdict.py's ``TRAIN_MEMORY``); ``-`` on other rows."""
    source = r.get("train_memory_source")
    if not isinstance(source, str):
        return "-"
    values = [r.get(f"{side}_train_bytes") for side in ("forced", "native")]
    shown = ["?" if v is None or v != v else f"{v / 2**20:,.1f}" for v in values]
    return f"{shown[0]} / {shown[1]} MiB {TRAIN_MEMORY_WORDS.get(source, source)}"


def cold_start_text(r: dict) -> str:
    """``0.30 / 0.12``: each kernel's compile seconds over the horizon (forced / native)."""
    values = [r.get(f"{side}_cold_start_s") for side in ("forced", "native")]
    if any(v is None or v != v for v in values):
        return "-"
    return " / ".join(f"{v:.2f}" if v < 100 else f"{v:,.0f}" for v in values)


def production_short(r: dict) -> str:
    """``measured, 200 steps, code trace`` or ``modelled beyond 64 of 200 steps``: what the production
    cost rests on, short (the row's ``production`` says it whole)."""
    steps = r.get("production_steps")
    if steps is None or steps != steps:
        return "-"
    least = r.get("production_measured")
    if least is not None and least == least:
        return f"modelled beyond {int(least):,} of {int(steps):,} steps"
    source = str(r.get("production_source") or "").removeprefix("the ")
    return f"measured, {int(steps):,} steps, {source}"


def _at_defaults(r: dict) -> str:
    answer = cell(r.get("paper_at_defaults"))
    ratio = r.get("paper_at_defaults_ratio")
    if ratio is None or ratio != ratio:
        return answer
    return f"{answer}, {ratio_text(ratio, r.get('paper_at_defaults_low'), r.get('paper_at_defaults_high'))}"


def compact_config(words: str) -> str:
    """``tuned block_q=256,block_k=256`` -> ``256x256``: the tile in the short table (its knobs are
    named once, in the notes); "" for a kernel at its defaults."""
    if not isinstance(words, str) or not words.startswith("tuned "):
        return ""
    return "x".join(part.split("=")[1] for part in words.removeprefix("tuned ").split(","))


def tuning_short(r: dict) -> str:
    """The short table's tuning cell: where tuning moved a config, the paper answer at the kernels'
    defaults against the tuned one (``flipped`` when both are decided and differ); else whether the
    defaults were kept or nothing was tuned."""
    tuning = cell(r.get("tuning"))
    if not tuning.startswith("tuned"):
        return tuning
    tuned, defaults = cell(r.get("paper")), cell(r.get("paper_at_defaults"))
    if tuned == defaults:
        return f"on paper {tuned}, at defaults too"
    flip = "flipped: " if "changed the paper answer" in tuning else ""
    return f"{flip}on paper {defaults} at defaults, {tuned} tuned"


def short(table) -> pd.DataFrame:
    """One short row per measured comparison: the answer, the ratio with its interval, the two kernels
    (with their tuned tiles where tuning moved them) and what tuning changed."""
    import pandas as pd

    measured = table[table["basis"] == "measured"] if not table.empty else table
    if measured.empty:
        return pd.DataFrame(columns=SHORT_COLUMNS)
    full = display(measured)
    rows = measured.to_dict("records")

    def named(side: str) -> list[str]:
        out = []
        for kernel, r in zip(full[side], rows, strict=True):
            tile = compact_config(r.get(f"{side}_config"))
            out.append(f"{_kernel(kernel)} {tile}" if tile else _kernel(kernel))
        return out

    full = full.assign(forced=named("forced"), native=named("native"), tuning=[tuning_short(r) for r in rows])
    return pd.DataFrame(full[SHORT_COLUMNS])


def terminal(short_table) -> tuple[list[dict], list[str], str | None]:
    """``short``'s rows for a terminal: ``TERMINAL_COLUMNS``, each kernel without its framework's
    prefix (the framework column says it: ``torch-xla-blockwise-flash`` reads ``blockwise-flash``), an
    equal answer as ``equal ±10%``, and, where every row is one machine's, that machine named once (the
    third value) instead of a column; ``(rows, columns, machine or None)``."""
    named = {"forced/native cost": "forced / native cost"}  # the short table's name, two spaces narrower
    rows = [{c: cell(r.get(named.get(c, c))) for c in TERMINAL_COLUMNS}
            for r in short_table.to_dict("records")]
    machines = {r["machine"] for r in rows}
    columns = list(TERMINAL_COLUMNS)
    machine = machines.pop() if len(machines) == 1 else None
    if machine is not None:
        columns.remove("machine")
    for r in rows:
        prefix = str(r["framework"]).replace("_", "-") + "-"
        for side in ("forced", "native"):
            r[side] = r[side].removeprefix(prefix)
        if r["answer"].startswith(f"{EQUAL} (±"):  # "equal ±10%": two columns narrower
            r["answer"] = r["answer"].replace(" (±", " ±").removesuffix(")")
    return rows, columns, machine


def targets(table) -> pd.DataFrame:
    """One short row per compile target and workload: the kernel that fits the most tokens per chip."""
    import pandas as pd

    rows = [{"target": r["machine"], "workload": r["workload"], "seq": cell(r["seq_len"]),
             "most headroom": cell(r.get("headroom_winner")), "predicted forced / native": predicted_cell(r)}
            for r in table.to_dict("records") if r["basis"] == "compiler only"]
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)


def published_targets(table) -> pd.DataFrame:
    """One row per compile target and published shape (basis ``compiler + published``): the chip's
    published figures, fastest first, and their source; ``none`` where the chip has none."""
    import pandas as pd

    rows = [{"target": r["machine"], "shape": f"{r['workload']} S{cell(r['seq_len'])}",
             PUBLISHED_COLUMNS[2]: cell(r.get("published")) if cell(r.get("published")) != "-" else
             "none for this chip", "source": cell(r.get("published_source")),
             "predicted forced / native": predicted_cell(r)}
            for r in table.to_dict("records") if r["basis"] == "compiler + published"]
    return pd.DataFrame(rows, columns=PUBLISHED_COLUMNS)


def predicted_cell(row: dict) -> str:
    """``0.42 (0.30-0.61) forced, predicted`` or ``-``: the time model's ratio, never called measured."""
    ratio = row.get("predicted_ratio")
    if ratio is None or ratio != ratio:
        return "-"
    extrapolated = str(row.get("predicted_extrapolated")) == "True"
    return (f"{ratio:.2f} ({row['predicted_ratio_low']:.2f}-{row['predicted_ratio_high']:.2f}) "
            f"{row['predicted']}, predicted" + (", extrapolated" if extrapolated else ""))


def counts(table) -> str:
    """``14 of 17 measured rows decided, 2 equal within ±10%, 1 can't tell``."""
    measured = table[(table["basis"] == "measured") & table["ratio"].notna()] if not table.empty else table
    if measured.empty:
        return "no measured row with a production answer"
    states = {k: int(v) for k, v in measured["answer"].value_counts().items()}
    forced, native = states.get(FORCED, 0), states.get(NATIVE, 0)
    return (f"{len(measured)} measured rows: {forced + native} decided ({forced} forced, {native} native), "
            f"{states.get(EQUAL, 0)} equal within the margin, {states.get(CANT_TELL, 0)} can't tell")


def notes(table, visibility: dict | None = None, frame=None, cases=None) -> list[str]:
    """What the rows share, said once: which forced kernels are this project's re-implementations,
    which native ones are tiled online softmaxes too, what a profiler sees, what was not ranked
    (from ``frame``'s cases: ``cases``, where ``case_table(frame)`` is already made)."""
    shown = table[table["basis"] == "measured"] if not table.empty else table
    forced = sorted({_kernel(k) for k in shown.get("forced", []) if isinstance(k, str)})
    native = sorted({_kernel(k) for k in shown.get("native", []) if isinstance(k, str)})
    out = []
    redone = [(k, _declared(k, "reimplements"), _declared(k, "framework")) for k in forced]
    redone = [(k, what, framework) for k, what, framework in redone if what]
    if redone:
        out.append("Re-implementations, not the GPU kernels: " + "; ".join(
            f"{k} is this project's {framework} re-implementation of {what}" for k, what, framework in redone)
            + ".")
    tuned = [(k, w) for side in ("forced", "native")
             for k, w in zip(shown.get(side, []), shown.get(f"{side}_config", []), strict=False)
             if compact_config(w)]
    if tuned:
        def knobs(words: str) -> str:
            return " x ".join(part.split("=")[0] for part in words.removeprefix("tuned ").split(","))

        named = sorted({f"{_kernel(k)}: {knobs(w)}" for k, w in tuned})
        out.append("A tile beside a kernel's name is the config `make tune` kept for it here "
                   f"(docs/tuning.md; {'; '.join(named)}); `tuning` compares the paper answer (the static "
                   "steps) tuned and with both kernels at their defaults, timed beside them in the same "
                   "rounds.")
    tiled = [k for k in native if _declared(k, "is_flash")]
    if tiled:
        out.append(f"Tiled online softmaxes among the native kernels: {', '.join(tiled)}: where one wins, a "
                   "tiled kernel native to the backend beat a forced one.")
    if visibility:
        compared = forced + native
        unseen = [k for k in compared if visibility.get(k) is False]
        seen = [k for k in compared if visibility.get(k) is True]
        if unseen or seen:
            out.append("Profiler visibility (results/observability): "
                       + "; ".join(p for p in (f"invisible to their framework's profiler: {', '.join(unseen)}"
                                               if unseen else "",
                                               f"visible: {', '.join(seen)}" if seen else "") if p) + ".")
    if frame is not None or cases is not None:
        cases = case_table(frame) if cases is None else cases
        if not cases.empty:
            interpreted = sorted(set(cases[cases["execution"] == "interpret"]["implementation"]))
            if interpreted:
                out.append("Not ranked anywhere, as they run in an interpreter here: "
                           f"{', '.join(interpreted)}.")
    return out


def _declared(impl: str, name: str):
    try:
        return getattr(attention_impls.get(impl), name, None)
    except KeyError:
        return None


def control_lines(table) -> list[str]:
    """Each A/A control on one line: the kernel against itself, the ratio, the answer."""
    return [f"A/A control, {r['machine']} {r['kernel']} at {r['seq_len']}: "
            f"{ratio_text(r['ratio'], r['ratio_low'], r['ratio_high'])} over {r['rounds']} rounds, "
            + (f"equal within ±{r['margin']:.0%}" if r["answer"] == EQUAL else r["answer"])
            for r in table.to_dict("records")]


def verdict_part(table, *, visibility: dict | None = None, frame=None, controls=None,
                 cases=None) -> dict | None:
    """The report's section ``## Verdict``: the short table, each row's sentence and reasons, the notes
    said once, the A/A controls, the full table, and the paper-only rows for later."""
    if table is None or table.empty:
        return None
    top = display(headline(table))
    rest = display(paper_only(table))
    shorter = display(other_lengths(table))
    sentences = [
        f"**{r['machine']} {r['framework']} {r['workload']} {r['seq']}**: {r['sentence']}"
        + (f" {r['reasons']}." if r["reasons"] != "-" else "")
        for r in top.to_dict("records") if r["sentence"] != "-"
    ]
    return {
        "table": Table.of(short(headline(table))),
        "targets": Table.of(targets(headline(table))) if not targets(headline(table)).empty else None,
        "counts": counts(table),
        "notes": notes(table, visibility, frame, cases)
        + (control_lines(controls) if controls is not None else []),
        "sentences": sentences,
        "full": Table.of(top[[c for c in top.columns if c not in ("reasons", "sentence")]]),
        "horizon": str(horizons.parse(None)),
        "paper_only": Table.of(rest) if not rest.empty else None,
        "other_lengths": Table.of(shorter) if not shorter.empty else None,
    }


# -- the picture ----------------------------------------------------------------------------------
def plot_stream_cost(frame, *, steps: int | None = None, cases=None, noise=None) -> bytes | None:
    """USD per million useful tokens against the steps served, per framework, at each measured
    machine's longest length stream: each kernel its cheapest way. **Measured**: bold, a point at the
    end of each trace window, the stream's cost so far (its own seconds and useful tokens, stalls
    included), with the uncertainty of what one run measures once as a band. **Modelled**: faint,
    beyond the measured steps (``streams.price_stream``), dotted at the verdict's stream where a longer
    one is asked for. Where two lines cross, the cheaper kernel changes. ``cases``:
    ``case_table(frame)`` already made; ``noise``: ``production.stream_noise(frame)`` already made."""
    cases = case_table(frame) if cases is None else cases
    if cases.empty:
        return None
    cases = cases[cases["dynamic:usd_per_million_useful_tokens_with_compiles"].notna() & _rankable(cases)]
    if cases.empty:
        return None
    measured = stream_steps(frame)
    steps = steps or measured
    scatter, floors = stream_noise(frame) if noise is None else noise
    panels = []
    for (machine, framework), part in cases.groupby(["machine", "framework"], sort=True):
        seq = part["seq_len"].max()
        panels.append((machine, framework, int(seq), part[part["seq_len"] == seq]))
    fig, axes = new_figure(1, len(panels), width=4.6, height=3.6)
    colors = colors_by_name(cases["implementation"])
    beyond = sorted({int(round(measured * 10 ** (k / 8))) for k in range(0, 17)} | {steps})
    for ax, (machine, framework, seq, part) in zip(axes[0], panels, strict=True):
        sources = set()
        for case in part.to_dict("records"):
            option = streams.cheapest_way(case, steps, scatter, floors, seq, measured)
            color, style = colors[case["implementation"]], line_style(case["label"])
            sources.add(case.get(f"{option['regime']}:traffic"))
            ran, so_far = window_costs(case, option["regime"], measured)
            if ran:
                width = math.exp(SCATTER_Z * math.hypot(option["sd_once"], _step_sd(case)))
                ax.plot(ran, so_far, style, marker="o", markersize=3, color=color, linewidth=1.8,
                        label=case["implementation"])
                ax.fill_between(ran, [c / width for c in so_far], [c * width for c in so_far], color=color,
                                alpha=0.12, linewidth=0)
            start = [m for m in beyond if m >= (ran[-1] if ran else measured)]
            modelled = [streams.cheapest_at(case, m, seq, measured) for m in start]
            ax.plot(start, modelled, style, color=color, linewidth=1.0, alpha=0.45,
                    label=None if ran else case["implementation"])
        ax.axvline(measured, color="grey", linewidth=0.8, linestyle=":")
        if steps != measured:
            ax.axvline(steps, color="black", linewidth=0.8, linestyle=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        source = ", ".join(sorted(traffic_name(s) for s in sources))
        ax.set_xlabel(f"steps served ({source}); measured up to the dotted line, {measured:,} steps"
                      + (f", verdict at {steps:,}" if steps != measured else ""), fontsize=7)
        ax.set_ylabel("USD per million useful tokens")
        ax.set_title(f"{machine} {framework}, lengths up to {seq}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, title="solid native, dashed forced;\nbold: measured (a point per trace\n"
                  "window); faint: modelled", title_fontsize=7)
    return png_bytes(fig)


def window_costs(case: dict, regime: str, measured_steps: int = 0) -> tuple[list[int], list[float]]:
    """The measured stream's cost so far at the end of each trace window: (steps served, USD per
    million useful tokens), from the case's per-window seconds and useful tokens at its price per
    second (its steady step's USD over its seconds); empty where they were not recorded. A packed
    stream's steps served count the steps of the stream it packed (``measured_steps``: the suite's)."""
    seconds, tokens = case.get(f"{regime}:window_seconds"), case.get(f"{regime}:window_tokens")
    usd, step_s = case.get("static:usd_per_step"), case.get("step_s")
    ran, planned = case.get(f"{regime}:steps"), case.get(f"{regime}:planned")
    windows = case.get(f"{regime}:windows")
    if (not isinstance(seconds, list) or not isinstance(tokens, list) or not seconds or not usd or usd != usd
            or not step_s or not ran or ran != ran):
        return [], []
    per_second = usd / step_s
    per = streams.packed_per_step(case, regime, measured_steps)
    planned = int(planned) if planned and planned == planned else int(ran)
    count = int(windows) if windows and windows == windows else len(seconds)
    per_window = -(-planned // count)
    steps_so_far, costs, spent, served = [], [], 0.0, 0
    for i, (s, t) in enumerate(zip(seconds, tokens, strict=False)):
        spent, served = spent + s, served + t
        steps_so_far.append(round(min(int(ran), (i + 1) * per_window) / per))
        costs.append(spent * per_second * 1e6 / served if served else float("nan"))
    return steps_so_far, costs


def _step_sd(case: dict) -> float:
    """A step's own relative uncertainty from its interval over the rounds (as a normal SD)."""
    return math.log(case["step_hi"] / case["step_lo"]) / (2 * SCATTER_Z) if case["step_lo"] > 0 else 0.0
