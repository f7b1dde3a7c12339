"""torch: numpy <-> tensors, autograd, device sync, profiler evidence, dynamo compile metering.

Runs on CUDA when torch sees a GPU, else on the CPU; the torch_xla backend subclasses it. A kernel
declaring ``compiled_by`` has its compiles metered and a fresh instance per runner (a new serving
loop has no compiled functions yet).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections import Counter

import numpy as np

from attention_impls.base import default_scale, mask_call, static_mask
from attnbench.backends.base import L2_FLUSH_BYTES, Backend, Runner, Step
from attnbench.backends.profiles import OpTime
from attnbench.core.inputs import make_inputs, stream_inputs
from attnbench.core.workload import Workload
from attnbench.hardware import Device, cpu_device
from attnbench.measure.timing import DeviceClock

# Imported where used: torch (each venv holds only some frameworks, and the asv process none).



def to_tensor(x: np.ndarray, device):
    import torch

    if x.dtype.name == "bfloat16":  # torch cannot wrap ml_dtypes' bfloat16; the float32 detour is exact
        return torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def to_float64(t) -> np.ndarray:
    """Copy to the host first, then widen: on a lazy device (XLA) ``.float()`` would run another graph."""
    return t.detach().cpu().double().numpy()


KINETO_LOG = re.compile(rb"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_quiet():
    """Drop the lines kineto writes to stderr on every profiler start and stop: they come from C++,
    past ``sys.stderr`` and ``KINETO_LOG_LEVEL``, so fd 2 is captured and other lines written back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not KINETO_LOG.match(line)]
            if kept:
                os.write(2, b"".join(kept))


def profiled_ops(run) -> dict[str, int]:
    """Run ``run`` once under torch's CPU-side profiler; how often each op name was recorded
    (a compiled region, Inductor or XLA, is one opaque entry)."""
    from torch.profiler import ProfilerActivity, profile

    with kineto_quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return dict(Counter(e.name for e in prof.events()))


def torch_op_times(run) -> list[OpTime]:
    """``run()`` once under ``torch.profiler``: every CPU event with its self time and parents."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile


    with kineto_quiet(), profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    ops = []
    for event in prof.events():
        if event.device_type != DeviceType.CPU:
            continue
        within, parent = [], event.cpu_parent
        while parent is not None:
            within.append(parent.name)
            parent = parent.cpu_parent
        ops.append(OpTime(event.name, event.self_cpu_time_total / 1e6, tuple(reversed(within))))
    return ops


def torch_profiler_peak_bytes(run) -> int:
    """Peak of live host bytes allocated during ``run()``, from the allocation records' running sum:
    op events' ``cpu_memory_usage`` includes nested ops, counting an allocation once per level."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with kineto_quiet(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    records, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            records.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, size in sorted(records):
        live += size
        peak = max(peak, live)
    return peak


