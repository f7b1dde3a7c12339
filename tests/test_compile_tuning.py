"""Tuned tiles on the compile targets (``attnbench tune-targets``, ``attnbench/compiled_for/tune.py``).

The kernels' search spaces and the tuner's choice run anywhere (a stand-in worker answers the
compiles); one case compiles for real, in .venv-targets (``ATTNBENCH_TEST_TARGETS=1``), else skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import attention_impls
from attention_impls.base import config_text
from attnbench.compiled_for import classify, tune
from attnbench.compiled_for.records import new_record
from attnbench.compiled_for.targets import environment_problem, load_targets
from attnbench.core.workload import Workload

SPLASH, TPU_FLASH, GPU_MHA = "jax-pallas-tpu-splash", "jax-pallas-tpu-flash", "jax-pallas-gpu-mha"
LENGTHS = (128, 256, 384, 512, 640, 768, 1024, 1536, 2048, 8192, 32768, 131072)
PREFILL = Workload(batch=1, q_heads=8, head_dim=128, seq_q=8192, dtype="bfloat16", causal=True)


def impl(name):
    return attention_impls.get(name)


def _old_tile(length: int) -> int:
    """Today's rule before the knobs, written out: the largest of 512/256/128 dividing the length."""
    return next((t for t in (512, 256, 128) if length % t == 0), 128)


# ------------------------------------------------------------------ the search spaces
@pytest.mark.parametrize("name", [SPLASH, TPU_FLASH, GPU_MHA])
def test_each_kernel_has_at_least_three_candidates_and_defaults_among_them(name):
    space = impl(name).search_space
    assert space is not None and len(space.candidates) >= 3
    assert space.defaults in space.candidates
    assert impl(name).config_now == space.defaults


@pytest.mark.parametrize("seq_q", LENGTHS)
@pytest.mark.parametrize("seq_k", (128, 384, 8192))
def test_the_defaults_reproduce_todays_tiles(seq_q, seq_k):
    pytest.importorskip("jax")
    from attention_impls import jax_pallas_tpu_flash, jax_pallas_tpu_splash

    tq, tk = _old_tile(seq_q), _old_tile(seq_k)
    flash = jax_pallas_tpu_flash.block_sizes(seq_q, seq_k, impl(TPU_FLASH).config_now)
    assert (flash.block_q, flash.block_k_major, flash.block_k, flash.block_b) == (tq, tk, tk, 1)
    assert (flash.block_q_major_dkv, flash.block_k_major_dkv, flash.block_k_dkv, flash.block_q_dkv,
            flash.block_k_major_dq, flash.block_k_dq, flash.block_q_dq) == (tq, tk, tk, tq, tk, tk, tq)
    splash = jax_pallas_tpu_splash.block_sizes(seq_q, seq_k, impl(SPLASH).config_now)
    assert (splash.block_q, splash.block_kv, splash.block_kv_compute, splash.block_q_dkv,
            splash.block_kv_dkv, splash.block_kv_dkv_compute, splash.block_q_dq,
            splash.block_kv_dq) == (tq, tk, tk, tq, tk, tk, tq, tk)
    # the no-argument call (today's callers) is the defaults too
    assert jax_pallas_tpu_splash.block_sizes(seq_q, seq_k) == splash
    assert jax_pallas_tpu_flash.tile(seq_q) == tq


def test_gpu_mha_defaults_are_jax_defaults_and_attention_passes_its_knobs(monkeypatch):
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention

    seen = []
    monkeypatch.setattr(attention, "mha", lambda *a, block_sizes, **kw: seen.append(block_sizes) or a[0])
    q = jnp.zeros((1, 256, 2, 64), jnp.float32)
    impl(GPU_MHA).attention(q, q, q, causal=True, scale=0.125)
    impl(GPU_MHA).with_config("block_q=64,block_k=128").attention(q, q, q, causal=True, scale=0.125)
    assert seen[0] == attention.BlockSizes.get_default()
    assert (seen[1].block_q, seen[1].block_k, seen[1].block_q_dkv, seen[1].block_kv_dq) == (64, 128, 32, 32)


def test_tpu_kernels_attention_reads_their_knobs(monkeypatch):
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as module

    from attention_impls import jax_pallas_tpu_splash

    seen = []
    monkeypatch.setattr(module, "flash_attention",
                        lambda q, k, v, block_sizes, **kw: seen.append(block_sizes) or q)
    q = jnp.zeros((1, 2048, 2, 64), jnp.bfloat16)
    impl(TPU_FLASH).with_config("block_q=1024,block_k_major=2048,block_k=512").attention(
        q, q, q, causal=True, scale=0.125)
    assert (seen[0].block_q, seen[0].block_k_major, seen[0].block_k) == (1024, 2048, 512)

    built = []

    def fake_kernel(*args):
        built.append(args[-1])
        return lambda q, k, v: q

    monkeypatch.setattr(jax_pallas_tpu_splash, "_kernel", fake_kernel)
    impl(SPLASH).with_config("block_q=256,block_kv=1024,block_kv_compute=512").attention(
        q, q, q, causal=True, scale=0.125)
    assert dict(built[0]) == {"block_q": 256, "block_kv": 1024, "block_kv_compute": 512, "block_q_bwd": 512,
                              "block_kv_bwd": 512}


