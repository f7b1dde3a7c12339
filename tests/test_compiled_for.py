"""The compiled-for tier's logic, with no compiler: expected values written by hand.

Error classification of real compiler messages (copied from libtpu, Mosaic, XLA:GPU and jax as
they failed here), the fits rule, roofline arithmetic, the bisection against a fake compiler, the
HLO reader on a hand-written module, targets and their GPU description, the compile-target hook
the kernels read, the killable worker (a hang, a crash), the CLI's bad input, the asv class where
the compilers are missing, and the report section on a hand-made records table.
Runs in every venv (the main one and .venv-targets); the real compiles are in
``test_compiled_for_compile.py``.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from attnbench.backends import here
from attnbench.compiled_for import classify, hlo
from attnbench.compiled_for.roofline import roofline, roofline_bytes
from attnbench.compiled_for.run import (
    Case,
    bisect_max_batch,
    bisect_max_length,
    kernel_block,
    max_batch,
    max_feasible,
    run_cases,
)
from attnbench.compiled_for.targets import environment_problem, get_targets, gpu_target_config, load_targets
from attnbench.core.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


# ------------------------------------------------------------------------ classification
def test_libtpu_hbm_refusal_is_does_not_fit_with_the_compilers_figures():
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
               "temporaries (132.25G) exceeds available HBM (15.75G).")
    status, reason = classify.classify_compile_error(message, "JaxRuntimeError")
    assert status == classify.DOES_NOT_FIT and reason == message
    assert classify.compiler_hbm_bytes(message) == 16_911_433_728  # 15.75 GiB
    assert classify.compiler_required_bytes(message) == 142_002_356_224  # 132.25 GiB


@pytest.mark.parametrize("message,exc_type,status,prefix", [
    ("INTERNAL: Mosaic failed to compile TPU kernel: E2001: CompileTimeMosaicUnsupportedRhsType: "
     "Unsupported matmul RHS type on target: vector<128x128xbf16>", "JaxRuntimeError",
     classify.KERNEL_REFUSED, "Mosaic: INTERNAL"),
    ("RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 327680, available: 232448, "
     "context: []", "JaxRuntimeError", classify.KERNEL_REFUSED, "Triton: RESOURCE_EXHAUSTED"),
    ("MLIR translation rule for primitive 'dot_product_attention_fwd' not found for platform tpu",
     "NotImplementedError", classify.UNSUPPORTED, "MLIR translation rule"),
    ("Cannot lower pallas_call on platform: gpu. To use Pallas on GPU, install jaxlib GPU.", "ValueError",
     classify.UNSUPPORTED, "Cannot lower"),
    ("something nobody expected\n  at line 3", "RuntimeError", classify.ERROR,
     "RuntimeError: something nobody expected at line 3"),
])
def test_compiler_errors_are_classified(message, exc_type, status, prefix):
    got, reason = classify.classify_compile_error(message, exc_type)
    assert got == status
    assert reason.startswith(prefix)


def test_fits_rule():
    assert classify.fits(15_000_000_000, 16_000_000_000) is True
    assert classify.fits(16_000_000_000, 16_000_000_000) is True
    assert classify.fits(206_000_000_000, 141_000_000_000) is False  # the GPU compiler accepted it
    assert classify.fits(None, 16_000_000_000, classify.DOES_NOT_FIT) is False
    assert classify.fits(None, 16_000_000_000, classify.KERNEL_REFUSED) is None
    assert classify.fits(1, None) is None


# ----------------------------------------------------------------------------- roofline
def test_roofline_is_the_larger_side_and_priced_per_chip_hour():
    # 3.94 TFLOP on a 197 TFLOP/s chip: 20 ms; 8.19 GB at 0.819 TB/s: 10 ms -> compute bound.
    model = roofline(flops_per_chip=3.94e12, bytes_per_chip=8.19e9, peak_tflops=197, hbm_tb_s=0.819,
                     price_per_chip_hour=1.20)
    assert model.bound == "compute"
    assert model.seconds == pytest.approx(0.020)
    assert model.memory_seconds == pytest.approx(0.010)
    assert model.usd == pytest.approx(0.020 * 1.20 / 3600)  # 6.667e-6
    # 1 TFLOP at 100 TFLOP/s: 10 ms; 18 GB at 0.9 TB/s: 20 ms -> memory bound, four chips paid.
    four = roofline(flops_per_chip=1e12, bytes_per_chip=18e9, peak_tflops=100, hbm_tb_s=0.9,
                    price_per_chip_hour=2.0, chips=4)
    assert four.bound == "memory" and four.seconds == pytest.approx(0.020)
    assert four.usd == pytest.approx(0.020 * 2.0 * 4 / 3600)
    no_peak = roofline(flops_per_chip=1e12, bytes_per_chip=1.6e9, peak_tflops=None, hbm_tb_s=1.6,
                       price_per_chip_hour=None)
    assert no_peak.seconds == pytest.approx(0.001) and no_peak.bound.startswith("memory (no peak")
    assert no_peak.usd is None


def test_the_roofline_says_what_its_usd_buys():
    """A target's roofline USD says what its price buys, from its records: the H200's the
    accelerator alone, a TPU VM's a whole instance; records from before it was kept say so."""
    pd = pytest.importorskip("pandas")
    from attnbench.report.compiled import price_kind_text

    h200 = pd.DataFrame({"hardware_profile": ["h200-sxm"] * 2, "price_kind": ["accelerator"] * 2})
    assert price_kind_text(h200) == "the accelerator's price alone (no host VM)"
    v5e = pd.DataFrame({"hardware_profile": ["tpu-v5e"], "price_kind": ["instance"]})
    assert price_kind_text(v5e) == "a whole instance's price (the chip with its host)"
    assert price_kind_text(pd.DataFrame({"hardware_profile": ["h200-sxm"]})).startswith(
        "its kind not recorded")


