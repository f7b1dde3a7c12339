"""The report as Markdown and as one self-contained HTML page, from one Jinja2 template.

``templates/report.j2`` holds the content once; ``markdown.j2`` and ``html.j2`` say how each block is
written in each format. The HTML embeds every plot as a ``data:`` URI and references nothing outside
itself. Also here: the sentences the CLI prints (``spike_sentences``, ``threshold_text``).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import attnbench.report.select as select
from attnbench.core import metrics
from attnbench.report.select import series_name, short_env
from attnbench.results.judge import ALERT_Z
from attnbench.results.noise import is_contended, is_kept
from attnbench.results.steps import DEFAULT_THRESHOLD, REGRESSION, UNCONFIRMED, WITHIN_NOISE
from attnbench.results.table import cell

# Imported where used: jinja2, markupsafe, pandas (the torch_xla venv has no report libraries).

if TYPE_CHECKING:
    import pandas as pd

MAX_TABLE_ROWS = 40  # longer tables are cut in report.md/html; the CSVs hold every row
TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


@dataclass
class Table:
    """A table of the report: at most ``MAX_TABLE_ROWS`` of its ``total`` rows, every cell a string."""

    cells: pd.DataFrame
    total: int

    @classmethod
    def of(cls, frame, columns: list[str] | None = None, total: int | None = None) -> Table:
        import pandas as pd

        if frame is None:
            frame = pd.DataFrame()
        elif not isinstance(frame, pd.DataFrame):  # rows as dicts
            frame = pd.DataFrame(list(frame))
        if columns is not None and not frame.empty:
            frame = frame[columns]
        cut = frame.head(MAX_TABLE_ROWS)
        cells = cut.astype(object).map(cell) if not cut.empty else cut
        return cls(cells=cells, total=len(frame) if total is None else total)

    @property
    def note(self) -> str | None:
        if self.total > len(self.cells):
            return (f"({len(self.cells)} of {self.total} rows shown; every row is in the CSV beside this "
                    "report.)")
        return None

    def markdown(self) -> str:
        if self.cells.empty:
            return "_(none)_"
        cells = self.cells.map(lambda text: text.replace("|", "\\|"))
        return cells.to_markdown(index=False, disable_numparse=True)

    def html(self):
        from markupsafe import Markup

        if self.cells.empty:
            return Markup("<p><em>(none)</em></p>")
        return Markup(self.cells.to_html(index=False, border=0, escape=True))


def threshold_text(thresholds: dict | None) -> str:

    thresholds = thresholds or {}
    common = Counter(thresholds.values()).most_common(1)
    default = common[0][0] if common and len(thresholds) > 1 else DEFAULT_THRESHOLD
    others = ", ".join(f"{k} {v:.3g}" for k, v in sorted(thresholds.items()) if v != default)
    return f"{default:.3g} (relative step) for every metric" + (f" but {others}" if others else "")


def percent(value) -> str:
    """A relative figure as a percentage, ``-`` where missing."""
    if value is None or value != value:
        return "-"
    return f"{value:.1%}"


def regression_rows(table, *, attribution: bool, verdict: bool = False) -> list[dict]:
    """Regressions (or cost spikes, with what moved with them; or steps, with their verdict) as
    display rows. ``noise``: the two levels' combined uncertainty relative to the level before."""
    rows = []
    for _, r in table.iterrows():
        row = {"machine": r["machine"], "env": short_env(r["env_name"]),
               "benchmark": r["benchmark"].removeprefix("attention."), "case": series_name(r),
               "commits": f"{str(r['commit_before'])[:8]} -> {str(r['commit_after'])[:8]}",
               "before": cell(r["value_before"]), "after": cell(r["value_after"]),
               "change": f"{r['relative_change']:+.1%}"}
        if "noise_relative" in r:
            row["noise"] = _noise_cell(r)
        if verdict or r.get("verdict") == REGRESSION:
            row["verdict" if verdict else "judged"] = r["verdict"] if verdict else r.get("judged", "noise")
            row["why"] = r["why"] or "-"
        row["versions changed"] = r["versions_changed"] or "-"
        if attribution:
            row["moved with"] = r["attribution"]
        rows.append(row)
    return rows


def _noise_cell(step) -> str:
    """A step's combined uncertainty: relative to the level before, absolute where that is 0."""
    if step.get("noise_source") == "unknown" or step["uncertainty"] != step["uncertainty"]:
        return "unknown"
    if step["noise_relative"] == step["noise_relative"]:
        return "±" + percent(step["noise_relative"])
    return "±" + cell(step["uncertainty"])


def noise_rows(noise) -> list[dict]:
    """``steps.noise_floor`` as display rows."""
    rows = []
    for _, r in noise.iterrows():
        rows.append({"machine": r["machine"], "timing figures": r["figures"],
                     "contended (left out)": r["contended"], "with intervals": r["with_intervals"],
                     "median interval half-width (99%)": percent(r["interval_half_width"]),
                     "noise floor (one figure's SD)": percent(r["noise_floor"]),
                     "alert band (one figure)": "±" + percent(r["alert_band"]), "from": r["measured_by"],
                     "smallest detectable step": percent(r["smallest_detectable_step"])})
    return rows


