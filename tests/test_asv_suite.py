"""The asv suite: discovery, units, skipped-not-failed, one measurement per case, and the loader
reading real asv output (plus damaged files)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.asv import machine as asv_machine
from attnbench.asv import sizes as asv_sizes
from attnbench.asv import suite as asv_suite
from attnbench.core import records
from attnbench.measure.engine import Case, Options
from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.skipif("jax" not in FRAMEWORKS or "torch" not in FRAMEWORKS,
                                reason="the asv suite's tests run in the main venv")
ROOT = Path(__file__).resolve().parents[1]
ASV = [sys.executable, "-m", "asv"]
SUBSET = "jax-xla,jax-cudnn,torch-sdpa-flash,torch-xla-sdpa"


def _conf(tmp_path: Path) -> Path:
    """The project's asv.conf.json, pointed at a temporary results folder and this venv."""
    text = "\n".join(line for line in (ROOT / "asv.conf.json").read_text().splitlines()
                     if not line.strip().startswith("//"))
    conf = json.loads(text)
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp_path / "results"),
                html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "env"), environment_type="existing")
    conf.pop("include")
    path = tmp_path / "asv.conf.json"
    path.write_text(json.dumps(conf))
    return path


@pytest.fixture(scope="module")
def asv_run(tmp_path_factory):
    """One real `asv run` of the suite (smoke suite size, a subset), in existing-environment mode,
    with a case cache for the run as ``make bench`` gives it (the classes measured in one sweep)."""
    tmp = tmp_path_factory.mktemp("asv")
    conf = _conf(tmp)
    env = {**os.environ, "ATTNBENCH_IMPLS": SUBSET, "ATTNBENCH_MACHINE": "test-cpu",
           "ATTNBENCH_SUITE": "smoke", "ATTNBENCH_RESULTS_DIR": str(tmp / "results"),
           "ATTNBENCH_CASE_CACHE": str(tmp / "handover")}
    subprocess.run([*ASV, "machine", "--yes", "--machine", "test-cpu", "--config", str(conf)],
                   check=True, capture_output=True, env=env, cwd=tmp)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    # the measured suite and the compiled-for tier; benchmarks/releases.py is make releases' own
    proc = subprocess.run([*ASV, "run", "--config", str(conf), "--python=same", "--set-commit-hash", head,
                           "--machine", "test-cpu", "--show-stderr", "-b", r"^(attention|compiled_for)\."],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=900)
    return tmp, proc, head


