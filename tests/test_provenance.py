"""Every figure means what its name says: labels recorded at measurement time (not recomputed), an
asv process that initialises no device, the suite's dtypes and their peaks, provenance beside each
result, unknown CPU prices, and sidecars that asv never mistakes for results.

Expected values here are written out by hand (a hand-made asv result tree, a hand-written sidecar),
never computed by the code under test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.asv import sidecar
from attnbench.asv import sizes as asv_sizes
from attnbench.asv import suite as asv_suite
from attnbench.core import presets, records
from attnbench.hardware import Attached, Device, accelerator_present, load_hardware_profiles
from attnbench.run import plan
from attnbench.run.worker import Failure
from tests.conftest import FRAMEWORKS

ROOT = Path(__file__).resolve().parents[1]
MAIN_ENV = pytest.mark.skipif("jax" not in FRAMEWORKS or "torch" not in FRAMEWORKS,
                              reason="the asv suite's tests run in the main venv")
ENV = "virtualenv-py3.11-test"
COLUMNS = ["result", "params", "version", "started_at", "duration"]
FORWARD_PARAMS = ["implementation", "seq_len", "regime", "dtype"]


# -- a hand-made asv result tree ------------------------------------------------------------------
def write_tree(results: Path, machine: str, commit: str, rows: dict[str, float], *, date_ms: int,
               seq_len: int = 256) -> None:
    """``results/benchmarks.json`` + ``<machine>/machine.json`` + one result file: Forward,
    ``seconds_per_step`` only, static float32 at one length, one value per implementation."""
    impls = list(rows)
    params = [[repr(i) for i in impls], [repr(seq_len)], [repr("static")], [repr("float32")]]
    name = "attention.Forward.track_seconds_per_step"
    results.mkdir(parents=True, exist_ok=True)
    (results / "benchmarks.json").write_text(json.dumps(
        {name: {"name": name, "param_names": FORWARD_PARAMS, "params": params, "type": "track",
                "unit": "seconds", "version": "1"}, "version": 2}))
    folder = results / machine
    folder.mkdir(exist_ok=True)
    (folder / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    payload = {"commit_hash": commit, "env_name": ENV, "date": date_ms, "params": {"machine": machine},
               "python": "3.11", "requirements": {}, "result_columns": COLUMNS, "version": 2,
               "results": {name: [[rows[i] for i in impls], params, "1", date_ms, 1.0]}}
    (folder / f"{commit[:8]}-{ENV}.json").write_text(json.dumps(payload))


def entry(label, execution, platform, device, status="ok"):
    return {"label": label, "execution": execution, "platform": platform, "device": device,
            "status": status, "reason": None}


def load(results: Path):
    from attnbench.results.asv_results import load_results

    frame = load_results(str(results), repo=str(results))  # no git there: commits by date
    return frame[frame["metric"] == "seconds_per_step"].set_index("implementation")


# -- 5. labels recorded, not recomputed ------------------------------------------------------------
def test_labels_come_from_the_sidecar_and_old_results_say_recomputed(tmp_path):
    pytest.importorskip("pandas")
    results = tmp_path / "results"
    old, new = "a" * 40, "b" * 40
    write_tree(results, "h200", old, {"torch-xla-blockwise-flash": 0.004, "torch-xla-sdpa": 0.002},
               date_ms=1_000)
    frame = load(results)
    # No sidecar: today's answer for the machine's platform (a GPU, from the name), said to be so.
    assert frame.loc["torch-xla-blockwise-flash", "label"] == "native"
    assert frame.loc["torch-xla-blockwise-flash", "platform"] == "gpu"
    assert (frame["labels_source"] == "recomputed").all()

    write_tree(results, "h200", new, {"torch-xla-blockwise-flash": 0.004, "torch-xla-sdpa": 0.002},
               date_ms=2_000)
    # What the engine saw: torch_xla has no GPU build on PyPI, so on the H200 it ran on PJRT CPU.
    sidecar.write(str(results), "h200", new, ENV, versions={"torch_xla": "2.9.0"},
                  settings={"suite": "default"},
                  cases={"Forward|torch-xla-blockwise-flash|256|static|float32":
                         entry("forced-flash", "compiled", "cpu", "AMD EPYC"),
                         "Forward|torch-xla-sdpa|256|static|float32":
                         entry("native", "compiled", "cpu", "AMD EPYC")})
    frame = load(results)
    newest = frame[frame["commit_hash"] == new]
    assert newest.loc["torch-xla-blockwise-flash", "label"] == "forced-flash"
    assert newest.loc["torch-xla-blockwise-flash", "platform"] == "cpu"
    assert newest.loc["torch-xla-blockwise-flash", "machine_platform"] == "gpu"
    assert newest.loc["torch-xla-blockwise-flash", "device"] == "AMD EPYC"
    assert (newest["labels_source"] == "recorded").all()
    assert (frame[frame["commit_hash"] == old]["labels_source"] == "recomputed").all()
    assert newest.loc["torch-xla-sdpa", "version_torch_xla"] == "2.9.0"
    assert newest.loc["torch-xla-sdpa", "setting_suite"] == "default"

    from attnbench.report import best_native_vs_forced

    best = best_native_vs_forced(frame.reset_index().assign(metric="seconds_per_step")).iloc[0]
    assert (best["best_native"], best["best_forced"]) == ("torch-xla-sdpa", "torch-xla-blockwise-flash")
    assert best["forced_ms_per_step"] == pytest.approx(4.0)


def test_an_interpreted_kernel_is_never_the_best_forced_flash_or_native(tmp_path):
    pytest.importorskip("pandas")
    from attnbench.report import best_native_vs_forced
    from attnbench.report.select import interpreted_runs

    results = tmp_path / "results"
    commit = "c" * 40
    # The interpreted Pallas kernels are the fastest of their labels here, on purpose.
    write_tree(results, "cpu-2core", commit,
               {"torch-sdpa-flash": 0.002, "jax-pallas-gpu-mha": 0.001,
                "torch-blockwise-flash": 0.003, "jax-pallas-tpu-flash": 0.0005}, date_ms=1_000)
    sidecar.write(str(results), "cpu-2core", commit, ENV, versions={}, settings={}, cases={
        "Forward|torch-sdpa-flash|256|static|float32": entry("native", "eager", "cpu", "AMD EPYC"),
        "Forward|jax-pallas-gpu-mha|256|static|float32": entry("native", "interpret", "cpu", "AMD EPYC"),
        "Forward|torch-blockwise-flash|256|static|float32": entry("forced-flash", "eager", "cpu", "AMD EPYC"),
        "Forward|jax-pallas-tpu-flash|256|static|float32":
            entry("forced-flash", "interpret", "cpu", "AMD EPYC")})
    frame = load(results)
    assert frame.loc["jax-pallas-tpu-flash", "category"] == "interpreted"
    assert frame.loc["torch-blockwise-flash", "category"] == "forced-flash"
    best = best_native_vs_forced(frame.reset_index()).iloc[0]
    assert best["best_native"] == "torch-sdpa-flash" and best["native_ms_per_step"] == pytest.approx(2.0)
    assert best["best_forced"] == "torch-blockwise-flash" and best["forced_ms_per_step"] == pytest.approx(3.0)
    interpreted = interpreted_runs(frame.reset_index())
    assert sorted(interpreted["implementation"]) == ["jax-pallas-gpu-mha", "jax-pallas-tpu-flash"]


def test_without_a_sidecar_interpreted_kernels_are_still_their_own_category(tmp_path):
    pytest.importorskip("pandas")
    from attnbench.report import best_native_vs_forced

    results = tmp_path / "results"
    write_tree(results, "cpu-2core", "d" * 40,
               {"torch-blockwise-flash": 0.003, "jax-pallas-tpu-flash": 0.0005}, date_ms=1_000)
    frame = load(results)
    # jax-pallas-tpu-flash runs on a CPU only in the TPU interpreter (the support matrix says so)
    assert frame.loc["jax-pallas-tpu-flash", "execution"] == "interpret"
    assert frame.loc["jax-pallas-tpu-flash", "labels_source"] == "recomputed"
    assert best_native_vs_forced(frame.reset_index()).iloc[0]["best_forced"] == "torch-blockwise-flash"


def test_the_legacy_versions_sidecar_is_still_read(tmp_path):
    pytest.importorskip("pandas")
    results = tmp_path / "results"
    commit = "e" * 40
    write_tree(results, "cpu-2core", commit, {"jax-xla": 0.05}, date_ms=1_000)
    legacy = results / "cpu-2core" / "versions" / f"{commit[:8]}-{ENV}.json"
    legacy.parent.mkdir()
    legacy.write_text(json.dumps({"versions": {"jax": "9.9.9"}, "settings": {"compile_cache": "warm"}}))
    frame = load(results)
    assert frame.loc["jax-xla", "version_jax"] == "9.9.9"
    assert frame.loc["jax-xla", "setting_compile_cache"] == "warm"


def test_sidecar_writes_merge_the_cases_of_both_benchmark_classes(tmp_path):
    first = sidecar.write(str(tmp_path), "m", "f" * 40, ENV, versions={"jax": "1"}, settings={"suite": "x"},
                          cases={"Forward|a|256|static|float32": entry("native", "compiled", "cpu", "c")})
    second = sidecar.write(str(tmp_path), "m", "f" * 40, ENV, versions={"jax": "2"}, settings={"suite": "y"},
                           cases={"Training|a|512|static|float32": entry("native", "compiled", "cpu", "c")})
    assert first == second == str(tmp_path / "m" / "sidecars" / f"ffffffff-{ENV}.sidecar")
    data = json.loads(Path(second).read_text())
    assert sorted(data["cases"]) == ["Forward|a|256|static|float32", "Training|a|512|static|float32"]
    assert data["versions"] == {"jax": "2"} and data["settings"] == {"suite": "y"}


def test_the_sidecar_records_contention_and_the_timing_interval_per_case(tmp_path):
    """What the engine recorded about the case's timing reaches the tidy rows of the metrics that
    depend on time, with asv's own intervals and quartiles; older sidecars read as unknown."""
    pd = pytest.importorskip("pandas")
    from attnbench.results.asv_results import load_results

    record = {"label": "native", "execution": "eager", "platform": "cpu", "device": "AMD EPYC",
              "status": "ok", "reason": None, "contended": True,
              "contention_reason": "other processes used 0.8 cores", "ci_low_s": 0.0019, "ci_high_s": 0.0023,
              "ci_basis": "rounds", "ci_coverage": 0.75, "rounds": 3, "seconds_per_step": 0.002,
              "mask": "causal+window(256)", "gqa": "native", "flops": 1.5e9, "ci_confidence": 0.99,
              "ci_method": "range of 3 round medians: 75.0% coverage, too few values for 99% (it needs 8)",
              "round_medians_s": "[0.0019, 0.002, 0.0023]", "round_ids": "[0, 1, 2]",
              "control_round_medians_s": None, "control_round_ids": None, "rounds_stopped": "settled",
              "config": "block_q=256,block_k=256", "config_source": "tuned",
              "defaults_round_medians_s": "[0.0021, 0.0022]", "defaults_round_ids": "[1, 2]"}
    recorded = sidecar.case_entry(record)
    assert recorded == {"label": "native", "execution": "eager", "platform": "cpu", "device": "AMD EPYC",
                     "status": "ok", "reason": None, "contended": True,
                     "contention_reason": "other processes used 0.8 cores", "ci_low_s": 0.0019,
                     "ci_high_s": 0.0023, "ci_basis": "rounds", "ci_coverage": 0.75, "rounds": 3,
                     "mask": "causal+window(256)", "gqa": "native", "flops": 1.5e9, "ci_confidence": 0.99,
                     "ci_method": record["ci_method"], "round_medians_s": [0.0019, 0.002, 0.0023],
                     "round_ids": [0, 1, 2], "control_round_medians_s": None, "control_round_ids": None,
                     "rounds_stopped": "settled", "phase_seconds": None, "contended_rounds": None,
                     "config": "block_q=256,block_k=256", "config_source": "tuned",
                     "defaults_round_medians_s": [0.0021, 0.0022], "defaults_round_ids": [1, 2],
                     "price_kind": None,  # a record without a price: what it buys is unknown
                     **dict.fromkeys(sidecar.STREAM_FIELDS)}  # a record without a stream: unknown
    assert sidecar.case_entry({**record, "ci_low_s": float("nan"), "rounds": None})["ci_low_s"] is None
    streamed = sidecar.case_entry({**record, "traffic": "azure-code", "latency_p99_s": 0.01,
                                   "window_seconds": "[0.5, 0.25]"})
    assert (streamed["traffic"], streamed["latency_p99_s"], streamed["window_seconds"]) == \
        ("azure-code", 0.01, [0.5, 0.25])

    results = tmp_path / "results"
    new, old = "c" * 40, "d" * 40
    columns = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
               "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
    params = [["'torch-sdpa-flash'"], ["256"], ["'static'"], ["'float32'"]]
    bench = {}
    for metric, unit in (("seconds_per_step", "seconds"), ("host_rss_growth_bytes", "bytes")):
        name = f"attention.Forward.track_{metric}"
        bench[name] = {"name": name, "param_names": FORWARD_PARAMS, "params": params, "type": "track",
                       "unit": unit, "version": "1"}
    results.mkdir()
    (results / "benchmarks.json").write_text(json.dumps({**bench, "version": 2}))
    (results / "cpu-2core").mkdir()
    (results / "cpu-2core" / "machine.json").write_text(json.dumps({"machine": "cpu-2core", "version": 1}))
    for commit, date in ((old, 1_000), (new, 2_000)):
        payload = {"commit_hash": commit, "env_name": ENV, "date": date, "params": {"machine": "cpu-2core"},
                   "python": "3.11", "requirements": {}, "result_columns": columns, "version": 2, "results": {
                       "attention.Forward.track_seconds_per_step":
                           [[0.002], params, "1", date, 1.0, [0.0018], [0.0024], [0.0019], [0.0022],
                            [1], [30], None, None],
                       "attention.Forward.track_host_rss_growth_bytes": [[4096.0], params, "1", date, 1.0]}}
        (results / "cpu-2core" / f"{commit[:8]}-{ENV}.json").write_text(json.dumps(payload))
    sidecar.write(str(results), "cpu-2core", new, ENV, versions={}, settings={"definitions": "2"},
                  cases={"Forward|torch-sdpa-flash|256|static|float32": recorded})
    sidecar.write(str(results), "cpu-2core", old, ENV, versions={}, settings={},  # an older sidecar
                  cases={"Forward|torch-sdpa-flash|256|static|float32":
                         entry("native", "eager", "cpu", "AMD EPYC")})
    frame = load_results(str(results), repo=str(results)).set_index(["commit_hash", "metric"])
    timed = frame.loc[(new, "seconds_per_step")]
    assert (timed["ci_low"], timed["ci_high"]) == (0.0018, 0.0024)
    assert (timed["q_25"], timed["q_75"]) == (0.0019, 0.0022)
    assert timed["contended"] is True and timed["contention_reason"] == "other processes used 0.8 cores"
    assert (timed["case_ci_low_s"], timed["case_ci_high_s"], timed["rounds"]) == (0.0019, 0.0023, 3)
    assert timed["case_ci_method"].startswith("range of 3 round medians")
    # the rounds by id, on the step time's row: the verdict pairs two kernels of one round with them
    assert json.loads(timed["round_ids"]) == [0, 1, 2] and json.loads(timed["round_medians_s"])[2] == 0.0023
    assert timed["setting_definitions"] == "2"
    untimed = frame.loc[(new, "host_rss_growth_bytes")]  # memory is not timed: contention says nothing
    assert untimed["contended"] is None and pd.isna(untimed["ci_low"]) and pd.isna(untimed["case_ci_low_s"])
    older = frame.loc[(old, "seconds_per_step")]
    assert older["contended"] is None and pd.isna(older["case_ci_low_s"]) and pd.isna(older["rounds"])
    assert older["labels_source"] == "recorded"
    commits = frame.reset_index().drop_duplicates("commit_hash").sort_values("commit_order")
    assert list(commits["commit_hash"]) == [old, new]  # no git there: by the dates asv recorded
    assert set(commits["commit_order_source"]) == {"date"}


