"""The prepared accelerator run (tools/device-run.sh) and what it stands on: a sweep that stops at its
deadline, workers shared by static cases, CPU figures kept off an accelerator's name, kernels that
refuse a release lacking their API, and the rehearsal of the whole script on this CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from attnbench.asv import sizes as asv_sizes
from attnbench.asv import suite as asv_suite
from attnbench.backends import here
from attnbench.core import records
from attnbench.core.workload import Workload
from attnbench.measure.engine import Case, Options
from attnbench.run import plan, sweep
from tests.cases import measure_sweep
from tests.conftest import FRAMEWORKS

ROOT = Path(__file__).resolve().parents[1]
SMALL = Workload(batch=1, q_heads=2, seq_q=64, head_dim=16, causal=True)
FAST = Options(min_seconds=0.02, regime_steps=2, numerics=False)


def test_no_case_starts_after_the_deadline_and_the_rest_say_why():
    cases = [("reference-float64", SMALL, "static"), ("reference-float64", SMALL.replace(seq_q=32), "static")]
    rows = measure_sweep(cases, FAST, isolate=False, progress=False, deadline=time.time() - 1)
    assert [r["status"] for r in rows] == [records.UNSUPPORTED] * 2
    assert all(r["reason"] == sweep.OUT_OF_TIME and r["impl"] == "reference-float64" for r in rows)
    [done] = measure_sweep(cases[:1], FAST, isolate=False, progress=False, deadline=time.time() + 600)
    assert done["status"] == records.OK


class _CountingWorker:
    started = 0

    def __init__(self, task, **kwargs):
        self.alive, self.threads = False, kwargs.get("threads")

    def call(self, args, timeout_s, preload=(), deadline=None):
        [case] = args  # one value in: the case
        if not self.alive:
            _CountingWorker.started += 1
            self.alive = True
        return {"impl": case.impl, "regime": case.regime, "status": records.OK,
                "process": _CountingWorker.started}, None

    def close(self):
        self.alive = False


def test_static_cases_share_a_worker_and_a_regime_case_gets_its_own(monkeypatch):
    monkeypatch.setattr(sweep, "Worker", _CountingWorker)
    _CountingWorker.started = 0
    cases = [("a", SMALL, "static"), ("b", SMALL, "static"), ("a", SMALL, "dynamic"), ("c", SMALL, "static"),
             ("d", SMALL, "static")]

    def measured(own_process):
        return sweep.measure_cases([Case(impl, w, Options(regime=regime), own_process=own_process or
                                         regime != "static") for impl, w, regime in cases], progress=False)

    assert [r["process"] for r in measured(False)] == [1, 1, 2, 3, 3]
    _CountingWorker.started = 0
    assert [r["process"] for r in measured(True)] == [1, 2, 3, 4, 5]  # a fresh process per case


def _gpu_grid(monkeypatch, impls=""):
    """benchmarks/attention.py as the lent GPU's run executes it."""
    from attnbench.asv import selection

    monkeypatch.setenv("ATTNBENCH_SUITE", "gpu")
    monkeypatch.setenv("ACCEL", "cuda")
    monkeypatch.setenv("ATTNBENCH_IMPLS", impls)
    return selection.benchmark_module(str(ROOT))


def test_the_gpu_grid_holds_only_kernels_that_give_a_number_on_a_gpu(monkeypatch):
    import attention_impls

    benchmarks = _gpu_grid(monkeypatch)
    grid = set(benchmarks.Forward.params[0])
    left_out = asv_sizes.left_out_kernels()
    assert grid | set(left_out) == set(attention_impls.names()) and not grid & set(left_out)
    for name in grid:
        impl = attention_impls.get(name)
        assert impl.framework in ("numpy", "jax", "torch") and impl.platform_support["gpu"].status == "runs"
    assert {"torch-xla-sdpa", "jax-pallas-tpu-flash", "jax-pallas-tpu-splash"} <= set(left_out)
    assert "torch_xla is not in the GPU image" in left_out["torch-xla-sdpa"]
    assert left_out["jax-pallas-tpu-splash"].startswith("interpret-only on a GPU: ")
    # the image has no tokamax: its kernels are left out, with the reason
    assert "jax-tokamax-cudnn" in left_out and "leaves out tokamax's kernels" in left_out["jax-tokamax-cudnn"]
    # the default keeps every kernel but those of a library beyond the frameworks (Tokamax's)
    default = asv_sizes.left_out_kernels(asv_sizes.SIZES["default"])
    assert set(default) == {n for n in attention_impls.names() if attention_impls.get(n).library == "tokamax"}


