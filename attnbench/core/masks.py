"""What an attention mask keeps: causal, sliding window, documents (segment ids), ragged KV caches.

One numpy definition shared by the float64 reference, the FLOPs count and the seeded inputs
(docs/workloads.md). Query row ``i`` sits at ``p = i + (Sk - Sq)`` (bottom-right aligned) and sees key
``j`` when every active rule keeps it: causal ``j <= p``; window ``W`` ``p - W < j <= p`` (the Mistral /
Hugging Face convention); equal segment ids. Soft-capping changes values, not which pairs are kept.

Packed layouts (``packed_segment_ids``) give each row's documents ids 0, 1, ... in order and the
row's unfilled tail ``-1``.
Seeded layouts (``default_rng(seed)``, per batch row): documents are cut at ``N - 1`` distinct uniform
positions in ``1 .. S-1``; a ragged cache's row 0 is full, the others' lengths uniform in
``[max(seq_q, kv_len // 4), kv_len]``, left-padded with segment id ``-1`` (queries ``0``).
"""

from __future__ import annotations

import numpy as np

DOCUMENT_SEED = 20_241  # the documents' and the cache lengths' seed: the same layout in every run
PADDING_SEGMENT = -1
MIN_RAGGED_FRACTION = 4  # shortest drawn cache: kv_len // 4 keys


def document_segment_ids(batch: int, seq: int, documents: int, seed: int = DOCUMENT_SEED) -> np.ndarray:
    """``[batch, seq]`` int32 document ids: ``documents`` contiguous documents per row (module doc)."""
    if not 1 <= documents <= seq:
        raise ValueError(f"documents must be in 1..{seq} (the sequence length), got {documents}")
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, seq), dtype=np.int32)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq), size=documents - 1, replace=False))
        for cut in cuts:
            ids[b, cut:] += 1
    return ids


def packed_segment_ids(rows, seq: int) -> np.ndarray:
    """``[len(rows), seq]`` int32 ids of packed documents: each row's documents in order, numbered
    from 0, the rest of the row padding (``PADDING_SEGMENT``: it sees only itself)."""
    ids = np.full((len(rows), seq), PADDING_SEGMENT, dtype=np.int32)
    for b, row in enumerate(rows):
        if sum(row) > seq:
            raise ValueError(f"row {b}: documents of {sum(row)} tokens exceed the sequence of {seq}")
        ids[b, : sum(row)] = np.repeat(np.arange(len(row), dtype=np.int32), row)
    return ids


