"""Support checks of the torch kernels on this CPU machine: what runs, how, and each refusal rule.

The rules are torch's own (``sdp_utils.cpp`` / ``sdp_utils_cpp.cpp`` gates, ``flex_attention.py``);
the tests that call torch directly show that a refused case really is one torch rejects, so a
forced backend can never quietly become another kernel.
"""

from __future__ import annotations

import numpy as np
import pytest

import attention_impls
from attention_impls.base import FORCED_FLASH, NATIVE, Unsupported
from attention_impls.reference_float64 import causal_mask
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.workload import Workload
from tests.conftest import FRAMEWORKS

pytestmark = pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")

MATH, FLASH, EFFICIENT, CUDNN, FLEX, BLOCKWISE = (
    "torch-sdpa-math", "torch-sdpa-flash", "torch-sdpa-efficient", "torch-sdpa-cudnn",
    "torch-flex-attention", "torch-blockwise-flash")
SDPA = (MATH, FLASH, EFFICIENT, CUDNN)
OURS = SDPA + (FLEX, BLOCKWISE)
CUDA_ONLY = {EFFICIENT: "EFFICIENT_ATTENTION", CUDNN: "CUDNN_ATTENTION"}
TORCH_REFUSAL = "No viable backend for scaled_dot_product_attention was found"

BASE = Workload(batch=1, q_heads=2, seq_q=128, head_dim=64)
# Every shape feature the correctness cases use, in each dtype and mode.
VARIANTS = [BASE.replace(**c, dtype=d, mode=m)
            for c in ({}, {"causal": True}, {"q_heads": 4, "kv_heads": 2, "causal": True},
                      {"seq_k": 256, "causal": True}, {"seq_q": 256, "seq_k": 128},
                      {"seq_q": 200, "seq_k": 200, "head_dim": 32, "causal": True})
            for d in ("float32", "bfloat16", "float16") for m in ("fwd", "fwd_bwd")]


def impl(name):
    return attention_impls.get(name)


def gpu(name, w, sm=None):
    """The GPU rules of an SDPA backend, as they read on a GPU of compute capability ``sm``."""
    return impl(name).rules(w, "gpu", sm)


# -- what runs here, and how ------------------------------------------------------------------------
def test_this_machine_is_a_cpu_for_torch():
    assert all(here.platform(impl(n)) == "cpu" for n in OURS)


@pytest.mark.parametrize("w", VARIANTS, ids=lambda w: w.describe())
def test_math_flash_and_blockwise_take_every_variant_here(w):
    for name in (MATH, FLASH, BLOCKWISE):
        assert here.check(impl(name), w) is None, name


@pytest.mark.parametrize("w", VARIANTS, ids=lambda w: w.describe())
def test_flex_takes_forward_only_here(w):
    reason = here.check(impl(FLEX), w)
    if w.mode == "fwd":
        assert reason is None
    else:
        assert reason.startswith("FlexAttention does not support backward on CPU")


@pytest.mark.parametrize("name", CUDA_ONLY)
@pytest.mark.parametrize("w", VARIANTS[:4], ids=lambda w: w.describe())
def test_efficient_and_cudnn_refuse_every_workload_with_the_exact_reason(name, w):
    backend = CUDA_ONLY[name]
    note = impl(name).platform_support["cpu"].note
    assert here.check(impl(name), w) == note
    assert note.startswith(f"{backend} (") and "is a CUDA-only kernel" in note
    assert f"sdpa_kernel([{backend}]) raises '{TORCH_REFUSAL}'" in note


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_refused_run_raises_unsupported_before_reaching_torch(name):
    x = make_inputs(BASE, seed=0)
    with pytest.raises(Unsupported) as info:
        here.run_numpy(impl(name), x.q, x.k, x.v, causal=False)
    assert info.value.reason == impl(name).platform_support["cpu"].note


@pytest.mark.parametrize("name, execution", [(MATH, "eager"), (FLASH, "eager"), (BLOCKWISE, "eager"),
                                             (FLEX, "compiled")])