def test_the_gpu_run_measures_the_headline_first_then_a_preset_then_the_rest(monkeypatch):
    benchmarks = _gpu_grid(monkeypatch)
    every = [Case(impl, w, Options(regime=regime))
             for cls in benchmarks.MEASURED for impl, w, regime in cls.cases()]
    order = [(c.impl, c.workload, c.regime) for c in asv_suite.run_order(every, asv_sizes.SIZES["gpu"])]
    headline = [c for c in order if c[0] in asv_sizes.GPU_HEADLINE_KERNELS and c[1].seq_q in (4096, 16384)
                and c[1].dtype == "bfloat16" and c[1].mode == "fwd" and c[2] == "static"
                and c[1].name == "custom"]
    assert order[:len(headline)] == headline and len(headline) == 2 * len(asv_sizes.GPU_HEADLINE_KERNELS)
    assert [c[1].seq_q for c in headline] == [4096] * 7 + [16384] * 7  # a whole length before the next
    presets = order[len(headline):]
    llama = [c for c in presets if c[1].name == "llama-3.1-8b" and c[1].phase in ("prefill", "decode")]
    assert presets[:len(llama)] == llama and {c[1].phase for c in llama} == {"prefill", "decode"}
    rest = [c[1].seq_q for c in order[len(headline) + len(llama):]]
    assert rest == sorted(rest)  # then the rest, shortest first


def test_the_device_budget_goes_to_measuring_and_asv_files_only_what_has_a_record(monkeypatch, tmp_path):
    """The budget's arithmetic against the real gpu grid: on the device only measuring and packing
    (DEVICE_PACK_S) follow the setup, no asv; back here asv starts a process per metric of each
    combination that has a record, none for the rest (most Models regimes are n/a: regime_presets)."""
    from attnbench.asv import carried
    from attnbench.run.case_cache import CaseCache

    script = (ROOT / "tools" / "device-run.sh").read_text()
    assert "-m asv" not in script and "pack_s=${DEVICE_PACK_S:-30}" in script
    assert "measure_left=$(( $(left) - pack_s ))" in script
    benchmarks = _gpu_grid(monkeypatch)
    combinations = sum(len(list(__import__("itertools").product(*cls.params))) for cls in benchmarks.MEASURED)
    processes = combinations * len(asv_suite.METRICS)
    assert (combinations, processes) == (686, 20580)  # docs/device.md states these
    cache = CaseCache(str(tmp_path), "h200", "0" * 40, "existing-py3.12-jax0.11.2-torch2.11.0", {})
    forward = benchmarks.Forward.cases()
    for i, case in enumerate(forward[:5]):
        record = records.new_record(status=records.OK if i < 3 else records.UNSUPPORTED)
        cache.put(asv_suite.case_key(*case), record)
    args = carried._bench_args(str(tmp_path))
    assert args[0] == "-b" and len(args) == 2  # one class has records
    import re

    names = [f"attention.Forward.track_x({', '.join(map(repr, p))})"
             for p in __import__("itertools").product(*benchmarks.Forward.params)]
    assert sum(bool(re.match(args[1], n)) for n in names) == 3  # ok records only: n/a starts nothing