def noise_sentences(noise) -> list[str]:
    """One sentence per machine: the noise floor it measured and the smallest change it can detect."""
    out = []
    for _, r in noise.iterrows():
        if r["noise_floor"] != r["noise_floor"]:
            out.append(f"{r['machine']}: noise floor unknown ({r['measured_by']}); steps are judged on the "
                       f"threshold ({percent(r['threshold'])}) alone.")
            continue
        out.append(f"{r['machine']}: noise floor {percent(r['noise_floor'])} (one static figure's SD from "
                   f"run to run, {r['measured_by']}), so the smallest change it can detect is "
                   f"{percent(r['smallest_detectable_step'])}"
                   + (f"; {r['contended']} contended figure(s) left out" if r["contended"] else "") + ".")
    return out


def host_rows(hosts) -> list[dict]:
    """``hosts.hosts_table`` as display rows."""
    return [{"machine": r["machine"], "runs": r["runs"], "with a recorded fingerprint": r["fingerprinted"],
             "hosts": r["hosts"], "host changes": r["host_changes"],
             "probe's run-to-run band": "±" + percent(r["probe_noise"])
             if r["probe_noise"] == r["probe_noise"] else "unknown"}
            for _, r in hosts.iterrows()]


def host_sentences(hosts, changes) -> list[str]:
    """Per machine: how many hosts its history holds, and each change with why."""
    out = []
    for _, r in hosts.iterrows():
        text = (f"{r['machine']}: its history holds {r['hosts']} host(s) over {r['runs']} runs "
                f"({r['fingerprinted']} with a recorded fingerprint)")
        mine = [] if changes is None else changes[(changes["machine"] == r["machine"]) & changes["changed"]]
        if len(mine):
            text += "; changed " + "; ".join(f"at {str(c['commit_after'])[:8]} ({c['why']})"
                                             for _, c in mine.iterrows())
        out.append(text + ".")
    return out


KEPT_WORDS = "kept the factor before it (too few series or kernels to say)"  # noise.run_shifts' kept


def shift_rows(shifts) -> list[dict]:
    """``noise.correction_shifts`` as display rows, newest pair first; a ``kept`` pair measured
    nothing of its own and shows none."""
    rows = []
    for _, r in shifts.iloc[::-1].iterrows():
        kept = is_kept(r.get("kept"))
        rows.append({"machine": r["machine"], "env": short_env(r["env_name"]),
                     "benchmark": str(r["benchmark"]).removeprefix("attention.").split(".")[0],
                     "metric": r.get("metric", "seconds_per_step"),
                     "commits": f"{str(r['commit_before'])[:8]} -> {str(r['commit_after'])[:8]}",
                     "series": r["series"], "whole run moved": KEPT_WORDS if kept else f"{r['shift']:+.1%}",
                     "middle half of the series": "-" if kept else f"{r['q25']:+.1%} .. {r['q75']:+.1%}",
                     "standard error": f"±{r['se']:.1%}" if r.get("se") == r.get("se") and not kept else "-"})
    return rows


def definition_rows() -> list[dict]:
    return [{"definitions": c.version, "date": c.date, "metrics": ", ".join(c.metrics),
             "only": "; ".join(x for x in (f"regimes {'/'.join(c.regimes)}" if c.regimes else "",
                                          f"platform {'/'.join(c.platforms)}" if c.platforms else "",
                                          f"kernels {'/'.join(c.impls)}" if c.impls else "",
                                          f"class {'/'.join(c.benchmarks)}" if c.benchmarks else "") if x)
             or "-", "what changed": c.reason} for c in metrics.DEFINITION_CHANGES]


def spike_sentences(spikes) -> list[str]:
    """One sentence per cost spike: what rose, where, by how much, and what moved with it. A spike
    judged against its run (``run_shift``) rose against it: the figures as measured can even fall,
    and the sentence says so."""
    out = []
    for _, s in spikes.iterrows():
        versions = s["versions_changed"] or "no library version changed"
        measured = f"{cell(s['value_before'])} -> {cell(s['value_after'])} {s['unit'] or ''}"
        shift = s.get("run_shift")
        if isinstance(shift, float) and shift == shift and abs(shift) > 1e-9:
            measured = f"against its run, whose step times moved {shift:+.1%} (as measured: {measured})"
        else:
            measured = f"({measured})"
        out.append(f"`{s['metric']}` of {series_name(s)} ({s['benchmark'].removeprefix('attention.')}) "
                   f"on {s['machine']} / {short_env(s['env_name'])} rose {s['relative_change']:+.1%} "
                   f"{measured} between "
                   f"{str(s['commit_before'])[:8]} and {str(s['commit_after'])[:8]}: moved with "
                   f"{s['attribution']}; {versions}.")
    return out