def test_execution_says_how_the_kernel_ran(name, execution):
    assert impl(name).execution("cpu") == execution


# -- a forced backend cannot silently fall back ------------------------------------------------------
@pytest.mark.parametrize("name", CUDA_ONLY)
def test_torch_itself_refuses_cuda_only_backends_on_cpu(name):
    """Our refusal is not a guess: sdpa() forced to this backend raises, it never falls back to MATH."""
    import torch
    from torch.nn.attention import SDPBackend

    from attention_impls._sdpa import sdpa

    q = torch.randn(1, 128, 2, 64)
    with pytest.raises(RuntimeError, match=TORCH_REFUSAL):
        sdpa(q, q, q, causal=True, scale=0.125, backend=getattr(SDPBackend, CUDA_ONLY[name]))


@pytest.mark.parametrize("name", CUDA_ONLY)
def test_the_dispatcher_probe_sees_the_same_refusal(name):
    import torch

    from attention_impls._sdpa import dispatch_refusal

    reason = dispatch_refusal(CUDA_ONLY[name], BASE, torch.device("cpu"))
    assert reason == f"torch's SDPA dispatcher refuses {CUDA_ONLY[name]} here: {TORCH_REFUSAL}." \
        " This is likely due to turning off both the math kernel and the fused kernels."


@pytest.mark.parametrize("w", VARIANTS, ids=lambda w: w.describe())
def test_the_dispatcher_probe_accepts_cpu_flash_for_every_variant(w):
    """CPU flash takes fp32/bf16/fp16, GQA and a materialized causal mask (use_flash_attention_cpp)."""
    import torch

    from attention_impls._sdpa import dispatch_refusal

    assert dispatch_refusal("FLASH_ATTENTION", w, torch.device("cpu")) is None


def test_dispatcher_reason_picks_the_forced_backends_lines():
    from attention_impls._sdpa import dispatcher_reason

    cuda_warnings = [  # what select_sdp_backend (sdp_utils.cpp) warns on CUDA, abridged
        "Memory efficient kernel not used because: (Triggered internally at sdp_utils.cpp:1.)",
        "Mem efficient attention requires last dimension of inputs to be divisible by 4. Got 62",
        "Flash attention kernel not used because:",
        "Flash attention has been runtime disabled.",
        "cuDNN attention kernel not used because:",
        "cuDNN attention has been runtime disabled.",
    ]
    assert dispatcher_reason("EFFICIENT_ATTENTION", cuda_warnings, "No available kernel.") == \
        "Mem efficient attention requires last dimension of inputs to be divisible by 4. Got 62"
    assert dispatcher_reason("FLASH_ATTENTION", cuda_warnings, "x") == \
        "Flash attention has been runtime disabled."
    assert dispatcher_reason("CUDNN_ATTENTION", [], "No available kernel.\nmore") == "No available kernel."


@pytest.mark.parametrize("name, mode, ops", [
    (FLASH, "fwd", {"aten::_scaled_dot_product_flash_attention_for_cpu"}),
    (FLASH, "fwd_bwd", {"aten::_scaled_dot_product_flash_attention_for_cpu",
                        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}),
    (MATH, "fwd", {"aten::_scaled_dot_product_attention_math"}),
])
def test_step_evidence_names_the_aten_kernel_that_ran(name, mode, ops):
    """Bottom-right causal with seq_q != seq_k goes through a materialized mask: still CPU flash."""
    step = here.make_step(impl(name), BASE.replace(seq_k=256, causal=True, mode=mode, q_heads=4, kv_heads=2))
    assert step.kernel_evidence == "not verified"  # nothing ran yet: the profiled run comes later
    seen = set(step.evidence().removeprefix("profiler saw ").split(", "))
    assert seen == ops


