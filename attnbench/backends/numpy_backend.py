"""numpy: the float64 reference on the host CPU. Eager, no device, nothing compiles."""

from __future__ import annotations

import os

import numpy as np

from attention_impls.base import default_scale, mask_call, static_mask
from attnbench.backends.base import Backend, Step
from attnbench.core.inputs import make_inputs
from attnbench.core.workload import Workload
from attnbench.hardware import cpu_device

# Imported where used: threadpoolctl (the tools extra).


class NumpyBackend(Backend):
    framework = "numpy"
    module = "numpy"

    def platform(self) -> str:
        return "cpu"


    def detect_device(self, host):
        return cpu_device(host)

    def gemm_runner(self, dtype: str):
        if dtype == "bf16":
            raise ValueError("numpy has no native bfloat16 matmul: probe bf16 with torch or jax")
        ndtype = {"fp16": np.float16, "fp32": np.float32}[dtype]

        def make(n):
            rng = np.random.default_rng(0)
            a = rng.standard_normal((n, n)).astype(ndtype)
            b = rng.standard_normal((n, n)).astype(ndtype)
            out = np.empty((n, n), dtype=ndtype)
            return lambda: np.matmul(a, b, out=out)

        return make, blas_threads()

    # A numpy kernel computes in float64 whatever its inputs' dtype: it is the yardstick.
    def run_numpy(self, impl, q, k, v, *, causal, scale, **mask):
        return np.asarray(impl.attention(q, k, v, causal=causal, scale=scale, **mask), dtype=np.float64)

    def grad_numpy(self, impl, q, k, v, do, *, causal, scale, **mask):
        return tuple(np.asarray(g, dtype=np.float64)
                     for g in impl.attention_grads(q, k, v, do, causal=causal, scale=scale, **mask))

    def make_step(self, impl, workload: Workload, seed: int = 0, *, config: bool = True) -> Step:
        self.require(impl, workload, config=config)
        x = make_inputs(workload, seed)
        q, k, v, do = (a.astype(np.float64) for a in (x.q, x.k, x.v, x.do))
        scale, causal = default_scale(workload.head_dim, None), workload.causal
        mask = mask_call(static_mask(workload), x.mask_arrays())
        if workload.mode == "fwd":
            def run():
                return impl.attention(q, k, v, causal=causal, scale=scale, **mask)
        else:
            def run():  # the forward and its gradients, as every framework's fwd_bwd step
                return (impl.attention(q, k, v, causal=causal, scale=scale, **mask),
                        impl.attention_grads(q, k, v, do, causal=causal, scale=scale, **mask))
        return Step(run=run, execution="eager", kernel_evidence="numpy einsum (host, float64)",
                    framework=self.framework)


def blas_threads() -> int | None:
    """Threads numpy's BLAS uses (threadpoolctl), else the thread variables it honours."""
    try:
        from threadpoolctl import threadpool_info

        blas = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
        if blas:
            return max(blas)
    except ImportError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


BACKEND = NumpyBackend()