def test_roofline_bytes_never_below_the_workload_minimum():
    assert roofline_bytes(1e9, 2, 1.5e9) == (2e9, "compiler (cost_analysis bytes accessed)")
    assert roofline_bytes(5e8, 1, 1.5e9)[0] == 1.5e9
    assert roofline_bytes(-1, 1, 1.5e9) == (1.5e9, "workload minimum (the compiler gives no bytes accessed)")
    assert roofline_bytes(None, 1, 7.0)[0] == 7.0


# ------------------------------------------------------------------------------ bisection
def test_bisect_finds_the_last_fitting_multiple_of_the_block():
    calls = []

    def fake_compiler(length):  # plain attention on an H200 stops fitting past 54144 tokens
        calls.append(length)
        assert length % 128 == 0
        return length <= 54144

    longest, tried = bisect_max_length(fake_compiler, 128, 131072)
    assert longest == 54144 and tried == len(calls) <= 11
    assert bisect_max_length(lambda n: True, 128, 131072) == (131072, 1)
    assert bisect_max_length(lambda n: False, 128, 131072)[0] == 0
    assert bisect_max_length(lambda n: n <= 900, 128, 1000)[0] == 896  # hi not a multiple: 7 blocks
    with pytest.raises(ValueError, match="below the kernel's block"):
        bisect_max_length(lambda n: True, 128, 100)


class FakeWorker:
    """A compiler where a case fits up to ``limit`` tokens; counts its compiles."""

    def __init__(self, limit):
        self.limit, self.compiled = limit, []

    def compile(self, target, impl, workload, *, timeout_s, hlo_dir=None):
        self.compiled.append(workload.seq_q)
        ok = workload.seq_q <= self.limit
        return {"target": target.name, "impl": impl, "mode": workload.mode, "dtype": workload.dtype,
                "seq_q": workload.seq_q, "seq_k": workload.seq_k,
                "status": classify.OK if ok else classify.DOES_NOT_FIT, "fits": ok,
                "reason": None if ok else "RESOURCE_EXHAUSTED: Ran out of memory on HBM"}


def test_max_feasible_bisects_reuses_known_records_and_names_what_stopped_it():
    [target] = get_targets(["tpu-v5e"])
    template = Workload(seq_q=1024, dtype="bfloat16", causal=True)
    known = [{"target": "tpu-v5e", "impl": "jax-xla", "mode": "fwd", "dtype": "bfloat16", "seq_q": 65536,
              "seq_k": 65536, "status": classify.DOES_NOT_FIT, "fits": False, "reason": "HBM"}]
    worker = FakeWorker(limit=20480)
    summary, compiled = max_feasible([target], ["jax-xla"], template, ["fwd"], ["bfloat16"], 131072,
                                     known=known, progress=False, worker=worker)
    [row] = summary
    assert row["max_feasible_seq"] == 20480 and row["block"] == 128
    assert 65536 not in worker.compiled  # answered by the known record
    assert row["compiles"] == len(worker.compiled) == len(compiled) == row["lengths_tried"] - 1
    assert row["stopped_by"].startswith("20608: does-not-fit")


def _asking(limit):
    """A feasibility function true up to ``limit`` that records what it was asked."""
    calls = []

    def is_feasible(batch):
        calls.append(batch)
        return batch <= limit

    return is_feasible, calls


@pytest.mark.parametrize("limit", [1, 2, 3, 37, 1000, 4095])
def test_bisect_max_batch_is_exact_and_tried_on_both_sides(limit):
    is_feasible, calls = _asking(limit)
    largest, tried = bisect_max_batch(is_feasible, 4096)
    assert largest == limit and tried == len(calls) == len(set(calls)) <= 14
    assert calls[0] == 1 and limit in calls and limit + 1 in calls  # verified on both sides


def test_bisect_max_batch_all_none_and_a_bound_of_one():
    assert bisect_max_batch(lambda b: True, 4096) == (4096, 2)  # batch 1, then HI: capped
    assert bisect_max_batch(lambda b: False, 4096) == (0, 1)  # batch 1 does not fit: nothing more
    assert bisect_max_batch(lambda b: True, 1) == (1, 1)
    assert bisect_max_batch(lambda b: b <= 5, 4096, [None, None])[0] == 5  # no estimate: bisection
    with pytest.raises(ValueError, match="upper batch 0 is below 1"):
        bisect_max_batch(lambda b: True, 0)


def test_bisect_max_batch_brackets_with_the_linear_estimate_in_two_tries():
    is_feasible, calls = _asking(37)
    assert bisect_max_batch(is_feasible, 4096, [37]) == (37, 3) and calls == [1, 37, 38]
    is_feasible, calls = _asking(37)  # one too many: the batch before it is the answer
    assert bisect_max_batch(is_feasible, 4096, [38]) == (37, 3) and calls == [1, 38, 37]
    is_feasible, calls = _asking(4096)  # an estimate above HI is HI
    assert bisect_max_batch(is_feasible, 4096, [9000]) == (4096, 2) and calls == [1, 4096]


def test_bisect_max_batch_falls_back_to_bisection_when_the_estimate_misses():
    is_feasible, calls = _asking(37)  # far too high: bisect below it
    largest, tried = bisect_max_batch(is_feasible, 4096, [100])
    assert largest == 37 and calls[:3] == [1, 100, 99] and tried == len(calls) > 3 and 38 in calls
    is_feasible, calls = _asking(37)  # too low: HI, then bisect above it
    largest, tried = bisect_max_batch(is_feasible, 4096, [20])
    assert largest == 37 and calls[:4] == [1, 20, 21, 4096] and 38 in calls and tried == len(calls)

    def guesses():  # read lazily: the second guess sees the first one's compiles
        yield 30
        assert calls[-2:] == [30, 31]
        yield 37

    is_feasible, calls = _asking(37)
    assert bisect_max_batch(is_feasible, 4096, guesses()) == (37, 5) and calls == [1, 30, 31, 37, 38]