def test_blockwise_evidence_counts_its_tile_matmuls():
    """Causal S256 in 128x128 tiles visits 3 tiles (the one above the diagonal is skipped): 6 bmm."""
    step = here.make_step(impl(BLOCKWISE), BASE.replace(seq_q=256, seq_k=256, causal=True))
    assert step.evidence().startswith("profiler saw 6 tile matmuls (aten::bmm) and no ATen attention op")


def test_blockwise_evidence_refuses_a_run_that_reached_an_attention_kernel():
    from attention_impls.torch_blockwise_flash import blockwise_evidence

    ops = {"aten::bmm": 2, "aten::_scaled_dot_product_flash_attention_for_cpu": 1}
    assert blockwise_evidence(ops).startswith("not verified")
    assert blockwise_evidence({"aten::mul": 3}).startswith("not verified")


def test_flex_evidence_sees_only_the_compiled_region():
    """The lesson in one record: the op profiler cannot see the fused kernel, only its region."""
    step = here.make_step(impl(FLEX), BASE.replace(causal=True))
    assert step.evidence().startswith("profiler saw one Torch-Compiled Region and no ATen matmul")


@pytest.mark.parametrize("ops", [{"aten::bmm": 2, "Torch-Compiled Region: 0/0": 1},  # unfused lowering
                                 {"aten::_scaled_dot_product_attention_math": 1},  # eager, no compile
                                 {"aten::transpose": 4}])
def test_flex_evidence_refuses_anything_but_one_opaque_region(ops):
    from attention_impls.torch_flex_attention import flex_evidence

    assert flex_evidence(ops).startswith("not verified")


# -- the GPU rules, as they read from this host (sm80+ unless a capability is given) ---------------
@pytest.mark.parametrize("name", (FLASH, CUDNN))
def test_flash_and_cudnn_on_cuda_take_half_precision_only(name):
    assert "float16/bfloat16 only, not float32" in gpu(name, BASE)
    assert gpu(name, BASE.replace(dtype="bfloat16")) is None
    assert gpu(name, BASE.replace(dtype="float16", mode="fwd_bwd", q_heads=4, kv_heads=2)) is None


def test_cuda_flash_rules():
    half = BASE.replace(dtype="bfloat16")
    assert gpu(FLASH, half.replace(head_dim=256)) is None
    assert gpu(FLASH, half.replace(head_dim=264)) == "FLASH_ATTENTION on CUDA needs head_dim <= 256, got 264"
    assert gpu(FLASH, half, sm=(7, 5)) == "FlashAttention-2 needs a GPU in sm80..sm121; this one is sm75"
    train_200 = half.replace(head_dim=200, mode="fwd_bwd")
    assert "no backward for head_dim in (192, 224] on sm86" in gpu(FLASH, train_200, sm=(8, 6))
    assert gpu(FLASH, train_200, sm=(9, 0)) is None
    assert gpu(FLASH, train_200.replace(mode="fwd"), sm=(8, 9)) is None
    # the CPU kernel has none of these limits
    assert impl(FLASH).rules(BASE.replace(head_dim=264), "cpu", None) is None


def test_cuda_efficient_rules():
    assert gpu(EFFICIENT, BASE) is None  # float32 is fine for the CUTLASS kernel
    assert gpu(EFFICIENT, BASE.replace(head_dim=62)) == \
        "EFFICIENT_ATTENTION needs head_dim divisible by 4 for float32, got 62"
    assert gpu(EFFICIENT, BASE.replace(head_dim=60)) is None
    assert "divisible by 8 for bfloat16" in gpu(EFFICIENT, BASE.replace(head_dim=60, dtype="bfloat16"))
    assert gpu(EFFICIENT, BASE.replace(head_dim=62), sm=(7, 0)) is None  # fp32 needs no alignment below sm80
    assert "bfloat16 only on sm80+" in gpu(EFFICIENT, BASE.replace(dtype="bfloat16"), sm=(7, 5))
    assert "sm50 or newer" in gpu(EFFICIENT, BASE, sm=(3, 7))


