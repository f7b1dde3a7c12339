"""The protocol every framework backend implements, and the step/runner values it hands out.

A backend is stateless and shared (``attnbench.backends.get(framework)``). It receives the
kernel (an ``attention_impls`` implementation) as an argument and reads only its declarations:
``attention``, ``platform_support``, ``shape_reason`` and the optional hooks ``trace_context``
(jax: where the kernel must be traced, e.g. Pallas' TPU interpreter), ``compiled_by`` (torch:
``"torch.compile"``) and ``evidence_from_ops`` (torch: what profiled ops say about the kernel).

Framework imports happen inside methods: importing a backend imports no framework.
"""

from __future__ import annotations

import abc
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnbench.core.workload import Workload


@dataclass
class Step:
    """One prepared, repeatable step of a workload: ``run()`` does the work and blocks until done.

    ``execution`` says how the kernel really executed (``compiled``, ``eager``, ``interpret``);
    ``kernel_evidence`` says how we know which kernel ran, or ``find_evidence`` finds it by running
    the step once more under a profiler; ``evidence()`` is the answer either way. Callers time the
    step before asking, so its first call stays the first.
    """

    run: Callable[[], Any]
    execution: str
    kernel_evidence: str = "not verified"
    find_evidence: Callable[[], str] | None = None
    # Ahead-of-time compile, where the framework has one (jax): {"lower_s", "compile_s",
    # "compiler_{temp,argument,output,peak}_bytes", "custom_calls"}, measured once in make_step.
    compile_info: dict | None = None
    framework: str = ""  # whose backend measures this step's memory
    # The device's high-water mark before the step's inputs were made, where the framework cannot
    # reset it (jax): a peak at or below it belongs to an earlier case of the same process.
    memory_mark: int | None = None

    def evidence(self) -> str:
        """How we know which kernel ran; starts with "not verified" when we do not."""
        return self.find_evidence() if self.find_evidence else self.kernel_evidence


