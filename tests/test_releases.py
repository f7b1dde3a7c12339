"""The release matrix (attnbench/releases/): statuses, the table, the asv config, one real cell."""

import json
import os
import re

import pytest

import attention_impls
from attnbench.releases import matrix
from tests.conftest import FRAMEWORKS

needs_jax = pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config():
    with open(os.path.join(ROOT, "asv.releases.conf.json")) as f:
        text = "\n".join(line for line in f if not line.lstrip().startswith("//"))
    return json.loads(text)


def test_asv_matrix_is_the_release_list_with_the_libtpu_each_jax_tpu_pins():
    config = _config()
    entries = [e["req"] for e in config["include"]]
    bare = [e for e in entries if not set(matrix.COMPANIONS) & set(e)]
    beside = [e for e in entries if set(matrix.COMPANIONS) <= set(e)]
    assert len(bare) + len(beside) == len(entries)
    for group in (bare, beside):  # each release once bare and once beside the companions
        assert [e["jax"] for e in group] == [r.version for r in matrix.JAX_RELEASES]
        assert [e.get("libtpu") for e in group] == [r.libtpu for r in matrix.JAX_RELEASES]
    assert all(e["jaxlib"] == e["jax"] for e in entries)
    assert sum(r.libtpu is not None for r in matrix.JAX_RELEASES) >= 3  # the three libtpu releases
    assert config["results_dir"] == "results/releases/asv" and config["env_dir"].startswith(".asv/")
    assert len(matrix.JAX_RELEASES) >= 5 and matrix.newest("jax").version == "0.10.2"


def test_releases_span_about_18_months_one_per_minor_series():
    dates = sorted(r.date for r in matrix.JAX_RELEASES)
    assert dates[0] <= "2025-06-30" and dates[-1] >= "2026-06-01"
    minors = [r.version.rsplit(".", 1)[0] for r in matrix.JAX_RELEASES]
    assert len(set(minors)) == len(minors)


@pytest.mark.parametrize(
    "stage,exc,status",
    [
        ("import", ImportError("cannot import name 'splash_attention'"), matrix.API_CHANGED),
        ("compile", AttributeError("module 'jax' has no attribute 'typeof'"), matrix.API_CHANGED),
        (
            "compile",
            TypeError("flash_attention() got an unexpected keyword argument 'segment_ids'"),
            matrix.API_CHANGED,
        ),
        ("compile", TypeError("unsupported operand type(s) for +: 'int' and 'str'"), matrix.COMPILE_FAILED),
        ("compile", ValueError("Mosaic lowering failed"), matrix.COMPILE_FAILED),
        ("run", RuntimeError("INTERNAL: XLA crashed"), matrix.RUNTIME_ERROR),
    ],
)
def test_the_failing_stage_and_the_exception_decide_the_status(stage, exc, status):
    assert matrix.classify(stage, exc) == status
    assert matrix.classify_text(stage, matrix.first_line(exc)) == status


def test_an_unknown_stage_is_refused_by_name():
    with pytest.raises(ValueError, match="stage must be one of"):
        matrix.classify("lowering", RuntimeError("x"))


def _surface(*params):
    """jax-xla's call surface with ``jax.nn.dot_product_attention`` taking ``params``."""
    return json.dumps({"jax.nn:dot_product_attention": {
        "present": True, "signature": f"({', '.join(params)})", "params": list(params),
        "var_keyword": False}})


FULL = _surface("query", "key", "value", "mask", "scale", "implementation", "is_causal", "local_window_size")


def _row(release, impl="jax-xla", status=matrix.OK, seconds=0.01, framework="jax", target="cpu",
         reason="ImportError: gone", surface=FULL):
    return {
        "api_surface": surface,
        "framework": framework,
        framework: release,
        "impl": impl,
        "workload": "causal-256",
        "seq_len": 256,
        "target": target,
        "status": status,
        "seconds_per_step": seconds if status == matrix.OK else None,
        "reason": None if status == matrix.OK else reason,
    }


