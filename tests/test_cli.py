"""The CLI end to end in this venv: list, matrix (and the docs' copies of it), bench, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import attention_impls
from attnbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_list_shows_every_implementation_with_its_status(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in attention_impls.names():
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), f"{name} missing from `attnbench list`"
    assert "cuDNN needs an NVIDIA GPU" in out or "jax is not installed" in out


def test_docs_matrix_rows_are_the_generated_ones(capsys):
    """Every row of the implementation matrix in docs/kernels.md is what `attnbench matrix --markdown`
    prints for that kernel (a new kernel file needs no docs edit for `make test` to pass, but a row
    that says something the code no longer does fails here)."""
    assert main(["matrix", "--markdown"]) == 0
    generated = capsys.readouterr().out.strip().splitlines()
    header, rows = generated[:2], {line.split("|")[1].strip(): line for line in generated[2:]}
    page = (ROOT / "docs" / "kernels.md").read_text()
    page = page.split("## Implementation matrix", 1)[1].split("\n## ", 1)[0]
    assert "\n".join(header) in page, "docs/kernels.md matrix header is stale: paste `make matrix` output"
    listed = re.findall(r"^\| (`[a-z0-9-]+`) \|.*$", page, re.M)
    assert len(listed) >= 16, "docs/kernels.md lists the implementation matrix"
    for line in re.findall(r"^\| `[a-z0-9-]+` \|.*$", page, re.M):
        name = line.split("|")[1].strip()
        assert name in rows, f"docs/kernels.md lists {name}, which is not registered"
        assert line == rows[name], f"docs/kernels.md row of {name} is stale: paste `make matrix` output"


def test_docs_feature_matrix_is_the_generated_one(capsys):
    """The GQA / mask-feature table of docs/workloads.md is `attnbench matrix --features --markdown`."""
    assert main(["matrix", "--features", "--markdown"]) == 0
    generated = capsys.readouterr().out.strip()
    page = (ROOT / "docs" / "workloads.md").read_text()
    section = page.split("## Every kernel declares what it takes", 1)[1].split("\n## ", 1)[0]
    assert generated in section, "docs/workloads.md feature matrix is stale: paste `make matrix` output"


@pytest.mark.parametrize("argv,message", [
    (["run", "--impl", "no-such-kernel"], "unknown implementation 'no-such-kernel'"),
    (["run", "--dtype", "float64", "--impl", "reference-float64"], "Workload.dtype must be one of"),
    (["run", "--memory-cap", "lots", "--impl", "reference-float64"], "--memory-cap must look like 8G"),
    (["run", "--rounds", "9", "--budget", "0", "--impl", "reference-float64"],
     "--budget must be more than 0 seconds, got 0"),
    (["run", "--rounds", "9", "--budget", "-5", "--impl", "reference-float64"],
     "--budget must be more than 0 seconds, got -5"),
    (["run", "--rounds", "9", "--margin", "1.5", "--impl", "reference-float64"],
     "--margin must be a fraction between 0 and 1"),
    (["run", "--rounds", "9", "--margin", "0", "--impl", "reference-float64"],
     "--margin must be a fraction between 0 and 1"),
    (["verdict", "--margin", "1"], "--margin must be a fraction between 0 and 1"),
    (["run", "--impl", "reference-float64", "--price-per-hour", "9.31"],
     "--price-per-hour needs --price-kind: instance (the accelerator with its host) or accelerator"),
    (["confirm", "--budget", "0"], "--budget must be more than 0 seconds"),
    (["verdict", "--horizon", "0"], "--horizon must be more than 0, got '0'"),
    (["verdict", "--horizon=-2h"], "--horizon must be more than 0, got '-2h'"),
    (["verdict", "--horizon", "3days"],
     "--horizon's unit must be steps or h (hours of the trace's request rate)"),
    (["run", "--impl", "reference-float64", "--workload", "llama-3.1-8b", "--phase", "decode", "--regime",
      "packed"], "--regime packed: the packed regime packs prefill and training sequences"),
])
def test_bad_input_exits_2_with_a_clear_message(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1  # one line


@pytest.mark.parametrize("variable,value,message", [
    ("ATTNBENCH_BUDGET_S", "0", "ATTNBENCH_BUDGET_S must be more than 0 seconds, got 0"),
    ("ATTNBENCH_BUDGET_S", "-1", "ATTNBENCH_BUDGET_S must be more than 0 seconds, got -1"),
    ("ATTNBENCH_MARGIN", "1.5", "ATTNBENCH_MARGIN must be a fraction between 0 and 1"),
    ("ATTNBENCH_MARGIN", "0", "ATTNBENCH_MARGIN must be a fraction between 0 and 1"),
    ("ATTNBENCH_MARGIN", "ten", "ATTNBENCH_MARGIN must be a number, got 'ten'"),
])
def test_make_bench_refuses_a_bad_budget_or_margin_in_one_line(monkeypatch, capsys, variable, value, message):
    """`make bench`'s first step (`selection check`), before any measuring."""
    from attnbench.asv import selection

    monkeypatch.setenv(variable, value)
    assert selection.main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("make bench: ")