@dataclass
class Runner:
    """One step function reused across sequence lengths, as a serving or training loop reuses it.

    ``step(length)`` runs ``template.mode`` once at ``template.at_length(length)`` (``seq_q = seq_k =
    length``; for decode, a cache of ``length`` keys; every other dimension from ``template``) and
    blocks until the device is done. The compiled function is the
    same for the runner's whole life, so a new length costs whatever the framework does for a new
    shape (a trace and compile under ``jax.jit`` / ``torch.compile`` / XLA, nothing in eager mode).

    Inputs are seeded (``attnbench.core.inputs.make_inputs(workload, seed)``), made and placed on the
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
    # Compiles served from a compiler cache (Inductor's FX-graph cache, jax's persistent cache,
    # torch_xla's in-process graph cache): a compile figure is cold only when this stays 0.
    count_cache_hits: Callable[[], int | None] = lambda: None
    inputs: dict[int, Any] = field(default_factory=dict, repr=False)

    def workload(self, length: int) -> Workload:
        """The workload of one step at ``length`` (``Workload`` rejects a length below 1)."""
        return self.template.at_length(length)

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

    def cache_hits(self) -> int | None:
        return self.count_cache_hits()


GemmRunner = tuple[Callable[[int], Callable[[], Any]], "int | None"]


class Backend(abc.ABC):
    """How one framework places inputs, runs, compiles, meters and inspects a kernel."""

    framework: str  # "numpy" | "jax" | "torch" | "torch_xla"
    module: str  # the importable module the framework needs

    # -- where it runs ------------------------------------------------------------------------
    def missing(self) -> str | None:
        """Why this framework cannot run in this environment, or ``None``."""
        if importlib.util.find_spec(self.module) is None:
            where = " (it lives in .venv-xla: make test-xla)" if self.framework == "torch_xla" else ""
            return f"{self.module} is not installed in this environment{where}"
        return None

    @abc.abstractmethod
    def platform(self) -> str:
        """The platform (cpu/gpu/tpu) of this framework's current default device."""

    def execution(self, impl, platform: str) -> str:
        """How ``impl`` executes on ``platform``: ``compiled``, ``eager`` or ``interpret``."""
        return "interpret" if impl.platform_support[platform].status == "interpret-only" else "compiled"

    @abc.abstractmethod
    def detect_device(self, host):
        """The ``hardware.Device`` this framework's default placement runs on (the host CPU if none)."""

    def gemm_runner(self, dtype: str) -> GemmRunner:
        """``(make(n) -> run, threads)``: ``run()`` does one blocking n x n x n matmul on the CPU in
        ``dtype`` (bf16/fp16/fp32) through this framework's own matmul; ``threads`` it uses."""
        raise ValueError(f"the {self.framework} backend has no CPU GEMM probe")

    # -- the conformance entry point ----------------------------------------------------------
    @abc.abstractmethod
    def run_numpy(self, impl, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
                  scale: float, **mask) -> np.ndarray:
        """``impl``'s kernel on numpy inputs in their dtype; float64 ``[B, Sq, Hq, D]``. ``mask``:
        the features set (``attention_impls.base.mask_kwargs``), segment ids as numpy int32."""

    @abc.abstractmethod
    def grad_numpy(self, impl, q, k, v, do, *, causal: bool, scale: float, **mask):
        """Gradients (dq, dk, dv) of ``sum(out * do)`` as float64 arrays shaped like q, k, v."""

    # -- measurement --------------------------------------------------------------------------
    @abc.abstractmethod
    def make_step(self, impl, workload: Workload, seed: int = 0) -> Step:
        """Inputs placed on the device and a ``Step`` that runs ``workload.mode`` once, blocking."""

    def make_runner(self, impl, template: Workload, seed: int = 0) -> Runner:
        """A ``Runner`` that runs ``template.mode`` at any length, reusing its compiled code.

        This default has nothing to reuse: ``prepare`` builds a fresh ``make_step`` per distinct
        length (untimed, so any compile there is invisible) and ``step`` runs it; compiles are 0
        for eager code and unknown (``None``) otherwise.
        """
        platform = impl.require(template)
        execution = self.execution(impl, platform)
        eager = execution == "eager"
        return Runner(template, execution, place=lambda w: self.make_step(impl, w, seed),
                      call=lambda step: step.run(),
                      count_compiles=(lambda: 0) if eager else (lambda: None),
                      count_compile_seconds=(lambda: 0.0) if eager else (lambda: None),
                      count_cache_hits=(lambda: 0) if eager else (lambda: None))

    def to_float64(self, array) -> np.ndarray:
        """One of this framework's arrays as a float64 numpy array on the host."""
        return np.asarray(array, dtype=np.float64)

    def host_arrays(self, result) -> list[np.ndarray]:
        """A step's result (an array, or nested tuples of them) as a flat list of float64 arrays."""
        if isinstance(result, (tuple, list)):
            return [a for part in result for a in self.host_arrays(part)]
        return [self.to_float64(result)]

    def measure_memory(self, step: Step) -> dict:
        """Peak memory of one more ``step.run()`` by source (record column -> bytes); a source this
        device lacks is left out. Every backend adds the host's resident high-water growth."""
        from attnbench.backends.memory import rss_growth_bytes

        return {"host_rss_growth_bytes": rss_growth_bytes(step.run)}

    def time(self, step: Step, *, timer: str = "wall", **budget):
        """``attnbench.measure.timing.Timing`` of ``step`` by ``timer``; ``budget``: ``time_step``'s stopping
        arguments. "wall" is the blocked autorange every backend has; a device timer is a backend's;
        "device" is the backend's device timer where it has one on this device, else "wall"."""
        from attnbench.measure.timing import time_step

        if timer not in ("wall", "device"):
            raise ValueError(f"timer {timer!r} is not available for {self.framework} here (only 'wall'; "
                             "'cuda-events' needs torch on a CUDA device)")
        return time_step(step.run, **budget)

    def compile_for(self, impl, workload: Workload, target: str):
        """Compile ``impl`` for a hardware ``target`` this host does not have (ahead of time)."""
        raise NotImplementedError(f"the {self.framework} backend cannot compile for another target")