def test_the_table_gives_each_step_time_relative_to_the_newest_release_and_the_grid_shows_it():
    from attnbench.releases.table import broken, grid, matrix_frame

    frame = matrix_frame(
        [
            _row("0.10.2", seconds=0.010),
            _row("0.6.2", seconds=0.015),
            _row("0.9.2", status=matrix.API_CHANGED, reason="jax.experimental.pallas.ops.tpu.flash_attention "
                 "does not import in jax 0.9.2: ModuleNotFoundError: No module named 'absl'"),
            # the exception's type says nothing: the release's own surface lost a keyword the call passes
            _row("0.8.2", status=matrix.API_CHANGED,
                 reason="TypeError: got an unexpected keyword 'implementation'",
                 surface=_surface("query", "key", "value", "mask", "scale", "is_causal",
                                  "local_window_size")),
            # "has no attribute" with every name of the call still there: not an API change
            _row("0.7.2", status=matrix.API_CHANGED,
                 reason="AttributeError: module 'x' has no attribute 'y'"),
            _row("2.13.0+cpu", impl="torch-sdpa-math", framework="torch", seconds=0.02),
            _row("2.9.0", impl="torch-sdpa-math", framework="torch", seconds=0.01),
        ]
    )
    assert list(frame.columns) == matrix.COLUMNS
    by = {(r["impl"], r["release"]): r for r in frame.to_dict("records")}
    assert by[("jax-xla", "0.6.2")]["relative_to_newest"] == pytest.approx(1.5)
    assert by[("jax-xla", "0.10.2")]["relative_to_newest"] == 1.0
    assert by[("jax-xla", "0.6.2")]["release_date"] == "2025-06-17"
    assert by[("torch-sdpa-math", "2.9.0")]["relative_to_newest"] == pytest.approx(0.5)  # 2.13.0 is newest
    assert by[("torch-sdpa-math", "2.13.0")]["release_date"] == "2026-07-08"  # "+cpu": a build tag
    table = grid(frame[frame["framework"] == "jax"])
    assert list(table.columns) == ["0.6.2", "0.7.2", "0.8.2", "0.9.2", "0.10.2"]  # release order
    # a broken cell shows its cause where its error tells one, else its status
    # a broken cell by its cause, never by the status its stage raised
    assert table.iloc[0].tolist() == ["ok 1.50x", "unexplained", "api-changed", "packaging", "ok 1.00x"]
    breaks = broken(frame)
    assert [(b["impl"], b["release"], b["status"], b["cause"]) for b in breaks] == [
        ("jax-xla", "0.7.2", "api-changed", "unexplained"),
        ("jax-xla", "0.8.2", "api-changed", "api-changed"),
        ("jax-xla", "0.9.2", "api-changed", "packaging"),
    ]
    moved = "from 0.7.2 to 0.8.2: jax.nn:dot_product_attention no longer takes implementation"
    assert moved in breaks[1]["evidence"]


def test_the_table_is_written_atomically_and_read_back_unchanged(tmp_path):
    from attnbench.releases.table import load_table, matrix_frame, write_table

    path = tmp_path / "releases.csv"
    write_table(matrix_frame([_row("0.10.2"), _row("0.8.2", seconds=0.02)]), str(path))
    before = path.read_bytes()
    frame = load_table(str(path))
    assert path.read_bytes() == before and list(frame["release"]) == ["0.8.2", "0.10.2"]
    assert not [p for p in os.listdir(tmp_path) if p != "releases.csv"]  # no temporary left behind
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a release-matrix table"):
        load_table(str(tmp_path / "other.csv"))