def grads(impl, q, k, v, do, causal, scale, **mask):
    """``impl``'s output and the gradients of ``sum(out * do)`` by autograd."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = impl.attention(q, k, v, causal=causal, scale=scale, **mask)
    out.backward(do)
    return out, (q.grad, k.grad, v.grad)


class TorchBackend(Backend):
    framework = "torch"
    module = "torch"
    profiler = "torch.profiler (CPU events)"
    profile_kind = "torch"

    def profile_ops(self, impl, workload: Workload, step) -> tuple[list[OpTime], str]:
        return torch_op_times(step.run), ""

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

    def to_float64(self, array) -> np.ndarray:
        return to_float64(array)


    def detect_device(self, host):
        import torch


        if torch.cuda.is_available():
            return Device("gpu", torch.cuda.get_device_name(0), torch.cuda.device_count(),
                          host.cpu_model, host.usable_cores)
        return cpu_device(host)

    def gemm_runner(self, dtype: str):
        import torch

        tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]

        def make(n):
            gen = torch.Generator().manual_seed(0)
            a = torch.randn(n, n, generator=gen).to(tdtype)
            b = torch.randn(n, n, generator=gen).to(tdtype)
            out = torch.empty(n, n, dtype=tdtype)
            return lambda: torch.matmul(a, b, out=out)

        return make, torch.get_num_threads()

    # The conformance path synchronizes once before reading anything back: on a lazy device (XLA)
    # ``.cpu()`` on each unsynced result would compile and run a graph per tensor.
    def _device_mask(self, mask: dict) -> dict:
        """A conformance call's mask keywords with the segment ids as tensors on the device."""
        return {k: to_tensor(v, self.device()) if isinstance(v, np.ndarray) else v for k, v in mask.items()}

    def run_numpy(self, impl, q, k, v, *, causal, scale, **mask):
        import torch

        dev = self.device()
        with torch.no_grad():
            out = impl.attention(to_tensor(q, dev), to_tensor(k, dev), to_tensor(v, dev),
                                 causal=causal, scale=scale, **self._device_mask(mask))
        self.synchronize()
        return to_float64(out)

    def grad_numpy(self, impl, q, k, v, do, *, causal, scale, **mask):
        dev = self.device()
        _, result = grads(impl, *(to_tensor(x, dev) for x in (q, k, v, do)), causal, scale,
                          **self._device_mask(mask))
        self.synchronize()
        return tuple(to_float64(g) for g in result)

    def _call(self, impl, workload: Workload, block: bool = True):
        """``call(placed)``: one step of ``workload.mode`` on ``_place``'s tensors, blocking until the
        device is done (``block``), or only launched (what device events bracket)."""
        import torch

        def wait():
            if block:
                self.synchronize()

        scale, causal, static = default_scale(workload.head_dim, None), workload.causal, static_mask(workload)
        if workload.mode == "fwd":
            def call(placed):
                tensors, segments = placed
                with torch.no_grad():
                    out = impl.attention(*tensors, causal=causal, scale=scale, **mask_call(static, segments))
                wait()
                return out
        else:
            def call(placed):
                tensors, segments = placed
                result = grads(impl, *tensors, causal, scale, **mask_call(static, segments))
                wait()
                return result
        return call

    def _place(self, workload: Workload, seed: int, template: Workload | None = None):
        """``((q, k, v[, do]), segment ids)`` as tensors on the device; segment ids ``()`` without.
        ``template``: a runner's, whose draws a stream step's inputs are cut from (``stream_inputs``)."""
        x = make_inputs(workload, seed) if template is None else stream_inputs(workload, template, seed)
        arrays = (x.q, x.k, x.v) if workload.mode == "fwd" else (x.q, x.k, x.v, x.do)
        tensors = tuple(to_tensor(a, self.device()) for a in arrays)
        segments = tuple(to_tensor(a, self.device()) for a in x.mask_arrays())
        self.synchronize()  # inputs really on the device (XLA transfers lazily) before any timing
        return tensors, segments

    def make_step(self, impl, workload: Workload, seed: int = 0, *, config: bool = True) -> Step:
        platform = self.require(impl, workload, config=config)
        tensors = self._place(workload, seed)
        call, launch = self._call(impl, workload), self._call(impl, workload, block=False)

        def run():
            return call(tensors)

        def enqueue():
            return launch(tensors)

        find = getattr(impl, "evidence_from_ops", None)
        return Step(run=run, execution=impl.execution(platform), framework=self.framework, enqueue=enqueue,
                    find_evidence=(lambda: find(profiled_ops(run))) if find else None,
                    trains=workload.mode == "fwd_bwd")

    def compile_meter(self, impl):
        """What counts ``impl``'s compiles inside a runner step (eager: none happen)."""
        return DynamoCompileMeter() if getattr(impl, "compiled_by", None) else NoCompiles()

    def make_runner(self, impl, template: Workload, seed: int = 0) -> Runner:
        """The same ``attention`` call at every length; a compiling kernel runs as a fresh instance,
        so each new (shape, grad mode) is a real compile whatever ran before in this process."""
        if getattr(impl, "compiled_by", None):
            impl = type(impl)().with_config(impl.config)
        platform = self.require(impl, template)
        meter = self.compile_meter(impl)
        call = self._call(impl, template)

        def place(workload: Workload):
            self.require(impl, workload, config=False)  # the config was checked at the template
            return self._place(workload, seed, template)

        def metered_call(tensors):
            with meter:
                return call(tensors)

        return Runner(template, impl.execution(platform), place=place, call=metered_call,
                      count_compiles=lambda: meter.compiles, count_compile_seconds=lambda: meter.seconds,
                      count_cache_hits=lambda: meter.cache_hits)

    def device_clock(self, step: Step, timer: str = "wall") -> DeviceClock | None:
        """``"cuda-events"`` (or ``"device"``) on a CUDA device: events around the step's launch alone
        (``Step.enqueue``: no host synchronisation between them), the L2 flush enqueued before the
        start event, outside the timed interval (``triton.testing.do_bench``'s method). Elsewhere
        ``"cuda-events"`` is refused and ``"device"`` falls back to the wall clock."""
        import torch

        events = timer in ("cuda-events", "device") and self.framework == "torch"
        if not events or not torch.cuda.is_available():
            return super().device_clock(step, timer)

        l2_flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")

        launch = step.enqueue or step.run

        def timed_call() -> float:
            l2_flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return DeviceClock("cuda-events", timed_call)

    def measure_memory(self, step: Step) -> dict:
        import torch

        out = {}
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            step.run()
            out["device_peak_bytes"] = torch.cuda.max_memory_allocated()
        else:
            out["host_profiler_peak_bytes"] = torch_profiler_peak_bytes(step.run)
        if step.trains:
            out["saved_for_backward_bytes"] = saved_for_backward_bytes(step.run)
        return {**out, **super().measure_memory(step)}


