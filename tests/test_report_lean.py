"""The report as it is built now: the grid cells asv stored as n/a counted, not carried as rows; its
tables the same, row for row, as the report made them before that (on the committed results of
54e70c9, against that commit's own outputs in tests/data/report-54e70c9); and the verdict's forest
plot, drawn from the verdict's own intervals."""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import warnings
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("asv")
pytest.importorskip("matplotlib")

from attnbench.report import forest  # noqa: E402
from attnbench.report.answers import CANT_TELL, EQUAL, FORCED, NATIVE  # noqa: E402
from attnbench.report.verdict import COLUMNS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The commit whose results/ and report outputs the golden files are: `attnbench report --threshold 0.1`
# run by that commit's code on its committed results (tests/data/report-54e70c9/README.md).
PINNED = "54e70c9b3943845e560eda438b5d990167bb697c"
GOLDEN = ROOT / "tests" / "data" / "report-54e70c9"
ROWS_BEFORE, CELLS_BEFORE = 384_708, 313_287  # that report's tidy rows, and how many were `skipped`


@pytest.fixture(scope="module")
def pinned_report(tmp_path_factory):
    """``write_report`` now, on git's copy of results/ at ``PINNED``, as `attnbench report --threshold 0.1`
    writes it (commits ordered, and code changes read, by this checkout's git)."""
    from attnbench.cli_results import parse_thresholds
    from attnbench.report import write_report

    out = tmp_path_factory.mktemp("pinned")
    archive = subprocess.run(["git", "archive", PINNED, "results"], cwd=ROOT, capture_output=True)
    if archive.returncode:
        pytest.skip(f"needs this project's git history (results/ at {PINNED[:7]}): {archive.stderr[:200]!r}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the history's older result files warn; not what is tested here
        return write_report(str(out / "results"), str(out / "report"), repo=str(ROOT),
                            thresholds=parse_thresholds(0.1, None))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["verdict", "regressions", "steps", "cost_spikes"])
def test_the_reports_tables_are_what_they_were_row_for_row(pinned_report, name):
    want = gzip.decompress((GOLDEN / f"{name}.csv.gz").read_bytes()).decode().splitlines()
    got = Path(pinned_report.tables[f"{name}.csv"]).read_text().splitlines()
    assert got[0] == want[0], f"{name}.csv: the columns changed"
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert first is None, f"{name}.csv row {first}: was\n{want[first]}\nnow\n{got[first]}"
    assert len(got) == len(want), f"{name}.csv: {len(want) - 1} rows before, {len(got) - 1} now"


@pytest.mark.slow
def test_the_trace_spikes_are_what_they_were(pinned_report):
    # each row names its trace file: under results/ then (the report ran from the checkout), here under tmp
    results = str(Path(pinned_report.out_dir).parent / "results")
    text = Path(pinned_report.tables["trace_spikes.csv"]).read_text().replace(results + "/", "results/")
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert digest == (GOLDEN / "trace_spikes.csv.sha256").read_text().strip()


@pytest.mark.slow
def test_unmeasured_cells_are_counted_not_carried_as_rows(pinned_report):
    frame = pinned_report.frame
    assert set(frame["status"]) <= {"ok", "failed"}
    unmeasured = pd.read_csv(pinned_report.tables["unmeasured.csv"])
    assert list(unmeasured.columns) == ["machine", "env_name", "commit_hash", "benchmark", "cells"]
    assert int(unmeasured["cells"].sum()) == CELLS_BEFORE  # every cell the old table held as a row
    assert len(frame) == ROWS_BEFORE - CELLS_BEFORE
    text = Path(pinned_report.markdown).read_text()
    assert f"{len(frame):,} tidy rows" in text
    assert f"{CELLS_BEFORE:,} cells of the asv parameter grids hold nothing" in text
    # the tidy files hold the measured rows only, and the same ones
    assert len(pd.read_parquet(pinned_report.tidy_parquet)) == len(frame)


# -- the forest plot ---------------------------------------------------------------------------------
def _row(**values) -> dict:
    return {**dict.fromkeys(COLUMNS), "dtype": "-", **values}


