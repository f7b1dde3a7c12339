"""The workload spec: validation messages, FLOPs convention and bytes, against hand-computed values."""

from __future__ import annotations

import pytest

from attnbench.core.workload import Workload


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


def test_flops_causal_square_count_the_diagonal_exactly():
    # Exact pairs: row i sees i + 1 keys, S(S+1)/2 in all (flash-attention's convention says S^2/2).
    w = Workload(batch=1, q_heads=8, seq_q=2048, head_dim=128, causal=True)
    assert w.pairs == 2048 * 2049 // 2
    assert w.avg_k == 1024.5
    assert w.flops == 4 * 8 * 128 * (2048 * 2049 // 2)


def test_flops_causal_bottom_right_rectangle():
    # Row i sees keys j <= i + 384: 385 .. 512 keys, 448.5 on average.
    w = Workload(batch=1, q_heads=4, seq_q=128, seq_k=512, head_dim=64, causal=True)
    assert w.pairs == sum(i + 385 for i in range(128))
    assert w.avg_k == 448.5
    assert w.flops == 4 * 4 * 64 * w.pairs


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


# -- masks: the pairs they keep, the FLOPs that follow, and what is refused -----------------------
def test_window_pairs_by_hand():
    # S=8, W=3: rows 0, 1, 2 see 1, 2, 3 keys; rows 3..7 see 3 each -> 1 + 2 + 3 + 5 * 3 = 21.
    w = Workload(batch=2, q_heads=2, seq_q=8, head_dim=4, causal=True, window=3)
    assert w.pairs == 2 * 21
    assert w.flops == 4 * 2 * 4 * 42
    assert w.mask_density == 42 / (2 * 64)
    assert w.dense_flops == 4 * 2 * 2 * 8 * 8 * 4


def test_documents_pairs_match_the_dense_mask_and_are_seeded():
    from attnbench.core import masks

    w = Workload(batch=3, q_heads=1, seq_q=300, head_dim=8, causal=True, documents=5, window=40)
    q_ids, kv_ids = w.segment_ids()
    dense = masks.dense_mask(300, 300, causal=True, window=40, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    assert w.pairs == int(dense.sum())
    assert [len(set(row.tolist())) for row in q_ids] == [5, 5, 5]  # every document has a token
    assert (w.segment_ids()[0] == q_ids).all()  # the same layout every time
    assert not (q_ids[0] == q_ids[1]).all()  # each row its own cut points


def test_ragged_decode_counts_only_the_valid_cache():
    w = Workload(batch=4, q_heads=8, kv_heads=2, seq_q=1, seq_k=1000, head_dim=64, causal=True, ragged=True)
    lengths = w.cache_lengths()
    assert lengths[0] == 1000 and all(250 <= n <= 1000 for n in lengths)
    assert w.phase == "decode"
    assert w.pairs == sum(lengths)
    assert w.flops == 4 * 8 * 64 * sum(lengths)
    # the KV cache is the bytes that matter: its valid keys read once, k and v
    assert w.min_bytes == 4 * (2 * 4 * 8 * 64 + 2 * sum(lengths) * 2 * 64)
    q_ids, kv_ids = w.segment_ids()
    assert (kv_ids[1, : 1000 - lengths[1]] == -1).all() and (kv_ids[1, 1000 - lengths[1]:] == 0).all()


def test_softcap_changes_no_pair():
    w = Workload(seq_q=256, causal=True)
    assert w.replace(softcap=30.0).flops == w.flops
    assert w.replace(softcap=30.0).mask == "causal+softcap(30)"


@pytest.mark.parametrize("changes, message", [
    ({"window": 16}, "window needs causal=True"),
    ({"causal": True, "window": 0}, "window must be a positive integer"),
    ({"causal": True, "softcap": 0.0}, "softcap must be a positive number"),
    ({"causal": True, "softcap": float("nan")}, "softcap must be a positive number"),
    ({"documents": 300}, r"documents must be an integer in 1..seq_q=256"),
    ({"seq_k": 512, "documents": 2}, "needs seq_q == seq_k"),
    ({"ragged": True}, "needs seq_q < seq_k"),
])
def test_bad_masks_are_refused_by_name(changes, message):
    with pytest.raises(ValueError, match=message):
        Workload(seq_q=256, **changes)


def test_phase_follows_the_shapes_and_at_length_keeps_it():
    assert Workload(seq_q=256).phase == "prefill"
    assert Workload(seq_q=256, mode="fwd_bwd").phase == "training"
    decode = Workload(batch=2, seq_q=1, seq_k=512, causal=True, ragged=True)
    assert decode.phase == "decode" and decode.stream_length == 512
    assert decode.at_length(256).seq_k == 256 and decode.at_length(256).seq_q == 1
    packed = Workload(seq_q=256, causal=True, documents=4)
    assert packed.at_length(2).documents == 2


def test_a_plain_workload_keeps_its_description():
    # case keys (asv_suite.case_key) of the toy workload must not change with the mask fields
    assert Workload(seq_q=1024, causal=True).describe() == "B1 H8 S1024 D64 float32 causal fwd"
    assert Workload(seq_q=64, causal=True, window=8, name="mistral-7b").describe() == \
        "mistral-7b B1 H8 S64 D64 float32 causal window(8) fwd"


def test_to_dict_leaves_out_unset_mask_fields_for_older_releases():
    plain = Workload(seq_q=256, causal=True)
    assert set(plain.to_dict()) == {"batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "dtype",
                                    "causal", "mode"}
    masked = plain.replace(window=16, name="mistral-7b")
    assert masked.to_dict()["window"] == 16 and Workload(**masked.to_dict()) == masked


# -- minimum bytes: only the keys (and values) some query sees ----------------------------------
def test_mistral_decode_reads_only_its_window_of_the_cache():
    # Mistral-7B's real decode: 8 caches of 32768 keys (ragged, each at least 32768 // 4 = 8192 valid
    # keys, so longer than the window), 1 new token, 32 q / 8 kv heads, head dim 128, float32.
    w = Workload(batch=8, q_heads=32, kv_heads=8, seq_q=1, seq_k=32768, head_dim=128, causal=True,
                 window=4096, ragged=True)
    assert w.visible_keys == 8 * 4096
    # k + v: 8 caches x 4096 keys x 8 kv heads x 128 x 2 = 67,108,864 elements;
    # q + o: 8 x 1 x 32 x 128 x 2 = 65,536 elements; 4 bytes each.
    assert w.min_bytes == 4 * (67_108_864 + 65_536) == 268_697_600
    # Counting every valid cache key instead would be 6.2x as much (the lengths are seeded).
    assert w.replace(window=None).min_bytes == 4 * (2 * sum(w.cache_lengths()) * 8 * 128 + 65_536)


def test_a_few_new_tokens_read_the_union_of_their_windows():
    # 4 queries at positions 1020..1023, window 256: the first sees 765..1020, the last 768..1023,
    # so keys 765..1023 are read: 259 keys.
    w = Workload(batch=1, q_heads=4, kv_heads=2, seq_q=4, seq_k=1024, head_dim=64, causal=True, window=256)
    assert w.visible_keys == 259
    # q + o: 2 x 4 x 4 x 64 = 2048 elements; k + v: 2 x 259 x 2 x 64 = 66,304; 4 bytes each.
    assert w.min_bytes == 4 * (2048 + 66_304) == 273_408
    # No window: the last query sees all 1024 keys.
    assert w.replace(window=None).visible_keys == 1024


def test_a_ragged_cache_with_a_window_reads_the_window_of_each_valid_cache():
    # Every cache holds at least 1000 // 4 = 250 valid keys, more than the window of 200.
    w = Workload(batch=4, q_heads=8, kv_heads=2, seq_q=1, seq_k=1000, head_dim=64, causal=True, window=200,
                 ragged=True)
    assert w.visible_keys == 4 * 200
    assert w.min_bytes == 4 * (2 * 4 * 8 * 64 + 2 * 800 * 2 * 64)


def test_training_bytes_write_whole_gradients():
    # 2 queries at positions 6, 7 of 8 keys, window 2: keys 5..7 are read (3), but dk and dv are
    # written for all 8 keys. Elements (head dim 1, one head): fwd q 2 + k, v 2 x 3 + o 2 = 10;
    # bwd reads q, o, dO 3 x 2 + k, v 2 x 3, writes dq 2 + dk, dv 2 x 8 = 30.
    w = Workload(batch=1, q_heads=1, seq_q=2, seq_k=8, head_dim=1, causal=True, window=2, mode="fwd_bwd")
    assert w.visible_keys == 3
    assert w.min_bytes == 4 * (10 + 30)


def test_visible_keys_of_a_split_segment_layout_are_counted_on_the_dense_mask():
    from attnbench.core import masks

    # Key ids alternate 0, 1, 0, 1 (one id in two runs): queries of id 0 see keys 0 and 2 only.
    kv = [[0, 1, 0, 1]]
    assert masks.visible_keys(2, 4, causal=False, q_segment_ids=[[0, 0]], kv_segment_ids=kv) == 2
    assert masks.visible_keys(2, 4, causal=False, q_segment_ids=[[0, 1]], kv_segment_ids=kv) == 4
    assert masks.visible_pairs(2, 4, causal=False, q_segment_ids=[[0, 0]], kv_segment_ids=kv) == 4


def test_window_scaled_from_is_provenance_checked_and_left_out_of_to_dict():
    scaled = Workload(seq_q=64, causal=True, window=32, window_scaled_from=4096)
    assert scaled == Workload(seq_q=64, causal=True, window=32)  # the same attention problem
    assert "window_scaled_from" not in scaled.to_dict()
    assert scaled.at_length(128).window_scaled_from == 4096
    for changes in ({"window_scaled_from": 16}, {"window": None}):
        with pytest.raises(ValueError, match="needs window < window_scaled_from"):
            scaled.replace(**changes)
