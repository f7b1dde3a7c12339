"""The shapes the field publishes device timings for, which this project compiles and measures too.

Tokamax's caches time the same attention problems on every chip (16k tokens a step: B x S = 16384 at
heads x head_dim = 2048, causal or not, and Llama-shaped grouped heads). Five of them, causal forward
in bfloat16, are this project's *aligned* shapes: ``make published`` compiles them for the chips
(records beside the published figure), and ``attnbench run --published-shapes`` measures them, so
that a figure measured on a chip lands row for row beside the published one (the report's
``measured here``).
"""

from __future__ import annotations

from attnbench.core.workload import Workload

DTYPE = "bfloat16"  # as published
ALIGNED = (
    Workload(batch=1, q_heads=16, seq_q=16384, head_dim=128, dtype=DTYPE, causal=True),
    Workload(batch=2, q_heads=16, seq_q=8192, head_dim=128, dtype=DTYPE, causal=True),
    Workload(batch=8, q_heads=16, seq_q=2048, head_dim=128, dtype=DTYPE, causal=True),
    Workload(batch=2, q_heads=32, seq_q=8192, head_dim=64, dtype=DTYPE, causal=True),
    Workload(batch=32, q_heads=32, kv_heads=8, seq_q=4096, head_dim=128, dtype=DTYPE, causal=True),
)
_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def label(workload: Workload) -> str:
    """``B32 Hq32 Hkv8 S4096 D128 causal bf16``: the shape as people read it (kv heads where grouped)."""
    kv = f" Hkv{workload.kv_heads}" if workload.is_gqa else ""
    seq = str(workload.seq_q) if workload.seq_q == workload.seq_k else f"{workload.seq_q}x{workload.seq_k}"
    causal = " causal" if workload.causal else ""
    return (f"B{workload.batch} Hq{workload.q_heads}{kv} S{seq} D{workload.head_dim}{causal} "
            f"{_SHORT_DTYPES.get(workload.dtype, workload.dtype)}")


NAMES = {label(w): w for w in ALIGNED}


def get(name: str) -> Workload:
    """The aligned shape named ``name`` (its ``label``); ``KeyError`` lists the known ones."""
    from attnbench.core.errors import UnknownName

    try:
        return NAMES[name]
    except KeyError:
        raise UnknownName(f"unknown published shape {name!r}; known: {', '.join(NAMES)}") from None


def key(*, batch, q_heads, kv_heads, seq_q, seq_k, head_dim, dtype, causal) -> tuple:
    """What a published row and a compiled or measured case must share to stand side by side."""
    return (int(batch), int(q_heads), int(kv_heads), int(seq_q), int(seq_k), int(head_dim), str(dtype),
            str(causal) == "True")


def workload_key(workload: Workload) -> tuple:
    return key(batch=workload.batch, q_heads=workload.q_heads, kv_heads=workload.kv_heads,
               seq_q=workload.seq_q, seq_k=workload.seq_k, head_dim=workload.head_dim, dtype=workload.dtype,
               causal=workload.causal)


# The columns a table of records (compiled, or measured by a sweep) needs to say its shape.
SHAPE_FIELDS = {"batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim", "dtype", "causal", "mode"}


def record_keys(records) -> list[tuple]:
    """Each record's shape ``key`` (a DataFrame with ``SHAPE_FIELDS``)."""
    return [key(batch=r.batch, q_heads=r.q_heads, kv_heads=r.kv_heads, seq_q=r.seq_q, seq_k=r.seq_k,
                head_dim=r.head_dim, dtype=r.dtype, causal=r.causal) for r in records.itertuples()]


def at_aligned_shapes(records):
    """A boolean Series: which records are the forward of an aligned shape (``make published``'s
    compiles); all False for a table without the shape's columns (an older or a made-up one)."""
    import pandas as pd

    if not SHAPE_FIELDS <= set(records.columns):
        return pd.Series(False, index=records.index, dtype=bool)
    aligned = {workload_key(w) for w in ALIGNED}
    named = records["workload"].fillna("custom") if "workload" in records else "custom"
    custom = (named == "custom") & (records["mode"] == "fwd")
    return custom & pd.Series([k in aligned for k in record_keys(records)], index=records.index, dtype=bool)