@pytest.mark.parametrize("name, config, workload, words", [
    (SPLASH, "block_q=1024,block_kv=1024,block_kv_compute=1024", PREFILL.replace(seq_q=1536, seq_k=1536),
     "block_q=1024 does not divide the 1536 queries"),
    (SPLASH, "block_q=512,block_kv=1024,block_kv_compute=512", PREFILL.replace(seq_q=512, seq_k=512),
     "block_kv=1024 is longer than the 512 keys"),
    (SPLASH, "block_kv=1024,block_kv_compute=192", PREFILL, "not a multiple of 128"),
    (SPLASH, "block_kv=512,block_kv_compute=1024", PREFILL,
     "block_kv_compute=1024 does not divide block_kv=512"),
    (TPU_FLASH, "block_q=1024,block_k_major=2048,block_k=512", PREFILL.replace(seq_q=1024, seq_k=1024),
     "block_k_major=2048 is longer than the 1024 keys"),
    (TPU_FLASH, "block_q_bwd=1024", PREFILL.replace(seq_q=1536, seq_k=1536, mode="fwd_bwd"),
     "block_q_bwd=1024 does not divide the 1536 queries"),
    (GPU_MHA, "block_q=128,block_k=128,block_q_bwd=64,block_k_bwd=64", PREFILL.replace(seq_q=96, seq_k=96),
     "block_q=128 is longer than the 96 queries"),
    (GPU_MHA, "block_q=128,block_k=48", PREFILL, "powers of two"),
])
def test_a_refused_candidate_has_its_reason(name, config, workload, words):
    kernel = impl(name)
    full = kernel.search_space.check(config, name)
    reason = kernel.config_reason(full, workload)
    assert reason is not None and words in reason


def test_every_candidate_is_taken_at_the_presets_real_lengths():
    """The search spaces are sized for the presets: none refused at 8k/32k (the tuner compiles them)."""
    for name in (SPLASH, TPU_FLASH):
        for n in (8192, 32768):
            refused = [r for _, r in impl(name).candidates(PREFILL.replace(seq_q=n, seq_k=n)) if r]
            assert refused == [], (name, n)


# ------------------------------------------------------------------ the tuner's choice (stand-in compiles)
class FakeWorker:
    """Answers ``compile`` as the compile worker does: a record per (kernel, config) x batch, from
    ``rules(config text, batch) -> (status, peak bytes)``."""

    def __init__(self, rules, broken=()):
        self.rules, self.calls, self.broken, self.checked = rules, [], broken, []

    def compile(self, target, spec, workload, *, timeout_s):
        name, config = spec[:2]
        if spec[2:] == ("numerics",):
            self.checked.append(config)
            ok = config not in self.broken
            return {"numerics": "ok" if ok else "fails: max |error| 0.5", "numerics_ok": ok}
        self.calls.append((config, workload.batch))
        status, peak = self.rules(config, workload.batch)
        record = new_record(target, spec, workload, status=status, execution="compiled")
        if status == classify.OK:
            hbm = 16_000_000_000
            record.update(peak_bytes=peak, hbm_bytes=hbm, fits=peak <= hbm, temp_bytes=peak // 10,
                          model_roofline_seconds=0.001 * workload.batch)
        else:
            record.update(reason=f"Mosaic: RESOURCE_EXHAUSTED: vmem ({config})", fits=None)
        return record


def _defaults(name):
    return config_text(impl(name).search_space.defaults)


def test_a_failed_compile_is_recorded_with_its_reason_and_never_kept():
    target = load_targets()["tpu-v5e"]
    failing = "block_q=128,block_kv=128,block_kv_compute=128,block_q_bwd=128,block_kv_bwd=128"

    def rules(config, batch):
        if config == failing:  # would hold the most, but the compiler refused it
            return classify.KERNEL_REFUSED, None
        return classify.OK, 300_000_000 * batch  # 53 fit

    worker = FakeWorker(rules)
    rows = tune.tune_case(worker, target, SPLASH, PREFILL, max_batch=4096, timeout_s=5)
    assert len(rows) == len(impl(SPLASH).search_space.candidates)
    bad = next(r for r in rows if r["config"] == failing)
    assert bad["status"] == classify.KERNEL_REFUSED and "vmem" in bad["reason"] and not bad["kept"]
    kept = [r for r in rows if r["kept"]]
    assert len(kept) == 1 and kept[0]["config"] == _defaults(SPLASH)  # a tie among the rest: the defaults
    assert kept[0]["config_source"] == "defaults" and kept[0]["max_batch"] == 53
    assert all("not measured" in r["speed"] for r in rows)
    summary = tune.kept_row(rows)
    assert summary["kept_config"] == _defaults(SPLASH) and summary["feasible"] == len(rows) - 1


