"""JAX side of the shared entry point: numpy <-> jax arrays, jit, vjp, blocking steps."""

from __future__ import annotations

import abc
import contextlib
from functools import partial

import numpy as np

from attention_impls.base import AttentionImpl, Runner, Step, default_scale, workload_of
from attnbench.workload import Workload


def jax_platform() -> str:
    import jax

    backend = jax.default_backend()
    return {"cuda": "gpu", "rocm": "gpu"}.get(backend, backend)


def to_float64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


class JaxImpl(AttentionImpl):
    framework = "jax"
    module = "jax"

    def platform(self) -> str:
        return jax_platform()

    @abc.abstractmethod
    def attention(self, q, k, v, *, causal: bool, scale: float):
        """The kernel call on jax arrays in [B, S, H, D]; returns [B, Sq, Hq, D] in q's dtype."""

    def context(self, platform: str):
        """Context the kernel must be traced in (Pallas TPU's interpret mode overrides this)."""
        return contextlib.nullcontext()

    def _forward(self, causal: bool, scale: float):
        import jax

        return jax.jit(partial(self.attention, causal=causal, scale=scale))

    def _forward_backward(self, causal: bool, scale: float):
        import jax

        f = partial(self.attention, causal=causal, scale=scale)

        def fwd_bwd(q, k, v, do):
            out, vjp = jax.vjp(f, q, k, v)
            return out, vjp(do)

        return jax.jit(fwd_bwd)

    def run_numpy(self, q, k, v, *, causal, scale=None):
        platform = self.require(workload_of(q, k, v, causal=causal))
        import jax.numpy as jnp

        with self.context(platform):
            out = self._forward(causal, default_scale(q.shape[3], scale))(
                jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
        return to_float64(out)

    def grad_numpy(self, q, k, v, do, *, causal, scale=None):
        platform = self.require(workload_of(q, k, v, causal=causal, mode="fwd_bwd"))
        import jax.numpy as jnp

        with self.context(platform):
            _, grads = self._forward_backward(causal, default_scale(q.shape[3], scale))(
                *(jnp.asarray(x) for x in (q, k, v, do)))
        return tuple(to_float64(g) for g in grads)

    def make_step(self, workload: Workload, seed: int = 0) -> Step:
        import jax

        from attnbench.inputs import make_inputs

        platform = self.require(workload)
        x = make_inputs(workload, seed)
        scale = default_scale(workload.head_dim, None)
        if workload.mode == "fwd":
            fn, args = self._forward(workload.causal, scale), (x.q, x.k, x.v)
        else:
            fn, args = self._forward_backward(workload.causal, scale), (x.q, x.k, x.v, x.do)
        args = tuple(jax.device_put(a) for a in args)

        def run():
            with self.context(platform):
                return jax.block_until_ready(fn(*args))

        with self.context(platform):
            info = compile_analysis(fn, args)
        step = Step(run=run, execution=self.execution(platform), compile_info=info)
        calls = info["custom_calls"]
        step.kernel_evidence = (f"compiled HLO custom-calls: {', '.join(calls)}" if calls
                                else "compiled HLO has no custom-call: XLA's own ops")
        if step.execution == "interpret":
            step.kernel_evidence += " (Pallas interpreter: the kernel body runs as plain XLA ops)"
        return step

    def make_runner(self, template: Workload, seed: int = 0) -> Runner:
        """One ``jax.jit`` object for the runner's life: each new length is a new trace + compile.

        ``compiles()`` is that function's ``_cache_size()`` (one entry per compiled shape; it was
        empty when the runner was made). ``compile_seconds()`` sums jax.monitoring's
        ``backend_compile_duration`` (XLA's compile only; tracing and lowering are in the step's
        wall time but not here) reported while this runner's step runs; see ``CompileMeter``.
        Inputs are ``device_put`` and ready before a step is timed. Pallas interpret-mode kernels
        are traced and run inside ``self.context(platform)``, as ``make_step`` does.
        """
        import jax

        from attnbench.inputs import make_inputs

        platform = self.require(template)
        scale = default_scale(template.head_dim, None)
        fwd = template.mode == "fwd"
        fn = self._forward(template.causal, scale) if fwd else self._forward_backward(template.causal, scale)
        meter = CompileMeter()

        def place(workload: Workload):
            self.require(workload)
            x = make_inputs(workload, seed)
            args = (x.q, x.k, x.v) if fwd else (x.q, x.k, x.v, x.do)
            return jax.block_until_ready(tuple(jax.device_put(a) for a in args))

        def call(args):
            with self.context(platform), meter:
                return jax.block_until_ready(fn(*args))

        return Runner(template, self.execution(platform), place=place, call=call,
                      count_compiles=fn._cache_size, count_compile_seconds=lambda: meter.seconds)


class CompileMeter:
    """Sums jax.monitoring's ``/jax/core/compile/backend_compile_duration`` while it is entered.

    jax's listeners are process-wide and the event also fires for helper jits (e.g. ops a Pallas
    interpreter or ``ensure_compile_time_eval`` compiles while the step is traced) and for
    persistent-cache hits. So the listener is registered only for the duration of a ``with`` block
    (one runner step) and everything reported meanwhile, from any thread, is charged to it: exact
    for a benchmark that compiles nothing else concurrently, which is what the harness runs.
    """

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.seconds = 0.0
        self.events = 0

    def _listen(self, event: str, duration: float, **_kwargs) -> None:
        if event == self.EVENT:
            self.seconds += duration
            self.events += 1

    def __enter__(self):
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        # Someone may have cleared jax's listeners meanwhile (jax asserts membership).
        with contextlib.suppress(AssertionError, ValueError):
            jax.monitoring.unregister_event_duration_listener(self._listen)


def compile_analysis(jitted, args) -> dict:
    """Lower and compile ``jitted(*args)`` ahead of time: times, XLA's memory estimate, custom calls."""
    import re
    import time

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