def test_cuda_cudnn_rules(monkeypatch):
    import torch

    half = BASE.replace(dtype="float16")
    assert gpu(CUDNN, half.replace(head_dim=68)) == "CUDNN_ATTENTION needs head_dim divisible by 8, got 68"
    assert "head_dim <= 128" in gpu(CUDNN, half.replace(head_dim=192))
    assert "key/value sequence of length 1" in gpu(CUDNN, half.replace(seq_q=4, seq_k=1))
    assert "sm80..sm121; this one is sm75" in gpu(CUDNN, half, sm=(7, 5))
    # sm90 with a new cuDNN takes head_dim up to 256 forward, but trains only <= 128 or exactly 256
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 92300)
    assert gpu(CUDNN, half.replace(head_dim=192), sm=(9, 0)) is None
    train_192 = half.replace(head_dim=192, mode="fwd_bwd")
    assert "backward only for head_dim <= 128 or 256" in gpu(CUDNN, train_192, sm=(9, 0))
    assert gpu(CUDNN, half.replace(head_dim=256, mode="fwd_bwd"), sm=(9, 0)) is None
    assert "head_dim <= 128" in gpu(CUDNN, half.replace(head_dim=192), sm=(8, 0))


def test_math_has_no_shape_rules_anywhere():
    for platform in ("cpu", "gpu"):
        assert impl(MATH).rules(BASE.replace(head_dim=7, dtype="float16"), platform, None) is None


def test_flex_gpu_rules():
    assert impl(FLEX).shape_reason(BASE.replace(head_dim=8), "gpu") == \
        "FlexAttention's Triton kernel needs head_dim >= 16, got 8"
    assert impl(FLEX).shape_reason(BASE.replace(head_dim=16, mode="fwd_bwd"), "gpu") in (
        None, "FlexAttention on CUDA needs triton, which is not installed")  # backward is fine on CUDA


# -- FlexAttention: the refusal is torch's, the mask is bottom-right, compiled once ------------------
def test_torch_itself_refuses_flex_backward_on_cpu():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 128, 64, requires_grad=True)
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        flex_attention(q, q, q)


def test_flex_block_mask_is_bottom_right_causal():
    import torch

    from attention_impls.torch_flex_attention import causal_block_mask

    mask = causal_block_mask(128, 320, "cpu")
    q_idx, kv_idx = torch.arange(128)[:, None], torch.arange(320)[None, :]
    dense = mask.mask_mod(torch.tensor(0), torch.tensor(0), q_idx, kv_idx).numpy()
    np.testing.assert_array_equal(dense, causal_mask(128, 320))
    assert mask.shape[-2:] == (128, 320)


def test_flex_compiles_once_per_shape_and_reuses_the_block_mask():
    flex = impl(FLEX)
    w = BASE.replace(seq_k=256, causal=True)
    x = make_inputs(w, seed=3)
    first = here.run_numpy(flex, x.q, x.k, x.v, causal=True)
    entries = dict(flex._compiled)
    second = here.run_numpy(flex, x.q, x.k, x.v, causal=True)
    assert dict(flex._compiled) == entries, "a repeated shape must not build a new function or mask"
    mine = [e for k, e in entries.items() if k[0] == (1, 2, 128, 64) and k[1] == (1, 2, 256, 64) and k[4]]
    assert len(mine) == 1 and mine[0][1] is not None
    np.testing.assert_array_equal(first, second)


# -- labels and the platforms torch cannot reach ------------------------------------------------------
@pytest.mark.parametrize("name, cpu, gpu_label", [
    (MATH, NATIVE, NATIVE), (FLASH, NATIVE, NATIVE), (EFFICIENT, FORCED_FLASH, NATIVE),
    (CUDNN, FORCED_FLASH, NATIVE), (FLEX, NATIVE, NATIVE), (BLOCKWISE, FORCED_FLASH, NATIVE),
])
def test_labels(name, cpu, gpu_label):
    assert impl(name).label("cpu") == cpu
    assert impl(name).label("gpu") == gpu_label
    expected_tpu = NATIVE if name == MATH else FORCED_FLASH
    assert impl(name).label("tpu") == expected_tpu


