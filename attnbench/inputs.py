"""Seeded inputs for a workload, as numpy arrays in the workload's dtype ([B, S, H, D])."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbench.workload import Workload


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


def make_inputs(workload: Workload, seed: int = 0) -> Inputs:
    """Standard-normal q, k, v and dO drawn in float32, then cast to the workload dtype."""
    rng = np.random.default_rng(seed)
    dtype = numpy_dtype(workload.dtype)

    def draw(shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    return Inputs(q=draw(workload.q_shape), k=draw(workload.kv_shape), v=draw(workload.kv_shape),
                  do=draw(workload.q_shape))