def _table() -> pd.DataFrame:
    rows = [
        _row(machine="cpu-2core", basis="measured", framework="torch", workload="llama-3.1-8b prefill",
             seq_len=512, answer=NATIVE, ratio=1.6, ratio_low=1.3, ratio_high=2.0,
             paper=NATIVE, paper_ratio=1.4, paper_low=1.3, paper_high=1.5),
        _row(machine="cpu-2core", basis="measured", framework="jax", workload="causal B1 H8 D64",
             seq_len=1024, dtype="float32", answer=CANT_TELL, ratio=0.9, ratio_low=0.5, ratio_high=1.8,
             paper=FORCED, paper_ratio=0.6, paper_low=0.55, paper_high=0.65),
        _row(machine="cpu-2core", basis="measured", framework="jax", workload="gemma-2-9b prefill",
             seq_len=512, answer=EQUAL, ratio=0.98, ratio_low=0.92, ratio_high=1.03,
             paper=EQUAL, paper_ratio=0.97, paper_low=0.93, paper_high=1.02),
        # a measured row with no length stream: paper only, not a headline row
        _row(machine="cpu-2core", basis="measured", framework="torch", workload="causal B1 H8 D64",
             seq_len=4096, answer="-", paper=NATIVE, paper_ratio=2.0, paper_low=1.9, paper_high=2.1),
        # compile targets: one with a predicted ratio, one memory only
        _row(machine="tpu-v5e", basis="compiler only", framework="jax", workload="gemma-2-9b prefill",
             seq_len=8192, dtype="bfloat16", answer="-", headroom_winner="jax-pallas-tpu-splash",
             predicted=NATIVE, predicted_ratio=121.0, predicted_ratio_low=68.0, predicted_ratio_high=215.0,
             predicted_extrapolated=True),
        _row(machine="h200", basis="compiler only", framework="jax", workload="llama-3.1-8b decode",
             seq_len=131072, dtype="bfloat16", answer="-", headroom_winner="jax-xla", predicted="-"),
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def test_the_forest_rows_are_the_verdicts_intervals_measured_first_predicted_apart():
    rows = forest.forest_rows(_table())
    assert list(rows["label"]) == ["torch · llama-3.1-8b prefill · 512",
                                   "jax · causal B1 H8 D64 · 1024 · float32",
                                   "jax · gemma-2-9b prefill · 512",
                                   "tpu-v5e · jax · gemma-2-9b prefill · 8192 · bfloat16"]
    assert list(rows["evidence"]) == [forest.MEASURED] * 3 + [forest.PREDICTED]
    assert list(rows["state"]) == [NATIVE, CANT_TELL, EQUAL, NATIVE]
    assert rows.iloc[1][["ratio", "low", "high"]].tolist() == [0.9, 0.5, 1.8]  # production, not paper
    predicted = rows.iloc[3]
    assert (predicted["ratio"], predicted["low"], predicted["high"]) == (121.0, 68.0, 215.0)
    assert predicted["interval_of"] == "predicted_ratio" and bool(predicted["extrapolated"])
    assert pd.isna(predicted["paper_state"]) and pd.isna(predicted["paper_ratio"])  # nothing ran there
    # the paper answer is drawn beside the production one only where the two states differ
    assert [forest.paper_differs(r) for r in rows.to_dict("records")] == [False, True, False, False]


def test_the_forest_png_carries_the_rows_it_draws_and_nothing_draws_nothing():
    table = _table()
    png = forest.plot_verdict_forest(table)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = pd.DataFrame(forest.rows_in_png(png), columns=forest.FOREST_COLUMNS)
    pd.testing.assert_frame_equal(drawn, forest.forest_rows(table), check_dtype=False)
    assert forest.plot_verdict_forest(table[table["basis"] != "measured"].iloc[1:]) is None  # memory only
    assert forest.plot_verdict_forest(pd.DataFrame(columns=COLUMNS)) is None


def test_the_band_is_the_margin_the_verdict_read_its_rows_against():
    cases = pd.DataFrame({"margin": [0.05, 0.05, None]})
    assert forest.margin_of(cases) == 0.05  # the one the runs recorded
    assert forest.margin_of(cases, 0.2) == 0.2  # asked for
    assert forest.margin_of(pd.DataFrame({"margin": [0.05, 0.1]})) == forest.DEFAULT_MARGIN  # not one
    assert forest.margin_of(None) == forest.DEFAULT_MARGIN


def test_a_forest_png_without_rows_reads_as_none():
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buffer, format="PNG")
    assert forest.rows_in_png(buffer.getvalue()) == []