def context(frame, results_dir, regressions, spikes, traces, trace_spikes, best, costs, pngs: dict,
            thresholds, trace_factor, *, steps=None, noise=None, shifts=None,
            ordering: str | None = None, hosts=None, changes=None, unmeasured) -> dict:
    """What ``templates/report.j2`` shows: tables, sentences and the plots (PNG bytes by file name);
    the keyword tables are ``results``' (``steps.find_steps``, ``steps.noise_floor``,
    ``noise.correction_shifts``, ``asv_results.Tidy.unmeasured``)."""
    import pandas as pd


    steps = pd.DataFrame() if steps is None else steps
    noise = pd.DataFrame() if noise is None else noise
    status = frame["status"]
    spike_part = None
    if not spikes.empty:
        largest = select.largest_first(spikes)
        spike_part = {"sentences": spike_sentences(largest.head(MAX_TABLE_ROWS)),
                      "table": Table.of(regression_rows(largest, attribution=True), total=len(spikes))}
    regression_part = None
    if not regressions.empty:
        regression_part = Table.of(regression_rows(select.largest_first(regressions), attribution=False),
                                   total=len(regressions))
    explained, unconfirmed, within = None, None, 0
    if not steps.empty:
        waiting = steps[steps["verdict"] == UNCONFIRMED]
        if not waiting.empty:
            unconfirmed = Table.of(regression_rows(select.largest_first(waiting), attribution=False,
                                                   verdict=True), total=len(waiting))
        other = steps[~steps["verdict"].isin([REGRESSION, WITHIN_NOISE, UNCONFIRMED])]
        within = int((steps["verdict"] == WITHIN_NOISE).sum())
        if not other.empty:
            rows = regression_rows(select.largest_first(other), attribution=False, verdict=True)
            explained = Table.of(rows, total=len(other))
    contended = int((is_contended(frame) & (frame["status"] == "ok")).sum())
    trace_part = None
    if not trace_spikes.empty:
        trace_part = {"summary": Table.of(select.trace_spike_summary(trace_spikes)),
                      "worst": Table.of(select.worst_trace_steps(trace_spikes))}
    return {
        "stamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "results_dir": results_dir,
        "counts": {"rows": f"{len(frame):,}", "ok": f"{int((status == 'ok').sum()):,}",
                   "skipped": f"{int(unmeasured['cells'].sum()):,}",  # the loader counted them
                   "failed": f"{int((status == 'failed').sum()):,}"},
        "thresholds": threshold_text(thresholds),
        "coverage": Table.of(select.coverage(frame, unmeasured)),
        "provenance": Table.of(select.provenance(frame)),
        "recomputed": _recomputed_commits(frame),
        "interpreted": Table.of(select.interpreted_runs(frame)),
        "commits": Table.of(select.commits_table(frame)),
        "best": Table.of(best),
        "regime_costs": Table.of(costs),
        "cost_metrics": metrics.names("cost"),
        "single_commit": frame["commit_hash"].nunique() < 2,
        "spikes": spike_part,
        "regressions": regression_part,
        "trace_spikes": trace_part,
        "has_traces": not traces.empty,
        "trace_factor": f"{trace_factor:g}",
        "ordering": ordering,
        "ordering_warning": bool(ordering and ordering.startswith("WARNING")),
        "noise": Table.of(noise_rows(noise)) if not noise.empty else None,
        "shifts": Table.of(shift_rows(shifts)) if shifts is not None and not shifts.empty else None,
        "noise_sentences": noise_sentences(noise) if not noise.empty else [],
        "hosts": Table.of(host_rows(hosts)) if hosts is not None and not hosts.empty else None,
        "host_sentences": host_sentences(hosts, changes) if hosts is not None and not hosts.empty else [],
        "explained": explained,
        "unconfirmed": unconfirmed,
        "within_noise": within,
        "contended": contended,
        "definitions": Table.of(definition_rows()),
        "definitions_version": metrics.DEFINITIONS,
        "alert_z": f"{ALERT_Z:g}",
        "images": {name: base64.b64encode(png).decode("ascii") for name, png in pngs.items()},
    }


def _recomputed_commits(frame) -> list[str]:
    """Commits (8 hex) with rows whose labels were recomputed from today's code, not recorded."""
    if "labels_source" not in frame:
        return []
    part = frame[frame["labels_source"] == "recomputed"]
    return sorted({str(c)[:8] for c in part["commit_hash"]})


def _environment(html: bool):
    import jinja2
    from markupsafe import Markup, escape

    def inline(text) -> Markup:  # `code` and **bold**, the only Markdown the report's text uses
        text = str(escape(text))
        text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
        return Markup(re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text))

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=html,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["inline"] = inline
    return env


def _tidy(text: str) -> str:
    """One blank line between blocks, whatever the template's conditionals left."""
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def render_markdown(ctx: dict) -> str:
    """``report.md``: figures by file name (the PNGs lie beside it)."""
    return _tidy(_environment(html=False).get_template("report.j2").render(ctx, fmt="markdown.j2"))


def render_html(ctx: dict, title: str = "attnbench report") -> str:
    """``report.html``: one self-contained page, plots embedded as data: URIs."""
    from markupsafe import Markup

    env = _environment(html=True)
    body = _tidy(env.get_template("report.j2").render(ctx, fmt="html.j2"))
    return env.get_template("page.html.j2").render(title=title, body=Markup(body))
