"""torch_xla: the torch backend on an XLA device.

torch_xla records ops into a lazy graph; ``torch_xla.sync()`` then ``xm.wait_device_ops()`` cut,
launch and wait for it, so a timed step is really executed.

``PJRT_DEVICE`` is left unset: torch_xla's import then picks TPU when libtpu finds chips, else CPU
(``torch_xla.runtime._maybe_select_default_device``), and a default of ours would hide a TPU. A GPU
needs ``PJRT_DEVICE=CUDA``.
"""

from __future__ import annotations

import re
import tempfile

from attention_impls.base import default_scale, mask_call, static_mask
from attnbench.backends.base import Backend, Step
from attnbench.backends.profiles import OpTime, ProfileUnreadable, read_xplane, xla_events, xla_op_times
from attnbench.backends.torch_backend import TorchBackend, saved_for_backward_bytes, to_tensor
from attnbench.core.inputs import make_inputs
from attnbench.core.workload import Workload
from attnbench.hardware import Device, cpu_device

# Imported where used: torch, torch_xla (each venv holds only some frameworks, and the asv process none).

# PJRT device type (``torch_xla.runtime.device_type()``) -> our platform names.
PLATFORM_OF = {"CPU": "cpu", "TPU": "tpu", "CUDA": "gpu", "GPU": "gpu"}


def custom_calls(tensors) -> list[str]:
    """Targets of the ``custom-call`` ops in the HLO that would compute ``tensors`` (not executed)."""
    import torch_xla

    hlo = torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))
    return sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))


class TorchXlaBackend(TorchBackend):
    framework = "torch_xla"
    module = "torch_xla"
    profiler = "torch_xla.debug.profiler (XLA op events)"
    profile_kind = "xla"

    def profile_ops(self, impl, workload: Workload, step) -> tuple[list[OpTime], str]:
        return profile_torch_xla(impl, workload, step)

    def device(self):
        import torch_xla

        return torch_xla.device()

    def platform(self) -> str:
        import torch_xla.runtime as xr

        device_type = xr.device_type()
        try:
            return PLATFORM_OF[device_type]
        except KeyError:
            raise RuntimeError(f"torch_xla runs on PJRT device {device_type!r}, which this harness "
                               f"does not map to cpu/gpu/tpu") from None

    def synchronize(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()


    def compile_meter(self, impl):
        """A runner step compiles a new graph per new shape; ``XlaCompileMeter`` counts them."""
        return XlaCompileMeter()

    def detect_device(self, host):
        import torch_xla
        import torch_xla.core.xla_model as xm


        dev = torch_xla.device()
        platform = PLATFORM_OF.get(str(xm.xla_device_hw(dev)).upper(), str(xm.xla_device_hw(dev)).lower())
        if platform == "cpu":
            return cpu_device(host)
        kind = None
        try:
            kind = xm.xla_device_kind(dev)
        except Exception:  # older runtimes: fall back to the hardware type
            kind = None
        try:
            import torch_xla.runtime as xr

            count = int(xr.global_runtime_device_count())
        except Exception:
            count = len(xm.get_xla_supported_devices() or [dev])
        return Device(platform, str(kind or platform.upper()), max(1, count), host.cpu_model,
                      host.usable_cores)

    def gemm_runner(self, dtype: str):
        return TorchBackend.gemm_runner(self, dtype)  # the venv's eager CPU matmul

    def make_step(self, impl, workload: Workload, seed: int = 0, *, config: bool = True) -> Step:
        """The torch step (run() ends in sync + wait), plus the forward HLO's custom calls as evidence."""
        import torch


        step = super().make_step(impl, workload, seed, config=config)
        x = make_inputs(workload, seed)
        inputs = [to_tensor(a, self.device()) for a in (x.q, x.k, x.v)]
        segments = tuple(to_tensor(a, self.device()) for a in x.mask_arrays())
        self.synchronize()  # inputs on the device: the traced (never executed) graph reads device data
        with torch.no_grad():
            out = impl.attention(*inputs, causal=workload.causal,
                                 scale=default_scale(workload.head_dim, None),
                                 **mask_call(static_mask(workload), segments))
        targets = custom_calls([out])
        del out  # traced only: the graph is dropped unexecuted
        step.kernel_evidence = (f"forward HLO custom-calls: {', '.join(targets)}" if targets
                                else "forward HLO has no custom-call: XLA's own ops")
        step.find_evidence = None
        return step

    def measure_memory(self, step: Step) -> dict:
        out = {}
        try:
            import torch_xla.core.xla_model as xm

            info = xm.get_memory_info(self.device())
            out["device_peak_bytes"] = info.get("peak_bytes_used") or info.get("bytes_used")
        except Exception:  # the CPU PJRT client reports no memory info
            out["device_peak_bytes"] = None
        if step.trains:
            out["saved_for_backward_bytes"] = saved_for_backward_bytes(step.run)
        return {**out, **Backend.measure_memory(self, step)}


class XlaCompileMeter:
    """Counts XLA graph compiles while entered, from ``torch_xla.debug.metrics``' ``CompileTime``.

    The metrics are process-wide, so only deltas across a ``with`` block (one runner step) are
    kept. The compile cache is process-wide too: a shape compiled earlier in this process is a
    cache hit, rightly counted 0.
    """

    def __init__(self):
        self.compiles = 0
        self.cache_hits = 0  # graphs served by the process's compile cache (``CachedCompile``)
        self._ns = 0.0

    @staticmethod
    def _read() -> tuple[int, float, int]:
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")  # None until the first compile of the process
        count, ns = (0, 0.0) if data is None else (int(data[0]), float(data[1]))
        return count, ns, int(met.counter_value("CachedCompile") or 0)

    def __enter__(self):
        self._start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        count, ns, cached = self._read()
        if count >= self._start[0]:
            self.compiles += count - self._start[0]
            self._ns += ns - self._start[1]
        self.cache_hits += max(0, cached - self._start[2])

    @property
    def seconds(self) -> float:
        return self._ns / 1e9


BACKEND = TorchXlaBackend()


def profile_torch_xla(impl, workload: Workload, step) -> tuple[list[OpTime], str]:
    """The step's XLA op events under torch_xla's profiler (its HLO's scopes are not read)."""
    import torch_xla.debug.profiler as xp

    with tempfile.TemporaryDirectory() as log_dir:
        xp.start_trace(log_dir)
        try:
            step.run()
        finally:
            xp.stop_trace()
        try:
            data = read_xplane(log_dir)
        except ImportError as exc:  # the xplane reader is jax's
            raise ProfileUnreadable(f"torch_xla's profiler wrote an xplane, but nothing here reads it "
                                    f"(jax.profiler.ProfileData: {exc})") from None
        lines = xla_events(data)
    return xla_op_times(lines), step.evidence()
