"""The protocol every framework backend implements, and the step/runner values it hands out.

A backend is stateless and shared; it reads only the kernel's declarations (``attention``,
``platform_support``, ``shape_reason`` and the optional hooks ``trace_context``, ``compiled_by``,
``evidence_from_ops``). Framework imports happen inside methods: importing a backend imports none.
"""

from __future__ import annotations

import abc
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attention_impls._compile_target import compile_target
from attention_impls.base import Unsupported
from attnbench.backends.memory import rss_growth_bytes
from attnbench.backends.profiles import OpTime, ProfileUnreadable
from attnbench.core.workload import Workload
from attnbench.measure.timing import DeviceClock

# What a device timer writes before each timed call, outside the timed interval, so no call reads
# the last one's operands from cache: larger than any GPU's L2 (H100/H200: 50 MB), as do_bench uses.
L2_FLUSH_BYTES = 256 * 2**20


@dataclass
class Step:
    """One prepared, repeatable step of a workload: ``run()`` does the work and blocks until done.
    ``find_evidence`` reruns the step under a profiler: time it before asking ``evidence()``."""

    run: Callable[[], Any]
    execution: str
    kernel_evidence: str = "not verified"
    find_evidence: Callable[[], str] | None = None
    # jax's ahead-of-time compile, measured once in make_step: lower_s, compile_s, compiler_*_bytes...
    compile_info: dict | None = None
    framework: str = ""  # whose backend measures this step's memory
    # The device's high-water mark before the step's inputs were made, where the framework cannot
    # reset it (jax): a peak at or below it belongs to an earlier case of the same process.
    memory_mark: int | None = None
    # The same work without waiting for the device: what device events bracket (``device_clock``),
    # so neither the host's wait nor its synchronisation lands inside a device figure. torch's steps
    # carry it (only torch on CUDA times with events); None where a backend builds none.
    enqueue: Callable[[], Any] | None = None
    trains: bool = False  # a forward+backward step: its memory includes what the backward keeps

    def evidence(self) -> str:
        """How we know which kernel ran; starts with "not verified" when we do not."""
        return self.find_evidence() if self.find_evidence else self.kernel_evidence


