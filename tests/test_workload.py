"""The workload spec: validation messages, FLOPs convention and bytes, against hand-computed values."""

from __future__ import annotations

import pytest

from attnbench.workload import Workload


def test_defaults_fill_kv_heads_and_seq_k():
    w = Workload(q_heads=8, seq_q=512)
    assert (w.kv_heads, w.seq_k) == (8, 512)
    assert not w.is_gqa
    assert Workload(q_heads=8, kv_heads=2).is_gqa


@pytest.mark.parametrize("field,value,fragment", [
    ("batch", 0, "Workload.batch must be a positive integer"),
    ("q_heads", -1, "Workload.q_heads must be a positive integer"),
    ("seq_q", 1.5, "Workload.seq_q must be a positive integer"),
    ("head_dim", True, "Workload.head_dim must be a positive integer"),
    ("kv_heads", 3, "Workload.kv_heads must divide q_heads: 3 does not divide 8"),
    ("dtype", "float64", "Workload.dtype must be one of"),
    ("mode", "bwd", "Workload.mode must be one of"),
    ("causal", 1, "Workload.causal must be a bool"),
])
def test_bad_values_name_the_field_and_rule(field, value, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.").replace("(", r"\(")):
        Workload(**{"q_heads": 8, field: value})


def test_causal_with_more_queries_than_keys_is_refused():
    with pytest.raises(ValueError, match="seq_q must not exceed seq_k when causal"):
        Workload(seq_q=256, seq_k=128, causal=True)
    assert Workload(seq_q=256, seq_k=128, causal=False).seq_k == 128


def test_flops_non_causal_by_hand():
    w = Workload(batch=2, q_heads=16, seq_q=1024, head_dim=64)
    assert w.flops == 4 * 2 * 16 * 1024 * 1024 * 64  # 8_589_934_592
    assert w.flops == 8_589_934_592


def test_flops_causal_square_is_half_plus_diagonal_convention():
    # flash-attention's convention: avg_k = (max(0, Sk - Sq) + Sk) / 2 = Sk / 2 when square.
    w = Workload(batch=1, q_heads=8, seq_q=2048, head_dim=128, causal=True)
    assert w.avg_k == 1024
    assert w.flops == 4 * 8 * 2048 * 1024 * 128


def test_flops_causal_bottom_right_rectangle():
    w = Workload(batch=1, q_heads=4, seq_q=128, seq_k=512, head_dim=64, causal=True)
    assert w.avg_k == (384 + 512) / 2 == 448
    assert w.flops == 4 * 4 * 128 * 448 * 64


def test_fwd_bwd_is_three_and_a_half_times_fwd():
    w = Workload(batch=1, q_heads=8, seq_q=1024, head_dim=64, causal=True)
    assert w.replace(mode="fwd_bwd").flops == pytest.approx(3.5 * w.flops)


def test_gqa_does_not_change_flops_but_cuts_kv_bytes():
    mha = Workload(q_heads=8, seq_q=1024, head_dim=64, dtype="bfloat16")
    gqa = mha.replace(kv_heads=2)
    assert gqa.flops == mha.flops
    # q + o: 2 * 1024 * 8 * 64 elements; k + v: 2 * 1024 * kv_heads * 64; 2 bytes each
    assert mha.min_bytes == 2 * (2 * 1024 * 8 * 64 + 2 * 1024 * 8 * 64)
    assert gqa.min_bytes == 2 * (2 * 1024 * 8 * 64 + 2 * 1024 * 2 * 64)


def test_fwd_bwd_bytes_add_the_backward_minimum():
    w = Workload(batch=1, q_heads=1, seq_q=10, head_dim=1)  # 10 q elements, 10 kv elements each
    # fwd: q, k, v read + o written = 40; bwd: q, k, v, o, dO read + dq, dk, dv written = 80
    assert w.min_bytes == 4 * 40
    assert w.replace(mode="fwd_bwd").min_bytes == 4 * 120


def test_tokens_and_describe():
    w = Workload(batch=4, q_heads=8, kv_heads=2, seq_q=128, seq_k=256, causal=True)
    assert w.tokens == 512
    assert w.describe() == "B4 H8/2kv S128x256 D64 float32 causal fwd"
