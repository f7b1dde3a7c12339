"""What a kernel can do here, on this process's device, asked of its framework's backend.

A kernel (``attention_impls``) only declares what it is: its framework, the platforms and features
it takes, ``shape_reason``, ``attention``. Where it runs, how it executes, whether it takes a
workload, and running or timing it are the backend's answers, given here by kernel:
``here.check(impl, workload)``, ``here.make_step(impl, workload)``. ``run_numpy`` and
``grad_numpy`` are the conformance entry point: the real kernel on numpy arrays.
"""

from __future__ import annotations

import numpy as np

from attention_impls.base import AttentionImpl, default_scale, mask_kwargs, workload_of
from attnbench import backends
from attnbench.core.workload import Workload


def backend_of(impl: AttentionImpl):
    """The backend of the kernel's framework (``attnbench/backends/``)."""
    return backends.get(impl.framework)


def framework_missing(impl: AttentionImpl) -> str | None:
    """Why the kernel's framework is not usable in this environment, or ``None``."""
    return backend_of(impl).missing()


def platform(impl: AttentionImpl) -> str:
    """cpu/gpu/tpu of the framework's default device, or the target's inside ``compiling_for``."""
    return backend_of(impl).platform_for()


def check(impl: AttentionImpl, workload: Workload) -> str | None:
    """Why the kernel cannot run ``workload`` here, or ``None`` when it can."""
    return backend_of(impl).refusal(impl, workload)


def refusal_before_import(impl: AttentionImpl, workload: Workload) -> str | None:
    """``check`` without importing the kernel's own modules (``api_missing``): what the kernel
    refuses here whatever the release, so that a release's import fault is judged only where the
    kernel would otherwise run (the release matrix)."""
    return backend_of(impl).refusal(impl, workload, imports=False)


def require(impl: AttentionImpl, workload: Workload) -> str:
    """Raise ``Unsupported`` unless ``workload`` runs here; return the platform."""
    return backend_of(impl).require(impl, workload)


def run_numpy(impl: AttentionImpl, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
              scale: float | None = None, window: int | None = None,
              q_segment_ids: np.ndarray | None = None, kv_segment_ids: np.ndarray | None = None,
              softcap: float | None = None) -> np.ndarray:
    """Run the real kernel on ``[B, S, H, D]`` numpy inputs in their dtype.

    Returns float64 ``[B, Sq, Hq, D]``; raises ``Unsupported`` or ``ValueError`` (bad inputs).
    """
    mask = mask_kwargs(q, k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                       kv_segment_ids=kv_segment_ids, softcap=softcap)
    require(impl, workload_of(q, k, v, causal=causal, **mask))
    return backend_of(impl).run_numpy(impl, q, k, v, causal=causal, scale=default_scale(q.shape[3], scale),
                                      **mask)


def grad_numpy(impl: AttentionImpl, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *,
               causal: bool, scale: float | None = None, window: int | None = None,
               q_segment_ids: np.ndarray | None = None, kv_segment_ids: np.ndarray | None = None,
               softcap: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients (dq, dk, dv) of ``sum(out * do)``, as float64 arrays shaped like q, k, v."""
    mask = mask_kwargs(q, k, causal=causal, window=window, q_segment_ids=q_segment_ids,
                       kv_segment_ids=kv_segment_ids, softcap=softcap)
    require(impl, workload_of(q, k, v, causal=causal, mode="fwd_bwd", **mask))
    return backend_of(impl).grad_numpy(impl, q, k, v, do, causal=causal,
                                       scale=default_scale(q.shape[3], scale), **mask)


def make_step(impl: AttentionImpl, workload: Workload, seed: int = 0):
    """Inputs placed on the device and an ``attnbench.backends.Step`` running ``workload.mode``."""
    return backend_of(impl).make_step(impl, workload, seed)


def make_runner(impl: AttentionImpl, template: Workload, seed: int = 0):
    """An ``attnbench.backends.Runner``: ``template.mode`` at any length, one compiled function."""
    return backend_of(impl).make_runner(impl, template, seed)