def cache_lengths(batch: int, kv_len: int, seq_q: int, seed: int = DOCUMENT_SEED) -> np.ndarray:
    """Per-sequence valid cache lengths of a ragged decode batch (module doc); row 0 is full."""
    rng = np.random.default_rng(seed)
    low = min(kv_len, max(seq_q, kv_len // MIN_RAGGED_FRACTION))
    lengths = rng.integers(low, kv_len + 1, size=batch)
    lengths[0] = kv_len
    return lengths.astype(np.int64)


def ragged_segment_ids(batch: int, seq_q: int, kv_len: int, seed: int = DOCUMENT_SEED):
    """``(q_segment_ids [B, Sq], kv_segment_ids [B, Sk])`` of a left-padded ragged cache."""
    lengths = cache_lengths(batch, kv_len, seq_q, seed)
    kv = np.zeros((batch, kv_len), dtype=np.int32)
    for b, length in enumerate(lengths):
        kv[b, : kv_len - length] = PADDING_SEGMENT
    return np.zeros((batch, seq_q), dtype=np.int32), kv


def dense_mask(seq_q: int, seq_k: int, *, causal: bool, window: int | None = None,
               q_segment_ids=None, kv_segment_ids=None) -> np.ndarray:
    """Boolean ``[B or 1, Sq, Sk]``: True where the query may see the key (module doc)."""
    pos = np.arange(seq_q)[:, None] + (seq_k - seq_q)
    keys = np.arange(seq_k)[None, :]
    keep = np.ones((seq_q, seq_k), dtype=bool)
    if causal:
        keep &= keys <= pos
    if window is not None:
        keep &= keys > pos - window
    keep = keep[None]
    if q_segment_ids is not None:
        keep = keep & (np.asarray(q_segment_ids)[:, :, None] == np.asarray(kv_segment_ids)[:, None, :])
    return keep


def _key_bounds(seq_q: int, seq_k: int, *, causal: bool, window: int | None, q_segment_ids,
                kv_segment_ids) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Each query's first and last visible key, ``(lo, hi)`` per batch row (one row shared by the
    batch without segment ids; empty where ``lo > hi``), or ``None`` when some segment id is split
    into several runs, so that a row's keys are no longer one interval."""
    pos = np.arange(seq_q, dtype=np.int64) + (seq_k - seq_q)
    hi = pos if causal else np.full(seq_q, seq_k - 1, dtype=np.int64)
    lo = np.maximum(pos - window + 1, 0) if window is not None else np.zeros(seq_q, dtype=np.int64)
    if q_segment_ids is None:
        return [(lo, hi)]
    q_ids, kv_ids = np.asarray(q_segment_ids), np.asarray(kv_segment_ids)
    rows = []
    for b in range(q_ids.shape[0]):
        row = kv_ids[b]
        starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        if len(np.unique(row)) != len(starts):
            return None
        ends = np.r_[starts[1:], len(row)] - 1
        first = dict(zip(row[starts].tolist(), starts.tolist(), strict=True))
        last = dict(zip(row[starts].tolist(), ends.tolist(), strict=True))
        seg_lo = np.array([first.get(i, 1) for i in q_ids[b].tolist()], dtype=np.int64)
        seg_hi = np.array([last.get(i, 0) for i in q_ids[b].tolist()], dtype=np.int64)
        rows.append((np.maximum(lo, seg_lo), np.minimum(hi, seg_hi)))
    return rows


def visible_pairs(seq_q: int, seq_k: int, *, causal: bool, window: int | None = None,
                  q_segment_ids=None, kv_segment_ids=None) -> int:
    """Exactly how many (query, key) pairs the mask keeps, summed over the batch (per head).

    Each row's keys are one interval when every segment id is one contiguous run (the layouts made
    here), so ``Sq x Sk`` is never materialised; other layouts are counted on the dense mask.
    """
    rows = _key_bounds(seq_q, seq_k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                       kv_segment_ids=kv_segment_ids)
    if rows is None:
        return int(dense_mask(seq_q, seq_k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                              kv_segment_ids=kv_segment_ids).sum())
    return sum(int(np.maximum(hi - lo + 1, 0).sum()) for lo, hi in rows)


def visible_keys(seq_q: int, seq_k: int, *, causal: bool, window: int | None = None,
                 q_segment_ids=None, kv_segment_ids=None) -> int:
    """How many keys at least one query sees, summed over the batch (per head; one row without
    segment ids): the keys, and values, a kernel must read. A decode step's window leaves the
    older cache unread; a ragged cache's padding is never read."""
    rows = _key_bounds(seq_q, seq_k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                       kv_segment_ids=kv_segment_ids)
    if rows is None:
        return int(dense_mask(seq_q, seq_k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                              kv_segment_ids=kv_segment_ids).any(axis=1).sum())
    total = 0
    for lo, hi in rows:
        # +1 where a query's interval starts, -1 after it ends: a key is seen where the sum is > 0.
        seen = hi >= lo
        edges = np.zeros(seq_k + 1, dtype=np.int64)
        np.add.at(edges, lo[seen], 1)
        np.add.at(edges, hi[seen] + 1, -1)
        total += int((np.cumsum(edges[:-1]) > 0).sum())
    return total


def empty_rows(seq_q: int, seq_k: int, **mask) -> int:
    """How many query rows see no key at all (their softmax is undefined)."""
    keep = dense_mask(seq_q, seq_k, **mask)
    return int((~keep.any(axis=-1)).sum())