def test_the_candidate_holding_the_most_tokens_is_kept_and_one_that_does_not_fit_never():
    target = load_targets()["tpu-v5e"]
    smaller = "block_q=256,block_kv=256,block_kv_compute=256,block_q_bwd=256,block_kv_bwd=256"
    too_big = "block_q=1024,block_kv=1024,block_kv_compute=1024,block_q_bwd=512,block_kv_bwd=512"

    def rules(config, batch):
        if config == too_big:
            return classify.OK, 20_000_000_000 * batch  # compiles, never fits 16 GB
        per = 200_000_000 if config == smaller else 300_000_000
        return classify.OK, per * batch

    rows = tune.tune_case(FakeWorker(rules), target, SPLASH, PREFILL, max_batch=4096, timeout_s=5)
    kept = next(r for r in rows if r["kept"])
    assert kept["config"] == smaller and kept["config_source"] == "tuned" and kept["max_batch"] == 80
    big = next(r for r in rows if r["config"] == too_big)
    assert str(big["fits"]) == "False" and not big["kept"]


def test_a_candidate_that_breaks_numerics_is_recorded_and_never_kept():
    target = load_targets()["tpu-v5e"]
    best = "block_q=256,block_kv=256,block_kv_compute=256,block_q_bwd=256,block_kv_bwd=256"

    def rules(config, batch):
        return classify.OK, (200_000_000 if config == best else 300_000_000) * batch

    worker = FakeWorker(rules, broken=(best,))
    rows = tune.tune_case(worker, target, SPLASH, PREFILL, max_batch=4096, timeout_s=5)
    broken = next(r for r in rows if r["config"] == best)
    assert broken["numerics_ok"] is False and "numerics" in broken["reason"] and not broken["kept"]
    kept = next(r for r in rows if r["kept"])
    assert kept["config"] == _defaults(SPLASH) and kept["numerics_ok"] is True
    assert worker.checked == [best, _defaults(SPLASH)]  # the best-ranked first, then the next


def test_the_numerics_check_is_the_sweeps_float64_check_on_a_small_case():
    """A candidate's tiles run here against the float64 reference with ``core.numerics.compare``'s
    float32 tolerance (2e-5 + 1e-4 x |reference|), the sweep's own check."""
    pytest.importorskip("jax")
    answer = tune.numerics_check("jax-blockwise-flash", (("block_q", 64), ("block_k", 64)), PREFILL)
    assert answer["numerics_ok"] is True and answer["numerics_max_error"] < 2e-5
    assert answer["numerics"].startswith("ok: max |error|") and "float32, 1024x1024" in answer["numerics"]


def test_a_refused_candidate_is_a_row_with_its_reason_and_is_not_compiled():
    target = load_targets()["tpu-v5e"]
    short = PREFILL.replace(seq_q=1536, seq_k=1536)
    worker = FakeWorker(lambda config, batch: (classify.OK, 100_000_000 * batch))
    rows = tune.tune_case(worker, target, SPLASH, short, max_batch=0, timeout_s=5)
    refused = [r for r in rows if r["status"] == tune.REFUSED]
    assert refused and all(r["reason"] and not r["kept"] for r in refused)
    assert {c for c, _ in worker.calls}.isdisjoint({r["config"] for r in refused})


def test_a_kernel_that_refuses_the_workload_refuses_every_tile_after_one_compile():
    target = load_targets()["tpu-v5e"]
    worker = FakeWorker(lambda config, batch: (classify.UNSUPPORTED, None))
    decode = Workload(batch=8, q_heads=32, kv_heads=8, head_dim=128, seq_q=1, seq_k=32768, dtype="bfloat16")
    rows = tune.tune_case(worker, target, SPLASH, decode, max_batch=4096, timeout_s=5)
    assert len(worker.calls) == 1 and all(r["status"] == classify.UNSUPPORTED for r in rows)
    assert not any(r["kept"] for r in rows)


def test_an_interpreted_kernel_is_not_compiled_for_its_tiles():
    target = load_targets()["h200"]
    worker = FakeWorker(lambda config, batch: (classify.OK, 1))
    rows = tune.tune_case(worker, target, SPLASH, PREFILL, max_batch=0, timeout_s=5)
    assert worker.calls == [] and all(r["status"] == tune.NOT_COMPILED for r in rows)
    assert "interpret" in rows[0]["reason"]