def test_a_broken_cell_fails_its_benchmark_and_a_refused_one_is_na():
    from attnbench.releases.suite import cell_for

    cache = {
        "a": {"status": matrix.API_CHANGED, "reason": "ImportError: x"},
        "b": {"status": matrix.UNSUPPORTED, "reason": "needs an NVIDIA GPU"},
        "c": {"status": matrix.OK, "seconds_per_step": 0.1},
        "d": {"skip": "no libtpu here"},
    }
    with pytest.raises(RuntimeError, match="api-changed: ImportError"):
        cell_for(cache, "a")
    with pytest.raises(NotImplementedError, match="NVIDIA"):
        cell_for(cache, "b")
    with pytest.raises(NotImplementedError, match="libtpu"):
        cell_for(cache, "d")
    with pytest.raises(NotImplementedError, match="not a cell"):
        cell_for(cache, "e")
    assert cell_for(cache, "c")["seconds_per_step"] == 0.1


def test_the_matrix_refuses_to_build_on_a_full_disk(tmp_path):
    from attnbench.releases.run import free_disk_problem

    assert free_disk_problem(str(tmp_path), need_gb=0.0) is None
    problem = free_disk_problem(str(tmp_path), need_gb=1e9)
    assert problem and re.search(r"only [\d.]+ GB free under .* still needs about [\d.]+ GB", problem)


def test_the_disk_check_counts_only_what_is_not_built(monkeypatch, tmp_path):
    from attnbench.releases import run

    monkeypatch.setattr(run, "asv_envs", lambda: {})
    monkeypatch.setattr(run, "LIBTPU_ROOT", str(tmp_path / "libtpu"))
    monkeypatch.setattr(matrix, "TORCH_VENV_ROOT", str(tmp_path / "torch"))
    own_torch = len(matrix.TORCH_RELEASES) - len(matrix.TORCH_SETUP_VENVS)
    nothing = run.disk_needed()
    configured = run.configured_envs()
    assert nothing == pytest.approx(
        sum(run.GB_JAX_TPU_VENV if "libtpu" in r else run.GB_JAX_VENV for r in configured)
        + run.GB_TORCH_VENV * own_torch + run.GB_LIBTPU * len(matrix.LIBTPU_AXIS))
    monkeypatch.setattr(run, "asv_envs", lambda: {f"/p{i}": r for i, r in enumerate(configured)})
    overlay = tmp_path / "libtpu" / f"libtpu-{matrix.LIBTPU_AXIS[0]}"
    overlay.mkdir(parents=True)
    (overlay / run.BUILT).write_text("")
    assert run.disk_needed() == pytest.approx(
        run.GB_TORCH_VENV * own_torch + run.GB_LIBTPU * (len(matrix.LIBTPU_AXIS) - 1))
    # issue 32's 25 GB from nothing, plus the libtpu 0.0.52 overlays issue 55 added
    # (an upper bound: the torch venvs hard-link their shared files; docs/releases.md has the du)
    assert nothing < 25 + run.GB_LIBTPU
    assert run.disk_needed(torch=False, libtpu=False) == pytest.approx(0.0)


def test_collect_without_cells_names_the_command(tmp_path):
    from attnbench.releases.run import collect

    with pytest.raises(ValueError, match="make releases"):
        collect("0123456789abcdef", root=str(tmp_path), out=str(tmp_path / "t.csv"))
    assert not (tmp_path / "t.csv").exists()


@needs_jax
@pytest.mark.slow
def test_a_real_cell_runs_every_stage_and_names_its_kernel():
    from attnbench.releases.cell import run_cell

    row = run_cell("jax-xla", "causal-256")
    assert row["status"] == matrix.OK and row["seconds_per_step"] > 0 and row["max_abs_err"] < 1e-3
    assert "custom-call" in row["kernel_evidence"] and row["jax"] and row["jaxlib"]
    gqa = run_cell("jax-xla-chunked", "mistral-7b-prefill-128")
    assert gqa["status"] == matrix.OK, gqa["reason"]


