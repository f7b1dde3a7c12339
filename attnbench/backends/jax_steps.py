"""A kernel's jitted jax step, forward or forward and backward: what the measured suite times, the
compiled-for tier compiles for its targets and the profiler check profiles.

Its own module so that the compiled-for tier builds the same program without importing the jax
backend, which calls that tier (``JaxBackend.compile_for``).
"""

from __future__ import annotations

from attention_impls.base import mask_call

# Imported where used: jax (each venv holds only some frameworks, and the asv process none).


def forward(impl, causal: bool, scale: float, static: dict | None = None):
    """``jit(f)(q, k, v, *segment_ids)``: the static mask features (window, softcap) are bound,
    segment ids (when the workload has them) are traced arguments after v."""
    import jax  # deferred: this module is imported where jax may be absent (the torch_xla venv)

    static = static or {}

    def fwd(q, k, v, *segments):
        return impl.attention(q, k, v, causal=causal, scale=scale, **mask_call(static, segments))

    return jax.jit(fwd)


def forward_backward(impl, causal: bool, scale: float, static: dict | None = None):
    """``jit(f)(q, k, v, do, *segment_ids)`` -> (out, (dq, dk, dv))."""
    import jax  # deferred: as in ``forward``

    static = static or {}

    def fwd_bwd(q, k, v, do, *segments):
        def f(q, k, v):
            return impl.attention(q, k, v, causal=causal, scale=scale, **mask_call(static, segments))

        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(do)

    return jax.jit(fwd_bwd)
