"""jax: numpy <-> jax arrays, ``jax.jit`` ahead-of-time lowering and compile, vjp, blocking steps.

A kernel's optional ``trace_context(platform)`` is entered around every trace and call (how Pallas'
TPU interpreter is switched on). ``compile_for`` serves the compiled-for tier.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time

import numpy as np

from attention_impls._compile_target import JAX_GPU_BACKENDS, jax_platform
from attention_impls.base import default_scale, static_mask
from attnbench.backends import jax_steps, profiles
from attnbench.backends.base import L2_FLUSH_BYTES, Backend, Runner, Step
from attnbench.backends.profiles import OpTime, hlo_instructions, read_xplane, xla_events, xla_op_times
from attnbench.compiled_for.compile import compile_case
from attnbench.core.inputs import make_inputs, stream_inputs
from attnbench.core.workload import Workload
from attnbench.hardware import Device, cpu_device
from attnbench.measure.timing import DeviceClock

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).


def _context(impl, platform: str):
    hook = getattr(impl, "trace_context", None)
    return hook(platform) if hook else contextlib.nullcontext()


def to_float64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _split(mask: dict) -> tuple[dict, tuple]:
    """A conformance call's mask keywords -> (static features, segment-id arrays)."""
    static = {k: v for k, v in mask.items() if k not in ("q_segment_ids", "kv_segment_ids")}
    segments = (mask["q_segment_ids"], mask["kv_segment_ids"]) if "q_segment_ids" in mask else ()
    return static, segments