def test_a_carried_run_is_filed_without_measuring(monkeypatch, tmp_path):
    from attnbench.run.case_cache import CaseCache

    case = ("jax-xla", asv_sizes.FORWARD, "static")
    key = asv_suite.case_key(*case)
    CaseCache(str(tmp_path), "h200", "0" * 40, "env", {}).put(key, records.new_record(status="ok"))
    monkeypatch.setenv(asv_suite.CARRIED_ENV, str(tmp_path))

    def no_measuring(*args, **kwargs):
        raise AssertionError("a carried run measured")

    monkeypatch.setattr(sweep, "measure_cases", no_measuring)
    other = ("jax-xla", asv_sizes.FORWARD.replace(seq_q=256, seq_k=256), "static")
    out = asv_suite.measure_suite([case, other], "Forward")
    assert list(out) == [key] and out[key]["status"] == "ok"
    monkeypatch.setenv(asv_suite.CARRIED_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="ATTNBENCH_CARRIED"):
        asv_suite.measure_suite([case], "Forward")


def test_the_device_checks_only_what_measuring_needs():
    from attnbench.run import environment

    assert {environment._dist_name(r) for r in environment.requirements("measure")} == \
        {"numpy", "psutil", "asv_runner", "threadpoolctl", "absl-py"}
    assert "asv" in {environment._dist_name(r) for r in environment.requirements("bench")}
    wheels = (ROOT / "tools" / "device-wheels.sh").read_text()
    # what measuring needs beyond the image's numpy and psutil travels as a wheel
    assert all(f"{name}==" in wheels for name in ("absl-py", "threadpoolctl", "asv_runner"))


