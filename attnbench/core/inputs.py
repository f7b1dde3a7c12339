"""Seeded inputs for a workload, as numpy arrays in the workload's dtype ([B, S, H, D])."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbench.core.workload import Workload

# Imported where used: ml_dtypes (each venv holds only some frameworks, and the asv process none).


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a workload dtype name; bfloat16 comes from ml_dtypes (a jax dependency)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


@dataclass(frozen=True)
class Inputs:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    do: np.ndarray  # upstream gradient of the output, for fwd_bwd
    q_segment_ids: np.ndarray | None = None  # int32 [B, Sq] where the mask has segment ids
    kv_segment_ids: np.ndarray | None = None  # int32 [B, Sk]

    def mask_arrays(self) -> tuple:
        """The segment-id arrays a kernel takes beside q, k, v: ``()`` or ``(q_ids, kv_ids)``."""
        return () if self.q_segment_ids is None else (self.q_segment_ids, self.kv_segment_ids)


def make_inputs(workload: Workload, seed: int = 0) -> Inputs:
    """Standard-normal q, k, v and dO drawn in float32, then cast to the workload dtype; the mask's
    segment ids (``Workload.segment_ids``: seeded by the layout's own seed, not by ``seed``)."""
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(workload.dtype)

    def draw(shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    segments = workload.segment_ids() or (None, None)
    return Inputs(q=draw(workload.q_shape), k=draw(workload.kv_shape), v=draw(workload.kv_shape),
                  do=draw(workload.q_shape), q_segment_ids=segments[0], kv_segment_ids=segments[1])
