"""The report, the `report` CLI and notebooks/cost_spikes.ipynb.

Synthetic fixtures are real asv result trees (``results/benchmarks.json`` +
``results/<machine>/<sha8>-<env>.json`` in asv's positional format, versions sidecars, per-step
traces) for the commits of a throw-away git repository, written by the same generator the
``selfcheck-report`` speed benchmark uses, with a +40% cost step injected at one commit.
The notebook also runs against the committed ``results/``, and fails (not skips) when those are empty.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("asv")
pytest.importorskip("matplotlib")

from attnbench.checks.selfcheck_report import ENV_MAIN, Spike, make_git_repo, write_synthetic_results  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.report import write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "cost_spikes.ipynb"
SPIKE = Spike(commit=3)  # jax-blockwise-flash S1024 static on cpu-2core: +40% seconds, +60% RSS, jax bump


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    repo = tmp_path_factory.mktemp("synthetic") / "repo"
    commits = make_git_repo(str(repo), 6)
    results = repo / "results"
    write_synthetic_results(str(results), commits, machines=("cpu-2core", "h200"), envs=(ENV_MAIN,),
                            spike=SPIKE)
    return repo, results, commits


def _png_ok(data: bytes) -> None:
    from PIL import Image

    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(data)) as image:
        image.verify()
    with Image.open(io.BytesIO(data)) as image:
        assert image.size[0] > 100 and image.size[1] > 100


@pytest.mark.slow
def test_report_names_the_injected_spike_and_leaves_results_untouched(synthetic, tmp_path):
    repo, results, commits = synthetic
    before = snapshot(results)
    out = tmp_path / "report"
    report = write_report(str(results), str(out))
    assert snapshot(results) == before, "write_report changed results/"

    for path in report.paths:
        assert Path(path).is_file() and Path(path).stat().st_size > 0, path
    assert set(report.plots) == {"throughput.png", "memory.png", "regime_cost.png", "cost_over_commits.png",
                                 "trace_dynamic.png"}
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")], "atomic writes left temp files"

    # the analysis found exactly the injected step, at the right commits, attributed
    spikes = report.cost_spikes
    assert set(spikes["metric"]) >= {"usd_per_step", "usd_per_million_tokens"}
    assert set(spikes["implementation"]) == {SPIKE.implementation}
    assert set(spikes["commit_after"]) == {commits[SPIKE.commit]}
    assert set(spikes["commit_before"]) == {commits[SPIKE.commit - 1]}
    step = spikes[spikes["metric"] == "usd_per_step"].iloc[0]
    assert step["relative_change"] == pytest.approx(0.40, abs=0.04)
    assert step["attribution"].startswith("host_rss_growth_bytes +60%")

    md = Path(report.markdown).read_text()
    before8, after8 = commits[SPIKE.commit - 1][:8], commits[SPIKE.commit][:8]
    sentence = next(line for line in md.splitlines() if line.startswith("- `usd_per_step` of"))
    assert f"{SPIKE.implementation} S{SPIKE.seq_len} {SPIKE.regime}" in sentence
    assert f"between {before8} and {after8}" in sentence
    assert "moved with host_rss_growth_bytes +60%; seconds_per_step +" in sentence
    assert "jax 0.10.2 -> 0.10.3" in sentence
    rise = float(re.search(r"rose \+(\d+\.\d)%", sentence).group(1))
    assert 36 <= rise <= 44
    assert f"{before8} -> {after8}" in md  # the regressions/spike tables
    for heading in ("## Coverage", "## Best native vs best forced-flash", "## Static vs dynamic vs bucketed",
                    "## Cost spikes", "## Noise floor", "## Regressions", "## Per-step trace spikes"):
        assert heading in md
    # top-down: the verdict first, then the plots, regressions and spikes, details; coverage last
    sections = re.findall(r"^## (.+)$", md, re.M)
    assert sections[:3] == ["Verdict", "Throughput, MFU and cost", "Regressions and cost spikes"]
    assert sections[-1] == "Coverage and provenance"
    assert md.index("## Verdict") < md.index("](throughput.png)") < md.index("### Best native")
    verdict = pd.read_csv(report.tables["verdict.csv"])
    assert set(verdict["basis"]) <= {"measured", "compiler only"} and len(verdict)
    assert report.verdict is not None and len(report.verdict) == len(verdict)
    assert "h200" in md and "cpu-2core" in md
    for name in report.plots:
        assert f"]({name})" in md

    html = Path(report.html).read_text()
    assert not re.search(r"https?:", html, re.I), "report.html must not reference anything outside itself"
    assert not re.search(r"""(?:src|href)=["'](?!data:)""", html), "only data: URIs may be loaded"
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == len(report.plots)
    for data in images:
        _png_ok(base64.b64decode(data))
    assert f"between {before8} and {after8}" in html and "host_rss_growth_bytes +60%" in html
    for path in report.plots.values():
        _png_ok(Path(path).read_bytes())

    tidy = pd.read_csv(report.tidy_csv)
    parquet = pd.read_parquet(report.tidy_parquet)
    assert len(tidy) == len(parquet) == len(report.frame)
    assert list(parquet.columns) == list(report.frame.columns)