class NoCompiles:
    """Compile meter of eager code: nothing compiles."""

    compiles = 0
    seconds = 0.0
    cache_hits = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class DynamoCompileMeter:
    """Counts ``torch.compile`` work done while entered: dynamo's ``unique_graphs`` (recompiles
    included) and the wall time of ``_compile.compile_inner`` (tracing through Inductor's build).

    Both are process-wide, so only deltas across a ``with`` block (one runner step) are kept. An
    FX-graph cache hit still counts as a compile, just a fast one.
    """

    def __init__(self):
        self.compiles = 0
        self.cache_hits = 0  # compiles whose Inductor output came from its FX-graph cache
        self._seconds = 0.0
        self._timed = True

    @staticmethod
    def _read() -> tuple[int, float | None, int]:
        from torch._dynamo import utils

        times = getattr(utils, "compilation_time_metrics", {}).get("_compile.compile_inner")
        return (utils.counters["stats"]["unique_graphs"], (sum(times) if times is not None else None),
                utils.counters["inductor"]["fxgraph_cache_hit"])

    def __enter__(self):
        self._start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        graphs, seconds, hits = self._read()
        self.compiles += max(0, graphs - self._start[0])
        self.cache_hits += max(0, hits - self._start[2])
        if graphs > self._start[0]:
            if seconds is None:
                self._timed = False  # torch no longer keeps this metric: say "unknown", not 0
            else:
                self._seconds += max(0.0, seconds - (self._start[1] or 0.0))

    @property
    def seconds(self) -> float | None:
        return self._seconds if self._timed else None


BACKEND = TorchBackend()


def saved_for_backward_bytes(forward) -> int:
    """The bytes autograd keeps for the backward of ``forward()`` (``saved_tensors_hooks``: every
    tensor an op or ``autograd.Function`` saves, each storage counted once, its whole storage; a
    torch_xla tensor, which has no storage here, by its own size)."""
    import torch

    storages: dict[int, int] = {}

    def pack(tensor):
        try:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # an XLA tensor has no host storage: its bytes
            storages[id(tensor)] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(storages.values())
