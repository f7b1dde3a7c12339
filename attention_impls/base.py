"""What every attention implementation declares and the one entry point they all share.

An implementation is a small class: its framework, the hardware its kernel was designed for, a
per-platform support table, shape rules, and ``attention(q, k, v, causal=, scale=)`` written in the
framework's own arrays. The framework base classes (``_jax.py``, ``_torch.py``) turn that into the
shared conformance entry point ``run_numpy`` / ``grad_numpy`` and into a timed ``make_step``.

Framework imports happen inside methods, never at module import, so that the registry can list
every implementation in an environment that lacks some frameworks (torch_xla lives in its own venv).
"""

from __future__ import annotations

import abc
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

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


@dataclass
class Step:
    """One prepared, repeatable step of a workload: ``run()`` does the work and blocks until done.

    ``execution`` says how the kernel really executed (``compiled``, ``eager``, ``interpret``);
    ``kernel_evidence`` says how we know which kernel ran (filled by the implementation), or
    ``find_evidence`` finds it by running the step once more under a profiler; ``evidence()`` is
    the answer either way. Callers time the step before asking, so its first call stays the first.
    """

    run: Callable[[], Any]
    execution: str
    kernel_evidence: str = "not verified"
    find_evidence: Callable[[], str] | None = None
    # Ahead-of-time compile, where the framework has one (jax): {"lower_s", "compile_s",
    # "compiler_{temp,argument,output,peak}_bytes", "custom_calls"}, measured once in make_step.
    compile_info: dict | None = None

    def evidence(self) -> str:
        """How we know which kernel ran; starts with "not verified" when we do not."""
        return self.find_evidence() if self.find_evidence else self.kernel_evidence


@dataclass
class Runner:
    """One step function reused across sequence lengths, as a serving or training loop reuses it.

    ``step(length)`` runs ``template.mode`` once with ``seq_q = seq_k = length`` (every other
    dimension from ``template``) and blocks until the device is done. The compiled function is the
    same for the runner's whole life, so a new length costs whatever the framework does for a new
    shape (a trace and compile under ``jax.jit`` / ``torch.compile`` / XLA, nothing in eager mode).

    Inputs are seeded (``attnbench.inputs.make_inputs(workload, seed)``), made and placed on the
    device once per distinct length by ``prepare(length)`` and cached (one set per length is kept:
    mind the memory for long, many-length streams). Call ``prepare`` before timing ``step``: the
    timed call then holds neither host-side generation nor the host-to-device copy (``step``
    prepares on its own when needed, inside its own time). ``prepare`` raises ``Unsupported``
    for a length the kernel cannot take.

    ``compiles()`` counts the compiles attributable to this runner so far (``None``: the framework
    does not say); ``compile_seconds()`` is their total compile time where the framework reports
    it (``None`` otherwise). Both count only work done inside ``step``.
    """

    template: Workload
    execution: str
    place: Callable[[Workload], Any]  # one length's workload -> its inputs on the device (blocking)
    call: Callable[[Any], Any]  # one step on placed inputs, blocking until done
    count_compiles: Callable[[], int | None] = lambda: None
    count_compile_seconds: Callable[[], float | None] = lambda: None
    inputs: dict[int, Any] = field(default_factory=dict, repr=False)

    def workload(self, length: int) -> Workload:
        """The workload of one step at ``length`` (``Workload`` rejects a length below 1)."""
        return self.template.replace(seq_q=length, seq_k=length)

    def prepare(self, length: int) -> None:
        if length not in self.inputs:
            self.inputs[length] = self.place(self.workload(length))

    def step(self, length: int) -> None:
        self.prepare(length)
        self.call(self.inputs[length])

    def compiles(self) -> int | None:
        return self.count_compiles()

    def compile_seconds(self) -> float | None:
        return self.count_compile_seconds()


