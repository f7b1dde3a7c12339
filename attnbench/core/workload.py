"""The workload value type: one attention problem, its mask, its FLOPs and its minimum bytes.

FLOPs count the (query, key) pairs the mask keeps, exactly, with flash-attention's factors
(``benchmarks/benchmark_attn.py``): fwd = 4 * D * Hq * pairs, fwd_bwd = 3.5 * fwd. Only the two
matmuls count; a kernel that computes masked blocks anyway shows a lower TFLOP/s, never more FLOPs.
Causal counts ``S (S + 1) / 2`` pairs, not flash-attention's ``S^2 / 2`` (docs/workloads.md).
Minimum bytes read only the keys and values some query sees (``masks.visible_keys``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from attnbench.core import masks

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MODES = ("fwd", "fwd_bwd")
PHASES = ("prefill", "training", "decode")
PHASE_MODES = {"prefill": "fwd", "training": "fwd_bwd", "decode": "fwd"}
CUSTOM = "custom"  # the ``name`` of a workload that is no preset's
BWD_FLOPS_FACTOR = 2.5


@dataclass(frozen=True)
class Workload:
    """One attention problem in ``[batch, seq, heads, head_dim]`` layout.

    ``kv_heads < q_heads`` is grouped-query attention. ``causal`` is bottom-right aligned (the
    convention of flash-attention >= 2.1 and of KV-cache decoding). The mask fields are
    ``attnbench.core.masks``'s; ``name`` is the preset (``attnbench.core.presets``) or ``custom``.
    """

    batch: int = 1
    q_heads: int = 8
    kv_heads: int | None = None  # None: same as q_heads
    seq_q: int = 1024
    seq_k: int | None = None  # None: same as seq_q
    head_dim: int = 64
    dtype: str = "float32"
    causal: bool = False
    mode: str = "fwd"
    window: int | None = None
    softcap: float | None = None
    documents: int | None = None
    # Packed varlen: each batch row's documents' lengths, in order, what is left of the row padding
    # (``masks.packed_segment_ids``). A layout belongs to one step of a ``packed`` stream.
    packed: tuple[tuple[int, ...], ...] | None = None
    ragged: bool = False
    name: str = CUSTOM
    # A preset's window shrunk with a suite size's shorter length: the model's own window. Provenance,
    # not part of the attention problem, so two workloads that compute the same thing stay equal.
    window_scaled_from: int | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.q_heads)
        if self.seq_k is None:
            object.__setattr__(self, "seq_k", self.seq_q)
        for field in ("batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Workload.{field} must be a positive integer, got {value!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"Workload.kv_heads must divide q_heads: {self.kv_heads} does not divide {self.q_heads}"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"Workload.dtype must be one of {sorted(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"Workload.mode must be one of {list(MODES)}, got {self.mode!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"Workload.causal must be a bool, got {self.causal!r}")
        if self.causal and self.seq_q > self.seq_k:
            # Bottom-right alignment would leave the first seq_q - seq_k query rows with no key at
            # all; kernels disagree on what such a row returns (0, NaN, mean of V), so we refuse it.
            raise ValueError(
                f"Workload.seq_q must not exceed seq_k when causal (bottom-right aligned): "
                f"seq_q={self.seq_q} > seq_k={self.seq_k} leaves query rows with no keys"
            )
        self._check_mask()

    def _check_mask(self) -> None:
        if self.window is not None:
            if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
                raise ValueError(f"Workload.window must be a positive integer (keys), got {self.window!r}")
            if not self.causal:
                raise ValueError("Workload.window needs causal=True: a sliding window is the last W keys "
                                 "up to the query's own position")
        if self.softcap is not None:
            if isinstance(self.softcap, bool) or not isinstance(self.softcap, (int, float)) \
                    or not math.isfinite(self.softcap) or self.softcap <= 0:
                raise ValueError(f"Workload.softcap must be a positive number, got {self.softcap!r}")
            object.__setattr__(self, "softcap", float(self.softcap))
        if self.documents is not None:
            if isinstance(self.documents, bool) or not isinstance(self.documents, int) \
                    or not 1 <= self.documents <= self.seq_q:
                raise ValueError(f"Workload.documents must be an integer in 1..seq_q={self.seq_q}, "
                                 f"got {self.documents!r}")
            if self.seq_q != self.seq_k:
                raise ValueError("Workload.documents packs one sequence of queries and keys: it needs "
                                 f"seq_q == seq_k, got {self.seq_q} and {self.seq_k}")
        if self.packed is not None:
            self._check_packed()
        if not isinstance(self.ragged, bool):
            raise ValueError(f"Workload.ragged must be a bool, got {self.ragged!r}")
        if self.ragged and not self.seq_q < self.seq_k:
            raise ValueError("Workload.ragged is a decode batch's ragged KV cache: it needs seq_q < seq_k, "
                             f"got {self.seq_q} and {self.seq_k}")
        if sum((self.ragged, self.documents is not None, self.packed is not None)) > 1:
            raise ValueError("Workload.ragged, Workload.documents and Workload.packed each set segment ids: "
                             "choose one")
        if self.window_scaled_from is not None:
            scaled_from = self.window_scaled_from
            if isinstance(scaled_from, bool) or not isinstance(scaled_from, int) or self.window is None \
                    or not self.window < scaled_from:
                raise ValueError("Workload.window_scaled_from is the larger window a scaled-down window "
                                 "stands for: it needs window < window_scaled_from, got "
                                 f"window={self.window} and window_scaled_from={scaled_from!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Workload.name must be a preset name or {CUSTOM!r}, got {self.name!r}")

    def _check_packed(self) -> None:
        rows = self.packed
        if not isinstance(rows, tuple) or len(rows) != self.batch \
                or not all(isinstance(r, tuple) for r in rows):
            raise ValueError(f"Workload.packed must be one tuple of document lengths per batch row "
                             f"({self.batch} rows), got {rows!r}")
        for b, row in enumerate(rows):
            if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in row):
                raise ValueError(f"Workload.packed row {b}: document lengths must be positive integers, "
                                 f"got {row!r}")
            if sum(row) > self.seq_q:
                raise ValueError(f"Workload.packed row {b}: documents of {sum(row)} tokens exceed "
                                 f"seq_q={self.seq_q}")
        if self.seq_q != self.seq_k:
            raise ValueError("Workload.packed packs one sequence of queries and keys: it needs "
                             f"seq_q == seq_k, got {self.seq_q} and {self.seq_k}")

    @property
    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seq_q, self.q_heads, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seq_k, self.kv_heads, self.head_dim)

    @property
    def is_gqa(self) -> bool:
        return self.kv_heads < self.q_heads

    @property
    def tokens(self) -> int:
        """Query tokens processed by one step (what tokens/s counts)."""
        return self.batch * self.seq_q

    @property
    def phase(self) -> str:
        if self.mode == "fwd_bwd":
            return "training"
        return "decode" if self.seq_q < self.seq_k else "prefill"

    @property
    def segmented(self) -> bool:
        """Whether the mask has segment ids (documents, or a ragged cache's padding)."""
        return self.packs_documents or self.ragged

    @property
    def packs_documents(self) -> bool:
        """Whether the segment ids are documents packed in a sequence (seeded, or a packed layout)."""
        return self.documents is not None or self.packed is not None

    def segment_ids(self):
        """``(q_segment_ids [B, Sq], kv_segment_ids [B, Sk])`` int32 numpy arrays, or ``None``."""
        if self.documents is not None:
            ids = masks.document_segment_ids(self.batch, self.seq_q, self.documents)
            return ids, ids.copy()
        if self.packed is not None:
            ids = masks.packed_segment_ids(self.packed, self.seq_q)
            return ids, ids.copy()
        if self.ragged:
            return masks.ragged_segment_ids(self.batch, self.seq_q, self.seq_k)
        return None

    def cache_lengths(self):
        """A decode batch's valid cache length per sequence (all ``seq_k`` unless ragged)."""
        if self.ragged:
            return masks.cache_lengths(self.batch, self.seq_k, self.seq_q)
        return [self.seq_k] * self.batch

    @property
    def mask_features(self) -> tuple[str, ...]:
        """The mask features beyond causal this workload uses, by the name kernels declare."""
        used = (("window", self.window is not None), ("softcap", self.softcap is not None),
                ("segment_ids", self.segmented))
        return tuple(feature for feature, on in used if on)

    @property
    def mask(self) -> str:
        """The mask in words: ``causal+window(4096)+softcap(50)``, ``none``..."""
        parts = ["causal"] if self.causal else []
        if self.window is not None:
            parts.append(f"window({self.window})")
        if self.documents is not None:
            parts.append(f"documents({self.documents})")
        if self.packed is not None:
            parts.append("packed")
        if self.ragged:
            parts.append("ragged-cache")
        if self.softcap is not None:
            parts.append(f"softcap({self.softcap:g})")
        return "+".join(parts) or "none"

    @functools.cached_property
    def pairs(self) -> int:
        """(query, key) pairs the mask keeps, summed over the batch, per query head (exact)."""
        return self._summed_over_batch(masks.visible_pairs)

    @functools.cached_property
    def visible_keys(self) -> int:
        """Keys (per kv head) that at least one query sees, summed over the batch: the keys, and
        values, a kernel must read (a window's older keys and a ragged cache's padding are not)."""
        return self._summed_over_batch(masks.visible_keys)

    def _summed_over_batch(self, count) -> int:
        """``count`` (a ``masks`` counter) over the batch: per sequence alike without segment ids."""
        segments = self.segment_ids()
        if segments is None:
            return self.batch * count(self.seq_q, self.seq_k, causal=self.causal, window=self.window)
        return count(self.seq_q, self.seq_k, causal=self.causal, window=self.window,
                     q_segment_ids=segments[0], kv_segment_ids=segments[1])

    @property
    def mask_density(self) -> float:
        """The unmasked fraction of the batch's Sq x Sk pairs."""
        return self.pairs / (self.batch * self.seq_q * self.seq_k)

    @property
    def avg_k(self) -> float:
        """Keys each query attends to, on average."""
        return self.pairs / (self.batch * self.seq_q)

    @property
    def fwd_flops(self) -> float:
        return 4.0 * self.q_heads * self.head_dim * self.pairs

    @property
    def dense_flops(self) -> float:
        """FLOPs of this step with no mask at all (every Sq x Sk pair), in this mode."""
        factor = 1.0 + (BWD_FLOPS_FACTOR if self.mode == "fwd_bwd" else 0.0)
        return 4.0 * self.batch * self.q_heads * self.seq_q * self.seq_k * self.head_dim * factor

    @property
    def flops(self) -> float:
        """FLOPs of one step in this workload's mode."""
        factor = 1.0 + (BWD_FLOPS_FACTOR if self.mode == "fwd_bwd" else 0.0)
        return self.fwd_flops * factor

    @property
    def min_bytes(self) -> int:
        """Bytes any kernel must move at least: read q, the k and v of the keys some query sees
        (``visible_keys``) and write o once; ``fwd_bwd`` also reads q, those k and v, o and dO and
        writes dq, dk and dv, the gradients whole (a key no query sees still gets its zero)."""
        itemsize = DTYPE_BYTES[self.dtype]
        q_elems = self.batch * self.seq_q * self.q_heads * self.head_dim
        kv_read = self.visible_keys * self.kv_heads * self.head_dim
        kv_whole = self.batch * self.seq_k * self.kv_heads * self.head_dim
        fwd = q_elems + 2 * kv_read + q_elems
        bwd = (3 * q_elems + 2 * kv_read) + (q_elems + 2 * kv_whole)
        return itemsize * (fwd + (bwd if self.mode == "fwd_bwd" else 0))

    @property
    def stream_length(self) -> int:
        """The length a stream of steps varies: the KV cache's for decode, else the sequence's."""
        return self.seq_k if self.phase == "decode" else self.seq_q

    def at_length(self, length: int) -> Workload:
        """This workload at another ``stream_length`` (decode: the cache; else seq_q = seq_k). A packed
        layout belongs to one step: it does not carry to another length."""
        if self.phase == "decode":
            return self.replace(seq_k=length)
        documents = None if self.documents is None else min(self.documents, length)
        return self.replace(seq_q=length, seq_k=length, documents=documents, packed=None)

    def to_dict(self) -> dict:
        """The fields, less the mask fields left at their defaults: what an older release's
        ``Workload(**fields)`` also takes (``attnbench compare`` hands it to another revision).
        ``window_scaled_from`` never goes: it changes nothing the other revision computes."""
        fields = dataclasses.asdict(self)
        del fields["window_scaled_from"]
        for name in ("window", "softcap", "documents", "packed", "ragged", "name"):
            if fields[name] == _DEFAULTS[name]:
                del fields[name]
        return fields

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        gqa = f"/{self.kv_heads}kv" if self.is_gqa else ""
        seq = f"{self.seq_q}" if self.seq_q == self.seq_k else f"{self.seq_q}x{self.seq_k}"
        causal = " causal" if self.causal else ""
        # Only what is set: a workload without a mask keeps the description (and case key) it had.
        extra = "".join(f" {p}" for p in self.mask.split("+") if p not in ("causal", "none"))
        name = f"{self.name} " if self.name != CUSTOM else ""
        return (
            f"{name}B{self.batch} H{self.q_heads}{gqa} S{seq} D{self.head_dim} "
            f"{self.dtype}{causal}{extra} {self.mode}"
        )


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Workload)}
