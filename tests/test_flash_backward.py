"""The blockwise FlashAttention ports' backward is FlashAttention-2's: gradients against the float64
reference under every mask and GQA, with tiles small enough that the masks skip and cut tiles, and a
forward that keeps q, k, v, the output and the log-sum-exp and no tile (in both venvs: torch_xla's
port in .venv-xla)."""

from __future__ import annotations

import pytest

import attention_impls
from attention_impls.reference_float64 import attention_grads
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.numerics import GRAD_SLACK, compare
from attnbench.core.workload import Workload
from tests.conftest import FRAMEWORKS, mask_of

PORTS = [name for name in ("jax-blockwise-flash", "torch-blockwise-flash", "torch-xla-blockwise-flash")
         if attention_impls.get(name).framework in FRAMEWORKS]
SMALL_TILES = (("block_q", 64), ("block_k", 32))  # several tiles a row; ragged lengths pad the last
MASKS = {
    "causal, ragged tiles": Workload(batch=1, q_heads=2, seq_q=200, head_dim=32, causal=True),
    "cross, not causal": Workload(batch=1, q_heads=2, seq_q=100, seq_k=230, head_dim=32),
    "cross, causal": Workload(batch=1, q_heads=2, seq_q=100, seq_k=230, head_dim=32, causal=True),
    "window": Workload(batch=1, q_heads=2, seq_q=256, head_dim=32, causal=True, window=40),
    "documents": Workload(batch=2, q_heads=2, seq_q=250, head_dim=32, causal=True, documents=3),
    "softcap": Workload(batch=1, q_heads=2, seq_q=128, head_dim=32, causal=True, softcap=2.0),
    "encoder documents": Workload(batch=1, q_heads=2, seq_q=256, head_dim=32, documents=2),
    "gqa, window, documents, softcap": Workload(batch=1, q_heads=4, kv_heads=2, seq_q=256, head_dim=32,
                                                causal=True, window=96, documents=2, softcap=2.0),
    "gqa, bfloat16": Workload(batch=1, q_heads=4, kv_heads=1, seq_q=160, head_dim=32, causal=True,
                              dtype="bfloat16"),
}


@pytest.mark.parametrize("case", MASKS)
@pytest.mark.parametrize("name", PORTS)
def test_flash_backward_matches_the_float64_gradients(name, case):
    impl = attention_impls.get(name).with_config(SMALL_TILES)
    workload = MASKS[case].replace(mode="fwd_bwd")
    x = make_inputs(workload, seed=4)
    mask = mask_of(workload, x)
    grads = here.grad_numpy(impl, x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
    expected = attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
    for label, got, want in zip("qkv", grads, expected, strict=True):
        assert got.shape == want.shape
        result = compare(got, want, workload.dtype, slack=GRAD_SLACK)
        assert result.finite and result.ok, f"{name} {case} d{label}: {result.describe()}"


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")
def test_torch_port_saves_q_k_v_the_output_and_the_log_sum_exp_alone():
    """What autograd keeps is exactly FA2's: q, k, v, the output, one float32 per row (the
    log-sum-exp) and the segment ids; autograd through the loops kept every tile's probabilities."""
    import torch

    from attnbench.backends.torch_backend import saved_for_backward_bytes
    from attnbench.checks.backward_memory import torch_saved_bytes

    w = Workload(batch=1, q_heads=4, seq_q=512, head_dim=64, causal=True, documents=2)
    x = make_inputs(w, seed=0)
    q, k, v = (torch.tensor(a, requires_grad=True) for a in (x.q, x.k, x.v))
    ids = torch.tensor(x.q_segment_ids), torch.tensor(x.kv_segment_ids)
    impl = attention_impls.get("torch-blockwise-flash")
    saved = saved_for_backward_bytes(lambda: impl.attention(q, k, v, causal=True, scale=0.125,
                                                            q_segment_ids=ids[0], kv_segment_ids=ids[1]))
    tensor = 512 * 4 * 64 * 4  # one [B, S, H, D] float32 tensor
    assert saved == 4 * tensor + 512 * 4 * 4 + sum(i.numel() * i.element_size() for i in ids)
    short, long = (torch_saved_bytes("torch-blockwise-flash", seq) for seq in (1024, 4096))
    assert long == 4 * short


@pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")
def test_jax_port_gradient_holds_no_tile_per_step():
    """XLA's compiled temporaries of the gradient grow with the length, not its square: autodiff
    through the loops kept every tile (14.8x for 4x the length, results/LOG.md)."""
    from attnbench.checks.backward_memory import jax_gradient_temp_bytes

    short, long = (jax_gradient_temp_bytes("jax-blockwise-flash", seq) for seq in (512, 2048))
    assert long <= 4.5 * short, (short, long)