class FakeBatchWorker:
    """A v5e-like compiler: peak per device 1e8 + batch x seq x 1e5 bytes against 16 GB; what
    exceeds 16.9 GB libtpu refuses, the rest compiles with its peak; ``jax-cudnn`` is unsupported,
    ``jax-pallas-gpu-mha`` runs as the interpreter. Counts its compiles."""

    HBM = 16_000_000_000

    def __init__(self):
        self.compiled = []

    def compile(self, target, impl, workload, *, timeout_s, hlo_dir=None):
        batch, seq = workload.batch, workload.seq_q
        self.compiled.append((impl, seq, batch))
        record = {"target": target.name, "impl": impl, "mode": workload.mode, "dtype": workload.dtype,
                  "seq_q": seq, "seq_k": workload.seq_k, "batch": batch, "hbm_bytes": self.HBM,
                  "execution": "interpret" if impl == "jax-pallas-gpu-mha" else "compiled", "reason": None}
        if impl == "jax-cudnn":
            return {**record, "status": classify.UNSUPPORTED, "fits": None, "execution": None,
                    "reason": "cuDNN needs an NVIDIA GPU"}
        peak = 100_000_000 + batch * seq * 100_000
        if peak > 16_900_000_000:
            return {**record, "status": classify.DOES_NOT_FIT, "fits": False, "compiler_required_bytes": peak,
                    "reason": "RESOURCE_EXHAUSTED: Ran out of memory on HBM"}
        return {**record, "status": classify.OK, "fits": peak <= self.HBM, "peak_bytes": peak,
                "inserted_copy_bytes": batch * seq * 1000}

    def close(self, keep_log=False):
        pass


def test_max_batch_bisects_each_length_skips_what_it_must_and_reuses_the_grid():
    [target] = get_targets(["tpu-v5e"])
    template = Workload(seq_q=1024, dtype="bfloat16", causal=True)
    worker = FakeBatchWorker()
    known = [worker.compile(target, "jax-xla", template.replace(seq_q=4096, seq_k=4096), timeout_s=1)]
    worker.compiled.clear()
    impls = ["jax-xla", "jax-cudnn", "jax-pallas-gpu-mha"]
    summary, compiled = max_batch([target], impls, template, [4096, 65536, 262144], ["fwd"], ["bfloat16"],
                                  4096, known=known, progress=False, worker=worker)
    rows = {(r["impl"], r["seq_len"]): r for r in summary}
    assert len(summary) == 9 and len(compiled) == len(worker.compiled)
    # 4k: 38 x 409.6 MB + 0.1 GB fits 16 GB, 39 compiles at 16.07 GB and does not fit. The line
    # through zero guessed 31 (31 and 32 fit), the line through batches 1 and 32 guessed 38.
    xla = rows["jax-xla", 4096]
    assert (xla["max_batch"], xla["capped"], xla["batches_tried"], xla["compiles"]) == (38, False, 5, 4)
    assert ("jax-xla", 4096, 1) not in worker.compiled  # the grid's batch-1 record answered it
    assert [b for i, s, b in worker.compiled if (i, s) == ("jax-xla", 4096)] == [31, 32, 38, 39]
    assert xla["tokens_per_chip"] == 38 * 4096 and xla["peak_bytes_at_max"] == 15_664_800_000
    assert xla["inserted_copy_bytes_at_max"] == 38 * 4096 * 1000 and xla["hbm_bytes"] == 16e9
    assert xla["stopped_by"] == "39: does not fit (peak > HBM)" and xla["skipped"] is None
    long = rows["jax-xla", 65536]  # 2 x 6.55 GB fits; 3 is refused by the compiler
    assert (long["max_batch"], long["batches_tried"], long["compiles"]) == (2, 3, 3)
    assert long["stopped_by"] == "3: does-not-fit: RESOURCE_EXHAUSTED: Ran out of memory on HBM"
    too_long = rows["jax-xla", 262144]  # 26 GB at batch 1: no bisection
    assert (too_long["max_batch"], too_long["capped"], too_long["batches_tried"]) == (None, False, 1)
    assert too_long["skipped"] == "not feasible at batch 1"
    assert too_long["stopped_by"].startswith("1: does-not-fit")
    assert too_long["tokens_per_chip"] is None and too_long["peak_bytes_at_max"] is None
    for seq in (4096, 65536, 262144):
        cudnn, mha = rows["jax-cudnn", seq], rows["jax-pallas-gpu-mha", seq]
        assert (cudnn["max_batch"], cudnn["capped"], cudnn["compiles"]) == (None, None, 1)
        assert cudnn["skipped"] == "unsupported at batch 1"
        assert cudnn["stopped_by"] == "1: unsupported: cuDNN needs an NVIDIA GPU"
        assert (mha["max_batch"], mha["capped"], mha["compiles"], mha["stopped_by"]) == (None, None, 1, None)
        assert mha["execution"] == "interpret" and mha["skipped"].startswith("interpret: ")
    assert all(b == 1 for i, s, b in worker.compiled if i != "jax-xla")


def test_max_batch_capped_and_tokens_per_chip_of_a_slice():
    [target] = get_targets(["tpu-v5e-2x2"])
    template = Workload(seq_q=4096, dtype="bfloat16", causal=True)
    [row], _ = max_batch([target], ["jax-xla"], template, [4096], ["fwd"], ["bfloat16"], 16,
                         progress=False, worker=FakeBatchWorker())
    assert (row["max_batch"], row["capped"], row["stopped_by"], row["batches_tried"]) == (16, True, None, 2)
    assert row["tokens_per_chip"] == 16 * 4096 // 4 and row["tried_up_to"] == 16


