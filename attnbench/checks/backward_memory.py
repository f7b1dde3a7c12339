"""``attnbench backward-memory``: how a training step's memory grows with the sequence length.

FlashAttention-2's backward keeps q, k, v, the output and each row's log-sum-exp, and recomputes each
tile's probabilities, so the memory its gradient holds grows with the length S, not with S^2. This
measures it for the blockwise ports, one way per framework, at two lengths 4x apart (B1 H4 D64,
causal, float32), and says whether it grew at most ``--limit`` times (6 by default: 4x the length
and room for per-call constants):

- jax: the compiled temporaries of the jitted forward+backward (XLA's ``memory_analysis``: what the
  compiler decided, not a run), at 2048 and 8192 tokens;
- torch: the bytes the forward saves for the backward (``torch.autograd.graph.saved_tensors_hooks``,
  each storage once), measured on a run at 1024 and 4096 tokens.

Exit status 1 when a kernel grows more than the limit.
"""

from __future__ import annotations

import argparse

import attention_impls
from attnbench.core.workload import Workload

JAX_LENGTHS, TORCH_LENGTHS = (2048, 8192), (1024, 4096)
MiB = 2**20


def workload(seq: int) -> Workload:
    return Workload(batch=1, q_heads=4, seq_q=seq, head_dim=64, causal=True, mode="fwd_bwd")


def jax_gradient_temp_bytes(name: str, seq: int) -> int:
    """XLA's compiled temporaries of the jitted forward+backward of ``name`` at ``seq`` tokens."""
    import jax
    import jax.numpy as jnp

    from attention_impls.base import default_scale
    from attnbench.backends.jax_steps import forward_backward

    w = workload(seq)
    arrays = [jax.ShapeDtypeStruct(w.q_shape, jnp.float32)] * 4
    fn = forward_backward(attention_impls.get(name), w.causal, default_scale(w.head_dim, None), {})
    return int(fn.lower(*arrays).compile().memory_analysis().temp_size_in_bytes)


def torch_saved_bytes(name: str, seq: int) -> int:
    """The bytes ``name``'s forward at ``seq`` tokens saves for its backward, each storage once."""
    import torch

    from attention_impls.base import default_scale
    from attnbench.backends.torch_backend import saved_for_backward_bytes
    from attnbench.core.inputs import make_inputs

    w = workload(seq)
    x = make_inputs(w, seed=0)
    q, k, v = (torch.tensor(a, requires_grad=True) for a in (x.q, x.k, x.v))
    impl = attention_impls.get(name)
    return saved_for_backward_bytes(lambda: impl.attention(q, k, v, causal=w.causal,
                                                           scale=default_scale(w.head_dim, None)))


def measure(frameworks: tuple[str, ...] = ("jax", "torch")) -> list[dict]:
    rows = []
    for framework, how, lengths, probe in (
            ("jax", "compiled temporaries of the gradient", JAX_LENGTHS, jax_gradient_temp_bytes),
            ("torch", "bytes saved for backward", TORCH_LENGTHS, torch_saved_bytes)):
        if framework not in frameworks:
            continue
        name = f"{framework}-blockwise-flash"
        short, long = (probe(name, seq) for seq in lengths)
        rows.append({"impl": name, "figure": how, "lengths": lengths, "short_bytes": short,
                     "long_bytes": long, "growth": long / short if short else float("inf")})
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=float, default=6.0, help="the most a kernel's memory may grow for 4x the "
                   "length (default 6)")
    p.add_argument("--frameworks", default="jax,torch", help="comma-separated: jax, torch (default both)")


def command(args) -> int:
    frameworks = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    unknown = sorted(set(frameworks) - {"jax", "torch"})
    if unknown:
        raise SystemExit(f"attnbench backward-memory: unknown framework(s) {', '.join(unknown)}; "
                         "expected jax, torch")
    over = 0
    for row in measure(frameworks):
        a, b = row["lengths"]
        within = row["growth"] <= args.limit
        over += not within
        print(f"{row['impl']}: {row['figure']} {row['short_bytes'] / MiB:.1f} MiB at S={a}, "
              f"{row['long_bytes'] / MiB:.1f} MiB at S={b}: {row['growth']:.2f}x for {b // a}x the length "
              f"({'within' if within else 'over'} {args.limit:g}x)")
    return 1 if over else 0