@needs_jax
def test_a_cell_says_which_stage_broke_and_through_which_line(monkeypatch):
    import attention_impls
    from attnbench.releases.cell import run_cell

    impl = attention_impls.get("jax-xla")
    monkeypatch.setattr(type(impl), "requires_modules", ("jax.experimental.no_such_module",))
    moved = run_cell("jax-xla", "causal-256")
    assert moved["status"] == matrix.API_CHANGED and moved["stage"] == "import"
    assert "no_such_module" in moved["reason"]
    monkeypatch.setattr(type(impl), "requires_modules", ())

    def bad_signature(*args, **kwargs):
        raise TypeError("dot_product_attention() got an unexpected keyword argument 'local_window_size'")

    monkeypatch.setattr(type(impl), "attention", bad_signature)  # the library call refuses
    changed = run_cell("jax-xla", "causal-256")
    assert changed["status"] == matrix.API_CHANGED and changed["stage"] == "compile"
    assert changed["line"].startswith("tests/test_releases.py:")


@needs_jax
def test_a_kernel_of_another_platform_is_unsupported_with_its_reason():
    from attnbench.releases.cell import run_cell

    row = run_cell("jax-cudnn", "causal-256")
    assert row["status"] == matrix.UNSUPPORTED and row["reason"]


@needs_jax
def test_the_support_check_runs_before_a_release_import_is_judged(monkeypatch):
    """A kernel refused on this platform in every release (Mosaic GPU on a CPU) is unsupported even
    where its module would not import (jax's undeclared absl): never a break of the release."""
    from attnbench.releases.cell import run_cell

    impl = attention_impls.get("jax-pallas-mgpu-attention")
    monkeypatch.setattr(type(impl), "requires_modules", ("jax.experimental.no_such_module",))
    row = run_cell("jax-pallas-mgpu-attention", "causal-256")
    assert row["status"] == matrix.UNSUPPORTED and "no_such_module" not in row["reason"]


def test_a_tpu_compile_whose_kernel_does_not_import_is_an_api_change_not_a_refusal():
    from attnbench.releases.suite import tpu_row

    moved = tpu_row(
        "tpu-v5e|jax-pallas-tpu-splash|4096",
        {
            "status": "unsupported",
            "reason": "jax.experimental.pallas.ops.tpu.splash_attention does not "
            "import in jax 0.9.2: ModuleNotFoundError: No module named 'absl'",
        },
    )
    assert moved["status"] == matrix.API_CHANGED and moved["seq_len"] == 4096 and moved["target"] == "tpu-v5e"
    refused = tpu_row(
        "tpu-v5e|jax-cudnn|4096", {"status": "unsupported", "reason": "cuDNN needs an NVIDIA GPU"}
    )
    assert refused["status"] == matrix.UNSUPPORTED
    full = tpu_row("tpu-v5e|jax-xla|32768", {"status": "does-not-fit", "reason": "RESOURCE_EXHAUSTED: HBM"})
    assert full["status"] == matrix.DOES_NOT_FIT
    mosaic = tpu_row(
        "tpu-v5e|jax-pallas-tpu-flash|4096", {"status": "kernel-refused", "reason": "MosaicError: x"}
    )
    assert mosaic["status"] == matrix.COMPILE_FAILED and mosaic["stage"] == "compile"


