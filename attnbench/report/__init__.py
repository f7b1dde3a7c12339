"""The pandas report over everything asv wrote under ``results/``: reads, never writes there.

``write_report`` writes, each file atomically, ``report.md``, a self-contained ``report.html``, the
plots and the full tables into ``out_dir`` (default ``html/report/``: ``asv publish`` deletes
``html/``, so write the report after publishing; docs/reports.md). ``verdict`` decides, ``select``
picks the data, ``plots`` draws it, ``render`` writes Markdown and HTML; this module keeps their
public names, which the CLI and ``notebooks/cost_spikes.ipynb`` use.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attnbench.core.atomic import atomic_file, atomic_write_bytes, atomic_write_text
from attnbench.report import aside
from attnbench.report import horizon as horizons
from attnbench.report.compiled import load_compiled_records
from attnbench.report.forest import margin_of, plot_verdict_forest
from attnbench.report.plots import (
    plot_cost_by_length,
    plot_cost_over_commits,
    plot_memory,
    plot_regime_cost,
    plot_throughput,
    plot_trace,
)
from attnbench.report.predicted import predicted_part
from attnbench.report.production import plot_lengths, stream_noise, stream_table
from attnbench.report.published import published_part
from attnbench.report.render import (
    MAX_TABLE_ROWS,
    Table,
    context,
    render_html,
    render_markdown,
    spike_sentences,
    threshold_text,
)
from attnbench.report.select import (
    REGIMES,
    best_native_vs_forced,
    commits_table,
    coverage,
    newest_commit,
    newest_traces,
    regime_costs,
    series_name,
    short_env,
    trace_seq,
    workload_tables,
)
from attnbench.report.tuning import tuning_table
from attnbench.report.verdict import case_table, controls, profiler_visibility, verdict_table
from attnbench.report.verdict_display import plot_stream_cost, verdict_part
from attnbench.results import confirmations
from attnbench.results.asv_results import load, ordering_note
from attnbench.results.hosts import host_changes, hosts_table, run_hosts
from attnbench.results.noise import correction_shifts, run_factors
from attnbench.results.observability import load_observability
from attnbench.results.sensitivity import sensitivity
from attnbench.results.spikes import find_cost_spikes, find_trace_spikes, load_traces
from attnbench.results.steps import REGRESSION, all_series, find_steps, floors_of, noise_floor, to_confirm

# Imported where used: pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_OUT = os.path.join("html", "report")
OBSERVABILITY_COLUMNS = ["machine", "framework", "impl", "label", "execution", "profiler_visible", "profiler",
                         "attributed_to", "attributed_share", "reason"]
PLOTS = ("verdict_forest.png", "stream_cost.png", "stream_lengths.png", "throughput.png",
         "cost_by_length.png", "memory.png", "regime_cost.png", "cost_over_commits.png", "trace_dynamic.png")

__all__ = [
    "DEFAULT_OUT", "MAX_TABLE_ROWS", "PLOTS", "REGIMES", "Report", "best_native_vs_forced",
    "commits_table", "coverage", "newest_commit", "newest_traces", "plot_cost_over_commits", "plot_memory",
    "plot_regime_cost", "plot_throughput", "plot_trace", "regime_costs", "series_name", "short_env",
    "spike_sentences", "threshold_text", "trace_seq", "workload_tables", "write_report",
]


@dataclass
class Report:
    """What ``write_report`` wrote (paths) and the analysis tables it wrote them from."""

    out_dir: str
    markdown: str
    html: str
    tidy_csv: str
    tidy_parquet: str
    plots: dict[str, str]
    tables: dict[str, str]
    regressions: pd.DataFrame
    cost_spikes: pd.DataFrame
    trace_spikes: pd.DataFrame
    frame: pd.DataFrame = field(repr=False)
    steps: pd.DataFrame | None = field(default=None, repr=False)  # every step, with its verdict
    noise: pd.DataFrame | None = field(default=None, repr=False)  # steps.noise_floor
    ordering: str | None = None  # asv_results.ordering_note's sentence; starts "WARNING" if unordered
    verdict: pd.DataFrame | None = field(default=None, repr=False)  # report.verdict.verdict_table
    controls: pd.DataFrame | None = field(default=None, repr=False)  # report.verdict.controls
    cases: pd.DataFrame | None = field(default=None, repr=False)  # report.verdict.case_table

    @property
    def paths(self) -> list[str]:
        return [self.markdown, self.html, self.tidy_csv, self.tidy_parquet, *self.plots.values(),
                *self.tables.values()]


TIDY_ROWS_AT_ONCE = 8192  # rows of the tidy table made Arrow at a time for its Parquet file


def _write_tidy(frame, csv_path: str, parquet_path: str) -> None:
    """The tidy table as CSV and Parquet, each straight to its file and a slice of rows at a time: a
    whole history's table is ~100 MB as text, and as one Arrow table a copy of all of it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_file(csv_path, "w") as out:
        frame.to_csv(out, index=False)
    schema = pa.Schema.from_pandas(frame, preserve_index=False)  # the whole table's types, every slice
    with atomic_file(parquet_path) as out, pq.ParquetWriter(out, schema) as writer:
        for start in range(0, max(len(frame), 1), TIDY_ROWS_AT_ONCE):
            part = frame.iloc[start:start + TIDY_ROWS_AT_ONCE]
            writer.write_table(pa.Table.from_pandas(part, schema=schema, preserve_index=False))