def test_the_gpu_suite_runs_lengths_shortest_first_and_regimes_in_bfloat16(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_SUITE", "gpu")
    monkeypatch.setenv(asv_suite.DEADLINE_ENV, "1e12")
    size = asv_sizes.suite_size()
    seen = {}

    def fake_sweep(cases, **kwargs):
        seen.update(cases=cases, **kwargs)
        return [records.new_record() for _ in cases]

    monkeypatch.setattr(sweep, "measure_cases", fake_sweep)
    monkeypatch.setattr(plan, "ask_in_worker", lambda task, cases, *args: [{"reason": None}] * len(cases))
    cases = [(i, asv_sizes.FORWARD.replace(seq_q=s, seq_k=s, dtype="bfloat16"), r)
             for i in ("jax-xla", "torch-sdpa-math") for s in (16384, 1024) for r in ("dynamic", "static")]
    asv_suite.measure_suite(cases, benchmark="Forward")
    assert [(c.workload.seq_q, c.regime) for c in seen["cases"]][:4] == \
        [(1024, "static")] * 2 + [(1024, "dynamic")] * 2
    assert {c.options.timer for c in seen["cases"]} == {"device"} and seen["deadline"] == 1e12
    assert [c.own_process for c in seen["cases"]] == [c.regime != "static" for c in seen["cases"]]
    impl = __import__("attention_impls").get("jax-xla")
    float32 = asv_sizes.FORWARD.replace(seq_q=4096, seq_k=4096)
    assert "in bfloat16 only" in asv_suite.outside_suite(impl, float32, "dynamic", size)
    assert asv_suite.outside_suite(impl, float32.replace(dtype="bfloat16"), "dynamic", size) is None
    monkeypatch.setenv(asv_suite.DEADLINE_ENV, "soon")
    with pytest.raises(ValueError, match="ATTNBENCH_DEADLINE must be seconds since the epoch"):
        asv_suite.deadline()


def test_cpu_figures_never_land_under_an_accelerator_name():
    import attention_impls

    jax_xla, reference = attention_impls.get("jax-xla"), attention_impls.get("reference-float64")
    reason = asv_suite.off_machine(jax_xla, "cpu", "h200", "gpu")
    assert "jax runs on the CPU" in reason and "h200" in reason
    assert asv_suite.off_machine(jax_xla, "gpu", "h200", "gpu") is None
    assert asv_suite.off_machine(jax_xla, "cpu", "cpu-16core", "cpu") is None
    assert asv_suite.off_machine(reference, "cpu", "h200", "gpu") is None  # the yardstick


@pytest.mark.skipif("jax" not in FRAMEWORKS, reason="the support check imports jax")
def test_the_support_check_refuses_cpu_jax_on_a_gpu_host(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_MACHINE", "h200")
    monkeypatch.setenv("ACCEL", "cuda")
    [answer] = asv_suite.check_cases([Case("jax-xla", asv_sizes.FORWARD)], asv_sizes.SIZES["smoke"])
    assert answer["platform"] == "cpu" and "CPU figures are never filed" in answer["reason"]


def test_a_kernel_whose_module_this_release_lacks_is_refused_with_the_reason():
    from attention_impls.reference_float64 import Float64Reference

    class Moved(Float64Reference):
        name = "stub-moved"
        requires_modules = ("numpy.no_such_module_in_this_release",)

    reason = here.check(Moved(), SMALL)
    assert reason.startswith("numpy.no_such_module_in_this_release does not import in numpy ")
    assert "ModuleNotFoundError" in reason


def test_the_mosaic_gpu_kernel_states_its_shape_rules():
    import attention_impls
    from attention_impls.jax_pallas_mgpu_attention import mgpu_shape_reason

    impl = attention_impls.get("jax-pallas-mgpu-attention")
    assert impl.designed_for == frozenset({"gpu"}) and impl.label("gpu") == "native"
    assert impl.label("cpu") == "forced-flash"
    bf16 = Workload(seq_q=1024, causal=True, dtype="bfloat16")
    assert mgpu_shape_reason(bf16, (9, 0)) is None
    assert "Hopper" in mgpu_shape_reason(bf16, (8, 0))
    assert "no visible CUDA GPU" in mgpu_shape_reason(bf16, None)
    assert "float16/bfloat16 only" in mgpu_shape_reason(bf16.replace(dtype="float32"), (9, 0))
    assert "multiple of 64" in mgpu_shape_reason(bf16.replace(head_dim=96), (9, 0))
    assert "2 * block_q = 128" in mgpu_shape_reason(bf16.replace(seq_q=192, seq_k=192), (9, 0))
    assert "no causal backward" in mgpu_shape_reason(bf16.replace(mode="fwd_bwd"), (9, 0))
    assert mgpu_shape_reason(bf16.replace(mode="fwd_bwd", causal=False), (9, 0)) is None
    assert mgpu_shape_reason(bf16.replace(q_heads=8, kv_heads=2), (9, 0)) is None  # GQA
    if "jax" in FRAMEWORKS:
        assert "Hopper GPU only" in here.check(impl, bf16)  # this host has no GPU


@pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax's backend")
def test_a_jax_device_peak_is_recorded_only_when_it_is_the_cases_own(monkeypatch):
    from attnbench.backends import jax_backend
    from attnbench.backends.base import Step

    peaks = iter([100, 250])
    monkeypatch.setattr(jax_backend, "_device_peak", lambda: next(peaks))
    step = Step(run=lambda: None, execution="compiled", memory_mark=200)
    assert jax_backend.BACKEND.measure_memory(step)["device_peak_bytes"] == 250
    peaks = iter([100, 150])
    out = jax_backend.BACKEND.measure_memory(step)
    assert out["device_peak_bytes"] is None and "set by an earlier case" in out["memory_note"]
    monkeypatch.setattr(jax_backend, "_device_peak", lambda: None)  # the CPU keeps no peak
    assert "device_peak_bytes" not in jax_backend.BACKEND.measure_memory(step)


# -- the rehearsal of tools/device-run.sh ---------------------------------------------------------------
@pytest.mark.skipif("jax" not in FRAMEWORKS or "torch" not in FRAMEWORKS,
                    reason="rehearses with the main venv's jax and torch")
@pytest.mark.slow
def test_the_device_run_rehearses_here_from_a_copy_without_git(tmp_path):
    """DEVICE_DRY_RUN=1: the same script on this CPU, from a copy of the tree with no .git (as the
    device receives it), the history in .whl/head.bundle; results filed under HEAD and the stable
    environment name, packed under $OUT, and nothing written into the checkout."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode:
        pytest.skip("needs a git checkout of this project (its history is bundled)")
    copy, out = tmp_path / "tree", tmp_path / "out"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (copy / ".whl").mkdir()
    subprocess.run(["git", "bundle", "create", "-q", str(copy / ".whl" / "head.bundle"), "HEAD"], cwd=ROOT,
                   check=True)
    before = subprocess.run(["git", "status", "--porcelain", "results"], cwd=ROOT, capture_output=True,
                            text=True).stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNBENCH_", "ASV"))}
    env.update(DEVICE_DRY_RUN="1", DEVICE_PYTHON=sys.executable, OUT=str(out), ACCEL="")
    # the copy is this working tree's: a developer's uncommitted edits are not the bundled commit
    code = ["attnbench", "attention_impls", "benchmarks", "tools", "asv.conf.json", "pyproject.toml"]
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *code], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    script = ["bash", str(copy / "tools" / "device-run.sh")]
    if dirty:
        env["DEVICE_ALLOW_DIRTY"] = "1"
    else:  # an edit to the copied code is refused before anything runs
        edited = copy / "attnbench" / "cli.py"
        original = edited.read_text()
        edited.write_text(original + "# edited\n")
        refused = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1 and "is not the bundled commit" in refused.stdout
        assert " M attnbench/cli.py" in refused.stdout
        edited.write_text(original)
    proc = subprocess.run(script, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert f"commit {head.stdout.strip()}" in log and "machine name: cpu-" in log
    assert "everything measure needs is here" in log and "evidence of which kernel" in log
    assert "asv run" not in log  # asv's bookkeeping is filed back here, not on the device's minutes
    machine = next(line.split(": ", 1)[1] for line in log.splitlines() if line.startswith("machine name: "))
    name = __import__("attnbench.run.environment").run.environment.asv_environment_name()
    with tarfile.open(out / f"measured-{machine}.tar.gz") as tar:
        assert sum(n.endswith(".case") for n in tar.getnames()) >= 20
        run = json.load(tar.extractfile("./carried.json"))
    assert run["commit"] == head.stdout.strip() and run["env_name"] == name and run["machine"] == machine
    assert run["settings"]["suite"] == "smoke" and run["asv_machine"]["num_cpu"] == str(os.cpu_count())
    assert (out / "device-run.log").read_text().count("== ") >= 5
    after = subprocess.run(["git", "status", "--porcelain", "results"], cwd=ROOT, capture_output=True,
                           text=True).stdout
    assert after == before, "the rehearsal wrote into the checkout's results/"

    # back here: asv files the carried records, measuring nothing
    results = tmp_path / "results"
    env["HOME"] = str(tmp_path)  # asv's ~/.asv-machine.json
    filed = subprocess.run([sys.executable, "-m", "attnbench.asv.carried", "file",
                            str(out / f"measured-{machine}.tar.gz"), "--results", str(results)],
                           env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert filed.returncode == 0, (filed.stdout + filed.stderr)[-4000:]
    result = json.loads((results / machine / f"{head.stdout[:8]}-{name}.json").read_text())
    sidecar = json.loads((results / machine / "sidecars" / f"{head.stdout[:8]}-{name}.sidecar").read_text())
    assert result["env_name"] == name and result["commit_hash"] == head.stdout.strip()
    assert json.loads((results / machine / "machine.json").read_text())["num_cpu"] == str(os.cpu_count())
    assert sidecar["settings"]["suite"] == "smoke"
    assert sidecar["settings"]["impls"].startswith("reference-float64")
    statuses = {c: e["status"] for c, e in sidecar["cases"].items()}
    assert statuses["Forward|jax-xla|128|static|float32"] == "ok"
    assert statuses["Forward|jax-cudnn|128|static|float32"] == "unsupported"
    columns = result["result_columns"]
    step = result["results"]["attention.Forward.track_seconds_per_step"][columns.index("result")]
    assert any(v == v and v is not None for v in step)  # a figure for what ran