def test_the_report_section_draws_the_grid_and_lists_what_broke(tmp_path):
    from attnbench.releases.table import matrix_frame, write_table
    from attnbench.report.releases import releases_part

    results, out = tmp_path / "results", tmp_path / "out"
    (results / "releases").mkdir(parents=True)
    out.mkdir()
    rows = [
        _row("0.10.2"),
        _row("0.9.2", status=matrix.API_CHANGED),
        _row("2.13.0", impl="torch-sdpa-math", framework="torch"),
    ]
    write_table(matrix_frame(rows), str(results / "releases" / "releases.csv"))
    part = releases_part(str(results), str(out))
    assert [g["name"] for g in part["grids"]] == ["jax on cpu", "torch on cpu"]
    assert part["n_broken"] == 1 and part["releases"] == ["jax 0.9.2", "jax 0.10.2", "torch 2.13.0"]
    assert (out / "releases.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert releases_part(str(tmp_path / "nothing"), str(out)) is None


def test_one_run_of_the_matrix_measures_one_commit_in_every_environment(monkeypatch, tmp_path):
    from attnbench.releases import run

    calls, heads = [], iter(["a" * 40, "b" * 40])  # a commit made meanwhile must not split the run
    monkeypatch.setattr(run, "_asv", lambda *args, env=None: calls.append(args) or 0)
    monkeypatch.setattr(run, "head_commit", lambda: next(heads))
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    built = {"2.13.0": str(python)}
    monkeypatch.setattr(run, "build_torch_venv", lambda version: built.get(version))
    assert run.run_matrix("cpu-2core", libtpu=False) == "a" * 40
    jax_run, torch_run = [c for c in calls if c[0] == "run"]
    assert jax_run[-1] == "a" * 40 + "^!" and "^releases\\." in jax_run
    assert torch_run[torch_run.index("--set-commit-hash") + 1] == "a" * 40
    assert f"existing:{python}" in torch_run and len(calls) == 3  # machine, jax releases, one torch venv


def test_a_cell_whose_worker_died_is_a_runtime_error_filed_under_its_framework(monkeypatch):
    from attnbench.releases.cell import run_cells
    from attnbench.releases.table import release_of
    from attnbench.run import worker as isolation

    died = (None, ("error", "worker died"))
    monkeypatch.setattr(isolation.Worker, "call", lambda self, args, timeout: died)
    rows = run_cells(("torch",))
    row = rows[matrix.cell_key("torch-sdpa-math", "causal-256")]
    assert row["status"] == matrix.RUNTIME_ERROR and row["reason"] == "worker died"
    assert row["framework"] == "torch" and release_of(row) == row["torch"].split("+")[0]


def test_a_resumed_matrix_measures_only_the_cells_not_filed_for_the_commit(monkeypatch, tmp_path):
    from attnbench.releases import suite

    context = {"results_dir": str(tmp_path), "machine": "m", "commit": "c" * 40, "env": "env"}
    monkeypatch.setattr(suite, "asv_context", lambda: context)
    suite.file_cells({"a|w": {"status": matrix.OK}})
    seen = []
    monkeypatch.setattr(suite, "run_cells", lambda done: seen.append(done) or {"b|w": {"status": matrix.OK}})
    cells = suite.measure_cells()
    assert seen == [frozenset({"a|w"})] and set(cells) == {"a|w", "b|w"}
    assert set(suite.read_cells(suite.cells_path(context))) == {"a|w", "b|w"}


def test_a_build_that_fails_removes_what_it_made(tmp_path):
    from attnbench.releases import run

    made = tmp_path / "venv"
    assert run._build(str(made), [["mkdir", str(made)], ["false"]]) is False and not made.exists()
    kept = tmp_path / "kept"
    assert run._build(str(kept), [["mkdir", str(kept)]]) is True and run.built(str(kept))
    half = tmp_path / "half"  # an earlier build stopped half-way: no mark, so it is built again
    half.mkdir()
    (half / "partial").write_text("")
    assert not run.built(str(half))
    assert run._build(str(half), [["mkdir", str(half)]]) and not (half / "partial").exists()


def test_cells_of_an_environment_holding_another_release_are_left_out(tmp_path, capsys):
    from attnbench.releases.run import filed_cells

    cells = tmp_path / "m" / "cells"
    cells.mkdir(parents=True)
    for env, jax in (("virtualenv-py3.11-absl-py-chex-jax0.6.2-numpy", "0.10.2"),
                     ("virtualenv-py3.11-jax0.7.2-numpy", "0.7.2")):
        (cells / f"{'d' * 8}-{env}.cells").write_text(json.dumps({"k": {"framework": "jax", "jax": jax}}))
    rows = filed_cells(["d" * 40], root=str(tmp_path))
    assert [r["jax"] for r in rows] == ["0.7.2"]
    assert "holds jax 0.10.2, not 0.6.2" in capsys.readouterr().err