def test_max_batch_table_columns_and_integers(tmp_path):
    pytest.importorskip("pandas")
    from attnbench.compiled_for.records import MAX_BATCH_COLUMNS
    from attnbench.compiled_for.run import max_batch_table

    [target] = get_targets(["tpu-v5e"])
    summary, _ = max_batch([target], ["jax-xla", "jax-cudnn"], Workload(dtype="bfloat16"), [4096, 262144],
                           ["fwd"], ["bfloat16"], 4096, progress=False, worker=FakeBatchWorker())
    path = tmp_path / "max_batch.csv"
    max_batch_table(summary, str(path))
    lines = path.read_text().splitlines()
    assert lines[0].split(",") == MAX_BATCH_COLUMNS
    assert lines[1].startswith("tpu-v5e,jax-xla,custom,prefill,fwd,bfloat16,4096,compiled,38,4096,5,5,False,"
                               "155648,")
    assert ",,4096,1,1,False,,," in lines[2]  # nothing fits at 256k: empty, not NaN or 0.0


def test_kernel_block_comes_from_the_kernel_module():
    import attention_impls

    assert kernel_block(attention_impls.get("jax-pallas-tpu-splash")) == 128
    assert kernel_block(attention_impls.get("jax-pallas-gpu-mha")) == 128  # BLOCK_FWD
    assert kernel_block(attention_impls.get("jax-xla")) == 128  # no block: the default


# ------------------------------------------------------------------------------------ HLO
# Hand-written after the HLO libtpu and XLA:GPU printed here (shapes, layouts, attributes).
HLO = Path(__file__).parent / "compiled_for_hlo"
TPU_HLO = (HLO / "tpu_flash.hlo.txt").read_text()
GPU_HLO = (HLO / "gpu_cudnn_triton.hlo.txt").read_text()


def test_shape_bytes_follow_the_tpu_tile_padding():
    # D=64 minor under T(8,128): padded to 128 lanes, twice the logical size.
    assert hlo.shape_bytes("bf16[1,8,4096,64]{3,2,1,0:T(8,128)(2,1)}") == 1 * 8 * 4096 * 128 * 2
    assert hlo.shape_bytes("bf16[1,8,4096,64]{3,2,1,0:T(8,128)(2,1)}", physical=False) == 4_194_304
    # S minor instead: 4096 lanes need no padding, 64 rows are a multiple of 8.
    assert hlo.shape_bytes("bf16[1,4096,8,64]{1,3,2,0:T(8,128)(2,1)}") == 4_194_304
    cudnn_result = "(bf16[1,8,4096,64]{3,1,2,0}, f32[1,8,4096]{2,1,0}, u8[0]{0})"
    assert hlo.shape_bytes(cudnn_result) == 4_194_304 + 131_072
    assert hlo.shape_bytes("f32[]") == 4


def test_tpu_module_kernel_evidence_copies_and_flops_source():
    module = hlo.parse_module(TPU_HLO)
    assert module.entry.name == "main.9" and len(module.entry.instructions) == 10
    [call] = hlo.kernel_calls(hlo.custom_calls(module))
    assert (call.target, call.kernel) == ("tpu_custom_call", "flash_attention")
    assert call.cost_estimate["flops"] == 34896609280
    assert hlo.kernel_evidence(module) == "tpu_custom_call: flash_attention"
    assert hlo.flops_source(module).startswith("hand-written cost_estimate of flash_attention")
    copies = {c.instruction: c for c in hlo.inserted_copies(module)}
    # fusion.1 computes (the scale multiply): not a copy. copy.1 and the transpose-only fusion.2 are.
    assert set(copies) == {"copy.1", "fusion.2", "copy.2"}
    assert (copies["copy.1"].side, copies["copy.1"].bytes) == ("in", 8 * 4096 * 128 * 2)
    assert (copies["fusion.2"].side, copies["fusion.2"].bytes) == ("in", 8 * 4096 * 128 * 2)
    assert (copies["copy.2"].side, copies["copy.2"].bytes) == ("out", 4096 * 8 * 64 * 2)
    assert hlo.describe_copies(list(copies.values())) == ("in: 1 copy, 1 fusion (16.8 MB); "
                                                          "out: 1 copy (4.2 MB)")


def test_gpu_module_names_cudnn_and_the_triton_kernel():
    module = hlo.parse_module(GPU_HLO)
    assert hlo.kernel_evidence(module) == ("__cudnn$fmhaSoftmax: dot_product_attention_fwd; "
                                           "__gpu$xla.gpu.triton: mha_forward")
    assert hlo.inserted_copies(module) == []
    assert "no cost estimate" in hlo.flops_source(module)


def test_a_module_without_custom_calls_is_plain_fusions():
    call = 'custom-call(%fusion.1, %bitcast.1, %fusion.2), custom_call_target="tpu_custom_call"'
    assert call in TPU_HLO
    text = TPU_HLO.replace(call, "add(%fusion.1, %fusion.2)")
    module = hlo.parse_module(text)
    assert hlo.kernel_evidence(module) == "no custom call: plain XLA fusions (2)"
    assert hlo.kernel_evidence(module, interpret=True).endswith("the kernel body as plain XLA ops")
    assert hlo.flops_source(module).startswith("xla:")


# -------------------------------------------------------------------------------- targets
def test_targets_tie_to_hardware_profiles_and_gpu_config_is_written_from_them():
    targets = load_targets()
    assert {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v5e-2x2", "h100-sxm", "h200"} <= set(targets)
    assert targets["tpu-v5e-2x2"].chips == 4
    config = gpu_target_config(targets["h200"])
    assert "core_count: 132" in config and "cuda_compute_capability { major: 9 minor: 0 }" in config
    assert "device_memory_size: 141000000000" in config  # hardware profile h200-sxm: 141 GB
    assert "memory_bandwidth: 4800000000000" in config  # 4.8 TB/s
    assert "shared_memory_per_block_optin: 232448" in config
    assert 'device_description_str: "NVIDIA H200"' in config
    assert "device_memory_size: 80000000000" in gpu_target_config(targets["h100-sxm"])
    for target in targets.values():
        for figure in target.spec.values():
            assert figure.source.strip() and figure.date


def test_unknown_target_names_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown compile target 'tpu-v9'; known: tpu-v4, tpu-v5e.*h200"):
        get_targets(["tpu-v5e", "tpu-v9"])


def test_a_gpu_figure_without_its_source_is_refused():
    text = (ROOT / "attnbench" / "compiled_for" / "targets.toml").read_text()
    broken = re.sub(r'core_count = \{ value = 132, source = "[^"]*"',
                    'core_count = { value = 132, source = " "', text)
    assert broken != text
    with pytest.raises(ValueError, match="chips.gh100-sxm.core_count: source is empty"):
        load_targets(broken)


def test_missing_compilers_name_the_install_step(monkeypatch):
    real = importlib.util.find_spec
    gone = ("libtpu", "jax_plugins.xla_cuda12")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in gone else real(name, *a))
    tpu = environment_problem("tpu")
    assert "libtpu is not installed" in tpu and "make setup-targets" in tpu
    gpu = environment_problem("gpu")
    assert "jax-cuda12-plugin" in gpu and "make setup-targets" in gpu