@pytest.mark.parametrize("name", SDPA)
def test_sdpa_on_tpu_points_to_torch_xla(name):
    support = impl(name).platform_support["tpu"]
    assert support.status == "unsupported" and "torch-xla-sdpa" in support.note


def test_flex_is_unsupported_on_tpu_and_gpu_runs():
    assert impl(FLEX).platform_support["tpu"].status == "unsupported"
    assert "torch_xla has no lowering" in impl(FLEX).platform_support["tpu"].note
    assert all(impl(n).platform_support["gpu"].status == "runs" for n in SDPA + (FLEX,))


# -- mask features: which kernel takes which, through which option, and what torch refuses -----------
WINDOW = BASE.replace(seq_q=256, seq_k=256, causal=True, window=64)
DOCS = BASE.replace(batch=2, seq_q=256, seq_k=256, causal=True, documents=3)
RAGGED = BASE.replace(batch=3, q_heads=4, kv_heads=1, seq_q=1, seq_k=256, causal=True, ragged=True)
SOFTCAP = BASE.replace(causal=True, softcap=30.0)


@pytest.mark.parametrize("name, supports, gqa", [
    (MATH, {"window", "segment_ids"}, "repeated"), (FLASH, {"window", "segment_ids"}, "native"),
    (EFFICIENT, {"window", "segment_ids"}, "native"), (CUDNN, {"window", "segment_ids"}, "native"),
    (FLEX, {"window", "softcap", "segment_ids"}, "native"),
    (BLOCKWISE, {"window", "softcap", "segment_ids"}, "native"),
])
def test_declared_mask_features_and_gqa(name, supports, gqa):
    assert impl(name).supports == supports
    assert impl(name).gqa == gqa


@pytest.mark.parametrize("name", SDPA)
def test_sdpa_refuses_softcap_naming_it(name):
    reason = impl(name).feature_reason(SOFTCAP)
    assert reason.startswith("torch's F.scaled_dot_product_attention takes no logit soft-capping: ")


@pytest.mark.parametrize("w", [WINDOW, DOCS, RAGGED, WINDOW.replace(dtype="bfloat16", mode="fwd_bwd")],
                         ids=lambda w: w.describe())
def test_cpu_flash_takes_an_explicit_mask_and_the_dispatcher_agrees(w):
    """use_flash_attention_cpp checks only the mask's shape: window and segment ids run on CPU flash."""
    import torch

    from attention_impls._sdpa import dispatch_refusal

    assert here.check(impl(FLASH), w) is None and here.check(impl(MATH), w) is None
    assert dispatch_refusal("FLASH_ATTENTION", w, torch.device("cpu")) is None


def test_the_dispatcher_probe_is_given_the_mask_the_real_call_passes(monkeypatch):
    import torch

    from attention_impls._sdpa import dispatch_refusal

    seen = []

    def choose(q, k, v, mask, dropout, is_causal, **kwargs):
        seen.append((None if mask is None else tuple(mask.shape), mask is not None and mask.dtype, is_causal))

    monkeypatch.setattr(torch, "_fused_sdp_choice", choose)
    for w in (DOCS, WINDOW, BASE.replace(causal=True)):
        assert dispatch_refusal("FLASH_ATTENTION", w, torch.device("cpu")) is None
    assert seen == [((2, 1, 256, 256), torch.bool, False), ((1, 1, 256, 256), torch.bool, False),
                    (None, False, True)]


def test_cuda_flash_refuses_window_and_segment_ids_by_name():
    half = WINDOW.replace(dtype="bfloat16")
    assert gpu(FLASH, half) == ("the torch SDPA FLASH backend on CUDA takes no explicit mask (sdp_utils.cpp "
                                "check_for_attn_mask), and a sliding window needs one")
    assert "and segment ids need one" in gpu(FLASH, DOCS.replace(dtype="bfloat16"))
    assert "a sliding window and segment ids need one" in gpu(FLASH, half.replace(documents=2))
    for name in (EFFICIENT, CUDNN, MATH):  # their gates take attn_mask
        assert gpu(name, half) is None and gpu(name, DOCS.replace(dtype="bfloat16")) is None