class JaxBackend(Backend):
    framework = "jax"
    module = "jax"
    profiler = "jax.profiler (XLA op events)"
    profile_kind = "xla"

    def profile_ops(self, impl, workload: Workload, step) -> tuple[list[OpTime], str]:
        return profile_jax(impl, workload, step)

    def platform(self) -> str:
        import jax

        backend = jax.default_backend()
        return JAX_GPU_BACKENDS.get(backend, backend)

    def to_float64(self, array) -> np.ndarray:
        return to_float64(array)

    def detect_device(self, host):
        import jax


        first = jax.devices()[0]
        platform = {"cuda": "gpu", "rocm": "gpu"}.get(first.platform, first.platform)
        if platform == "cpu":
            return cpu_device(host)
        count = sum(1 for d in jax.local_devices() if d.platform == first.platform)
        return Device(platform, str(first.device_kind), count, host.cpu_model, host.usable_cores)

    def gemm_runner(self, dtype: str):
        import jax
        import jax.numpy as jnp

        jdtype = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}[dtype]
        cpu = jax.devices("cpu")[0]
        matmul = jax.jit(jnp.matmul)

        def make(n):
            ka, kb = jax.random.split(jax.random.PRNGKey(0))
            a = jax.device_put(jax.random.normal(ka, (n, n), jnp.float32).astype(jdtype), cpu)
            b = jax.device_put(jax.random.normal(kb, (n, n), jnp.float32).astype(jdtype), cpu)
            return lambda: matmul(a, b).block_until_ready()

        return make, xla_cpu_threads()

    # -- jitted functions of a kernel (``jax_steps``, shared with the compiled-for tier) ----------
    forward = staticmethod(jax_steps.forward)
    forward_backward = staticmethod(jax_steps.forward_backward)

    def run_numpy(self, impl, q, k, v, *, causal, scale, **mask):
        import jax.numpy as jnp

        static, segments = _split(mask)
        platform = self.platform()
        with _context(impl, platform):
            out = self.forward(impl, causal, scale, static)(*(jnp.asarray(x) for x in (q, k, v, *segments)))
        return to_float64(out)

    def grad_numpy(self, impl, q, k, v, do, *, causal, scale, **mask):
        import jax.numpy as jnp

        static, segments = _split(mask)
        with _context(impl, self.platform()):
            _, grads = self.forward_backward(impl, causal, scale, static)(
                *(jnp.asarray(x) for x in (q, k, v, do, *segments)))
        return tuple(to_float64(g) for g in grads)

    def make_step(self, impl, workload: Workload, seed: int = 0, *, config: bool = True) -> Step:
        import jax


        platform = self.require(impl, workload, config=config)
        mark = _device_peak()  # this process's high-water mark before the case (earlier cases' steps)
        x = make_inputs(workload, seed)
        scale, static = default_scale(workload.head_dim, None), static_mask(workload)
        if workload.mode == "fwd":
            fn, args = self.forward(impl, workload.causal, scale, static), (x.q, x.k, x.v)
        else:
            fn, args = self.forward_backward(impl, workload.causal, scale, static), (x.q, x.k, x.v, x.do)
        args = tuple(jax.device_put(a) for a in args + x.mask_arrays())

        def run():
            with _context(impl, platform):
                return jax.block_until_ready(fn(*args))

        with _context(impl, platform):
            info = compile_analysis(fn, args)
        step = Step(run=run, execution=impl.execution(platform), compile_info=info,
                    framework=self.framework, memory_mark=mark, trains=workload.mode == "fwd_bwd")
        calls = info["custom_calls"]
        step.kernel_evidence = (f"compiled HLO custom-calls: {', '.join(calls)}" if calls
                                else "compiled HLO has no custom-call: XLA's own ops")
        if step.execution == "interpret":
            step.kernel_evidence += " (Pallas interpreter: the kernel body runs as plain XLA ops)"
        return step

    def make_runner(self, impl, template: Workload, seed: int = 0) -> Runner:
        """One ``jax.jit`` object for the runner's life: each new length is a new trace + compile.

        ``compiles()`` is its ``_cache_size()`` (one entry per compiled shape). ``compile_seconds()``
        is XLA's compile only (``CompileMeter``): tracing and lowering are in the step's wall time.
        """
        import jax


        platform = self.require(impl, template)
        scale = default_scale(template.head_dim, None)
        fwd = template.mode == "fwd"
        fn = (self.forward if fwd else self.forward_backward)(impl, template.causal, scale,
                                                              static_mask(template))
        meter = CompileMeter()

        def place(workload: Workload):
            self.require(impl, workload, config=False)  # the config was checked at the template
            x = stream_inputs(workload, template, seed)
            args = ((x.q, x.k, x.v) if fwd else (x.q, x.k, x.v, x.do)) + x.mask_arrays()
            return jax.block_until_ready(tuple(jax.device_put(a) for a in args))

        def call(args):
            with _context(impl, platform), meter:
                return jax.block_until_ready(fn(*args))

        return Runner(template, impl.execution(platform), place=place, call=call,
                      # a private jit method: a release without it leaves the count unknown (None)
                      count_compiles=getattr(fn, "_cache_size", lambda: None),
                      count_compile_seconds=lambda: meter.seconds,
                      count_cache_hits=lambda: meter.cache_hits)

    def device_clock(self, step: Step, timer: str = "wall") -> DeviceClock | None:
        """``"xla-device-events"`` (or ``"device"``) on a GPU or TPU: a sample is one ``jax.profiler``
        session around a few calls of the step (``calls_per_sample``: about 10 ms of them), each call
        after an L2 flush on a GPU; its figure is the device's busy time in the session's device events
        per call (``profiles.device_busy_seconds``, the flush's executable left out), so neither the
        host's dispatch nor its wait is in it. Tokamax times its jax kernels from device events too
        (XProf on a TPU, CUPTI on a GPU). On a CPU ``"device"`` falls back to the wall clock and
        ``"xla-device-events"`` is refused."""
        platform = self.platform()
        if timer not in ("xla-device-events", "device") or platform == "cpu":
            return super().device_clock(step, timer)
        import jax

        flush = l2_flusher() if platform == "gpu" else None  # a TPU: device events time it as is
        step.run()  # warm: the call timed next is a steady one
        began = time.perf_counter()
        step.run()
        calls = max(1, min(32, int(0.01 / max(time.perf_counter() - began, 1e-6))))

        def timed_call() -> float:
            with tempfile.TemporaryDirectory() as log_dir:
                if flush:
                    flush()  # outside the session: its executable is left out of the figure anyway
                jax.profiler.start_trace(log_dir)
                try:
                    for i in range(calls):
                        if flush and i:
                            flush()
                        step.run()
                finally:
                    jax.profiler.stop_trace()
                busy = profiles.device_busy_seconds(read_xplane(log_dir), planes=profiles.DEVICE_PLANES,
                                                    skip_module=L2_FLUSH_MODULE)
            return busy / calls

        return DeviceClock("xla-device-events", timed_call, calls_per_sample=calls)

    def compile_for(self, impl, workload: Workload, target) -> dict:
        """The compiled-for record of ``impl`` at ``workload`` for ``target`` (``targets.toml`` name or
        ``Target``), compiled in this process by the target's own compiler. Needs libtpu / the CUDA
        plugin (``.venv-targets``) and ``JAX_PLATFORMS=cpu``; sweeps use killable workers instead."""
        return compile_case(target, impl.name, workload)

    def measure_memory(self, step: Step) -> dict:
        out = {}
        if _device_peak() is not None:
            step.run()
            peak = _device_peak()
            if peak > (step.memory_mark or 0):
                # No reset exists (jax-ml/jax#8096): the high-water mark is the case's own only when it
                # rose above the mark its process had before the case (earlier cases' buffers are gone).
                out["device_peak_bytes"] = peak
            else:
                out["device_peak_bytes"] = None
                out["memory_note"] = ("device_peak_bytes: not this case's own; the process's high-water "
                                      "mark was set by an earlier case (jax cannot reset it)")
        return {**out, **super().measure_memory(step)}