@pytest.mark.slow
def test_report_of_a_single_commit_outside_git(tmp_path):
    """No history (one commit, unknown to git): nothing to detect, and the report still writes."""
    results = tmp_path / "results"
    write_synthetic_results(str(results), ["f" * 40], envs=(ENV_MAIN,), forward_seqs=(256,))
    report = write_report(str(results), str(tmp_path / "out"), repo=str(tmp_path))
    md = Path(report.markdown).read_text()
    assert report.regressions.empty and report.cost_spikes.empty
    assert "No regressions detected." in md
    assert "only one commit so far" in md
    assert "torch-sdpa-flash" in md  # best native on this CPU model


@pytest.mark.slow
def test_cli_report_prints_spikes_and_where_the_report_is(synthetic, tmp_path, capsys):
    _, results, commits = synthetic
    out = tmp_path / "cli"
    assert main(["report", "--results", str(results), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "cost spike(s):" in printed
    assert f"between {commits[SPIKE.commit - 1][:8]} and {commits[SPIKE.commit][:8]}" in printed
    assert "13 regression(s) (" in printed and "largest 13:" in printed
    assert str(out / "report.md") in printed and (out / "report.html").is_file()

    loose = ["--threshold-metric", "usd_per_step=0.5", "--threshold-metric", "usd_per_million_tokens=0.5",
             "--threshold-metric", "usd_per_step_with_compiles=0.5"]
    assert main(["report", "--results", str(results), "--out", str(out), *loose]) == 0
    assert "no cost spikes detected" in capsys.readouterr().out
    assert main(["report", "--results", str(results), "--out", str(out), "--threshold", "0.9"]) == 0
    assert "no regressions detected" in capsys.readouterr().out


@pytest.mark.slow
def test_report_summary_prints_what_summary_prints(committed_results, tmp_path, capsys):
    """`make bench` ends with `report --summary`, which hands the summary the report's own verdict, A/A
    controls and case table instead of making them again: the same text as `summary` alone (on the
    committed results, whose newest run has verdict rows and A/A controls)."""
    results = committed_results
    assert main(["summary", "--results", str(results)]) == 0
    alone = capsys.readouterr().out
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "out"), "--summary"]) == 0
    printed = capsys.readouterr().out
    assert "# verdict" in alone and "A/A control" in alone
    assert printed.endswith("\n" + alone)
    # a terminal's width: the verdict's short table, its notes and the best-kernel table
    assert max(len(line) for line in alone.splitlines()) <= 120, max(alone.splitlines(), key=len)