@dataclass
class Runner:
    """One step function reused across sequence lengths, as a serving or training loop reuses it,
    so a new length costs whatever the framework does for a new shape. ``prepare(length)`` places and
    caches seeded inputs (``Unsupported`` for a length the kernel refuses): call it before timing
    ``step``; a packed stream's step also names its layout (``packed``: its inputs carry the layout's
    segment ids, same shape). The compile counts cover only work inside ``step`` (``None``: the
    framework does not say).
    """

    template: Workload
    execution: str
    place: Callable[[Workload], Any]  # one length's workload -> its inputs on the device (blocking)
    call: Callable[[Any], Any]  # one step on placed inputs, blocking until done
    count_compiles: Callable[[], int | None] = lambda: None
    count_compile_seconds: Callable[[], float | None] = lambda: None
    # Compiles a compiler cache served: a compile figure is cold only when this stays 0.
    count_cache_hits: Callable[[], int | None] = lambda: None
    inputs: dict[int, Any] = field(default_factory=dict, repr=False)

    def workload(self, length: int, packed=None) -> Workload:
        """The workload of one step at ``length`` (``Workload`` rejects a length below 1), with the
        step's packed layout (``Workload.packed``) where it has one."""
        workload = self.template.at_length(length)
        return workload if packed is None else workload.replace(packed=packed)

    def prepare(self, length: int, packed=None) -> None:
        key = (length, packed)
        if key not in self.inputs:
            self.inputs[key] = self.place(self.workload(length, packed))

    def step(self, length: int, packed=None) -> None:
        self.prepare(length, packed)
        self.call(self.inputs[(length, packed)])

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
    profiler: str = ""  # the framework profiler ``profile_ops`` reads, in words
    profile_kind: str = ""  # "torch" (CPU events) or "xla" (XLA op events): how its op names read

    def missing(self) -> str | None:
        """Why this framework cannot run in this environment, or ``None``."""
        if importlib.util.find_spec(self.module) is None:
            where = " (it lives in .venv-xla: make test-xla)" if self.framework == "torch_xla" else ""
            return f"{self.module} is not installed in this environment{where}"
        return None

    @abc.abstractmethod
    def platform(self) -> str:
        """The platform (cpu/gpu/tpu) of this framework's current default device."""

    def platform_for(self) -> str:
        """The platform a kernel is traced for: the target's inside ``compiling_for``, else this
        framework's default device's."""
        target = compile_target()
        return target.platform if target is not None else self.platform()

    def refusal(self, impl, workload: Workload, *, imports: bool = True, config: bool = True) -> str | None:
        """Why ``impl`` cannot run ``workload`` here, or ``None`` when it can: the framework missing,
        the platform, the kernel's own imports (``imports``), its mask features, its shapes and a
        config it was given (``AttentionImpl.config_reason``; ``config`` False: not asked, for a
        stream's shorter steps, which run the config its workload kept)."""
        missing = self.missing()
        if missing:
            return missing
        on = self.platform_for()
        support = impl.platform_support[on]
        if support.status == "unsupported":
            return support.note
        return ((impl.api_missing() if imports else None) or impl.feature_reason(workload)
                or impl.shape_reason(workload, on)
                or (impl.config_reason(impl.config_now, workload) if impl.config and config else None))

    def require(self, impl, workload: Workload, *, config: bool = True) -> str:
        """Raise ``Unsupported`` unless ``impl`` runs ``workload`` here; return the platform.
        ``config`` False: a stream's step, whose config was checked at the stream's longest length
        (a tile longer than a shorter step pads, a chunk is clamped, as at the kernel's defaults)."""
        reason = self.refusal(impl, workload, config=config)
        if reason:
            raise Unsupported(impl.name, reason)
        return self.platform_for()

    def profile_ops(self, impl, workload: Workload, step) -> tuple[list[OpTime], str]:
        """One warm ``step`` run under the framework's profiler: its ops, and a note that explains
        an invisible kernel (or ""). ``ProfileUnreadable`` where no profiler is read."""
        raise ProfileUnreadable(f"no framework profiler is read for {self.framework} kernels")

    @abc.abstractmethod
    def detect_device(self, host):
        """The ``hardware.Device`` this framework's default placement runs on (the host CPU if none)."""

    def gemm_runner(self, dtype: str) -> GemmRunner:
        """``(make(n) -> run, threads)``: ``run()`` is one blocking n x n x n CPU matmul in ``dtype``."""
        raise ValueError(f"the {self.framework} backend has no CPU GEMM probe")

    @abc.abstractmethod
    def run_numpy(self, impl, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool,
                  scale: float, **mask) -> np.ndarray:
        """``impl``'s kernel on numpy inputs in their dtype; float64 ``[B, Sq, Hq, D]``. ``mask``:
        the features set (``attention_impls.base.mask_kwargs``), segment ids as numpy int32."""

    @abc.abstractmethod
    def grad_numpy(self, impl, q, k, v, do, *, causal: bool, scale: float, **mask):
        """Gradients (dq, dk, dv) of ``sum(out * do)`` as float64 arrays shaped like q, k, v."""

    @abc.abstractmethod
    def make_step(self, impl, workload: Workload, seed: int = 0, *, config: bool = True) -> Step:
        """Inputs placed on the device and a ``Step`` that runs ``workload.mode`` once, blocking
        (``config``: as ``require``'s)."""

    def make_runner(self, impl, template: Workload, seed: int = 0) -> Runner:
        """A ``Runner`` that runs ``template.mode`` at any length, reusing its compiled code. This
        default builds a ``make_step`` per length in the untimed ``prepare`` (compiles: 0 or ``None``)."""
        platform = self.require(impl, template)
        execution = impl.execution(platform)
        eager = execution == "eager"
        return Runner(template, execution, place=lambda w: self.make_step(impl, w, seed, config=False),
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
        """Peak memory of one more ``step.run()`` by source (column -> bytes; always host RSS growth)."""
        return {"host_rss_growth_bytes": rss_growth_bytes(step.run)}

    def device_clock(self, step: Step, timer: str = "wall") -> DeviceClock | None:
        """The device's own timer of one call of ``step`` where ``timer`` asks for one and the backend
        has it (a value: ``measure.timing.time_calls`` times with it); None where the wall clock times
        the step (``time_step``). "device" is the device's timer where there is one, else the wall."""
        if timer not in ("wall", "device"):
            raise ValueError(f"timer {timer!r} is not available for {self.framework} here (only 'wall'; "
                             "'cuda-events' needs torch on a CUDA device, 'xla-device-events' jax on a "
                             "GPU or TPU)")
        return None

    def compile_for(self, impl, workload: Workload, target: str):
        """Compile ``impl`` for a hardware ``target`` this host does not have (ahead of time)."""
        raise NotImplementedError(f"the {self.framework} backend cannot compile for another target")
