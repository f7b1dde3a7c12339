"""JAX side of the shared entry point: numpy <-> jax arrays, jit, vjp, blocking steps."""

from __future__ import annotations

import abc
import contextlib
from functools import partial

import numpy as np

from attention_impls.base import AttentionImpl, Step, default_scale, workload_of
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

        return Step(run=run, execution=self.execution(platform))