# -- 8. sidecars where asv publish does not load them ----------------------------------------------
@pytest.mark.asv
def test_asv_never_iterates_a_sidecar(tmp_path, monkeypatch):
    """On a copy of the committed results, plus a sidecar written by today's writer: asv's own
    iteration of result files (what `asv publish` loads) yields result files only, with no
    "could not load .../machine.json" warning (the old versions/*.json sidecars gave one, and so
    did a sweep's run-args.json under results/runs/ until it became run-args.txt)."""
    pytest.importorskip("pandas")
    import asv.results

    from attnbench.results.asv_results import load_results

    results = tmp_path / "results"
    shutil.copytree(ROOT / "results", results)
    commit = "0123456789abcdef0123456789abcdef01234567"
    sidecar.write(str(results), "cpu-2core", commit, ENV, versions={}, settings={}, cases={})
    frame = load_results(str(results), repo=str(ROOT))
    assert len(frame) > 0
    assert not (results / "cpu-2core" / "versions").exists(), "sidecars still in versions/*.json"
    warned = []
    monkeypatch.setattr(asv.results.log, "warning", lambda message, *a, **k: warned.append(message))
    yielded = list(asv.results.iter_results_paths(str(results)))
    assert yielded and not warned, warned
    files = sorted(os.path.join(root, name) for root, name, _ in yielded)
    # the measured suite's result files, and the release matrix's (asv publish shows its series too)
    patterns = ("*/*.json", "releases/asv/*/*.json")
    expected = sorted(str(p) for pattern in patterns for p in results.glob(pattern)
                      if p.name != "machine.json")
    assert files == expected
    assert not [f for f in files if "sidecar" in f or os.sep + "versions" + os.sep in f]