def test_make_bench_refuses_a_trace_without_generated_tokens_before_its_decode_streams(monkeypatch, capsys,
                                                                                       tmp_path):
    """Every stream of the suite takes the user's trace, the presets' decode streams too: a file of
    context lengths only is refused in `make bench`'s first step, not by each decode case mid-run."""
    from attnbench.asv import selection

    trace = tmp_path / "lengths.csv"
    trace.write_text("ContextTokens\n300\n1200\n")
    monkeypatch.setenv("ATTNBENCH_TRAFFIC", str(trace))
    monkeypatch.setenv("ATTNBENCH_SUITE", "default")
    assert selection.main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"make bench: {trace}:1: a decode stream needs a GeneratedTokens column"]
    trace.write_text("ContextTokens,GeneratedTokens\n300,20\n1200,40\n")
    assert selection.main(["check"]) == 0


def test_a_bug_is_not_reported_as_bad_input(monkeypatch):
    """A bare KeyError inside a command is the project's bug: its traceback, not "bad input", exit 2."""
    import attnbench.cli as cli

    def broken(args):
        return {}["a key the code forgot"]

    monkeypatch.setattr(cli, "cmd_list", broken)  # build_parser reads it when main calls it
    with pytest.raises(KeyError, match="a key the code forgot"):
        cli.main(["list"])


@pytest.mark.slow
def test_run_writes_a_tidy_table_with_provenance_and_traces(tmp_path, capsys):
    import csv

    out = tmp_path / "run"
    assert main(["run", "--impl", "reference-float64", "jax-cudnn", "--seq", "128", "--heads", "2",
                 "--regime", "static", "dynamic", "--steps", "3", "--min-seconds", "0.02",
                 "--no-isolate", "--quiet", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "records.csv")))
    assert [(r["impl"], r["regime"], r["status"]) for r in rows] == [
        ("reference-float64", "static", "ok"), ("reference-float64", "dynamic", "ok"),
        ("jax-cudnn", "static", "unsupported"), ("jax-cudnn", "dynamic", "unsupported")]
    for row in rows:
        assert row["git_commit"] and row["version_numpy"] and row["host_cores"]
    assert float(rows[0]["seconds_per_step"]) > 0
    assert (out / "traces").is_dir() and len(list((out / "traces").iterdir())) == 2
    assert "wrote" in capsys.readouterr().out


def test_bad_input_is_refused_before_the_first_case(monkeypatch, capsys):
    """An unknown hardware profile, an unknown compile target, or a dtype this machine cannot run is
    refused with the valid choices named, before any case is measured."""
    from attnbench import hardware
    from attnbench.run import sweep

    monkeypatch.setattr(sweep, "measure_cases", lambda *a, **k: pytest.fail("a case was measured"))
    assert main(["run", "--impl", "reference-float64", "--hardware-profile", "no-such-chip"]) == 2
    err = capsys.readouterr().err
    assert "--hardware-profile 'no-such-chip' is not a hardware profile; choose one of" in err
    assert "h200-sxm" in err and "tpu-v5e" in err
    monkeypatch.setattr(hardware, "accelerator_present", lambda: hardware.Attached("tpu", 4, "v5e"))
    assert main(["run", "--impl", "reference-float64", "--dtype", "float32"]) == 2
    assert "--dtype float32: a TPU runs bfloat16 only here" in capsys.readouterr().err
    assert main(["compile-for", "--target", "tpu-v9z", "--seq", "1k"]) == 2
    err = capsys.readouterr().err
    assert "tpu-v9z" in err and "tpu-v5e" in err