class AttentionImpl(abc.ABC):
    """Base of every implementation. Subclasses set the class attributes and ``attention``."""

    name: str  # stable kebab-case registry name
    framework: str  # "numpy" | "jax" | "torch" | "torch_xla"
    module: str  # importable module the framework needs (checked before running)
    designed_for: frozenset[str] = frozenset()  # platforms the kernel was written for; empty = portable
    is_flash: bool = False  # a tiled online-softmax (FlashAttention-style) kernel
    summary: str = ""
    platform_support: dict[str, PlatformSupport] = {p: RUNS for p in PLATFORMS}

    # -- what the kernel is -------------------------------------------------------------------
    def label(self, platform: str) -> str:
        """``forced-flash`` when a flash kernel runs off the hardware it was designed for."""
        if self.is_flash and self.designed_for and platform not in self.designed_for:
            return FORCED_FLASH
        return NATIVE

    def designed_for_text(self) -> str:
        return "/".join(sorted(self.designed_for)) if self.designed_for else "portable"

    # -- where it can run -----------------------------------------------------------------------
    def framework_missing(self) -> str | None:
        if importlib.util.find_spec(self.module) is None:
            where = " (it lives in .venv-xla: make test-xla)" if self.framework == "torch_xla" else ""
            return f"{self.module} is not installed in this environment{where}"
        return None

    @abc.abstractmethod
    def platform(self) -> str:
        """The platform (cpu/gpu/tpu) of this framework's current default device."""

    def shape_reason(self, workload: Workload, platform: str) -> str | None:
        """Why this kernel cannot run ``workload`` (shapes, dtype, masking); ``None`` when it can."""
        return None

    def check(self, workload: Workload) -> str | None:
        """Why this implementation cannot run ``workload`` here, or ``None`` when it can."""
        missing = self.framework_missing()
        if missing:
            return missing
        platform = self.platform()
        support = self.platform_support[platform]
        if support.status == "unsupported":
            return support.note
        return self.shape_reason(workload, platform)

    def require(self, workload: Workload) -> str:
        """Raise ``Unsupported`` unless ``workload`` runs here; return the platform."""
        reason = self.check(workload)
        if reason:
            raise Unsupported(self.name, reason)
        return self.platform()

    def execution(self, platform: str) -> str:
        return "interpret" if self.platform_support[platform].status == "interpret-only" else "compiled"

    # -- the conformance entry point ------------------------------------------------------------
    @abc.abstractmethod
    def run_numpy(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
                  scale: float | None = None) -> np.ndarray:
        """Run the real kernel on ``[B, S, H, D]`` numpy inputs in their dtype.

        Returns the output as float64 ``[B, Sq, Hq, D]``; raises ``Unsupported`` with the reason.
        """

    @abc.abstractmethod
    def grad_numpy(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, *, causal: bool,
                   scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gradients (dq, dk, dv) of ``sum(out * do)``, as float64 arrays shaped like q, k, v."""

    @abc.abstractmethod
    def make_step(self, workload: Workload, seed: int = 0) -> Step:
        """Inputs placed on the device and a ``Step`` that runs ``workload.mode`` once, blocking."""

    def make_runner(self, template: Workload, seed: int = 0) -> Runner:
        """A ``Runner`` that runs ``template.mode`` at any sequence length, reusing its compiled code.

        Frameworks override this (``_jax.py``, ``_torch.py``, ``_torch_xla.py``). This default has
        nothing to reuse: ``prepare`` builds a fresh ``make_step`` per distinct length (untimed, so
        any compile there is invisible) and ``step`` runs it; compiles are 0 for an eager
        implementation and unknown (``None``) otherwise.
        """
        platform = self.require(template)
        execution = self.execution(platform)
        eager = execution == "eager"

        def place(workload: Workload) -> Step:
            return self.make_step(workload, seed)

        return Runner(template, execution, place=place, call=lambda step: step.run(),
                      count_compiles=(lambda: 0) if eager else (lambda: None),
                      count_compile_seconds=(lambda: 0.0) if eager else (lambda: None))

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
