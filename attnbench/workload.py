"""The workload value type: one attention problem, its FLOPs and its minimum bytes.

FLOPs follow flash-attention's convention (``benchmarks/benchmark_attn.py``):

    fwd     = 4 * B * Hq * Sq * avg_k * D
    avg_k   = Sk                            (non-causal)
            = (max(0, Sk - Sq) + Sk) / 2    (causal, bottom-right aligned)
    fwd_bwd = 3.5 * fwd                     (bwd = 2.5 * fwd)

Only the two matmuls count; softmax exponentials and masking are not FLOPs here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MODES = ("fwd", "fwd_bwd")
BWD_FLOPS_FACTOR = 2.5


@dataclass(frozen=True)
class Workload:
    """One attention problem in ``[batch, seq, heads, head_dim]`` layout.

    ``kv_heads`` below ``q_heads`` is grouped-query attention (each kv head serves
    ``q_heads // kv_heads`` query heads). ``causal`` masks are bottom-right aligned:
    query ``i`` sees keys ``j <= i + (seq_k - seq_q)``, the convention of
    flash-attention >= 2.1 and of KV-cache decoding.
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

    # -- shapes ---------------------------------------------------------------------------------
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

    # -- cost model -----------------------------------------------------------------------------
    @property
    def avg_k(self) -> float:
        """Keys each query attends to, on average."""
        if not self.causal:
            return float(self.seq_k)
        return (max(0, self.seq_k - self.seq_q) + self.seq_k) / 2

    @property
    def fwd_flops(self) -> float:
        return 4.0 * self.batch * self.q_heads * self.seq_q * self.avg_k * self.head_dim

    @property
    def flops(self) -> float:
        """FLOPs of one step in this workload's mode."""
        factor = 1.0 + (BWD_FLOPS_FACTOR if self.mode == "fwd_bwd" else 0.0)
        return self.fwd_flops * factor

    @property
    def min_bytes(self) -> int:
        """Bytes any kernel must move at least: read q, k, v and write o once.

        ``fwd_bwd`` adds the backward pass's own minimum: read q, k, v, o and dO, write dq, dk, dv.
        """
        itemsize = DTYPE_BYTES[self.dtype]
        q_elems = self.batch * self.seq_q * self.q_heads * self.head_dim
        kv_elems = self.batch * self.seq_k * self.kv_heads * self.head_dim
        fwd = q_elems + 2 * kv_elems + q_elems
        bwd = (3 * q_elems + 2 * kv_elems) + (q_elems + 2 * kv_elems)
        return itemsize * (fwd + (bwd if self.mode == "fwd_bwd" else 0))

    # -- helpers --------------------------------------------------------------------------------
    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        gqa = f"/{self.kv_heads}kv" if self.is_gqa else ""
        seq = f"{self.seq_q}" if self.seq_q == self.seq_k else f"{self.seq_q}x{self.seq_k}"
        causal = " causal" if self.causal else ""
        return (
            f"B{self.batch} H{self.q_heads}{gqa} S{seq} D{self.head_dim} "
            f"{self.dtype}{causal} {self.mode}"
        )