# -- 7. the asv process initialises no device -------------------------------------------------------
PLAN = """
import json, os, sys
from attnbench.asv import sizes as asv_sizes
from attnbench.asv import suite as asv_suite
F = asv_sizes.FORWARD
cases = [("jax-cudnn", F, "static"), ("torch-xla-sdpa", F, "static"), ("jax-pallas-tpu-flash", F, "static"),
         ("reference-float64", F.replace(seq_q=128, seq_k=128), "static")]  # the one case measured
out = asv_suite.measure_suite(cases, benchmark="Forward")
print(json.dumps({"status": {k.split("|")[0]: v["status"] for k, v in out.items()},
                  "reason": {k.split("|")[0]: v["reason"] for k, v in out.items()},
                  "machine": asv_suite.machine_name(), "dtypes": list(asv_sizes.suite_dtypes()),
                  "loaded": sorted(m for m in ("jax", "jaxlib", "torch", "torch_xla") if m in sys.modules)}))
"""


@MAIN_ENV
@pytest.mark.asv
def test_the_asv_process_imports_no_framework_while_planning_and_measuring():
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATTNBENCH_MACHINE", "ACCEL", "ATTNBENCH_ACCEL", "ATTNBENCH_IMPLS")}
    env.update(ATTNBENCH_SUITE="default")
    proc = subprocess.run([sys.executable, "-c", PLAN], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["loaded"] == [], f"the asv process imported {answer['loaded']}"
    assert answer["status"] == {"jax-cudnn": "unsupported", "torch-xla-sdpa": "unsupported",
                                "jax-pallas-tpu-flash": "unsupported", "reference-float64": "ok"}
    assert "cuDNN needs an NVIDIA GPU" in answer["reason"]["jax-cudnn"]
    assert "runs only in an interpreter here" in answer["reason"]["jax-pallas-tpu-flash"]
    assert answer["machine"] == f"cpu-{len(os.sched_getaffinity(0))}core"
    assert answer["dtypes"] == ["float32"]


@MAIN_ENV
def test_planning_sends_only_this_environments_cases_to_the_check(monkeypatch):
    asked, real_ask = [], plan.ask_in_worker

    def ask(task, cases, size):
        asked.extend(case.impl for case in cases)
        return [{"reason": None}, {"reason": "not here"}]

    monkeypatch.setattr(plan, "ask_in_worker", ask)
    smoke = asv_sizes.SIZES["smoke"]
    out, to_run = asv_suite.plan_cases([("jax-xla", asv_sizes.FORWARD, "static"),
                                        ("torch-xla-sdpa", asv_sizes.FORWARD, "static"),
                                        ("jax-cudnn", asv_sizes.FORWARD, "static")], smoke)
    assert asked == ["jax-xla", "jax-cudnn"]
    assert [case.impl for case in to_run] == ["jax-xla"]
    assert to_run[0].options == smoke.options("static", trace_dir=None, compile_cache="cold")
    assert {k.split("|")[0]: (v["status"], v["reason"]) for k, v in out.items()} == {
        "torch-xla-sdpa": ("unsupported", "torch_xla is measured in the other asv environment"),
        "jax-cudnn": ("unsupported", "not here")}
    monkeypatch.setattr(plan, "ask_in_worker", real_ask)
    monkeypatch.setattr(plan, "Worker", _SilentWorker)  # a check that gives no answer in time
    failed, to_run = asv_suite.plan_cases([("jax-xla", asv_sizes.FORWARD, "static")], smoke)
    assert to_run == [] and [r["status"] for r in failed.values()] == ["error"]
    assert "the support check failed: no answer within 600 s" in next(iter(failed.values()))["reason"]


class _SilentWorker:
    def __init__(self, task, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def call(self, args, timeout_s, preload=(), deadline=None):
        return None, Failure(records.TIMEOUT, f"no result within {timeout_s:g} s; worker killed")


def test_device_files_say_which_accelerator_is_attached(tmp_path):
    dev, pci = tmp_path / "dev", tmp_path / "pci"
    dev.mkdir()
    pci.mkdir()

    def pci_device(slot, vendor, device):
        (pci / slot).mkdir()
        (pci / slot / "vendor").write_text(vendor + "\n")
        (pci / slot / "device").write_text(device + "\n")

    assert accelerator_present(str(dev), str(pci)) is None
    pci_device("0000:00:04.0", "0x1ae0", "0x0042")  # Google's gVNIC: a NIC, not a TPU
    pci_device("0000:00:05.0", "0x8086", "0x0063")
    assert accelerator_present(str(dev), str(pci)) is None
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    assert accelerator_present(str(dev), str(pci)) == Attached("gpu", 2)
    for slot in ("0000:00:06.0", "0000:00:07.0", "0000:00:08.0", "0000:00:09.0"):
        pci_device(slot, "0x1ae0", "0x0063")
    assert accelerator_present(str(dev), str(pci)) == Attached("tpu", 4, "v5e")


def test_the_suite_runs_bfloat16_on_accelerators(monkeypatch):
    assert asv_sizes.suite_dtypes(asv_sizes.SIZES["default"], "cpu") == ("float32",)
    assert asv_sizes.suite_dtypes(asv_sizes.SIZES["full"], "cpu") == ("float32", "bfloat16")
    for size in asv_sizes.SIZES.values():
        assert asv_sizes.suite_dtypes(size, "gpu") == ("bfloat16", "float32")  # the first is Training's
        assert asv_sizes.suite_dtypes(size, "tpu") == ("bfloat16",)
    monkeypatch.delenv("ATTNBENCH_ACCEL", raising=False)
    for accel, kind in (("cuda", "gpu"), ("tpu", "tpu"), ("cpu", "cpu")):
        monkeypatch.setenv("ACCEL", accel)
        assert asv_sizes.accelerator_kind() == kind
    monkeypatch.setenv("ACCEL", "rocm")
    with pytest.raises(ValueError, match="ACCEL must be one of"):
        asv_sizes.accelerator_kind()


# Training runs bfloat16 on a GPU: FlashAttention-2 and cuDNN refuse float32 (no forced kernel would run).
@pytest.mark.parametrize("accel, forward, training", [("cuda", ["bfloat16", "float32"], "bfloat16"),
                                                      ("tpu", ["bfloat16"], "bfloat16")])
def test_the_benchmarks_take_their_dtypes_from_accel_without_a_framework(accel, forward, training):
    env = {**os.environ, "ACCEL": accel, "ATTNBENCH_SUITE": "default"}
    env.pop("ATTNBENCH_ACCEL", None)
    code = ("import json, sys; import benchmarks.attention as b; "
            "print(json.dumps([b.Forward.params[3], b.Training.workload(512).dtype, "
            "[m for m in ('jax', 'torch') if m in sys.modules]]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [forward, training, []]


def test_every_accelerator_profile_has_a_peak_for_each_dtype_the_suite_runs_on_it():
    profiles = load_hardware_profiles()
    missing = []
    for profile in profiles.values():
        if profile.kind == "cpu":
            continue
        for size, suite_size in asv_sizes.SIZES.items():
            for dtype in asv_sizes.suite_dtypes(suite_size, profile.kind):
                if profile.peak(dtype) is None:
                    missing.append(f"{profile.name} {dtype} ({size} suite)")
    assert not missing, f"no peak (so no MFU) for: {', '.join(sorted(set(missing)))}"
    # and the suite runs on them what the TOML was filled for
    assert {d for p in profiles.values() if p.kind == "gpu" for d in p.peak_tflops} >= {"bf16", "fp32"}


# -- 8. provenance: the suite and its settings, beside each result and in the report ----------------
def test_the_sidecar_records_the_suite_and_its_settings(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_SUITE", "full")
    monkeypatch.setenv("ATTNBENCH_COMPILE_CACHE", "warm")
    monkeypatch.setenv("ACCEL", "cpu")
    settings = asv_suite.provenance_settings()
    assert settings["suite"] == "full" and settings["compile_cache"] == "warm"
    assert settings["forward_seqs"] == "256,512,1024,2048,4096,8192"
    assert settings["dtypes"] == "float32,bfloat16"
    assert (settings["min_seconds"], settings["max_extra_seconds"]) == (0.5, 3.0)
    assert settings["regime_seqs"] == "every length" and settings["max_interpret_seq"] == "no limit"
    assert settings["case_timeout_s"] == 600.0
    assert settings["definitions"] == "7"  # metrics.DEFINITION_CHANGES of this release
    assert settings["timer"] == "wall"  # the suite's "device" timer is a CPU's wall clock
    assert settings["model_presets"] == ",".join(presets.PRESETS) and settings["preset_size"] == "real"
    for value in settings.values():  # one scalar cell each in the tidy table
        assert isinstance(value, (str, int, float))


def test_the_report_shows_the_recorded_suite_and_which_labels_were_recomputed(tmp_path):
    pytest.importorskip("matplotlib")
    from attnbench.report import write_report

    results = tmp_path / "results"
    old, new = "1" * 40, "2" * 40
    write_tree(results, "cpu-2core", old, {"torch-sdpa-flash": 0.002}, date_ms=1_000)
    write_tree(results, "cpu-2core", new, {"torch-sdpa-flash": 0.002}, date_ms=2_000)
    sidecar.write(str(results), "cpu-2core", new, ENV, versions={},
                  settings={"suite": "full", "compile_cache": "cold", "min_seconds": 0.5},
                  cases={"Forward|torch-sdpa-flash|256|static|float32":
                         entry("native", "eager", "cpu", "AMD EPYC")})
    md = Path(write_report(str(results), str(tmp_path / "out"), repo=str(tmp_path)).markdown).read_text()
    section = md.split("## Provenance", 1)[1].split("\n## ", 1)[0]
    lines = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("|")]
    header, rows = lines[0], [dict(zip(lines[0], cells, strict=True)) for cells in lines[2:]]
    assert header[:4] == ["machine", "env", "commit", "labels"]
    assert [(r["commit"], r["labels"], r["suite"], r["min_seconds"]) for r in rows] == [
        ("11111111", "recomputed", "-", "-"), ("22222222", "recorded", "full", "0.5")]
    assert "Labels recomputed, not recorded" in section
    assert "11111111" in section.split("Labels recomputed")[1] and "22222222" not in section.split(
        "Labels recomputed")[1]


# -- 8. an unknown CPU is not priced as the first CPU row -----------------------------------------
def test_a_made_up_cpu_gets_an_unknown_price():
    from attnbench.measure import cost

    made_up = Device("cpu", "Frobnitz Q9000 Made-Up CPU", 1, "Frobnitz Q9000 Made-Up CPU", 4)
    pricing = cost.pricing_for(made_up)
    assert pricing.hardware_profile is None and pricing.on_demand_usd_per_hour is None
    out = cost.cost_per_step(0.01, pricing, tokens_per_step=1024)
    assert out["usd_per_step_on_demand"] is None
    assert out["cost_note"].startswith("unknown: no price for Frobnitz Q9000 Made-Up CPU")
    epyc = cost.pricing_for(Device("cpu", "AMD EPYC 7B13", 1, "AMD EPYC 7B13", 4))
    assert epyc.hardware_profile == "cpu" and epyc.on_demand_usd_per_hour == pytest.approx(4 * 0.0474)


@MAIN_ENV
@pytest.mark.slow
def test_with_an_accelerator_attached_the_frameworks_name_the_machine_in_another_process():
    """A GPU/TPU device file and no ATTNBENCH_MACHINE: `attnbench machine-name` runs as a process of
    its own (here, on a CPU host, it answers cpu-<cores>core) and this one imports no framework."""
    code = ("import json, sys; from attnbench.asv import suite as asv_suite; "
            "from attnbench.hardware import detection; "
            "detection.accelerator_present = lambda: detection.Attached('gpu', 1); "
            "print(json.dumps([asv_suite.machine_name(), "
            "[m for m in ('jax', 'torch', 'torch_xla') if m in sys.modules]]))")
    env = {k: v for k, v in os.environ.items() if k != "ATTNBENCH_MACHINE"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [f"cpu-{len(os.sched_getaffinity(0))}core", []]


# -- 9. the host each run ran on -----------------------------------------------------------------------
def test_the_host_fingerprint_names_the_host_and_carries_the_runs_probe(tmp_path):
    import subprocess as sp

    from attnbench.core import host_identity
    from attnbench.hardware import fingerprint

    probes = tmp_path / "probes"
    probes.mkdir()
    probe = {"framework": "torch", "dtype": "fp32", "size": 1024, "threads": 2, "best_tflops": 0.2,
             "median_tflops": 0.19, "rounds": 3}
    (probes / "gemm-0123.json").write_text(json.dumps(probe))

    def smi(cmd, **_kwargs):
        assert cmd[1] == "--query-gpu=name,driver_version"
        return sp.CompletedProcess(cmd, 0, stdout="NVIDIA H200, 580.159.04\nNVIDIA H200, 580.159.04\n")

    found = fingerprint.host_fingerprint(str(probes), which=lambda _n: "/usr/bin/nvidia-smi", run=smi)
    assert set(found) == set(host_identity.IDENTITY) | set(host_identity.PROBE)
    assert (found["accelerator"], found["driver"]) == ("2 x NVIDIA H200", "580.159.04")
    assert (found["gemm_peak_tflops"], found["gemm_median_tflops"]) == (0.2, 0.19)
    assert found["usable_cores"] >= 1 and found["cpu_model"]
    assert found["cpu_flags"] is None or "flags, sha256 " in found["cpu_flags"]
    plain = fingerprint.host_fingerprint(None, which=lambda _n: None)
    assert plain["gemm_peak_tflops"] is None and plain["driver"] is None
    # the probe measures the host, it does not name it
    assert host_identity.identity(plain) == host_identity.identity(dict(plain, gemm_peak_tflops=9.9))
    assert host_identity.identity({}) is None


def test_the_sidecar_keeps_the_host_and_the_loader_gives_it_columns(tmp_path):
    results = tmp_path / "results"
    commit = "3" * 40
    write_tree(results, "cpu-2core", commit, {"torch-sdpa-flash": 0.002}, date_ms=1_000)
    host = {"cpu_model": "AMD EPYC", "usable_cores": 2, "gemm_peak_tflops": 0.19, "driver": None}
    sidecar.write(str(results), "cpu-2core", commit, ENV, versions={}, settings={}, cases={}, host=host)
    # a later class's process could not read the probe: what was recorded stays
    sidecar.write(str(results), "cpu-2core", commit, ENV, versions={}, settings={}, cases={},
                  host=dict(host, gemm_peak_tflops=None))
    assert sidecar.read(str(results), "cpu-2core", commit, ENV)["host"]["gemm_peak_tflops"] == 0.19
    row = load(results).loc["torch-sdpa-flash"]
    assert (row["host_cpu_model"], row["host_usable_cores"]) == ("AMD EPYC", 2)
    assert row["host_gemm_peak_tflops"] == 0.19


def test_a_models_row_finds_its_sidecar_entry_and_the_report_tables_it_per_workload(tmp_path):
    """Models has no length parameter: its sidecar key is ``<preset>:<phase>``, and the loaded rows
    carry ``workload`` and ``phase`` for the report's per-workload section."""
    pytest.importorskip("pandas")
    from attnbench.report import workload_tables

    results = tmp_path / "results"
    commit = "c" * 40
    impls, phases = ["jax-xla", "jax-blockwise-flash"], ["prefill", "decode"]
    params = [[repr(i) for i in impls], [repr("mistral-7b")], [repr(p) for p in phases]]
    name = "attention.Models.track_seconds_per_step"
    results.mkdir(parents=True)
    (results / "benchmarks.json").write_text(json.dumps(
        {name: {"name": name, "param_names": ["implementation", "workload", "phase"], "params": params,
                "type": "track", "unit": "seconds", "version": "1"}, "version": 2}))
    (results / "cpu-2core").mkdir()
    (results / "cpu-2core" / "machine.json").write_text(json.dumps({"machine": "cpu-2core", "version": 1}))
    # impl-major, then preset, then phase: jax-xla prefill, decode; blockwise prefill, decode
    values = [0.010, 0.002, 0.030, 0.001]
    payload = {"commit_hash": commit, "env_name": ENV, "date": 1_000, "params": {"machine": "cpu-2core"},
               "python": "3.11", "requirements": {}, "result_columns": COLUMNS, "version": 2,
               "results": {name: [values, params, "1", 1_000, 1.0]}}
    (results / "cpu-2core" / f"{commit[:8]}-{ENV}.json").write_text(json.dumps(payload))
    sidecar.write(str(results), "cpu-2core", commit, ENV, versions={}, settings={"suite": "default"},
                  cases={"Models|jax-xla|mistral-7b:prefill|static|float32":
                         entry("native", "compiled", "cpu", "AMD EPYC"),
                         "Models|jax-xla|mistral-7b:decode|static|float32":
                         dict(entry("native", "compiled", "cpu", "AMD EPYC"), price_kind="instance"),
                         "Models|jax-blockwise-flash|mistral-7b:prefill|static|float32":
                         entry("forced-flash", "compiled", "cpu", "AMD EPYC"),
                         "Models|jax-blockwise-flash|mistral-7b:decode|static|float32":
                         entry("forced-flash", "compiled", "cpu", "AMD EPYC")})
    from attnbench.results.asv_results import load_results

    frame = load_results(str(results), repo=str(results))
    rows = frame[frame["metric"] == "seconds_per_step"]
    assert set(rows["labels_source"]) == {"recorded"}
    assert set(zip(rows["implementation"], rows["phase"], rows["label"], strict=True)) == {
        ("jax-xla", "prefill", "native"), ("jax-xla", "decode", "native"),
        ("jax-blockwise-flash", "prefill", "forced-flash"), ("jax-blockwise-flash", "decode", "forced-flash")}
    table = workload_tables(frame)["mistral-7b"]
    assert list(zip(table["phase"], table["implementation"], strict=True)) == [
        ("prefill", "jax-xla"), ("prefill", "jax-blockwise-flash"),
        ("decode", "jax-blockwise-flash"), ("decode", "jax-xla")]  # phase order, fastest first
    assert list(table["ms/step"]) == pytest.approx([10.0, 30.0, 1.0, 2.0])
    # what each price buys, from its sidecar entry; "-" for an entry from before it was kept
    assert list(table["price kind"]) == ["-", "-", "-", "instance"]
    assert list(table["best"]) == ["fastest native", "fastest forced-flash", "fastest forced-flash",
                                   "fastest native"]