def test_the_tidy_files_are_written_straight_to_their_place_atomically(tmp_path):
    """``atomic_file``: the new content takes the old one's place whole, or not at all."""
    from attnbench.core.atomic import atomic_file

    target = tmp_path / "tidy.csv"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_file(str(target), "w") as out:
        out.write("half of the new")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["tidy.csv"]
    with atomic_file(str(target), "w") as out:
        out.write("a,b\n1,2\n")
    assert target.read_text() == "a,b\n1,2\n"
    with pytest.raises(ValueError, match="mode 'wb' or 'w'"), atomic_file(str(target), "a"):
        pass


def test_the_tidy_parquet_written_a_slice_at_a_time_reads_back_as_the_table(tmp_path, monkeypatch):
    import attnbench.report as report

    monkeypatch.setattr(report, "TIDY_ROWS_AT_ONCE", 3)  # several slices of a small table
    frame = pd.DataFrame({"value": [1.5, None, 3.0, 4.0, 5.0, 6.0, 7.0], "status": ["ok"] * 6 + ["failed"],
                          "label": ["native", None, "forced-flash", None, None, "native", None]})
    report._write_tidy(frame, str(tmp_path / "tidy.csv"), str(tmp_path / "tidy.parquet"))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "tidy.parquet"), frame)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "tidy.csv"), frame)


# -- the sections drawn aside -------------------------------------------------------------------------
def _broken_releases(tmp_path) -> Path:
    from attnbench.report.releases import TABLE

    results = tmp_path / "results"
    (results / TABLE).parent.mkdir(parents=True)
    (results / TABLE).write_text("framework,release\njax\n")  # no target, no status: the table is refused
    return results


def test_a_section_that_raises_in_the_aside_process_raises_in_the_report_with_its_traceback(tmp_path,
                                                                                        monkeypatch):
    from attnbench.report import aside

    results = _broken_releases(tmp_path)
    monkeypatch.setattr(aside, "_usable_cores", lambda: 2)
    inline = None
    try:
        aside.made(str(results), str(tmp_path / "inline"))
    except Exception as exc:  # noqa: BLE001 (what the section raises here, to compare)
        inline = exc
    assert inline is not None
    side = aside.start(str(results), str(tmp_path / "out"))
    assert side.process is not None  # two cores and a table to draw: a process of its own
    with pytest.raises(aside.AsideError, match=type(inline).__name__) as raised:
        side.result()
    assert "Traceback" in str(raised.value) and "(in the report's aside process)" in str(raised.value)


def test_without_two_cores_or_anything_to_draw_the_sections_are_made_in_the_report(tmp_path, monkeypatch):
    from attnbench.report import aside

    empty = tmp_path / "results"
    empty.mkdir()
    assert aside.start(str(empty), str(tmp_path / "out")).process is None  # nothing to draw
    assert aside.start(str(empty), str(tmp_path / "out")).result() == {"compiled_for": None, "releases": None}
    results = _broken_releases(tmp_path)
    monkeypatch.setattr(aside, "_usable_cores", lambda: 1)
    assert aside.start(str(results), str(tmp_path / "out")).process is None


@pytest.mark.parametrize("dies", ["import sys; sys.exit(3)",
                                  "import sys; sys.stdout.buffer.write(b'half an answer'); sys.exit(3)"])
def test_an_aside_process_that_dies_without_an_answer_is_said_and_the_sections_made_here(tmp_path, dies):
    import sys
    import threading

    from attnbench.report import aside

    empty = tmp_path / "results"
    empty.mkdir()
    process = subprocess.Popen([sys.executable, "-c", dies], stdout=subprocess.PIPE)
    answer: list = []
    receiver = threading.Thread(target=aside._receive, args=(process, answer))
    receiver.start()
    side = aside.Aside(str(empty), str(tmp_path / "out"), process, receiver, answer)
    with pytest.warns(UserWarning, match=r"aside process died \(exit code 3\)"):
        assert side.result() == {"compiled_for": None, "releases": None}
