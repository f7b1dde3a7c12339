"""Real compiles for TPUs and GPUs this host does not have (libtpu, XLA:GPU + ptxas + cuDNN).

Runs in .venv-targets (``make test-targets``: ``JAX_PLATFORMS=cpu``, ``ATTNBENCH_TEST_TARGETS=1``,
where a missing compiler fails); elsewhere the module is skipped. Small sizes, except the two
acceptance cases at 64k tokens, which cost about 20 s of splash's host-side mask building.
"""

from __future__ import annotations

import csv
import importlib.util
import os

import pytest

from attnbench.backends import here
from attnbench.compiled_for import classify
from attnbench.compiled_for.targets import Target, environment_problem
from attnbench.core.workload import Workload

_MISSING = environment_problem("tpu") or environment_problem("gpu")
if _MISSING and os.environ.get("ATTNBENCH_TEST_TARGETS"):
    raise RuntimeError(f"ATTNBENCH_TEST_TARGETS is set but this venv cannot compile for targets: {_MISSING}")
pytestmark = [pytest.mark.compilers,
              pytest.mark.skipif(bool(_MISSING), reason=f"needs the targets venv: {_MISSING}")]

W1K = Workload(seq_q=1024, q_heads=8, head_dim=64, dtype="bfloat16", causal=True)


@pytest.fixture(scope="module", autouse=True)
def compiling_process():
    from attnbench.compiled_for.worker import compile_environment

    compile_environment()  # JAX_PLATFORMS=cpu before jax is imported here
    import jax

    assert jax.devices()[0].platform == "cpu"


def compile_case(*args, **kwargs):
    from attnbench.compiled_for.compile import compile_case as real

    return real(*args, **kwargs)