def test_default_kernels_per_platform():
    assert set(tune.default_impls("tpu")) >= {SPLASH, TPU_FLASH}
    assert GPU_MHA in tune.default_impls("gpu") and SPLASH not in tune.default_impls("gpu")


def test_vmem_is_read_from_the_pallas_calls_scoped_memory():
    hlo = "\n".join([
        "HloModule m",
        '%fusion = f32[8] fusion(%p), backend_config={"used_scoped_memory_configs":[{"memory_space":"1",'
        '"offset":"0","size":"4194304"}]}',
        '%k = (f32[8]) custom-call(%a), custom_call_target="tpu_custom_call", '
        'frontend_attributes={kernel_metadata={',
        "}}, metadata={}, backend_config={\"used_scoped_memory_configs\":[{\"memory_space\":\"1\","
        '"offset":"0","size":"6500352"}]}',
    ])
    assert tune.vmem_evidence(hlo) == (6500352, 6500352)
    assert tune.vmem_evidence(hlo.split("\n%k")[0]) == (None, 4194304)


def test_the_verdict_rows_name_the_kept_tiles():
    pd = pytest.importorskip("pandas")
    from attnbench.report.compiled_verdict import compiled_verdicts

    records = pd.DataFrame([{
        "target": "tpu-v5e", "impl": SPLASH, "workload": "llama-3.1-8b", "phase": "prefill", "mode": "fwd",
        "seq_q": 8192, "seq_k": 8192, "batch": 1, "dtype": "bfloat16", "execution": "compiled",
        "status": "ok", "fits": True, "model_roofline_seconds": 0.001, "inserted_copy_bytes": 0,
        "label": "native"}])
    kept = pd.DataFrame([{"target": "tpu-v5e", "impl": SPLASH, "workload": "llama-3.1-8b", "phase": "prefill",
                          "seq_len": 8192, "kept_config": "block_q=1024,block_kv=1024",
                          "config_source": "tuned", "candidates": 7, "compiled": 7}])
    table = compiled_verdicts(records, None, tuning=kept)
    assert "block_q=1024,block_kv=1024 (tuned)" in table.iloc[0]["reasons"]
    assert "not measured" in table.iloc[0]["reasons"]
    assert "Tiles kept for tpu-v5e" in table.iloc[0]["sentence"]
    elsewhere = compiled_verdicts(records.assign(target="tpu-v6e"), None, tuning=kept)
    assert "Tiles kept" not in elsewhere.iloc[0]["sentence"]


# ------------------------------------------------------------------ the command
@pytest.mark.parametrize("argv, words", [
    (["--target", "tpu-v9"], "unknown compile target"),
    (["--impl", "jax-nonesuch"], "jax-nonesuch"),
    (["--impl", "jax-xla"], "no tile knobs"),
    (["--impl", SPLASH, "--config", "block_q=abc"], "malformed config"),
    (["--impl", SPLASH, "--config", "block_z=128"], "has no knob block_z"),
    (["--case", "llama-3.1-8b:prefill"], "preset:phase:lengths"),
    (["--case", "nonesuch:prefill:8k"], "unknown workload preset"),
])
def test_bad_input_exits_2_with_one_line(argv, words):
    done = subprocess.run([sys.executable, "-m", "attnbench", "tune-targets", "--quiet", *argv],
                          capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], done.stderr
    assert done.stdout == ""


# ------------------------------------------------------------------ one real compile (targets venv)
_MISSING = environment_problem("tpu")


@pytest.mark.compilers
@pytest.mark.skipif(bool(_MISSING), reason=f"needs the targets venv: {_MISSING}")
def test_real_compiles_keep_a_config_that_compiles_and_never_one_mosaic_refused(tmp_path):
    """libtpu for a v5e: 2048-row tiles run out of scoped VMEM (Mosaic refuses), the defaults compile."""
    target = load_targets()["tpu-v5e"]
    workload = Workload(batch=1, q_heads=8, head_dim=128, seq_q=4096, dtype="bfloat16", causal=True)
    huge = impl(SPLASH).search_space.check("block_q=2048,block_kv=2048,block_kv_compute=2048", SPLASH)
    from attnbench.compiled_for.worker import CompileWorker

    with CompileWorker(task=tune.tune_task) as worker:
        rows = tune.tune_case(worker, target, SPLASH, workload, max_batch=0, timeout_s=600, configs=[huge])
    by = {r["config"]: r for r in rows}
    assert by[_defaults(SPLASH)]["status"] == classify.OK and by[_defaults(SPLASH)]["kept"]
    assert by[_defaults(SPLASH)]["kernel_vmem_bytes"] > 0
    failed = by[config_text(huge)]
    assert failed["status"] == classify.KERNEL_REFUSED and "vmem" in failed["reason"].lower()
    assert not failed["kept"]
