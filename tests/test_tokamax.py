"""Tokamax's six kernels: what each declares, refuses and leaves out, and how the harness reads them.

Their numerics are the conformance tests' (test_correctness.py, test_mask_correctness.py: every
registered kernel); their compiles for the chips are test_compiled_for_compile.py's (.venv-targets).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import attention_impls
from attention_impls.base import FORCED_FLASH, NATIVE
from attnbench.core.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
TOKAMAX = {"jax-tokamax-xla": "xla", "jax-tokamax-xla-chunked": "xla_chunked",
           "jax-tokamax-mosaic-tpu": "mosaic_tpu", "jax-tokamax-triton": "triton",
           "jax-tokamax-mosaic-gpu": "mosaic_gpu", "jax-tokamax-cudnn": "cudnn"}


def test_six_tokamax_kernels_are_registered_each_with_its_implementation():
    names = [n for n in attention_impls.names() if n.startswith("jax-tokamax-")]
    assert sorted(names) == sorted(TOKAMAX)
    for name, implementation in TOKAMAX.items():
        impl = attention_impls.get(name)
        assert impl.implementation == implementation and impl.library == "tokamax"
        assert impl.requires_modules == ("tokamax",) and "tokamax:dot_product_attention" in impl.public_calls


def test_each_tokamax_kernel_is_native_on_its_own_chips_and_refused_elsewhere_with_a_reason():
    labels = {name: {p: attention_impls.get(name).label(p) for p in ("cpu", "gpu", "tpu")}
              for name in TOKAMAX}
    assert labels["jax-tokamax-mosaic-tpu"] == {"cpu": FORCED_FLASH, "gpu": FORCED_FLASH, "tpu": NATIVE}
    for name in ("jax-tokamax-triton", "jax-tokamax-mosaic-gpu", "jax-tokamax-cudnn"):
        assert labels[name]["gpu"] == NATIVE
        support = attention_impls.get(name).platform_support
        assert support["gpu"].status == "runs"
        assert support["cpu"].status == support["tpu"].status == "unsupported"
    for name in ("jax-tokamax-xla", "jax-tokamax-xla-chunked"):
        assert set(labels[name].values()) == {NATIVE}
    mosaic = attention_impls.get("jax-tokamax-mosaic-tpu").platform_support
    assert mosaic["cpu"].status == "interpret-only" and "interpreter" in mosaic["cpu"].note
    assert mosaic["gpu"].status == "unsupported" and "v5 or newer" in mosaic["gpu"].note


@pytest.mark.parametrize("workload, words", [
    (Workload(batch=2, q_heads=2, seq_q=128, head_dim=64), "batch 1 only"),
    (Workload(batch=1, q_heads=2, seq_q=128, head_dim=64, mode="fwd_bwd"), "backward does not run"),
    (Workload(batch=1, q_heads=2, seq_q=200, head_dim=64), "multiples of 128"),
    (Workload(batch=1, q_heads=2, seq_q=256, head_dim=64, causal=True, window=64), "mask.k_start"),
    (Workload(batch=1, q_heads=2, seq_q=256, head_dim=64, causal=True, documents=2), "unbatched boolean"),
    (Workload(batch=1, q_heads=2, seq_q=128, seq_k=256, head_dim=64, causal=True), "top-left"),
])
def test_the_mosaic_tpu_kernel_refuses_what_it_cannot_do_on_a_cpu_with_its_reason(workload, words):
    from attnbench.backends import here

    impl = attention_impls.get("jax-tokamax-mosaic-tpu")
    assert words in (here.check(impl, workload) or "")
    assert here.check(impl, Workload(batch=1, q_heads=2, seq_q=128, head_dim=64, causal=True)) is None


def test_the_default_suite_leaves_tokamax_out_and_full_takes_it(monkeypatch):
    from attnbench.asv import sizes

    monkeypatch.setenv("ATTNBENCH_SUITE", "default")
    left_out = sizes.left_out_kernels()
    assert set(TOKAMAX) <= set(left_out) and not set(TOKAMAX) & set(sizes.impl_names())
    assert "make published" in left_out["jax-tokamax-xla"]
    monkeypatch.setenv("ATTNBENCH_SUITE", "full")
    assert set(TOKAMAX) <= set(sizes.impl_names()) and not set(TOKAMAX) & set(sizes.left_out_kernels())


def test_the_release_matrix_varies_the_framework_alone_not_tokamax():
    from attnbench.releases import cell, suite

    assert not set(TOKAMAX) & set(cell.kernel_names("jax")) and not set(TOKAMAX) & set(suite.impl_names())
    assert "jax-xla" in cell.kernel_names("jax") and "jax-xla" in suite.impl_names()


@pytest.mark.slow
def test_a_process_whose_arguments_are_not_absl_flags_still_runs_tokamax():
    """Tokamax parses sys.argv as absl flags the first time it reads an option: the kernels mark them
    parsed first. Without that, `-q` here raises UnrecognizedFlagError."""
    code = "\n".join([
        "import numpy as np, attention_impls",
        "from attnbench.backends import here",
        "from attnbench.core.inputs import make_inputs",
        "from attnbench.core.workload import Workload",
        "w = Workload(batch=1, q_heads=2, seq_q=128, head_dim=64, causal=True)",
        "x = make_inputs(w, seed=0)",
        "impl = attention_impls.get('jax-tokamax-mosaic-tpu')",
        "print(np.isfinite(here.run_numpy(impl, x.q, x.k, x.v, causal=True)).all())"])
    done = subprocess.run([sys.executable, "-c", code, "-q", "--not-an-absl-flag"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("True")


# -- the compiled program's word on a Tokamax kernel ---------------------------------------------------
HLO = ('HloModule m\n\nENTRY %main (p: f32[8]) -> f32[8] {\n'
       '  %p = f32[8]{0} parameter(0)\n'
       '  ROOT %custom-call.1 = f32[8]{0} custom-call(%p), custom_call_target="tpu_custom_call", '
       'metadata={op_name="jit(f)/tokamax:{\\"op\\":{\\"__type\\":\\"tokamax._src.ops.attention.'
       'pallas_mosaic_tpu.PallasMosaicTpuFlashAttention\\",\\"config\\":{\\"block_q\\":128,\\"block_kv\\":256,'
       '\\"use_base2_exp\\":true},\\"vjp\\":null},\\"arguments\\":{}}/splash_mha_fwd/pallas_call"}\n}\n')


def test_the_config_tokamax_built_its_kernel_at_is_read_from_the_compiled_programs_metadata():
    from attnbench.compiled_for import hlo

    assert hlo.tokamax_configs(HLO) == \
        "PallasMosaicTpuFlashAttention block_q=128,block_kv=256,use_base2_exp=true"
    assert hlo.tokamax_configs(HLO.replace('\\"config\\":{\\"block_q\\":128,\\"block_kv\\":256,'
                                           '\\"use_base2_exp\\":true}', '\\"config\\":null')) == \
        "PallasMosaicTpuFlashAttention no config"
    assert hlo.tokamax_configs("HloModule m") == ""
    # an attribute holding escaped quotes is read whole, so the kernel's name is its own
    module = hlo.parse_module(HLO)
    (call,) = hlo.custom_calls(module)
    assert call.kernel == "splash_mha_fwd" and call.target == "tpu_custom_call"


def _compile_args(**given) -> argparse.Namespace:
    args = {"workload": None, "published_shapes": True, "dtype": ["bfloat16"], "mode": ["fwd"], "seq": None,
            "batch": 1, "heads": 8, "kv_heads": None, "head_dim": 64, "causal": True, "phase": None,
            "layer": None}
    return argparse.Namespace(**{**args, **given})


def test_compile_for_published_shapes_are_the_aligned_ones_and_refuse_other_cases():
    from attnbench.compiled_for.cli import _grids
    from attnbench.published import shapes

    grids = _grids(_compile_args())
    assert [g[0] for g in grids] == list(shapes.ALIGNED) and all(g[2] == ["fwd"] for g in grids)
    with pytest.raises(ValueError, match="two kinds of case"):
        _grids(_compile_args(workload="llama-3.1-8b"))
    with pytest.raises(ValueError, match="causal forward in bfloat16"):
        _grids(_compile_args(dtype=["float32"]))
    assert shapes.label(shapes.ALIGNED[-1]) == "B32 Hq32 Hkv8 S4096 D128 causal bf16"
    with pytest.raises(KeyError, match="known: B1 Hq16 S16384"):
        shapes.get("B3 Hq1 S7 D8 bf16")