@pytest.mark.slow
def test_results_outside_git_are_ordered_by_the_dates_asv_recorded(synthetic, tmp_path, capsys):
    """A copy of results/ outside any git checkout: commits ordered by the result files' ``date``,
    the same spike found, and the report says how it ordered them. Without dates either: a loud
    warning (report and stderr), never a silent "no regressions detected"."""
    _, results, commits = synthetic
    copy = tmp_path / "copy" / "results"
    shutil.copytree(results, copy)
    report = write_report(str(copy), str(tmp_path / "out"))
    assert set(report.frame["commit_order_source"]) == {"date"}
    assert "commit dates asv recorded" in report.ordering
    assert set(report.cost_spikes["commit_after"]) == {commits[SPIKE.commit]}
    assert set(report.cost_spikes["implementation"]) == {SPIKE.implementation}
    assert "which code changed is unknown" in set(report.regressions["why"]).pop()
    assert "Commit order: " in Path(report.markdown).read_text()
    assert main(["report", "--results", str(copy), "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr()
    assert "commit dates asv recorded" in printed.err
    assert "13 regression(s) (" in printed.out

    for path in copy.glob("*/*.json"):
        if path.name != "machine.json":
            data = json.loads(path.read_text())
            data["date"] = None  # no date recorded: asv's reader refuses a file without the key
            path.write_text(json.dumps(data))
    assert main(["report", "--results", str(copy), "--out", str(tmp_path / "cli2")]) == 0
    printed = capsys.readouterr()
    assert "WARNING: 6 of 6 commit(s) cannot be ordered" in printed.err
    assert "no regressions detected (the commits could not be ordered" in printed.out
    md = (tmp_path / "cli2" / "report.md").read_text()
    assert "**WARNING: 6 of 6 commit(s) cannot be ordered" in md
    assert "No regressions detected: the commits could not be ordered" in md


@pytest.mark.slow
def test_report_writes_the_noise_floor_and_every_step_with_its_verdict(synthetic, tmp_path):
    _, results, commits = synthetic
    report = write_report(str(results), str(tmp_path / "out"))
    assert {"steps.csv", "noise_floor.csv"} <= set(report.tables)
    steps = pd.read_csv(report.tables["steps.csv"])
    from attnbench.results.steps import VERDICTS

    assert set(steps["verdict"]) <= set(VERDICTS)
    assert len(steps[steps["verdict"] == "regression"]) == len(report.regressions)
    noise = pd.read_csv(report.tables["noise_floor.csv"])
    assert list(noise["machine"]) == ["cpu-2core", "h200"]
    assert noise["measured_by"].str.startswith("median over the static compiled series").all()
    md = Path(report.markdown).read_text()
    section = md.split("## Noise floor", 1)[1].split("\n## ", 1)[0]
    for _, row in noise.iterrows():
        assert f"- {row['machine']}: noise floor {row['noise_floor']:.1%} (one static figure's SD" in section
        assert f"smallest change it can detect is {row['smallest_detectable_step']:.1%}" in section
    # how far each whole run moved: one row per consecutive pair of commits with static timings
    shifts = pd.read_csv(report.tables["run_shifts.csv"])
    assert len(shifts) and (shifts["series"] >= 3).all()
    newest = shifts.iloc[-1]
    assert f"{str(newest['commit_before'])[:8]} -> {str(newest['commit_after'])[:8]}" in section
    assert f"{newest['shift']:+.1%}" in section


def test_cli_report_on_empty_or_missing_results_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for folder in ("empty", "missing"):
        assert main(["report", "--results", str(tmp_path / folder), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "no asv results" in err and "make bench" in err
    assert not (tmp_path / "out").exists()
    assert main(["report", "--results", str(tmp_path / "empty"), "--threshold-metric", "nope=1"]) == 2
    assert "--threshold-metric" in capsys.readouterr().err


def test_selfcheck_report_runs_and_finds_its_spike(capsys):
    """The speed benchmark's machinery at a small size (its timing is reported by the CLI, not tested)."""
    from attnbench.checks import selfcheck_report

    assert selfcheck_report.main(rows=4000, target_s=1e9) == 0
    printed = capsys.readouterr().out
    assert re.search(r"found, attributed to host_rss_growth_bytes \+6\d%", printed) and "PASS" in printed


# -- the notebook ---------------------------------------------------------------------------------
# Committed executed (`make notebook`: attnbench/report/notebook.py), so a code host shows its outputs.
def test_committed_notebook_is_executed():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert any(c.outputs for c in code), "the committed notebook has no outputs: run `make notebook`"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), \
        "execution counts are not 1, 2, ... in cell order: run `make notebook`"
    errors = [i for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"cell(s) {errors} of the committed notebook hold an error"
    assert not [i for i, c in enumerate(nb.cells) if "execution" in c.metadata], \
        "execution timing metadata in the committed notebook: run `make notebook`"


def _execute_notebook(results: Path | None):
    """One fresh execution as `make notebook` runs it (results None: the committed results/)."""
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from attnbench.report.notebook import execute

    nb = execute(NOTEBOOK, results)  # raises NotebookCellError naming the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return "".join(o.get("text", "") for o in outputs if o.output_type == "stream"), outputs, nb


@pytest.mark.slow
def test_notebook_runs_headless_on_the_committed_results():
    """A fresh execution on the committed results/ writes nothing there, and its outputs have the
    committed notebook's structure: the same cells with outputs, the same kinds of output in each."""
    import nbformat

    from attnbench.report.notebook import changed, listing, structure

    results = ROOT / "results"
    files = [p for p in results.glob("*/*.json") if p.name != "machine.json"]
    if not (results / "benchmarks.json").is_file() or not files:
        pytest.fail("results/ holds no asv results: run `make bench` and commit results/ "
                    "(the notebook is tested against them)")
    committed = nbformat.read(NOTEBOOK, as_version=4)
    before = listing(results)
    text, outputs, fresh = _execute_notebook(None)
    moved = changed(before, listing(results))
    assert not moved, f"executing the notebook wrote under results/: {moved[:10]}"
    assert f"results: {results}" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)

    want, got = structure(fresh), structure(committed)
    assert not [k for kinds in (*want.values(), *got.values()) for k in kinds if k.startswith("error")]
    differ = sorted(i for i in want.keys() | got.keys() if want.get(i) != got.get(i))
    assert not differ, (f"cells {differ}: the committed notebook's outputs differ from a fresh execution's "
                        f"(committed {[got.get(i) for i in differ]}, fresh {[want.get(i) for i in differ]}): "
                        "run `make notebook`")


@pytest.mark.slow
def test_notebook_attributes_a_spike_in_synthetic_history(synthetic):
    _, results, commits = synthetic
    text, _, _ = _execute_notebook(results)
    assert f"between {commits[SPIKE.commit - 1][:8]} and {commits[SPIKE.commit][:8]}" in text
    assert "moved with host_rss_growth_bytes +60%" in text


def test_a_step_up_from_zero_is_an_infinite_regression_not_a_crash():
    """Real results have metrics at 0 (host RSS growth, compiles) that later rise: no ZeroDivisionError."""
    from attnbench.results.steps import find_regressions

    rows = [{"machine": "cpu-2core", "env_name": "env", "benchmark": "attention.Forward.track_compiles",
             "implementation": "jax-xla", "seq_len": 256, "regime": "static", "dtype": "float32",
             "metric": "compiles", "unit": "count", "status": "ok", "direction": "lower",
             "commit_hash": f"{i:040x}", "commit_position": i, "value": value}
            for i, value in enumerate([0.0, 0.0, 0.0, 2.0, 2.0, 2.0])]
    found = find_regressions(pd.DataFrame(rows))
    assert len(found) == 1 and found.iloc[0]["relative_change"] == float("inf")


@pytest.mark.slow
def test_summary_and_report_pick_each_machines_newest_commit(tmp_path, monkeypatch, capsys):
    """One summary of native vs forced-flash: `attnbench summary` prints the report's table, taken at
    each machine's own newest commit (h200 here stops three commits before cpu-2core)."""
    from attnbench import report
    from attnbench.results.asv_results import load_results

    repo = tmp_path / "repo"
    commits = make_git_repo(str(repo), 6)
    results = repo / "results"
    write_synthetic_results(str(results), commits, machines=("cpu-2core",), envs=(ENV_MAIN,),
                            forward_seqs=(256,), traces=None, seed=1)
    write_synthetic_results(str(results), commits[:3], machines=("h200",), envs=(ENV_MAIN,),
                            forward_seqs=(256,), traces=None, seed=2)

    for where in (repo, tmp_path):  # commits in git order, then (outside the repo) by date
        monkeypatch.chdir(where)
        frame = load_results(str(results), repo=".")
        best = report.best_native_vs_forced(frame)
        assert list(best["machine"]) == ["cpu-2core", "h200"]
        for machine, newest in (("cpu-2core", commits[5]), ("h200", commits[2])):
            rows = frame[(frame["machine"] == machine) & (frame["commit_hash"] == newest)
                         & (frame["metric"] == "seconds_per_step") & (frame["suite"] == "Forward")
                         & (frame["regime"] == "static") & (frame["label"] == "native")
                         & (frame["status"] == "ok")]
            fastest = rows.loc[rows["value"].idxmin()]
            row = best[best["machine"] == machine].iloc[0]
            assert row["best_native"] == fastest["implementation"]
            assert row["native_ms_per_step"] == pytest.approx(fastest["value"] * 1e3)

        assert main(["summary", "--results", str(results), "--markdown"]) == 0
        printed = capsys.readouterr().out
        assert "each machine's newest commit" in printed
        lines = [line for line in printed.splitlines() if line.startswith("| cpu-2core") or
                 line.startswith("| h200")]
        assert len(lines) == 2
        for line, (_, row) in zip(lines, best.iterrows(), strict=True):
            assert row["best_native"] in line and f"{row['native_ms_per_step']:.4g}" in line


def test_a_spike_judged_against_its_run_says_so_beside_the_figures_as_measured():
    """A cost that rose against its run can fall as measured: the sentence says which is which."""
    from attnbench.report.render import spike_sentences

    spike = {"metric": "usd_per_step", "implementation": "jax-xla", "seq_len": 512, "regime": None,
             "dtype": None, "benchmark": "attention.Training.track_usd_per_step", "machine": "cpu-2core",
             "env_name": "virtualenv-py3.11-jax", "relative_change": 0.136, "value_before": 9.43e-07,
             "value_after": 9.01e-07, "unit": "USD", "commit_before": "a" * 40, "commit_after": "b" * 40,
             "attribution": "seconds_per_step -4%", "versions_changed": "", "run_shift": -0.159}
    [sentence] = spike_sentences(pd.DataFrame([spike]))
    assert "rose +13.6% against its run, whose step times moved -15.9% (as measured: 9.43e-07 -> 9.01e-07" \
        in sentence
    [plain] = spike_sentences(pd.DataFrame([{**spike, "run_shift": 0.0, "value_after": 1.07e-06}]))
    assert "rose +13.6% (9.43e-07 -> 1.07e-06 USD) between" in plain and "against its run" not in plain