# ------------------------------------------------------------------- the kernels' hook
def test_kernels_see_the_target_platform_while_compiling_for_it():
    import attention_impls
    from attention_impls._compile_target import compile_target, compiling_for
    from attention_impls.jax_cudnn import gpu_compute_capability, head_dim_limit

    splash = attention_impls.get("jax-pallas-tpu-splash")
    cudnn = attention_impls.get("jax-cudnn")
    assert compile_target() is None
    with compiling_for("tpu", name="tpu-v5e"):
        assert here.platform(splash) == "tpu"  # so splash builds its kernel with interpret=False
        assert here.check(cudnn, Workload(dtype="bfloat16")) == cudnn.platform_support["tpu"].note
        with compiling_for("gpu", name="h200", compute_capability=(9, 0)):
            assert here.platform(cudnn) == "gpu" and gpu_compute_capability() == (9, 0)
            assert head_dim_limit(gpu_compute_capability()) == 256
        assert compile_target().name == "tpu-v5e"
    assert compile_target() is None
    with pytest.raises(ValueError, match="must be one of"):
        with compiling_for("cpu"):
            pass


# -------------------------------------------------------------------------------- worker
@pytest.fixture
def stubs(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import compiled_for_stubs

    return compiled_for_stubs


def test_a_hanging_compile_is_a_timeout_record_and_a_crash_an_error_record(stubs):
    from attnbench.compiled_for.worker import CompileWorker

    [target] = get_targets(["tpu-v5e"])
    workload = Workload(seq_q=1024, dtype="bfloat16", causal=True)
    with CompileWorker(task=stubs.hang) as worker:
        record = worker.compile(target, "jax-xla", workload, timeout_s=1.0)
    assert record["status"] == classify.TIMEOUT and "no result within 1 s" in record["reason"]
    assert (record["target"], record["impl"], record["seq_q"]) == ("tpu-v5e", "jax-xla", 1024)
    with CompileWorker(task=stubs.die) as worker:
        record = worker.compile(target, "jax-xla", workload, timeout_s=30.0)
    assert record["status"] == classify.ERROR and "exit code 3" in record["reason"]
    assert "Check failed: layout assignment aborted" in record["reason"]


def test_a_crash_mid_sweep_never_stops_it(stubs):
    from attnbench.compiled_for.worker import CompileWorker

    [target] = get_targets(["h200"])
    workload = Workload(seq_q=1024, dtype="bfloat16", causal=True)
    cases = [Case(target, name, workload) for name in ("jax-xla", "crash", "jax-cudnn")]
    seen = []
    with CompileWorker(task=stubs.echo) as worker:
        rows = run_cases(cases, progress=False, worker=worker, on_record=lambda i, record: seen.append(i + 1))
    assert [r["status"] for r in rows] == [classify.OK, classify.ERROR, classify.OK]
    assert "exit code 9" in rows[1]["reason"] and seen == [1, 2, 3]


# ------------------------------------------------------------------------------------ CLI
def test_cli_bad_input(capsys, monkeypatch):
    from attnbench.cli import main
    from attnbench.compiled_for.cli import parse_length

    assert parse_length("64k") == 65536 and parse_length("4096") == 4096
    assert main(["compile-for", "--target", "tpu-v9", "--impl", "jax-xla"]) == 2
    assert "unknown compile target 'tpu-v9'; known: tpu-v4" in capsys.readouterr().err
    assert main(["compile-for", "--target", "h200", "--impl", "no-such-kernel"]) == 2
    capsys.readouterr()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    assert main(["compile-for", "--target", "tpu-v5e", "--impl", "jax-xla", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot compile for tpu-v5e: libtpu is not installed" in err and "make setup-targets" in err
    with pytest.raises(SystemExit) as exit_:
        main(["compile-for", "--target", "tpu-v5e", "--seq", "12x"])
    assert exit_.value.code == 2


@pytest.mark.parametrize("bad", ["0", "-3", "4k", "1.5"])
def test_cli_max_batch_must_be_a_whole_number_of_at_least_one(bad, capsys):
    from attnbench.cli import main
    from attnbench.compiled_for.cli import parse_batch

    assert parse_batch("4096") == 4096 and parse_batch("1") == 1
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["compile-for", "--target", "tpu-v5e", "--max-batch", bad])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --max-batch" in err and ">= 1" in err and repr(bad) in err


def test_cli_max_batch_writes_its_table_and_keeps_records_csv_one_batch(tmp_path, capsys, monkeypatch):
    import csv

    from attnbench.cli import main
    from attnbench.compiled_for import targets, worker
    from attnbench.compiled_for.records import MAX_BATCH_COLUMNS

    monkeypatch.setattr(targets, "environment_problem", lambda platform: None)
    monkeypatch.setattr(worker, "CompileWorker", FakeBatchWorker)  # the sweep's workers
    out = tmp_path / "run"
    assert main(["compile-for", "--target", "tpu-v5e", "--impl", "jax-xla", "--seq", "4k", "--quiet",
                 "--max-batch", "4096", "--out", str(out)]) == 0
    with open(out / "max_batch.csv") as f:
        [row] = list(csv.DictReader(f))
    assert list(row) == MAX_BATCH_COLUMNS
    assert (row["max_batch"], row["compiles"], row["batches_tried"]) == ("38", "4", "5")
    assert (row["capped"], row["tokens_per_chip"]) == ("False", "155648")
    assert row["peak_bytes_at_max"] == "15664800000"
    with open(out / "records.csv") as f:
        assert [r["batch"] for r in csv.DictReader(f)] == ["1"]
    with open(out / "max_batch_records.csv") as f:
        assert [r["batch"] for r in csv.DictReader(f)] == ["31", "32", "38", "39"]
    printed = capsys.readouterr().out
    assert "max_batch" in printed and "39: does not fit (peak > HBM)" in printed and "15.7 GB" in printed


# -------------------------------------------------------------------------------- the asv class
def _benchmark_module():
    path = ROOT / "benchmarks" / "compiled_for.py"
    spec = importlib.util.spec_from_file_location("compiled_for_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_asv_class_is_na_with_the_install_step_where_the_compilers_are_missing(monkeypatch):
    from attnbench.compiled_for import suite, targets

    monkeypatch.setattr(targets, "environment_problem",
                        lambda platform: f"no {platform} compiler here; make setup-targets")
    bench = _benchmark_module().CompiledFor()
    cache = bench.setup_cache()  # nothing compiles: no worker, no jax
    target, impl, seq, mode, dtype = (p[0] for p in bench.params)
    with pytest.raises(NotImplementedError, match="compiler here; make setup-targets"):
        bench.setup(cache, target, impl, seq, mode, dtype)
    for name in dir(bench):
        if name.startswith("track_"):
            method = getattr(bench, name)
            assert method.unit and method.version == suite.VERSION and name.startswith("track_compiled_")


def test_asv_readers_and_the_default_suite_leaves_interpreters_out():
    from attnbench.compiled_for import suite

    ok = {"status": "ok", "fits": False, "peak_bytes": 206e9, "model_roofline_usd": None}
    assert suite.status_code(ok) == 0 and suite.does_not_fit(ok) == 1.0
    assert suite.number(ok, "peak_bytes") == 206e9 and math.isnan(suite.number(ok, "model_roofline_usd"))
    assert suite.status_code({"status": "does-not-fit", "fits": False}) == 1
    assert math.isnan(suite.does_not_fit({"status": "error", "fits": None}))
    [tpu] = get_targets(["tpu-v5e"])
    assert "interpret-only" in suite.outside_suite(tpu, "jax-pallas-gpu-mha", suite.SUITES["default"])
    assert suite.outside_suite(tpu, "jax-pallas-gpu-mha", suite.SUITES["full"]) is None
    assert suite.outside_suite(tpu, "jax-pallas-tpu-splash", suite.SUITES["default"]) is None
    with pytest.raises(NotImplementedError, match="cuDNN needs"):
        key = suite.key("tpu-v5e", "jax-cudnn", 4096, "fwd", "bfloat16")
        suite.record_for({key: {"status": "unsupported", "reason": "cuDNN needs an NVIDIA GPU"}},
                         "tpu-v5e", "jax-cudnn", 4096, "fwd", "bfloat16")


# ----------------------------------------------------------------------------- the report
def _records(tmp_path):
    pd = pytest.importorskip("pandas")
    from attnbench.compiled_for.records import COLUMNS

    base = dict.fromkeys(COLUMNS)
    base.update(target="tpu-v5e", platform="tpu", hardware_profile="tpu-v5e", topology="v5e:1x1", chips=1,
                devices=1, batch=1, q_heads=8, kv_heads=8, head_dim=64, dtype="bfloat16", causal=True,
                mode="fwd", hbm_bytes=16e9, jax="0.10.2", libtpu="0.0.42.1")
    rows = [
        {**base, "impl": "jax-xla", "seq_q": 4096, "status": "ok", "fits": True, "peak_bytes": 1.09e9,
         "inserted_copy_bytes": 0, "model_roofline_seconds": 3.38e-3, "model_roofline_usd": 1.1e-6,
         "model_roofline_bound": "memory", "roofline_bytes_source": "compiler",
         "compiler_flops_source": "xla"},
        {**base, "impl": "jax-xla", "seq_q": 65536, "status": "does-not-fit", "fits": False,
         "compiler_required_bytes": 142e9, "reason": "RESOURCE_EXHAUSTED: Ran out of memory on HBM"},
        {**base, "impl": "jax-pallas-tpu-splash", "seq_q": 65536, "status": "ok", "fits": True,
         "peak_bytes": 0.806e9, "inserted_copy_bytes": 0.336e9,
         "inserted_copy_detail": "in: 2 copy (268.4 MB)",
         "kernel_evidence": "tpu_custom_call: splash_mha_fwd_no_residuals", "model_roofline_seconds": 0.0223,
         "model_roofline_usd": 7.4e-6, "model_roofline_bound": "compute"},
        {**base, "impl": "jax-cudnn", "seq_q": 4096, "status": "unsupported",
         "reason": "cuDNN needs an NVIDIA GPU"},
    ]
    for row in rows:
        row["seq_k"] = row["seq_q"]
    folder = tmp_path / "results" / "compiled-for"
    folder.mkdir(parents=True)
    pd.DataFrame(rows, columns=COLUMNS).to_csv(folder / "records.csv", index=False)
    return tmp_path / "results"


def test_report_section_says_compiled_not_measured(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("jinja2")
    from attnbench.report.compiled import compiled_part, fits_cell
    from attnbench.report.render import _environment

    results = _records(tmp_path)
    part = compiled_part(str(results), str(tmp_path / "out"))
    [target] = part["targets"]
    fits = target["fits"].cells.set_index("implementation mode")
    assert fits.loc["jax-xla fwd", "4096"] == "fits (1.09 GB)"
    assert fits.loc["jax-xla fwd", "65536"] == "refused: HBM (needs 142 GB)"
    assert fits.loc["jax-pallas-tpu-splash fwd", "65536"] == "fits (0.806 GB)"
    assert fits.loc["jax-cudnn fwd", "4096"] == "n/a"
    assert part["images"]["compiled_tpu-v5e.png"].startswith(b"\x89PNG")
    assert (tmp_path / "out" / "compiled_tpu-v5e.png").exists()
    assert fits_cell({"status": "ok", "fits": False, "peak_bytes": 206e9}) == "does not fit (206 GB)"
    for fmt in ("markdown.j2", "html.j2"):
        images = {k: "AAAA" for k in part["images"]}
        text = _environment(html=fmt == "html.j2").get_template("compiled.j2").render(
            compiled_for=part, fmt=fmt, images=images)
        assert "Compiled for, not measured" in text and "Compiled for tpu-v5e" in text
        assert "model" in text and "splash_mha_fwd_no_residuals" in text


def test_report_max_batch_table_reads_the_committed_file_and_newer_runs(tmp_path):
    pd = pytest.importorskip("pandas")
    from attnbench.compiled_for.run import max_batch_table as write_max_batch
    from attnbench.report.compiled import max_batch_table

    assert max_batch_table(str(tmp_path / "nothing")).empty
    targets = get_targets(["tpu-v5e", "h200"])
    summary, _ = max_batch(targets, ["jax-xla", "jax-cudnn"], Workload(dtype="bfloat16"), [4096], ["fwd"],
                           ["bfloat16"], 4096, progress=False, worker=FakeBatchWorker())
    folder = tmp_path / "results" / "compiled-for"
    write_max_batch(summary, str(folder / "max_batch.csv"))
    newer = [dict(summary[0], max_batch=37, capped=False)]  # a later run of one case wins
    write_max_batch(newer, str(folder / "runs" / "20270101T000000Z" / "max_batch.csv"))
    results = str(tmp_path / "results")
    table = max_batch_table(results, "tpu-v5e")
    assert "target" not in table and list(table["implementation"]) == ["jax-cudnn", "jax-xla"]
    assert list(table.columns[:6]) == ["implementation", "mode", "dtype", "length", "execution",
                                       "largest batch"]
    cudnn, xla = table.iloc[0], table.iloc[1]
    assert (xla["largest batch"], xla["tokens per chip"], xla["peak at max"]) == ("37", "155648", "15.7 GB")
    assert (cudnn["largest batch"], cudnn["skipped"]) == ("-", "unsupported at batch 1")
    every = max_batch_table(results)
    assert isinstance(every, pd.DataFrame) and every.columns[0] == "target"
    cases = zip(every["target"], every["implementation"], every["largest batch"], strict=True)
    assert sorted(cases) == [
        ("h200", "jax-cudnn", "-"), ("h200", "jax-xla", "38"), ("tpu-v5e", "jax-cudnn", "-"),
        ("tpu-v5e", "jax-xla", "37")]
    assert max_batch_table(results, "tpu-v6e").empty


# ------------------------------------------------------------------ the models grid (no compiler)
def test_a_preset_workloads_record_carries_its_mask_and_exact_flops():
    from attnbench.compiled_for.records import COLUMNS, new_record
    from attnbench.core import presets

    [h200] = get_targets(["h200"])
    gemma = presets.workload("gemma-2-9b", "prefill", size="real", dtype="bfloat16", seq=8192)
    record = new_record(h200, "jax-xla-chunked", gemma)
    assert {"workload", "phase", "mask", "mask_density", "window", "softcap", "documents"} <= set(COLUMNS)
    assert (record["workload"], record["phase"], record["mask"]) == \
        ("gemma-2-9b", "prefill", "causal+window(4096)+softcap(50)")
    assert (record["window"], record["softcap"], record["documents"]) == (4096, 50.0, None)
    # Row i keeps min(i + 1, 4096) keys: a triangle of 4096 rows, then 4096 rows of 4096 keys.
    pairs = 4096 * 4097 // 2 + 4096 * 4096
    assert record["mask_density"] == pytest.approx(pairs / 8192**2)
    assert record["flops"] == 4 * 16 * 256 * pairs
    decode = presets.workload("llama-3.1-8b", "decode", size="real", dtype="bfloat16", kv_len=131072)
    record = new_record(h200, "jax-xla", decode)
    assert (record["phase"], record["mask"], record["batch"], record["seq_q"]) == \
        ("decode", "causal+ragged-cache", 8, 1)
    assert 0.25 < record["mask_density"] < 1  # the ragged caches' padding is not attended
    # The roofline's bytes floor for decode is the KV cache, its valid keys read once.
    kv_bytes = 2 * sum(decode.cache_lengths()) * 8 * 128 * 2
    assert decode.min_bytes == kv_bytes + 2 * 8 * 32 * 128 * 2


def test_models_grid_marks_impossible_cases_na_with_the_reason(monkeypatch):
    from attnbench.compiled_for import suite

    monkeypatch.setenv("ATTNBENCH_SUITE", "full")
    cases = {
        ("vit-b-16", "decode", 32768): "vit-b-16 has no decode phase (bidirectional encoder",
        ("bert-base", "prefill", 8192): "bert-base is an encoder of 512 tokens",
        ("gemma-2-9b", "prefill", 32768): "gemma-2-9b's context is 8192 tokens",
        ("gemma-2-9b", "decode", 32768): "shorter than a 32768-key cache",
        ("mistral-7b", "decode", 131072): "mistral-7b's context is 32768 tokens",
        ("llama-3.1-8b", "prefill", 131072): "prefill compiles prompts of 8192 and 32768 tokens",
        ("llama-3.1-8b", "decode", 8192): "decode compiles caches of 32768 and 131072 keys",
    }
    for (preset, phase, length), reason in cases.items():
        workload, why = suite.model_case(preset, phase, length)
        assert workload is None and reason in why, (preset, phase, length, why)
    decode, _ = suite.model_case("llama-3.1-8b", "decode", 131072)
    assert (decode.batch, decode.seq_q, decode.seq_k, decode.ragged, decode.dtype) == \
        (8, 1, 131072, True, "bfloat16")
    prefill, _ = suite.model_case("mistral-7b", "prefill", 32768)
    assert (prefill.batch, prefill.seq_q, prefill.window, prefill.name) == (1, 32768, 4096, "mistral-7b")
    training, _ = suite.model_case("llama-3.1-70b", "training", 32768)
    assert (training.mode, training.documents, training.q_heads, training.kv_heads) == \
        ("fwd_bwd", None, 64, 8)
    monkeypatch.setenv("ATTNBENCH_SUITE", "default")
    workload, why = suite.model_case("llama-3.1-8b", "prefill", 8192)
    assert workload is None and why.startswith("left out of the default suite size, which compiles "
                                               "llama-3.1-8b prefill 32768, llama-3.1-8b decode 131072")
    # An impossible case says why it is impossible, not that the size left it out.
    assert "context is 8192" in suite.model_case("gemma-2-9b", "decode", 131072)[1]


def test_models_class_params_per_size(monkeypatch):
    from attnbench.core import presets

    monkeypatch.delenv("ATTNBENCH_IMPLS", raising=False)
    monkeypatch.delenv("ATTNBENCH_COMPILE_TARGETS", raising=False)
    monkeypatch.setenv("ATTNBENCH_SUITE", "full")
    full = _benchmark_module().CompiledForModels
    assert full.param_names == ["target", "implementation", "workload", "phase", "length"]
    targets, impls, workloads, phases, lengths = full.params
    assert targets == ["tpu-v5e", "tpu-v6e", "h200"] and workloads == list(presets.PRESETS)
    assert phases == ["prefill", "training", "decode"] and lengths == [8192, 32768, 131072]
    assert "jax-pallas-tpu-splash" in impls and "jax-cudnn" in impls
    monkeypatch.setenv("ATTNBENCH_SUITE", "default")
    default = _benchmark_module().CompiledForModels
    assert default.params[0] == ["tpu-v5e", "h200"] and default.params[2] == ["llama-3.1-8b", "gemma-2-9b"]
    assert default.params[3] == ["prefill", "decode"] and default.params[4] == [8192, 32768, 131072]
    assert set(default.params[1]) <= set(impls) and "jax-blockwise-flash" not in default.params[1]
    monkeypatch.setenv("ATTNBENCH_IMPLS", "jax-blockwise-flash,torch-sdpa-math")
    # ATTNBENCH_IMPLS replaces the size's kernels (its jax ones)
    assert _benchmark_module().CompiledForModels.params[1] == ["jax-blockwise-flash"]
    # Both classes track the same figures, from one shared definition.
    module = _benchmark_module()
    for name in dir(module.CompiledFor):
        if name.startswith("track_"):
            assert getattr(module.CompiledForModels, name) is getattr(module.CompiledFor, name)


def test_models_setup_cache_compiles_only_the_chosen_cases(monkeypatch):
    """The default grid with a stand-in compiler: what it sends, and the n/a reasons of the rest."""
    from attnbench.compiled_for import run, suite, targets

    monkeypatch.setenv("ATTNBENCH_SUITE", "default")
    monkeypatch.delenv("ATTNBENCH_IMPLS", raising=False)
    monkeypatch.delenv("ATTNBENCH_COMPILE_TARGETS", raising=False)
    monkeypatch.setattr(targets, "environment_problem", lambda platform: None)
    sent = []

    def fake_run_cases(cases, **kwargs):
        sent.extend(cases)
        ok = {"status": "ok", "fits": True, "peak_bytes": 1e9, "model_roofline_usd": 1e-6}
        refused = {"status": "unsupported", "reason": "a shape rule"}
        return [ok if c.impl == "jax-xla" else refused for c in cases]

    monkeypatch.setattr(run, "run_cases", fake_run_cases)
    bench = _benchmark_module().CompiledForModels()
    cache = bench.setup_cache()
    chosen = {(c.workload.name, c.workload.phase, c.workload.stream_length) for c in sent}
    assert chosen == set(suite.MODELS["default"]["cases"])
    assert {c.workload.dtype for c in sent} == {"bfloat16"}
    # Interpret-only kernels are left out without compiling: the GPU decode kernel on a TPU.
    assert ("tpu-v5e", "jax-pallas-gpu-decode") not in {(c.target.name, c.impl) for c in sent}
    assert ("h200", "jax-pallas-gpu-decode") in {(c.target.name, c.impl) for c in sent}
    bench.setup(cache, "h200", "jax-xla", "llama-3.1-8b", "decode", 131072)
    assert bench.track_compiled_status(cache) == 0 and bench.track_compiled_peak_bytes(cache) == 1e9
    with pytest.raises(NotImplementedError, match="a shape rule"):
        bench.setup(cache, "h200", "jax-cudnn", "llama-3.1-8b", "decode", 131072)
    with pytest.raises(NotImplementedError, match="interpret-only"):
        bench.setup(cache, "tpu-v5e", "jax-pallas-gpu-decode", "llama-3.1-8b", "decode", 131072)
    with pytest.raises(NotImplementedError, match="context is 8192 tokens"):
        bench.setup(cache, "h200", "jax-xla", "gemma-2-9b", "decode", 131072)
    with pytest.raises(NotImplementedError, match="left out of the default suite size"):
        bench.setup(cache, "h200", "jax-xla", "llama-3.1-8b", "decode", 32768)


def test_models_class_is_na_with_the_install_step_where_the_compilers_are_missing(monkeypatch):
    from attnbench.compiled_for import targets

    monkeypatch.setattr(targets, "environment_problem",
                        lambda platform: f"no {platform} compiler here; make setup-targets")
    bench = _benchmark_module().CompiledForModels()
    cache = bench.setup_cache()  # nothing compiles: no worker, no jax
    with pytest.raises(NotImplementedError, match="compiler here; make setup-targets"):
        bench.setup(cache, "h200", bench.params[1][0], "llama-3.1-8b", "decode", 131072)