def test_sdpa_keep_mask_is_the_harness_mask():
    import torch

    from attention_impls._sdpa import keep_mask
    from attnbench.core.masks import dense_mask

    q_ids, kv_ids = DOCS.segment_ids()
    got = keep_mask(256, 256, "cpu", causal=True, window=96, q_segment_ids=torch.from_numpy(q_ids),
                    kv_segment_ids=torch.from_numpy(kv_ids))
    assert got.shape == (2, 1, 256, 256) and got.dtype == torch.bool
    want = dense_mask(256, 256, causal=True, window=96, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    np.testing.assert_array_equal(got[:, 0].numpy(), want)
    ragged = keep_mask(1, 256, "cpu", causal=True, window=128)
    np.testing.assert_array_equal(ragged[0, 0].numpy(), dense_mask(1, 256, causal=True, window=128)[0])


@pytest.mark.parametrize("name, repeats", [(MATH, True), (FLASH, False)])
def test_gqa_mode_is_what_the_profiler_sees(name, repeats):
    """MATH repeat_interleaves the kv heads (pre_process_group_query_attention_input); CPU flash does not."""
    from attnbench.backends.torch_backend import profiled_ops

    step = here.make_step(impl(name), RAGGED)
    assert ("aten::repeat_interleave" in profiled_ops(step.run)) == repeats


def test_masked_sdpa_step_still_runs_the_forced_kernel():
    step = here.make_step(impl(FLASH), DOCS.replace(mode="fwd_bwd"))
    seen = set(step.evidence().removeprefix("profiler saw ").split(", "))
    assert seen == {"aten::_scaled_dot_product_flash_attention_for_cpu",
                    "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}


# -- FlexAttention: one mask_mod, a softcap score_mod, block masks rebuilt only for new ids ----------
def test_flex_mask_mod_is_the_harness_mask():
    import torch

    from attention_impls.torch_flex_attention import keep_block_mask
    from attnbench.core.masks import dense_mask

    q_ids, kv_ids = DOCS.segment_ids()
    mask = keep_block_mask(256, 256, "cpu", causal=True, window=96, q_segment_ids=torch.from_numpy(q_ids),
                           kv_segment_ids=torch.from_numpy(kv_ids))
    assert mask.shape == (2, 1, 256, 256)
    want = dense_mask(256, 256, causal=True, window=96, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    np.testing.assert_array_equal(mask.to_dense().numpy()[:, 0] > 0, _blocks_touched(want, 128))
    q_idx, kv_idx = torch.arange(256)[:, None], torch.arange(256)[None, :]
    for b in range(2):
        dense = mask.mask_mod(torch.tensor(b), torch.tensor(0), q_idx, kv_idx).numpy()
        np.testing.assert_array_equal(dense, want[b])


def _blocks_touched(keep, block):
    """Which (q block, kv block) tiles keep any pair: the tiles flex must visit."""
    b, sq, sk = keep.shape
    return keep.reshape(b, sq // block, block, sk // block, block).any(axis=(2, 4))


def test_flex_softcap_is_a_score_mod_on_the_scaled_score():
    import torch

    from attention_impls.torch_flex_attention import softcap_mod

    capped = softcap_mod(2.0)(torch.tensor([-100.0, 0.5, 100.0]), 0, 0, 0, 0)
    np.testing.assert_allclose(capped.numpy(), 2.0 * np.tanh(np.array([-100.0, 0.5, 100.0]) / 2.0), rtol=1e-6)


def test_flex_rebuilds_the_block_mask_for_new_segment_ids_and_keeps_the_compiled_function():
    import torch

    from attention_impls.torch_flex_attention import TorchFlexAttention

    flex = TorchFlexAttention()
    x = make_inputs(DOCS, seed=5)
    q, k, v = (torch.from_numpy(a).transpose(1, 2) for a in (x.q, x.k, x.v))
    ids = [torch.from_numpy(a) for a in x.mask_arrays()]
    with torch.no_grad():
        fn, mask, segments = flex._entry(q, k, True, 0.125, q_segment_ids=ids[0], kv_segment_ids=ids[1])
        assert flex._entry(q, k, True, 0.125, q_segment_ids=ids[0], kv_segment_ids=ids[1])[1] is mask
        fresh = [t.clone() for t in ids]
        fn2, mask2, segments2 = flex._entry(q, k, True, 0.125, q_segment_ids=fresh[0],
                                            kv_segment_ids=fresh[1])
    assert fn2 is fn and mask2 is not mask and segments2[0] is fresh[0]
    assert len(flex._compiled) == 1


@pytest.mark.parametrize("w", [DOCS, RAGGED, WINDOW.replace(softcap=2.0, q_heads=4, kv_heads=2)],
                         ids=lambda w: w.describe())
def test_flex_masked_step_is_one_fused_region_compiled_once(w):
    """The mask and score mods stay inside Inductor's template: no matmul, no recompile per call."""
    from torch._dynamo.utils import counters

    from attention_impls.torch_flex_attention import TorchFlexAttention

    flex = TorchFlexAttention()
    step = here.make_step(flex, w)
    step.run()
    graphs = counters["stats"]["unique_graphs"]
    assert step.evidence().startswith("profiler saw one Torch-Compiled Region and no ATen matmul")
    assert counters["stats"]["unique_graphs"] == graphs and len(flex._compiled) == 1


# -- blockwise: tiles the causal mask, the window or the documents cut off are never computed -------
def _tile_matmuls(**kwargs) -> int:
    import torch

    from attention_impls.torch_blockwise_flash import blockwise_attention
    from attnbench.backends.torch_backend import profiled_ops

    q = torch.randn(1, 512, 2, 64)
    return profiled_ops(lambda: blockwise_attention(q, q, q, scale=0.125, **kwargs)).get("aten::bmm", 0)


def test_blockwise_skips_the_tiles_left_of_the_window():
    """S512 in 128-tiles: causal visits 10 tiles; a 128-key window only the diagonal and one left: 7."""
    assert _tile_matmuls(causal=True) == 2 * 10
    assert _tile_matmuls(causal=True, window=128) == 2 * 7
    assert _tile_matmuls(causal=True, window=1) == 2 * 4  # each row sees itself only


def test_blockwise_skips_tiles_whose_documents_cannot_meet():
    import torch

    ids = torch.zeros(1, 512, dtype=torch.int32)
    ids[:, 256:] = 1  # two documents of two tiles each: 8 of the 16 tiles can meet
    segments = {"q_segment_ids": ids, "kv_segment_ids": ids}
    assert _tile_matmuls(causal=False, **segments) == 2 * 16  # default: masked, not skipped (XLA-safe)
    assert _tile_matmuls(causal=False, skip_segments=True, **segments) == 2 * 8
    assert _tile_matmuls(causal=True, skip_segments=True, **segments) == 2 * 6


def test_blockwise_skipping_changes_no_value():
    import torch

    from attention_impls.torch_blockwise_flash import blockwise_attention

    x = make_inputs(DOCS.replace(q_heads=4, kv_heads=2, window=100, softcap=2.0), seed=6)
    q, k, v = (torch.from_numpy(a) for a in (x.q, x.k, x.v))
    q_ids, kv_ids = (torch.from_numpy(a) for a in x.mask_arrays())
    ids = {"q_segment_ids": q_ids, "kv_segment_ids": kv_ids}
    kw = dict(causal=True, scale=0.125, window=100, softcap=2.0, **ids)
    torch.testing.assert_close(blockwise_attention(q, k, v, skip_segments=True, **kw),
                               blockwise_attention(q, k, v, **kw), rtol=0, atol=0)