def test_cases_prints_what_ran_and_its_evidence_from_a_case_cache(tmp_path, capsys):
    import json

    folder = tmp_path / "cases" / "h200" / "abcdef12-existing-py3.12" / "0123"
    folder.mkdir(parents=True)
    ok = {"impl": "jax-cudnn", "dtype": "bfloat16", "seq_q": 4096, "mode": "fwd", "regime": "static",
          "status": "ok", "seconds_per_step": 0.0012,
          "kernel_evidence": "compiled HLO custom-calls: __cudnn$fmha"}
    refused = {**ok, "impl": "jax-pallas-tpu-flash", "status": "unsupported", "reason": "interpreted here"}
    for i, record in enumerate((ok, refused)):
        (folder / f"{i}.case").write_text(json.dumps({"key": str(i), "record": record}))
    (folder / "2.case").write_text("{damaged")
    assert main(["cases", str(tmp_path / "cases")]) == 0
    captured = capsys.readouterr()
    assert "__cudnn$fmha" in captured.out and "1.2" in captured.out
    assert "jax-pallas-tpu-flash" not in captured.out
    assert "2.case is not a case record" in captured.err
    assert main(["cases", str(tmp_path / "cases"), "--all"]) == 0
    assert "interpreted here" in capsys.readouterr().out


def test_feature_matrix_says_refused_and_names_the_segment_id_kind(capsys):
    """GQA `refused` and the segment-id kind come from each kernel's declarations (`gqa`,
    `segment_kinds`); the kernels that refuse say so in their reasons."""
    from attention_impls.base import SEGMENT_KINDS
    from attnbench.core.workload import Workload

    assert main(["matrix", "--features", "--markdown"]) == 0
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in capsys.readouterr().out.strip().splitlines()[2:]}
    # columns: gqa, window, softcap, segment ids
    assert rows["`jax-pallas-gpu-mha`"] == ["refused", "no", "no", "documents"]
    assert rows["`torch-xla-pallas-flash`"] == ["refused", "no", "no", "both"]
    assert rows["`jax-pallas-gpu-decode`"][3] == rows["`jax-pallas-tpu-ragged-paged`"][3] == "ragged"
    assert rows["`jax-pallas-mgpu-attention`"][3] == "no" and rows["`jax-xla`"][3] == "both"
    gqa = Workload(q_heads=8, kv_heads=2, seq_q=256, head_dim=64)
    documents = Workload(q_heads=4, seq_q=256, head_dim=64, documents=2)
    ragged = Workload(batch=2, q_heads=4, seq_q=1, seq_k=256, head_dim=64, causal=True, ragged=True)
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        assert impl.gqa in ("native", "repeated", "refused")
        assert impl.segment_kinds and set(impl.segment_kinds) <= set(SEGMENT_KINDS)
        platform = sorted(impl.designed_for or {"cpu"})[0]
        if impl.gqa == "refused":  # the declaration is what shape_reason does
            reason = impl.shape_reason(gqa, platform)
            assert reason and ("GQA" in reason or "grouped-query" in reason), f"{name}: {reason!r}"
        if "segment_ids" in impl.supports:
            for kind, workload in (("documents", documents), ("ragged", ragged)):
                if kind not in impl.segment_kinds:
                    reason = impl.shape_reason(workload, platform)
                    assert reason and "segment ids" in reason, f"{name} on {kind}: {reason!r}"


def test_commands_with_their_own_module_parse_on_the_one_parser():
    # noisecheck (attnbench) and run (attnbench.fleet) add their options to the subparser: no argv
    # is handed around the parser, so a typo is argparse's usage error like any other command's.
    from attnbench.checks import noisecheck
    from attnbench.cli import build_parser
    from attnbench.fleet import __main__ as fleet_main
    from attnbench.fleet import runner

    args = build_parser().parse_args(["noisecheck", "--rounds", "3", "--slowdown", "0.2"])
    assert (args.func, args.rounds, args.slowdown) == (noisecheck.command, 3, 0.2)
    args = fleet_main.build_parser().parse_args(["run", "--machine", "m", "--commit", "c", "--checkout", "x",
                                                  "--", "--quick"])
    assert (args.func, args.machine, args.asv_args) == (runner.command, "m", ["--quick"])
    with pytest.raises(SystemExit) as exit_:
        main(["noisecheck", "--round", "3x"])
    assert exit_.value.code == 2