def test_splash_compiles_to_a_mosaic_kernel_for_v5e_not_the_interpreter():
    record = compile_case("tpu-v5e", "jax-pallas-tpu-splash", W1K)
    assert record["status"] == classify.OK and record["fits"] is True
    assert record["execution"] == "compiled" and record["label"] == "native"
    assert record["kernel_evidence"] == "tpu_custom_call: splash_mha_fwd_no_residuals"
    assert 0 < record["peak_bytes"] < record["hbm_bytes"] == 16_000_000_000
    # q, k, v and o in [B, S, H, D] bf16: 4 x 1 MiB logical; D=64 tiles to 128 lanes where laid minor.
    assert record["inserted_copies"] >= 2 and record["inserted_copy_bytes"] >= 2 * 1024 * 8 * 64 * 2
    assert "no cost estimate" in record["compiler_flops_source"]
    assert record["compiler_bytes_accessed"] > 0 and record["roofline_bytes_source"].startswith("compiler")
    # The workload's count, causal fwd: 4 H D x the kept pairs, S (S + 1) / 2 exactly.
    assert record["flops"] == 4 * 8 * 64 * (1024 * 1025 // 2)
    assert (record["workload"], record["phase"], record["mask"], record["mask_density"]) == \
        ("custom", "prefill", "causal", 1025 / 2048)
    assert record["model_roofline_seconds"] == pytest.approx(
        max(record["flops"] / 197e12, record["roofline_bytes"] / 0.819e12))
    assert record["model_roofline_usd"] == pytest.approx(record["model_roofline_seconds"] * 1.20 / 3600)
    assert record["libtpu"] and record["jax"] == "0.10.2"


def test_plain_attention_at_64k_does_not_fit_a_v5e_in_the_compilers_words():
    record = compile_case("tpu-v5e", "jax-xla", W1K.replace(seq_q=65536, seq_k=65536))
    assert record["status"] == classify.DOES_NOT_FIT and record["fits"] is False
    assert "Ran out of memory on HBM" in record["reason"]
    assert record["compiler_hbm_bytes"] == pytest.approx(15.75 * 2**30)
    assert record["compiler_required_bytes"] > record["compiler_hbm_bytes"]


def test_cudnn_compiles_to_its_fmha_call_for_h200_and_the_gpu_compiler_accepts_what_cannot_fit():
    cudnn = compile_case("h200", "jax-cudnn", W1K)
    assert cudnn["status"] == classify.OK and cudnn["fits"] is True
    assert cudnn["kernel_evidence"] == "__cudnn$fmhaSoftmax: dot_product_attention_fwd"
    assert cudnn["compiler_flops_source"].startswith("none: the GPU compiler gives no cost analysis")
    assert cudnn["roofline_bytes_source"].startswith("workload minimum")
    import attention_impls

    impl = attention_impls.get("jax-cudnn")
    via_backend = here.backend_of(impl).compile_for(impl, W1K, "h200")  # the backend protocol's entry point
    assert via_backend["kernel_evidence"] == cudnn["kernel_evidence"]
    assert via_backend["peak_bytes"] == cudnn["peak_bytes"]
    big = compile_case("h200", "jax-xla", W1K.replace(seq_q=65536, seq_k=65536))
    assert big["status"] == classify.OK and big["fits"] is False  # compiled, yet 206 GB > 141 GB
    assert big["peak_bytes"] > 141e9 and big["kernel_evidence"].startswith("no custom call")


def test_pallas_gpu_mha_is_a_triton_call_and_too_large_tiles_are_refused_by_it():
    record = compile_case("h200", "jax-pallas-gpu-mha", W1K)
    assert record["kernel_evidence"] == "__gpu$xla.gpu.triton: mha_forward"
    refused = compile_case("h200", "jax-pallas-gpu-mha", W1K.replace(head_dim=256, mode="fwd_bwd"))
    assert refused["status"] == classify.KERNEL_REFUSED
    assert "Shared memory size limit exceeded" in refused["reason"] and "232448" in refused["reason"]


def test_unsupported_cases_give_the_implementations_reason():
    flash_on_gpu = compile_case("h200", "jax-pallas-tpu-flash", W1K)
    assert flash_on_gpu["status"] == classify.UNSUPPORTED and "Mosaic TPU kernel" in flash_on_gpu["reason"]
    ragged = compile_case("tpu-v5e", "jax-pallas-tpu-splash", W1K.replace(seq_q=1000, seq_k=1000))
    assert ragged["status"] == classify.UNSUPPORTED and "multiple of the 128 block" in ragged["reason"]


def test_mosaic_refuses_the_kernels_on_a_v3_a_real_kernel_refusal():
    v3 = Target(name="tpu-v3-test", platform="tpu", hardware_profile="tpu-v4", topology="v3:1x1x1")
    record = compile_case(v3, "jax-pallas-tpu-flash", W1K)
    assert record["status"] == classify.KERNEL_REFUSED
    assert record["reason"].startswith("Mosaic:") and "Unsupported matmul RHS type" in record["reason"]
    assert compile_case(v3, "jax-xla", W1K)["status"] == classify.OK


def test_a_slice_shards_heads_over_its_chips_and_a_v4_chip_over_its_cores():
    slice_ = compile_case("tpu-v5e-2x2", "jax-pallas-tpu-splash", W1K.replace(mode="fwd_bwd"))
    assert slice_["status"] == classify.OK and (slice_["devices"], slice_["chips"]) == (4, 4)
    assert slice_["kernel_evidence"].startswith("tpu_custom_call: splash_mha_fwd_residuals")
    v4 = compile_case("tpu-v4", "jax-pallas-tpu-flash", W1K)
    assert v4["status"] == classify.OK and v4["devices"] == 2 and v4["hbm_bytes"] == 16_000_000_000
    odd = compile_case("tpu-v5e-2x2", "jax-xla", W1K.replace(q_heads=6, kv_heads=6))
    assert odd["status"] == classify.UNSUPPORTED and "do not divide evenly" in odd["reason"]


def test_cli_acceptance_writes_the_records_table(tmp_path, capsys):
    """The acceptance of the issue, through the CLI and its killable workers."""
    from attnbench.cli import main

    out = tmp_path / "run"
    assert main(["compile-for", "--target", "tpu-v5e", "h200", "--impl", "jax-xla", "jax-pallas-tpu-splash",
                 "jax-cudnn", "--seq", "64k", "--dtype", "bfloat16", "--quiet", "--out", str(out)]) == 0
    rows = {(r["target"], r["impl"]): r for r in csv.DictReader(open(out / "records.csv"))}
    for column in ("target", "impl", "seq_q", "mode", "dtype", "status", "fits", "peak_bytes", "hbm_bytes",
                   "kernel_evidence", "reason"):
        assert column in next(iter(rows.values()))
    plain = rows["tpu-v5e", "jax-xla"]
    assert (plain["status"], plain["fits"]) == ("does-not-fit", "False")
    splash = rows["tpu-v5e", "jax-pallas-tpu-splash"]
    assert (splash["status"], splash["fits"]) == ("ok", "True")
    assert "tpu_custom_call" in splash["kernel_evidence"]
    assert rows["h200", "jax-xla"]["fits"] == "False"
    cudnn = rows["h200", "jax-cudnn"]
    assert (cudnn["status"], cudnn["fits"]) == ("ok", "True") and "__cudnn$fmha" in cudnn["kernel_evidence"]
    assert rows["tpu-v5e", "jax-cudnn"]["status"] == "unsupported"
    printed = capsys.readouterr().out
    assert "compiled for, not measured" in printed and "tpu_custom_call" in printed


def test_max_feasible_length_from_the_compiler():
    from attnbench.compiled_for.run import max_feasible
    from attnbench.compiled_for.targets import get_targets

    summary, _ = max_feasible(get_targets(["h200"]), ["jax-cudnn"], W1K, ["fwd"], ["bfloat16"], 8192,
                              progress=False)
    assert summary[0]["max_feasible_seq"] == 8192 and summary[0]["compiles"] == 1


def test_max_batch_from_the_compiler_fits_and_one_more_does_not():
    """Plain attention at 4k on a v5e (about 1.1 GB a sequence): the largest batch under 32 whose
    program fits 16 GB, its record and the one a batch above it both compiled by libtpu."""
    from attnbench.compiled_for.run import feasible, max_batch
    from attnbench.compiled_for.targets import get_targets

    [row], compiled = max_batch(get_targets(["tpu-v5e"]), ["jax-xla"], W1K, [4096], ["fwd"], ["bfloat16"], 32,
                                progress=False)
    by_batch = {r["batch"]: r for r in compiled}
    best = row["max_batch"]
    assert 1 < best < 32 and row["capped"] is False and row["compiles"] == len(compiled)
    assert feasible(by_batch[best]) and not feasible(by_batch[best + 1])
    assert row["peak_bytes_at_max"] == by_batch[best]["peak_bytes"] <= row["hbm_bytes"] == 16_000_000_000
    assert row["stopped_by"].startswith(f"{best + 1}: ") and row["tokens_per_chip"] == best * 4096


def test_asv_class_tracks_the_compilers_figures(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_SUITE", "smoke")
    monkeypatch.setenv("ATTNBENCH_IMPLS", "jax-xla,jax-pallas-tpu-splash,jax-cudnn")
    spec = importlib.util.spec_from_file_location(
        "compiled_for_bench", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "compiled_for.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bench = module.CompiledFor()
    impls = ["jax-cudnn", "jax-pallas-tpu-splash", "jax-xla"]  # the registry's order
    assert bench.params[:3] == (["tpu-v5e", "h200"], impls, [1024])
    cache = bench.setup_cache()
    bench.setup(cache, "tpu-v5e", "jax-pallas-tpu-splash", 1024, "fwd", "bfloat16")
    assert bench.track_compiled_status(cache) == 0 and bench.track_compiled_does_not_fit(cache) == 0
    assert bench.track_compiled_peak_bytes(cache) > 0 and bench.track_compiled_inserted_copy_bytes(cache) > 0
    assert bench.track_compiled_model_roofline_usd(cache) > 0
    bench.setup(cache, "h200", "jax-cudnn", 1024, "fwd", "bfloat16")
    assert bench.track_compiled_inserted_copy_bytes(cache) == 0
    with pytest.raises(NotImplementedError, match="cuDNN needs an NVIDIA GPU"):
        bench.setup(cache, "tpu-v5e", "jax-cudnn", 1024, "fwd", "bfloat16")
    with pytest.raises(NotImplementedError, match="interpret-only"):
        bench.setup(cache, "h200", "jax-pallas-tpu-splash", 1024, "fwd", "bfloat16")


def _entry_parameters(hlo_dir) -> list[str]:
    [path] = list(hlo_dir.iterdir())
    text = path.read_text()
    return [line for line in text[text.index("ENTRY"):].splitlines() if "parameter(" in line]


def test_a_preset_workload_compiles_with_its_mask_its_columns_and_segment_ids(tmp_path):
    """Llama-3.1-8B decode (smoke size: 2 ragged caches of 256 keys) for v5e: the segment ids are
    traced int32 arguments after q, k, v; the record says which preset, phase and mask it was."""
    from attnbench.core import presets

    decode = presets.workload("llama-3.1-8b", "decode", size="smoke", dtype="bfloat16")
    record = compile_case("tpu-v5e", "jax-xla", decode, hlo_dir=str(tmp_path))
    assert record["status"] == classify.OK and record["fits"] is True
    assert (record["workload"], record["phase"], record["mask"]) == \
        ("llama-3.1-8b", "decode", "causal+ragged-cache")
    assert record["mask_density"] == pytest.approx(decode.mask_density) and record["mask_density"] < 1
    assert (record["window"], record["softcap"], record["documents"]) == (None, None, None)
    assert record["flops"] == decode.flops and record["roofline_bytes"] >= decode.min_bytes
    params = _entry_parameters(tmp_path)
    assert len(params) == 5  # q, k, v, then the two segment-id arrays
    assert any("s32[2,1]" in p and "parameter(3)" in p for p in params)
    assert any("s32[2,256]" in p and "parameter(4)" in p for p in params)


def test_packed_documents_and_a_window_with_softcap_reach_the_compiled_kernels(tmp_path):
    from attnbench.core import presets

    bert = presets.workload("bert-base", "prefill", size="smoke", dtype="bfloat16", documents=4)  # 512 tokens
    record = compile_case("h200", "jax-xla", bert, hlo_dir=str(tmp_path / "bert"))
    assert record["status"] == classify.OK and (record["documents"], record["mask"]) == (4, "documents(4)")
    assert sum("s32[1,512]" in p for p in _entry_parameters(tmp_path / "bert")) == 2
    gemma = presets.workload("gemma-2-9b", "prefill", size="smoke", dtype="bfloat16")
    splash = compile_case("tpu-v5e", "jax-pallas-tpu-splash", gemma)
    assert splash["status"] == classify.OK and splash["kernel_evidence"].startswith("tpu_custom_call: splash")
    assert (splash["window"], splash["softcap"]) == (gemma.window, 50.0)
    refused = compile_case("h200", "jax-cudnn", gemma)  # a kernel without soft-capping says so
    assert refused["status"] == classify.UNSUPPORTED and "soft" in refused["reason"]


def test_segment_ids_under_the_head_sharding_of_a_slice_and_in_the_backward():
    from attnbench.core import presets

    training = presets.workload("llama-3.1-8b", "training", size="smoke", dtype="bfloat16", documents=4)
    sliced = compile_case("tpu-v5e-2x2", "jax-xla", training)
    assert sliced["status"] == classify.OK and sliced["devices"] == 4 and sliced["phase"] == "training"
    single = compile_case("h200", "jax-xla", training)
    assert single["status"] == classify.OK and single["mode"] == "fwd_bwd"


def test_models_asv_class_compiles_the_smoke_grid(monkeypatch):
    monkeypatch.setenv("ATTNBENCH_SUITE", "smoke")
    monkeypatch.delenv("ATTNBENCH_IMPLS", raising=False)
    spec = importlib.util.spec_from_file_location(
        "compiled_for_bench", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "compiled_for.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bench = module.CompiledForModels()
    assert bench.params == (["tpu-v5e", "h200"], ["jax-xla"], ["llama-3.1-8b", "gemma-2-9b", "vit-b-16"],
                            ["prefill", "decode"], [8192, 32768, 131072])
    cache = bench.setup_cache()
    for target in ("tpu-v5e", "h200"):  # B8 ragged caches of 32768 keys, 32 query / 8 kv heads, D128
        bench.setup(cache, target, "jax-xla", "llama-3.1-8b", "decode", 32768)
        assert bench.track_compiled_status(cache) == 0 and bench.track_compiled_does_not_fit(cache) == 0
        assert bench.record["batch"] == 8 and bench.record["mask"] == "causal+ragged-cache"
        assert bench.track_compiled_peak_bytes(cache) > 2 * 8 * 32768 * 8 * 128 * 2 * 0.5
        assert bench.track_compiled_model_roofline_seconds(cache) > 0
    with pytest.raises(NotImplementedError, match="no decode phase"):
        bench.setup(cache, "h200", "jax-xla", "vit-b-16", "decode", 32768)
    with pytest.raises(NotImplementedError, match="left out of the smoke suite size"):
        bench.setup(cache, "h200", "jax-xla", "llama-3.1-8b", "prefill", 32768)


def test_cudnn_lowers_window_and_segment_ids_to_its_own_options_for_an_h200():
    """Deviceless, in the targets venv: the window reaches cuDNN as sliding_window_length = W, the
    segment ids as the bias operand of __cudnn$fmhaScaleBiasSoftmax (jax's side only: cuDNN
    itself first sees the call on a GPU)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from attention_impls._compile_target import compiling_for
    from attnbench.compiled_for.compile import target_devices
    from attnbench.compiled_for.targets import load_targets

    target = load_targets()["h200"]
    devices, _ = target_devices(target)
    sharding = SingleDeviceSharding(devices[0])
    q = jax.ShapeDtypeStruct((2, 1024, 8, 64), jnp.bfloat16, sharding=sharding)
    kv = jax.ShapeDtypeStruct((2, 1024, 2, 64), jnp.bfloat16, sharding=sharding)
    ids = jax.ShapeDtypeStruct((2, 1024), jnp.int32, sharding=sharding)
    import attention_impls

    cudnn = attention_impls.get("jax-cudnn")
    with compiling_for("gpu", name=target.name, compute_capability=target.compute_capability):
        window = jax.jit(lambda q, k, v: cudnn.attention(q, k, v, causal=True, scale=0.125, window=128))
        text = window.lower(q, kv, kv).as_text()
        assert "__cudnn$fmhaSoftmax" in text and "sliding_window_length\\22: 128" in text
        segments = jax.jit(lambda q, k, v, a, b: cudnn.attention(q, k, v, causal=True, scale=0.125,
                                                                 q_segment_ids=a, kv_segment_ids=b))
        text = segments.lower(q, kv, kv, ids, ids).as_text()
        assert "__cudnn$fmhaScaleBiasSoftmax" in text


# -- Tokamax's kernels ----------------------------------------------------------------------------------
TOKAMAX_1K = Workload(batch=2, seq_q=1024, q_heads=8, head_dim=128, dtype="bfloat16", causal=True)


def test_tokamax_mosaic_tpu_compiles_to_its_splash_kernel_at_its_heuristic_tiles_for_v5e_and_v6e():
    for target in ("tpu-v5e", "tpu-v6e"):
        record = compile_case(target, "jax-tokamax-mosaic-tpu", TOKAMAX_1K)
        assert record["status"] == classify.OK and record["fits"] is True, record["reason"]
        assert record["execution"] == "compiled" and record["label"] == "native"
        assert record["kernel_evidence"] == "tpu_custom_call: splash_mha_fwd_no_residuals"
        # the 0.0.12 wheel caches no v5e or v6e attention: Tokamax's heuristic config, from the HLO
        assert record["library_config"].startswith("PallasMosaicTpuFlashAttention block_q=128,block_kv=128,")


def test_tokamax_gpu_kernels_compile_to_their_own_calls_for_an_h200_and_refuse_a_tpu():
    expected = {"jax-tokamax-triton": "__gpu$xla.gpu.triton: pallas_flash_attention",
                "jax-tokamax-mosaic-gpu": "mosaic_gpu_v2: ", "jax-tokamax-cudnn": "__cudnn$fmhaSoftmax: "}
    for impl, evidence in expected.items():
        record = compile_case("h200", impl, TOKAMAX_1K)
        assert record["status"] == classify.OK, (impl, record["reason"])
        assert record["kernel_evidence"].startswith(evidence), (impl, record["kernel_evidence"])
        refused = compile_case("tpu-v5e", impl, TOKAMAX_1K)
        assert refused["status"] == classify.UNSUPPORTED and "TPU" in refused["reason"]
    mosaic_tpu = compile_case("h200", "jax-tokamax-mosaic-tpu", TOKAMAX_1K)
    assert mosaic_tpu["status"] == classify.UNSUPPORTED and "TPU v5 or newer" in mosaic_tpu["reason"]


def test_tokamax_gpu_kernels_take_their_declared_masks_and_backward_for_an_h200():
    masked = TOKAMAX_1K.replace(batch=1, kv_heads=4, window=256, softcap=30.0, documents=3)
    for impl in ("jax-tokamax-triton", "jax-tokamax-mosaic-gpu", "jax-tokamax-cudnn"):
        declared = masked if impl != "jax-tokamax-cudnn" else masked.replace(softcap=None)  # no soft cap
        for workload in (declared, TOKAMAX_1K.replace(mode="fwd_bwd")):
            record = compile_case("h200", impl, workload)
            assert record["status"] == classify.OK, (impl, workload.describe(), record["reason"])


def test_published_shapes_compile_from_the_cli(tmp_path, capsys):
    from attnbench.cli import main

    out = tmp_path / "published"
    assert main(["compile-for", "--published-shapes", "--target", "h200", "--impl", "jax-tokamax-cudnn",
                 "--quiet", "--out", str(out)]) == 0
    with open(out / "records.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(int(r["batch"]), int(r["q_heads"]), int(r["kv_heads"]), int(r["seq_q"]), int(r["head_dim"]))
            for r in rows} == {(1, 16, 16, 16384, 128), (2, 16, 16, 8192, 128), (8, 16, 16, 2048, 128),
                               (2, 32, 32, 8192, 64), (32, 32, 8, 4096, 128)}
    assert all(r["status"] == "ok" and r["kernel_evidence"].startswith("__cudnn$") for r in rows)
    assert "the published shapes" in capsys.readouterr().out