def write_report(results_dir: str = "results", out_dir: str = DEFAULT_OUT, *, repo: str | None = None,
                 thresholds: dict | None = None, trace_factor: float = 2.0) -> Report:
    """Load ``results_dir`` (read only), analyse it and write the report into ``out_dir``.

    ``repo`` orders commits and says which code changed (default: the folder holding
    ``results_dir``); ``thresholds``: relative step per metric that counts as a regression (default
    5%). Raises ``asv_results.ResultsError`` when nothing loadable is there.
    """
    repo = repo or os.path.dirname(os.path.abspath(results_dir))
    side = aside.start(results_dir, out_dir)  # compiled-for and releases, drawn beside the analysis
    tidy = load(results_dir, repo=repo)  # the measured cells as rows; the empty ones counted
    frame = tidy.frame
    _, ordering = ordering_note(frame)
    traces = load_traces(results_dir)
    shifts = correction_shifts(frame)  # how whole runs moved: the timed metrics are judged against them
    factors = run_factors(shifts)
    hosts = run_hosts(frame)  # which host of each machine name ran each run
    changes = host_changes(frame, hosts)
    every = all_series(frame, factors)  # each series once: the noise floors and the steps are found in them
    floors = floors_of(every)  # no figure is judged against less noise than its kind has here
    confirmed = confirmations.load(results_dir)  # paired re-measurements of newest-run steps
    steps = find_steps(frame, thresholds, repo=repo, factors=factors, changes=changes, floors=floors,
                       confirmed=confirmed, series=every)
    regressions = steps[steps["verdict"] == REGRESSION].reset_index(drop=True) if not steps.empty else steps
    spikes = find_cost_spikes(frame, thresholds, repo=repo, factors=factors, changes=changes, floors=floors,
                              confirmed=confirmed)
    noise = noise_floor(frame, thresholds, floors=floors)
    detectable = sensitivity(frame, floors, thresholds, confirmed)
    awaiting = {machine: to_confirm(frame, steps, machine, repo, confirmed)
                for machine in sorted(frame["machine"].unique())}
    host_table = hosts_table(frame, changes, hosts)
    trace_spikes = find_trace_spikes(traces, factor=trace_factor)
    best = best_native_vs_forced(frame)
    costs = regime_costs(frame)
    cases = case_table(frame)  # the newest run's kernel cases: the verdict, controls, notes and picture
    records = load_compiled_records(results_dir)  # every compiled-for record: the verdict and three sections
    cost_noise = stream_noise(frame)  # what one run's stream cost is uncertain by: verdict and picture
    verdict = verdict_table(results_dir, frame, cases=cases, records=records, noise=cost_noise)
    control = controls(frame, cases=cases)
    production = stream_table(frame)

    os.makedirs(out_dir, exist_ok=True)
    paths = {name: os.path.join(out_dir, name) for name in ("report.md", "report.html", "tidy.csv",
                                                             "tidy.parquet")}
    makers = {"verdict_forest.png": lambda: plot_verdict_forest(verdict, margin=margin_of(cases),
                                                                horizon=str(horizons.parse(None))),
              "stream_cost.png": lambda: plot_stream_cost(frame, cases=cases, noise=cost_noise),
              "stream_lengths.png": lambda: plot_lengths(frame),
              "throughput.png": lambda: plot_throughput(frame),
              "cost_by_length.png": lambda: plot_cost_by_length(frame),
              "memory.png": lambda: plot_memory(frame),
              "regime_cost.png": lambda: plot_regime_cost(costs),
              "cost_over_commits.png": lambda: plot_cost_over_commits(frame, spikes),
              "trace_dynamic.png": lambda: plot_trace(traces, frame, trace_factor)}
    plots, pngs = {}, {}
    for name in PLOTS:
        png = makers[name]()
        if png is not None:
            plots[name] = os.path.join(out_dir, name)
            pngs[name] = png
            atomic_write_bytes(plots[name], png)

    _write_tidy(frame, paths["tidy.csv"], paths["tidy.parquet"])
    tables = {}
    for name, table in (("verdict.csv", verdict), ("controls.csv", control), ("regressions.csv", regressions),
                        ("steps.csv", steps),
                        ("noise_floor.csv", noise), ("sensitivity.csv", detectable),
                        ("run_shifts.csv", shifts), ("host_changes.csv", changes),
                        ("cost_spikes.csv", spikes), ("streams.csv", production),
                        ("trace_spikes.csv", trace_spikes), ("unmeasured.csv", tidy.unmeasured)):
        tables[name] = os.path.join(out_dir, name)
        atomic_write_text(tables[name], table.to_csv(index=False))

    ctx = context(frame, results_dir, regressions, spikes, traces, trace_spikes, best, costs, pngs,
                  thresholds, trace_factor, steps=steps, noise=noise, shifts=shifts, ordering=ordering,
                  hosts=host_table, changes=changes, unmeasured=tidy.unmeasured)
    # "Compiled for, not measured" (report/compiled.py): the compile-for records, when there are any.

    ctx["verdict"] = verdict_part(verdict, visibility=profiler_visibility(results_dir), frame=frame,
                                  controls=control, cases=cases)
    ctx["sensitivity"] = Table.of(detectable) if not detectable.empty else None
    ctx["production"] = Table.of(production) if not production.empty else None
    tiles = tuning_table(results_dir)
    ctx["tuning"] = Table.of(tiles) if not tiles.empty else None
    tables["tuning.csv"] = os.path.join(out_dir, "tuning.csv")
    atomic_write_text(tables["tuning.csv"], tiles.to_csv(index=False))
    ctx["awaiting"] = [f"{machine}: {len(cases)} case(s) "
                       f"({', '.join(sorted({c['implementation'] for c in cases}))})"
                       for machine, cases in awaiting.items() if cases]

    seen = load_observability(results_dir)
    ctx["observability"] = Table.of(seen[OBSERVABILITY_COLUMNS]) if not seen.empty else None
    ctx["workloads"] = [{"name": name, "table": Table.of(table)}
                        for name, table in workload_tables(frame).items()]
    sections = side.result()
    ctx["compiled_for"] = sections["compiled_for"]
    if ctx["compiled_for"]:
        plots.update(ctx["compiled_for"]["plots"])
        ctx["images"].update({name: base64.b64encode(png).decode("ascii")
                              for name, png in ctx["compiled_for"]["images"].items()})

    ctx["published"] = published_part(results_dir, records)  # "On the chip, published", when the table exists
    if ctx["published"]:
        tables["published_on_chip.csv"] = os.path.join(out_dir, "published_on_chip.csv")
        chips = ctx["published"]["on_chip_frame"]
        atomic_write_text(tables["published_on_chip.csv"], chips.to_csv(index=False))

    # "Predicted speed on the chips", when a calibration table exists
    ctx["predicted"] = predicted_part(results_dir, cases, records)

    ctx["releases"] = sections["releases"]  # "Fragility across releases", when measured
    if ctx["releases"]:
        plots.update(ctx["releases"]["plots"])
        ctx["images"].update({name: base64.b64encode(png).decode("ascii")
                              for name, png in ctx["releases"]["images"].items()})
    atomic_write_text(paths["report.md"], render_markdown(ctx))
    atomic_write_text(paths["report.html"], render_html(ctx, "attnbench report"))
    return Report(out_dir=out_dir, markdown=paths["report.md"], html=paths["report.html"],
                  tidy_csv=paths["tidy.csv"], tidy_parquet=paths["tidy.parquet"], plots=plots, tables=tables,
                  regressions=regressions, cost_spikes=spikes, trace_spikes=trace_spikes, frame=frame,
                  steps=steps, noise=noise, ordering=ordering, verdict=verdict,
                  controls=control, cases=cases)