L2_FLUSH_MODULE = "jit_l2_flush"  # the flush's executable, by the name jax gives a jitted function


def l2_flusher():
    """A blocking call that rewrites ``L2_FLUSH_BYTES`` on the default device, so a GPU's L2 holds
    no operand of the call before it."""
    import jax
    import jax.numpy as jnp

    def l2_flush(buffer):
        return buffer + 1

    rewrite = jax.jit(l2_flush, donate_argnums=0)
    buffer = [jnp.zeros(L2_FLUSH_BYTES, jnp.int8)]

    def flush() -> None:
        buffer[0] = jax.block_until_ready(rewrite(buffer[0]))

    return flush


def _device_peak() -> int | None:
    """``peak_bytes_in_use`` of jax's default device; ``None`` where it keeps none (the CPU)."""
    import jax

    stats = jax.devices()[0].memory_stats()
    return stats.get("peak_bytes_in_use") if stats else None


class CompileMeter:
    """Sums jax.monitoring's ``/jax/core/compile/backend_compile_duration`` while it is entered.

    jax's listeners are process-wide and the event also fires for helper jits, so the listener lives
    only for one ``with`` block (one runner step): exact while nothing else compiles concurrently.
    """

    EVENT = "/jax/core/compile/backend_compile_duration"
    CACHE_HIT = "/jax/compilation_cache/cache_hits"  # the persistent cache served an executable

    def __init__(self):
        self.seconds = 0.0
        self.events = 0
        self.cache_hits = 0

    def _listen(self, event: str, duration: float, **_kwargs) -> None:
        if event == self.EVENT:
            self.seconds += duration
            self.events += 1

    def _count(self, event: str, **_kwargs) -> None:
        if event == self.CACHE_HIT:
            self.cache_hits += 1

    def __enter__(self):
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        jax.monitoring.register_event_listener(self._count)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        # Someone may have cleared jax's listeners meanwhile (jax asserts membership).
        with contextlib.suppress(AssertionError, ValueError):
            jax.monitoring.unregister_event_duration_listener(self._listen)
        with contextlib.suppress(AssertionError, ValueError):
            jax.monitoring.unregister_event_listener(self._count)


def compile_analysis(jitted, args) -> dict:
    """Lower and compile ``jitted(*args)`` ahead of time: times, XLA's memory estimate, custom calls."""
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    result = {"lower_s": lower_s, "compile_s": compile_s}
    memory = compiled.memory_analysis()  # None where the backend gives no estimate
    for field in ("temp", "argument", "output"):
        result[f"compiler_{field}_bytes"] = getattr(memory, f"{field}_size_in_bytes", None)
    result["compiler_peak_bytes"] = getattr(memory, "peak_memory_in_bytes", None)
    hlo = compiled.as_text() or ""
    result["custom_calls"] = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    return result


def xla_cpu_threads() -> int | None:
    """Threads XLA:CPU's matmuls use, from ``XLA_FLAGS`` (one per usable core by default)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if re.search(r"--xla_cpu_multi_thread_eigen=(false|0)\b", flags):
        return 1
    found = re.search(r"intra_op_parallelism_threads=(\d+)", flags)
    if found:
        return int(found.group(1))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


BACKEND = JaxBackend()


def jax_hlo_text(impl, workload: Workload, seed: int = 0) -> str:
    """The compiled HLO of the function ``JaxBackend.make_step`` jits for ``workload``, lowered again
    (the step keeps only its custom calls; the same function and shapes give the same names)."""
    import jax


    x = make_inputs(workload, seed)
    scale, static = default_scale(workload.head_dim, None), static_mask(workload)
    if workload.mode == "fwd":
        fn, args = jax_steps.forward(impl, workload.causal, scale, static), (x.q, x.k, x.v)
    else:
        fn, args = (jax_steps.forward_backward(impl, workload.causal, scale, static),
                    (x.q, x.k, x.v, x.do))
    args = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args + x.mask_arrays())
    hook = getattr(impl, "trace_context", None)
    with hook(jax_platform()) if hook else contextlib.nullcontext():
        return fn.lower(*args).compile().as_text() or ""


def profile_jax(impl, workload: Workload, step) -> tuple[list[OpTime], str]:
    """The step's XLA op events under ``jax.profiler``, named with its HLO's custom calls and scopes."""
    import jax

    hlo = jax_hlo_text(impl, workload)
    module = re.search(r"^HloModule (\S+?),", hlo, re.MULTILINE)
    modules = {module.group(1): hlo_instructions(hlo)} if module else {}
    with tempfile.TemporaryDirectory() as log_dir:
        jax.profiler.start_trace(log_dir)
        try:
            step.run()
        finally:
            jax.profiler.stop_trace()
        lines = xla_events(read_xplane(log_dir), modules)
    return xla_op_times(lines), ""
