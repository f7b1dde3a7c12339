"""The timed step's own output checked against the float64 reference (``attention_impls``'
``reference-float64``), or a smaller proxy workload where the reference would not fit."""

from __future__ import annotations

import functools

from attention_impls.base import mask_call, static_mask
from attention_impls.reference_float64 import attention_fwd, attention_grads
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.numerics import GRAD_SLACK, compare
from attnbench.core.workload import Workload

# The float64 reference materialises B*H*Sq*Sk doubles; above this it runs on a proxy workload.
REFERENCE_MAX_SCORE_ELEMENTS = 2**25  # 256 MiB of float64 scores
PROXY_SEQ = 512


def numerics_workload(workload: Workload) -> Workload:
    """The workload itself, or a smaller proxy when the float64 reference would not fit: one
    sequence of ``PROXY_SEQ`` keys (a decode keeps its queries; a window shrinks with the length)."""
    fwd = workload.replace(mode="fwd")
    if fwd.batch * fwd.q_heads * fwd.seq_q * fwd.seq_k <= REFERENCE_MAX_SCORE_ELEMENTS:
        return fwd
    seq_q = min(fwd.seq_q, PROXY_SEQ) if fwd.seq_q < fwd.seq_k else PROXY_SEQ
    window = None if fwd.window is None else max(1, fwd.window * PROXY_SEQ // fwd.seq_k)
    documents = None if fwd.documents is None else min(fwd.documents, seq_q)
    return fwd.replace(batch=1 if not fwd.ragged else min(fwd.batch, 2), seq_q=seq_q, seq_k=PROXY_SEQ,
                       window=window, documents=documents)


def reference_mask(workload: Workload, x) -> dict:
    """The mask keywords of ``workload`` with its inputs' segment ids, for the float64 reference."""
    return mask_call(static_mask(workload), x.mask_arrays())


@functools.lru_cache(maxsize=16)
def reference_outputs(workload: Workload, seed: int) -> list:
    """The float64 reference's output (and gradients, for ``fwd_bwd``) on the seeded inputs: computed
    once per workload in a process, as the cases sharing a worker check every kernel of a workload
    against the same one."""
    x = make_inputs(workload, seed)
    mask = reference_mask(workload, x)
    expected = [attention_fwd(x.q, x.k, x.v, causal=workload.causal, **mask)]
    if workload.mode == "fwd_bwd":
        expected += attention_grads(x.q, x.k, x.v, x.do, causal=workload.causal, **mask)
    for array in expected:
        array.setflags(write=False)  # shared by the checks that read it
    return expected


def check_numerics(impl, workload: Workload, step, seed: int) -> dict:
    """Errors of the timed step's own output (and gradients) against the float64 reference, from
    one more run of the same compiled function. Where the reference would not fit, a smaller proxy
    is checked through the conformance entry point instead, and the record says so.
    """
    checked = numerics_workload(workload)
    if checked.replace(mode=workload.mode) == workload:
        actual = here.backend_of(impl).host_arrays(step.run())
        expected = reference_outputs(workload, seed)
        if len(actual) != len(expected):
            raise ValueError(f"the timed step returned {len(actual)} arrays; expected {len(expected)} "
                             f"(output{', dq, dk, dv' if workload.mode == 'fwd_bwd' else ''})")
        results = [compare(a, e, workload.dtype, slack=1.0 if i == 0 else GRAD_SLACK)
                   for i, (a, e) in enumerate(zip(actual, expected, strict=True))]
        label = f"the timed step ({'output and gradients' if len(results) > 1 else 'output'})"
    else:
        if here.check(impl, checked):
            return {"numerics_workload": f"proxy {checked.describe()}", "numerics_ok": None}
        x = make_inputs(checked, seed=7)
        mask = reference_mask(checked, x)
        results = [compare(here.run_numpy(impl, x.q, x.k, x.v, causal=checked.causal, **mask),
                           attention_fwd(x.q, x.k, x.v, causal=checked.causal, **mask), checked.dtype)]
        label = (f"proxy {checked.describe()} (the reference at {workload.describe()} would exceed "
                 f"{REFERENCE_MAX_SCORE_ELEMENTS} score elements)")
    broken = [r for r in results if not r.finite]  # NaN/inf: reported as such, never as a small error
    worst = broken[0] if broken else max(results, key=lambda r: r.max_abs)
    return {"numerics_workload": label, "max_abs_err": worst.max_abs, "max_rel_err": worst.max_rel,
            "numerics_ok": all(r.ok for r in results)}
