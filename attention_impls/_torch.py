"""torch side of the shared entry point: numpy <-> tensors, autograd, device sync.

``TorchImpl`` runs on CUDA when torch sees a GPU and on the CPU otherwise; ``torch_xla`` subclasses
swap the device and the synchronisation (``_torch_xla.py``).
"""

from __future__ import annotations

import abc

import numpy as np

from attention_impls.base import AttentionImpl, Runner, Step, default_scale, workload_of
from attnbench.workload import Workload


def to_tensor(x: np.ndarray, device):
    import torch

    if x.dtype.name == "bfloat16":  # torch cannot wrap ml_dtypes' bfloat16; the float32 detour is exact
        return torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def profiled_ops(run) -> dict[str, int]:
    """Run ``run`` once under torch's CPU-side profiler; how often each op name was recorded.

    This is what an op-level profiler can see of a step: ATen ops by name, but a compiled region
    (Inductor, XLA) only as one opaque entry.
    """
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return dict(Counter(e.name for e in prof.events()))


def attention_ops(ops: dict[str, int]) -> list[str]:
    """The ATen attention kernels among ``ops`` (the dispatching wrapper itself is not one)."""
    wrapper = "aten::scaled_dot_product_attention"
    return sorted(name for name in ops if "attention" in name and name != wrapper)


def to_float64(t) -> np.ndarray:
    """Copy to the host first, then widen: on a lazy device (XLA) ``.float()`` would run another graph."""
    return t.detach().cpu().double().numpy()


class TorchImpl(AttentionImpl):
    framework = "torch"
    module = "torch"
    # What the profiled ops of one step (``profiled_ops``) say about the kernel that ran, as
    # ``Step.kernel_evidence`` text; None: no profiler check. Set with ``staticmethod(...)``.
    evidence_from_ops = None

    def device(self):
        import torch

        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def platform(self) -> str:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"

    def synchronize(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def execution(self, platform: str) -> str:
        status = self.platform_support[platform].status
        return "interpret" if status == "interpret-only" else "eager"

    @abc.abstractmethod
    def attention(self, q, k, v, *, causal: bool, scale: float):
        """The kernel call on tensors in [B, S, H, D]; returns [B, Sq, Hq, D] in q's dtype."""

    def _grads(self, q, k, v, do, causal, scale):
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = self.attention(q, k, v, causal=causal, scale=scale)
        out.backward(do)
        return out, (q.grad, k.grad, v.grad)

    # The conformance path synchronizes once before reading anything back: on a lazy device (XLA)
    # ``.cpu()`` on each unsynced result would compile and run a graph per tensor.
    def run_numpy(self, q, k, v, *, causal, scale=None):
        self.require(workload_of(q, k, v, causal=causal))
        import torch

        dev = self.device()
        with torch.no_grad():
            out = self.attention(to_tensor(q, dev), to_tensor(k, dev), to_tensor(v, dev),
                                 causal=causal, scale=default_scale(q.shape[3], scale))
        self.synchronize()
        return to_float64(out)

    def grad_numpy(self, q, k, v, do, *, causal, scale=None):
        self.require(workload_of(q, k, v, causal=causal, mode="fwd_bwd"))
        dev = self.device()
        _, grads = self._grads(*(to_tensor(x, dev) for x in (q, k, v, do)), causal,
                               default_scale(q.shape[3], scale))
        self.synchronize()
        return tuple(to_float64(g) for g in grads)

    def make_step(self, workload: Workload, seed: int = 0) -> Step:
        import torch

        from attnbench.inputs import make_inputs

        platform = self.require(workload)
        dev = self.device()
        x = make_inputs(workload, seed)
        q, k, v, do = (to_tensor(a, dev) for a in (x.q, x.k, x.v, x.do))
        self.synchronize()  # inputs really on the device (XLA transfers lazily) before any timing
        scale = default_scale(workload.head_dim, None)
        causal = workload.causal

        if workload.mode == "fwd":
            def run():
                with torch.no_grad():
                    out = self.attention(q, k, v, causal=causal, scale=scale)
                self.synchronize()
                return out
        else:
            def run():
                result = self._grads(q, k, v, do, causal, scale)
                self.synchronize()
                return result

        find = self.evidence_from_ops
        return Step(run=run, execution=self.execution(platform),
                    find_evidence=(lambda: find(profiled_ops(run))) if find else None)

    def compile_meter(self):
        """What counts this implementation's compiles inside a runner step (eager: none happen)."""
        return NoCompiles()

    def make_runner(self, template: Workload, seed: int = 0) -> Runner:
        """The same ``attention`` call at every length; ``compile_meter()`` counts what compiles.

        Eager torch compiles nothing (0 compiles, 0 s); ``torch.compile`` and torch_xla
        implementations bring their own meter. Inputs are moved to the device and synchronized
        before a step is timed; ``fwd_bwd`` runs autograd as ``make_step`` does.
        """
        import torch

        from attnbench.inputs import make_inputs

        platform = self.require(template)
        dev = self.device()
        scale = default_scale(template.head_dim, None)
        causal, fwd = template.causal, template.mode == "fwd"
        meter = self.compile_meter()

        def place(workload: Workload):
            self.require(workload)
            x = make_inputs(workload, seed)
            tensors = tuple(to_tensor(a, dev) for a in ((x.q, x.k, x.v) if fwd else (x.q, x.k, x.v, x.do)))
            self.synchronize()
            return tensors

        def call(tensors):
            with meter:
                if fwd:
                    with torch.no_grad():
                        result = self.attention(*tensors, causal=causal, scale=scale)
                else:
                    result = self._grads(*tensors, causal, scale)
                self.synchronize()
            return result

        return Runner(template, self.execution(platform), place=place, call=call,
                      count_compiles=lambda: meter.compiles, count_compile_seconds=lambda: meter.seconds)


class NoCompiles:
    """Compile meter of eager code: nothing compiles."""

    compiles = 0
    seconds = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class DynamoCompileMeter:
    """Counts ``torch.compile`` work done while entered: dynamo's ``unique_graphs`` counter (one per
    graph dynamo compiles, recompiles included) and the wall time of its ``_compile.compile_inner``
    (dynamo tracing + AOTAutograd + Inductor codegen and C++/Triton build, all of a compile).

    Both are process-wide, so only deltas taken across a ``with`` block (one runner step) are kept.
    A compile whose Inductor output comes from its FX-graph cache (warm, on disk across processes)
    still counts as a compile here, just a fast one.
    """

    def __init__(self):
        self.compiles = 0
        self._seconds = 0.0
        self._timed = True

    @staticmethod
    def _read() -> tuple[int, float | None]:
        from torch._dynamo import utils

        times = getattr(utils, "compilation_time_metrics", {}).get("_compile.compile_inner")
        return utils.counters["stats"]["unique_graphs"], (sum(times) if times is not None else None)

    def __enter__(self):
        self._start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        graphs, seconds = self._read()
        self.compiles += max(0, graphs - self._start[0])
        if graphs > self._start[0]:
            if seconds is None:
                self._timed = False  # torch no longer keeps this metric: say "unknown", not 0
            else:
                self._seconds += max(0.0, seconds - (self._start[1] or 0.0))

    @property
    def seconds(self) -> float | None:
        return self._seconds if self._timed else None