@pytest.mark.asv
def test_asv_check_discovers_every_benchmark(tmp_path):
    proc = subprocess.run([*ASV, "check", "--config", str(_conf(tmp_path)), "--python=same"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No problems found" in proc.stdout


def test_every_metric_has_a_unit_a_version_and_a_lower_is_better_twin():
    from benchmarks.attention import Forward, Models, Training

    for cls in (Forward, Training, Models):
        for metric in asv_suite.METRICS:
            track = getattr(cls, f"track_{metric.name}")
            assert track.unit == metric.unit and track.unit
            assert track.version == asv_suite.METRIC_VERSION
    names = {m.name for m in asv_suite.METRICS}
    twins = {"tokens_per_s": "seconds_per_million_tokens", "tflops": "seconds_per_pflop",
             "mfu": "mfu_shortfall", "useful_tokens_per_s": "seconds_per_million_useful_tokens",
             "bytes_per_s": "seconds_per_gb"}
    for higher in (m.name for m in asv_suite.METRICS if m.direction == "higher"):
        assert twins[higher] in names, f"{higher} needs a lower-is-better twin for asv"


def test_twins_are_exact_inverses():
    record = {"tflops": 0.5, "mfu": 0.25, "useful_tokens_per_s": 2e5, "bytes_per_s": 4e9,
              "status": records.OK}
    value = {m.name: m.value(record) for m in asv_suite.METRICS}
    assert value["seconds_per_gb"] == pytest.approx(0.25)
    assert value["seconds_per_pflop"] == pytest.approx(1e-3 / 0.5)
    assert value["mfu_shortfall"] == pytest.approx(0.75)
    assert value["seconds_per_million_useful_tokens"] == pytest.approx(5.0)
    assert math.isnan(value["seconds_per_step"]) and value["status"] == 0


def test_unsupported_is_skipped_with_reason_and_other_env_is_not_started():
    cache = asv_suite.measure_suite([("jax-cudnn", asv_sizes.FORWARD, "static"),
                                       ("torch-xla-sdpa", asv_sizes.FORWARD, "static")])
    cudnn, xla = (asv_suite.case_key(n, asv_sizes.FORWARD, "static") for n in ("jax-cudnn", "torch-xla-sdpa"))
    with pytest.raises(NotImplementedError, match="cuDNN needs an NVIDIA GPU"):
        asv_suite.record_for(cache, cudnn)
    with pytest.raises(NotImplementedError, match="measured in the other asv environment"):
        asv_suite.record_for(cache, xla)


@pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax-xla runs in the main venv")
def test_default_suite_runs_dynamic_regimes_at_its_regime_lengths_only(monkeypatch):
    """Also: measuring outside asv (here, pytest with asv imported) writes nothing under results/."""
    import asv  # noqa: F401  (imported asv once made the suite think it ran inside asv)

    assert asv_machine.asv_context() is None
    monkeypatch.setenv("ATTNBENCH_SUITE", "default")
    short = asv_sizes.FORWARD.replace(seq_q=256, seq_k=256)
    cache = asv_suite.measure_suite([("jax-xla", short, "dynamic")])
    with pytest.raises(NotImplementedError, match="runs the dynamic regime at 1024 tokens only"):
        asv_suite.record_for(cache, asv_suite.case_key("jax-xla", short, "dynamic"))


@pytest.mark.asv
def test_asv_run_records_ok_and_skipped_not_failed(asv_run):
    tmp, proc, head = asv_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [result_file] = [p for p in (tmp / "results" / "test-cpu").glob("*.json") if p.name != "machine.json"]
    data = json.loads(result_file.read_text())
    entry = dict(zip(data["result_columns"], data["results"]["attention.Training.track_seconds_per_step"],
                     strict=False))
    names = [p.strip("'") for p in entry["params"][0]]
    by_impl = dict(zip(names, entry["result"], strict=True))
    assert by_impl["jax-xla"] > 0 and by_impl["torch-sdpa-flash"] > 0
    assert math.isnan(by_impl["jax-cudnn"]) and math.isnan(by_impl["torch-xla-sdpa"])  # n/a, not null
    sidecar = tmp / "results" / "test-cpu" / "sidecars" / f"{head[:8]}-{data['env_name']}.sidecar"
    sidecar = json.loads(sidecar.read_text())
    assert sidecar["versions"]["jax"] and sidecar["versions"]["torch"]
    assert sidecar["settings"]["compile_cache"] == "cold"
    assert sidecar["settings"]["suite"] == "smoke" and sidecar["settings"]["forward_seqs"] == "128,256"
    assert sidecar["settings"]["min_seconds"] == 0.05 and sidecar["settings"]["impls"] == SUBSET
    # the host it ran on, with the run's own CPU GEMM probe (the MFU of its cases divides by it)
    assert sidecar["host"]["cpu_model"] and sidecar["host"]["usable_cores"] >= 1
    assert sidecar["host"]["gemm_peak_tflops"] > 0
    # what each case was, recorded when it was measured (both benchmark classes, merged)
    cases = sidecar["cases"]
    jax_xla = cases["Training|jax-xla|128|static|float32"]
    assert (jax_xla["label"], jax_xla["execution"], jax_xla["platform"], jax_xla["status"]) == \
        ("native", "compiled", "cpu", "ok")
    sdpa = cases["Forward|torch-sdpa-flash|256|static|float32"]
    assert (sdpa["label"], sdpa["execution"], sdpa["platform"]) == ("native", "eager", "cpu")
    assert sdpa["device"]
    assert cases["Forward|jax-cudnn|128|static|float32"]["status"] == "unsupported"
    assert not list((tmp / "results").rglob("versions"))
    # The smoke suite times 2 rounds (up to 2 more where they were contended): too few values for a
    # 99% interval (core/stats.min_values), so asv gets the figure alone and stores no interval of its
    # own, and the record says how its interval was made and at what confidence.
    assert "stats_ci_99_a" not in entry and "stats_q_25" not in entry
    rounds = jax_xla["rounds"]
    assert 1 <= rounds <= 4 and jax_xla["ci_basis"] == ("rounds" if rounds > 1 else "samples")
    assert jax_xla["ci_confidence"] == 0.99 and "too few values for 99%" in jax_xla["ci_method"]
    # One sweep measured both classes: Forward's setup_cache measured the Training cases too and
    # handed them over through the run's case cache; Training's setup_cache only read them.
    from benchmarks.attention import Forward, Models, Training

    handed = list((tmp / "handover").rglob("*.case"))
    # Forward: 2 lengths x 4 regimes x 4 impls; Training: 4; Models (smoke: mistral-7b decode): the 3
    # that run natively on a CPU (jax-cudnn is left out of the presets: asv_sizes.preset_impl_names),
    # static, and their dynamic, bucketed and packed cases as n/a records with the size's reason
    # (packed: a decode has nothing to pack)
    assert len(handed) == 2 * 4 * 4 + 4 + 3 + 3 * 3, handed
    setup = {key: seconds for key, seconds in data["durations"].items() if "setup_cache attention" in key}
    forward_s, training_s, models_s = (
        setup[f"<setup_cache attention:{cls.setup_cache.__code__.co_firstlineno}>"]
        for cls in (Forward, Training, Models))
    assert training_s < forward_s / 5 and models_s < forward_s / 5, setup
    # The preset's case, recorded under <preset>:<phase>, with its mask
    decode = cases["Models|jax-xla|mistral-7b:decode|static|float32"]
    assert (decode["label"], decode["status"], decode["gqa"]) == ("native", "ok", "native")
    assert decode["mask"] == "causal+window(32)+ragged-cache"  # 4096 of a 32k cache: 32 of 256


@pytest.mark.asv
def test_loader_reads_real_asv_output(asv_run):
    from attnbench.report import best_native_vs_forced
    from attnbench.results.asv_results import load

    tmp, _, head = asv_run
    tidy = load(str(tmp / "results"), repo=str(ROOT))
    frame = tidy.frame
    # The compiled-for tier (benchmarks/compiled_for.py) needs libtpu and the CUDA plugin: n/a here,
    # every cell of its grid counted, none a row.
    assert not frame["suite"].str.startswith("CompiledFor").any()
    empty = tidy.unmeasured
    compiled = empty[empty["benchmark"].str.contains(".CompiledFor")]
    assert len(compiled) and (compiled["cells"] > 0).all() and (empty["commit_hash"] == head).all()
    assert all(b.rpartition(".")[2].startswith("track_compiled_") for b in compiled["benchmark"])
    # every metric is measured here, or n/a in every cell (device_peak_bytes: no device) and counted
    counted = {b.rpartition(".track_")[2] for b in empty["benchmark"] if ".CompiledFor" not in b}
    assert set(frame["metric"]) | counted == {m.name for m in asv_suite.METRICS}
    assert set(frame["status"]) == {"ok"}  # the n/a cells (jax-cudnn, torch-xla-sdpa here) are counted
    na = empty[empty["benchmark"] == "attention.Training.track_seconds_per_step"]
    assert int(na["cells"].sum()) >= 2
    ok = frame[(frame.metric == "seconds_per_step") & (frame.status == "ok")]
    assert set(ok["implementation"]) == {"jax-xla", "torch-sdpa-flash"}
    assert (frame["commit_hash"] == head).all() and frame["commit_position"].notna().all()
    assert frame.loc[frame.metric == "tokens_per_s", "direction"].eq("higher").all()
    assert frame["version_jax"].notna().all()
    assert set(frame["label"].dropna()) <= {"native", "forced-flash"}
    ran = frame[frame.status == "ok"]
    assert (ran["labels_source"] == "recorded").all() and ran["device"].notna().all()
    assert set(ran["platform"]) == {"cpu"} and set(ran["execution"]) == {"compiled", "eager"}
    summary = best_native_vs_forced(frame)
    # contended timings never rank (a busy CI host marks some): every length with a clean one does
    from attnbench.results.noise import is_contended

    forward = ok[ok["suite"] == "Forward"]
    clean = forward[~is_contended(forward)]
    assert len(clean), "every timing of the run was contended: nothing to summarise"
    assert list(summary["seq_len"]) == sorted(set(clean["seq_len"])) and set(summary["seq_len"]) <= {128, 256}
    assert set(summary["best_native"]) <= {"jax-xla", "torch-sdpa-flash"}
    assert "best_forced" not in summary  # no forced-flash kernel in this subset


@pytest.mark.asv
def test_loader_survives_damaged_files_and_never_writes(asv_run, tmp_path):
    from attnbench.results.asv_results import ResultsError, load_results

    src, _, _ = asv_run
    results = tmp_path / "results"
    shutil.copytree(src / "results", results)
    machine = results / "test-cpu"
    good = next(p for p in machine.glob("*.json") if p.name != "machine.json")
    (machine / "truncated-env.json").write_text(good.read_text()[:200])
    stale = json.loads(good.read_text())
    for entry in stale["results"].values():
        entry[2] = "0-old"  # version column: another suite version
    (machine / "stale-env.json").write_text(json.dumps(stale))
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    with pytest.warns(UserWarning) as caught:
        frame = load_results(str(results), repo=str(ROOT))
    messages = " ".join(str(w.message) for w in caught)
    assert "truncated-env.json: unreadable" in messages and "stale-env.json" in messages
    assert len(frame) > 0 and not frame["file"].str.contains("stale|truncated").any()
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == before
    with pytest.raises(ResultsError, match="no asv results"):
        load_results(str(tmp_path / "empty"))


@pytest.mark.asv
def test_published_site_renders_our_graphs_offline(asv_run):
    """`asv publish` + our offline rewrite, opened in headless Chromium with the network cut."""
    from attnbench.offline_html import check_published_site, make_offline

    tmp, _, _ = asv_run
    conf = tmp / "asv.conf.json"
    proc = subprocess.run([*ASV, "publish", "--config", str(conf)], capture_output=True, text=True, cwd=tmp,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "could not load" not in proc.stdout + proc.stderr  # no sidecar taken for a result file
    make_offline(tmp / "html")
    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    screenshot = artifacts / "asv_forward_seconds_per_step.png"
    pages = check_published_site(tmp / "html", ["attention.Forward.track_seconds_per_step",
                                                "attention.Training.track_usd_per_step"], screenshot)
    assert pages and screenshot.stat().st_size > 10_000


@pytest.mark.parametrize("suite_name", sorted(asv_sizes.SIZES))
def test_every_suite_size_imports_every_benchmark_module(suite_name, monkeypatch):
    """asv imports every module under benchmarks/ whatever it runs: a size one module does not know
    (the gpu suite of tools/device-run.sh) must not break discovery."""
    import importlib
    import sys as _sys

    monkeypatch.setenv("ATTNBENCH_SUITE", suite_name)
    for module in ("benchmarks.attention", "benchmarks.compiled_for"):
        monkeypatch.delitem(_sys.modules, module, raising=False)
        loaded = importlib.import_module(module)
        assert loaded.__name__ == module
    for module in ("benchmarks.attention", "benchmarks.compiled_for"):
        _sys.modules.pop(module, None)  # later tests import the default size again


def test_the_presets_run_the_kernels_the_size_chooses(monkeypatch):
    monkeypatch.setenv("ACCEL", "cpu")
    default = asv_sizes.preset_impl_names(asv_sizes.SIZES["default"])
    assert "reference-float64" not in default  # the yardstick
    assert "jax-pallas-tpu-flash" not in default  # interpreted here
    assert not [n for n in default if n.startswith("torch-xla")]  # torch_xla: full only
    assert {"jax-xla", "jax-xla-chunked", "torch-sdpa-math", "torch-flex-attention"} <= set(default)
    full = asv_sizes.preset_impl_names(asv_sizes.SIZES["full"])
    assert set(full) == set(asv_sizes.impl_names())


def test_the_default_size_measures_its_static_cases_first_in_one_worker():
    short, long = asv_sizes.FORWARD.replace(seq_q=256, seq_k=256), asv_sizes.FORWARD
    parts = [("a", long, "dynamic"), ("a", long, "static"), ("b", short, "bucketed"), ("b", short, "static")]
    cases = [Case(impl, workload, Options(regime=regime)) for impl, workload, regime in parts]
    assert asv_suite.run_order(cases, asv_sizes.SIZES["default"]) == [cases[1], cases[3], cases[0], cases[2]]
    assert asv_suite.run_order(cases, asv_sizes.SIZES["gpu"]) == [cases[3], cases[2], cases[1], cases[0]]
    assert asv_suite.run_order(cases, asv_sizes.SIZES["smoke"]) == cases


def test_static_cases_share_a_worker_only_where_the_size_says_so():
    from attnbench.core import presets

    toy, preset = asv_sizes.FORWARD, presets.workload("llama-3.1-8b", "decode", size="smoke")
    assert asv_sizes.SIZES["default"].own_process(toy, "static") is False
    assert asv_sizes.SIZES["default"].own_process(toy, "dynamic") is True  # a regime case: always
    mixed = dataclasses.replace(asv_sizes.SIZES["smoke"], fresh_process=True, preset_fresh_process=False)
    assert mixed.own_process(toy, "static") is True and mixed.own_process(preset, "static") is False
    assert asv_sizes.SIZES["smoke"].own_process(preset, "static") is True
    assert asv_sizes.SIZES["gpu"].own_process(toy, "static") is False
    # the default size leaves the reference out of the presets, with the reason
    reference = __import__("attention_impls").get("reference-float64")
    why = asv_suite.outside_suite(reference, preset, "static", asv_sizes.SIZES["default"])
    assert "yardstick" in why and asv_suite.outside_suite(reference, preset, "static",
                                                          asv_sizes.SIZES["full"]) is None


def test_each_asv_environment_runs_only_the_parameter_combinations_it_can(monkeypatch):
    import itertools
    import re
    import sys

    from attnbench.asv import selection as asv_selection

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import attention as suite_module

    size = asv_sizes.SIZES["default"]

    def kept(frameworks):
        regexes = asv_selection.selection(suite_module.MEASURED, frameworks, size, "cpu")
        return {asv_selection._asv_name(f"attention.{cls.__name__}.track_mfu", p)
                for cls in suite_module.MEASURED for p in itertools.product(*cls.params)
                if any(re.search(r, asv_selection._asv_name(f"attention.{cls.__name__}.track_mfu", p))
                       for r in regexes)}

    main, xla = kept(asv_selection.MAIN_FRAMEWORKS), kept(asv_selection.XLA_FRAMEWORKS)
    assert "attention.Forward.track_mfu('jax-xla', 1024, 'dynamic', 'float32')" in main
    assert "attention.Forward.track_mfu('jax-xla', 256, 'dynamic', 'float32')" not in main  # regimes at 1024
    assert "attention.Forward.track_mfu('jax-pallas-tpu-flash', 256, 'static', 'float32')" in main
    assert "attention.Forward.track_mfu('jax-pallas-tpu-flash', 1024, 'static', 'float32')" not in main
    assert "attention.Forward.track_mfu('jax-cudnn', 1024, 'static', 'float32')" not in main  # no GPU here
    assert not [n for n in main if "torch-xla" in n] and xla and all("torch-xla" in n for n in xla)
    # on an accelerator host nothing is guessed about the device: the GPU kernels stay selected
    gpu = asv_selection.selection(suite_module.MEASURED, asv_selection.MAIN_FRAMEWORKS, size, "gpu")
    cudnn = "attention.Forward.track_mfu('jax-cudnn', 1024, 'static', 'float32')"
    assert any(re.search(r, cudnn) for r in gpu)


def test_each_virtualenv_gets_a_config_of_its_own_with_the_same_environment(tmp_path):
    import shutil

    from attnbench.asv import selection as asv_selection

    shutil.copy(os.path.join(ROOT, "asv.conf.json"), tmp_path / "asv.conf.json")
    configs = asv_selection.env_configs(str(tmp_path / "asv.conf.json"))
    assert [fw for _, fw in configs] == [asv_selection.MAIN_FRAMEWORKS, asv_selection.XLA_FRAMEWORKS]
    for path, _ in configs:
        config = json.loads(open(path).read())
        assert len(config["include"]) == 1 and config["results_dir"] == "results"
    assert asv_selection._user_selects(["-b", "Training"]) and not asv_selection._user_selects(["--quick"])


def test_existing_environments_run_at_the_commit_with_their_own_selection(monkeypatch):
    from attnbench.asv import selection as asv_selection

    calls = []
    monkeypatch.setattr(asv_selection, "run_asv", lambda command, env: calls.append(command) or 0)
    monkeypatch.setattr(asv_selection, "existing_frameworks", lambda python: asv_selection.MAIN_FRAMEWORKS)
    asv_selection.run("cpu-2core", ["/py/a"], "c" * 40, ["--show-stderr"])
    [command] = calls
    at = command.index("-E")
    assert command[at:at + 4] == ["-E", "existing:/py/a", "--set-commit-hash", "c" * 40]
    assert "--show-stderr" in command and command.count("-b") == 3  # Forward, Training, Models
    calls.clear()
    asv_selection.run("cpu-2core", ["/py/a"], "c" * 40, ["-b", "Training"])  # the user's own choice
    assert calls[0].count("-b") == 1 and calls[0][-1] == "Training"
