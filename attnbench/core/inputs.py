"""Seeded inputs for a workload, as numpy arrays in the workload's dtype ([B, S, H, D])."""

from __future__ import annotations

import functools
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


def stream_inputs(workload: Workload, template: Workload, seed: int = 0) -> Inputs:
    """A stream step's inputs: the ``template``'s draws at its longest lengths (``make_inputs``, made
    once per process and template) cut to the step's lengths, with the step's own segment ids. A
    stream meets up to one new length a step, and drawing each afresh cost more than the steps
    themselves (19.3 s of a 200-step decode stream whose steps took 1.2 s, results/LOG.md). The values
    differ from ``make_inputs`` at the step's own length, which no stream compares against: the
    float64 check runs on the static step, whose inputs are ``make_inputs``'. A workload that is not
    the template at shorter lengths gets ``make_inputs``."""
    if (workload.replace(seq_q=template.seq_q, seq_k=template.seq_k, packed=template.packed) != template
            or workload.seq_q > template.seq_q or workload.seq_k > template.seq_k):
        return make_inputs(workload, seed)
    full = _template_draws(template.replace(packed=None), seed)
    segments = workload.segment_ids() or (None, None)

    def cut(array: np.ndarray, length: int) -> np.ndarray:
        return np.ascontiguousarray(array[:, :length])

    return Inputs(q=cut(full.q, workload.seq_q), k=cut(full.k, workload.seq_k), v=cut(full.v, workload.seq_k),
                  do=cut(full.do, workload.seq_q), q_segment_ids=segments[0], kv_segment_ids=segments[1])


@functools.lru_cache(maxsize=2)
def _template_draws(template: Workload, seed: int) -> Inputs:
    x = make_inputs(template, seed)
    return Inputs(q=x.q, k=x.k, v=x.v, do=x.do)
