"""What every kernel declares, and the conformance entry point they all share.

A kernel is one file holding one small class: its framework, the hardware it was designed for, a
per-platform support table, shape rules, and ``attention(q, k, v, causal=, scale=)`` written in the
framework's own arrays. The framework's backend (``attnbench/backends/``) turns that into the
conformance entry point ``run_numpy`` / ``grad_numpy`` and into a timed ``make_step``.

Framework imports happen inside methods, never at module import, so that the registry can list
every implementation in an environment that lacks some frameworks (torch_xla lives in its own venv).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Literal

import numpy as np

from attention_impls._compile_target import compile_target
from attnbench.workload import Workload

PLATFORMS = ("cpu", "gpu", "tpu")
FORCED_FLASH = "forced-flash"
NATIVE = "native"


class Unsupported(NotImplementedError):
    """This implementation cannot run this workload here; ``reason`` says why in plain words."""

    def __init__(self, impl: str, reason: str):
        super().__init__(f"{impl}: {reason}")
        self.impl = impl
        self.reason = reason


@dataclass(frozen=True)
class PlatformSupport:
    """How an implementation runs on one platform: natively, only in an interpreter, or not at all."""

    status: Literal["runs", "interpret-only", "unsupported"]
    note: str = ""


RUNS = PlatformSupport("runs")


def interpret_only(note: str) -> PlatformSupport:
    return PlatformSupport("interpret-only", note)


def unsupported(reason: str) -> PlatformSupport:
    return PlatformSupport("unsupported", reason)


class AttentionImpl(abc.ABC):
    """Base of every kernel. A kernel file subclasses it, sets the declarations and ``attention``.

    Declarations: ``name`` (stable kebab-case: results are keyed by it), ``framework`` (whose
    backend in ``attnbench.backends`` places, runs and meters it), ``designed_for`` (the platforms
    the kernel was written for; empty = portable), ``is_flash``, ``summary``, ``platform_support``
    (cpu/gpu/tpu: runs, interpret-only or unsupported, with the reason) and ``shape_reason``.

    Optional hooks a backend reads: ``trace_context(platform)`` (jax: the context the kernel must
    be traced and run in), ``compiled_by`` (torch: ``"torch.compile"``), ``evidence_from_ops``
    (torch: profiled op counts -> how we know this kernel ran), ``attention_grads`` (numpy: the
    analytic gradients, as numpy has no autodiff).
    """

    name: str  # stable kebab-case registry name
    framework: str  # "numpy" | "jax" | "torch" | "torch_xla"
    # Modules the kernel imports beyond its framework: one the installed release lacks (moved or
    # removed across releases) makes ``check`` refuse with that reason instead of failing mid-sweep.
    requires_modules: tuple[str, ...] = ()
    designed_for: frozenset[str] = frozenset()  # platforms the kernel was written for; empty = portable
    is_flash: bool = False  # a tiled online-softmax (FlashAttention-style) kernel
    summary: str = ""
    platform_support: dict[str, PlatformSupport] = {p: RUNS for p in PLATFORMS}

    @abc.abstractmethod
    def attention(self, q, k, v, *, causal: bool, scale: float):
        """The kernel on the framework's arrays in ``[B, S, H, D]``, bottom-right causal; returns
        ``[B, Sq, Hq, D]`` in q's dtype. Import the framework inside, never at module level."""

    def shape_reason(self, workload: Workload, platform: str) -> str | None:
        """Why this kernel cannot run ``workload`` (shapes, dtype, masking); ``None`` when it can."""
        return None

    # -- what the kernel is -------------------------------------------------------------------
    def label(self, platform: str) -> str:
        """``forced-flash`` when a flash kernel runs off the hardware it was designed for."""
        if self.is_flash and self.designed_for and platform not in self.designed_for:
            return FORCED_FLASH
        return NATIVE

    def designed_for_text(self) -> str:
        return "/".join(sorted(self.designed_for)) if self.designed_for else "portable"

    # -- where it can run (answered by the framework's backend) ---------------------------------
    def backend(self):
        from attnbench import backends

        return backends.get(self.framework)

    def framework_missing(self) -> str | None:
        return self.backend().missing()

    def api_missing(self) -> str | None:
        """Why this framework release lacks what the kernel imports (``requires_modules``); ``None``
        when it has it. The import is tried, since a module can exist and fail to import."""
        import importlib

        for module in self.requires_modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # ImportError, or a module that breaks at import on this release
                from importlib import metadata

                version = metadata.version(self.framework.replace("_", "-"))
                return (f"{module} does not import in {self.framework} {version}: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
        return None

    def platform(self) -> str:
        """The platform (cpu/gpu/tpu) of this framework's current default device; inside
        ``attention_impls._compile_target.compiling_for(p)`` (the compiled-for tier compiling for
        hardware this host lacks), the target's platform ``p``, so kernels trace as on it."""
        target = compile_target()
        return target.platform if target is not None else self.backend().platform()

    def execution(self, platform: str) -> str:
        """How this kernel executes on ``platform``: ``compiled``, ``eager`` or ``interpret``."""
        return self.backend().execution(self, platform)

    def check(self, workload: Workload) -> str | None:
        """Why this implementation cannot run ``workload`` here, or ``None`` when it can."""
        missing = self.framework_missing()
        if missing:
            return missing
        platform = self.platform()
        support = self.platform_support[platform]
        if support.status == "unsupported":
            return support.note
        return self.api_missing() or self.shape_reason(workload, platform)

    def require(self, workload: Workload) -> str:
        """Raise ``Unsupported`` unless ``workload`` runs here; return the platform."""
        reason = self.check(workload)
        if reason:
            raise Unsupported(self.name, reason)
        return self.platform()

    # -- the conformance entry point ------------------------------------------------------------
    def run_numpy(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
                  scale: float | None = None) -> np.ndarray:
        """Run the real kernel on ``[B, S, H, D]`` numpy inputs in their dtype.

        Returns the output as float64 ``[B, Sq, Hq, D]``; raises ``Unsupported`` with the reason.
        """
        self.require(workload_of(q, k, v, causal=causal))
        return self.backend().run_numpy(self, q, k, v, causal=causal,
                                        scale=default_scale(q.shape[3], scale))

    def grad_numpy(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *, causal: bool,
                   scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gradients (dq, dk, dv) of ``sum(out * do)``, as float64 arrays shaped like q, k, v."""
        self.require(workload_of(q, k, v, causal=causal, mode="fwd_bwd"))
        return self.backend().grad_numpy(self, q, k, v, do, causal=causal,
                                         scale=default_scale(q.shape[3], scale))

    # -- measurement (the backend's; kept here so one object is all a caller needs) -------------
    def make_step(self, workload: Workload, seed: int = 0):
        """Inputs placed on the device and an ``attnbench.backends.Step`` running ``workload.mode``."""
        return self.backend().make_step(self, workload, seed)

    def make_runner(self, template: Workload, seed: int = 0):
        """An ``attnbench.backends.Runner``: ``template.mode`` at any length, one compiled function."""
        return self.backend().make_runner(self, template, seed)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def workload_of(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool, mode: str = "fwd") -> Workload:
    """The workload that numpy inputs describe; shape mismatches raise ``ValueError`` naming them."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [B, S, H, D]; got shapes {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must agree on batch and head_dim; got {q.shape} and {k.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    return Workload(batch=q.shape[0], seq_q=q.shape[1], q_heads=q.shape[2], head_dim=q.shape[3],
                    seq_k=k.shape[1], kv_heads=k.shape[2], dtype=str(q.dtype), causal=causal, mode=mode)


def default_scale(head_dim: int, scale: float | None) -> float:
    return float(scale) if scale is not None else 1.0 / float(np.sqrt(head_dim))
