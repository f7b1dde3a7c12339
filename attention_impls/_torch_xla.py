"""torch_xla side of the shared entry point: the torch code of ``TorchImpl`` on an XLA device.

torch_xla records torch ops into a lazy graph; nothing runs until the graph is cut. Here the cut is
``torch_xla.sync()`` (compile, or fetch from the compile cache, and launch the pending graph) followed
by ``xm.wait_device_ops()`` (block until the device is done), so a timed step is really executed.

Device selection: torch_xla refuses to start without ``PJRT_DEVICE``, but since 2.x its own import
picks a default when the variable is unset (``torch_xla.runtime._maybe_select_default_device``):
TPU when libtpu finds chips, else CPU, logging "Defaulting to PJRT_DEVICE=CPU". We therefore set
nothing ourselves: a default of CPU here would hide a TPU from that detection. A GPU is never picked
by default; run with ``PJRT_DEVICE=CUDA`` for one.
"""

from __future__ import annotations

import re

from attention_impls._torch import TorchImpl, to_tensor
from attention_impls.base import AttentionImpl, Step, default_scale
from attnbench.workload import Workload

# PJRT device type (``torch_xla.runtime.device_type()``) -> our platform names.
PLATFORM_OF = {"CPU": "cpu", "TPU": "tpu", "CUDA": "gpu", "GPU": "gpu"}


def xla_platform() -> str:
    import torch_xla.runtime as xr

    device_type = xr.device_type()
    try:
        return PLATFORM_OF[device_type]
    except KeyError:
        raise RuntimeError(f"torch_xla runs on PJRT device {device_type!r}, which this harness does "
                           f"not map to cpu/gpu/tpu") from None


def custom_calls(tensors) -> list[str]:
    """Targets of the ``custom-call`` ops in the HLO that would compute ``tensors`` (not executed)."""
    import torch_xla

    hlo = torch_xla._XLAC._get_xla_tensors_hlo(list(tensors))
    return sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))


class TorchXlaImpl(TorchImpl):
    framework = "torch_xla"
    module = "torch_xla"

    def device(self):
        import torch_xla

        return torch_xla.device()

    def platform(self) -> str:
        return xla_platform()

    def synchronize(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm

        torch_xla.sync()
        xm.wait_device_ops()

    def compile_meter(self):
        """A runner step compiles a new graph per new shape; ``XlaCompileMeter`` counts them."""
        return XlaCompileMeter()

    def execution(self, platform: str) -> str:
        return AttentionImpl.execution(self, platform)  # "compiled" by XLA, or "interpret"

    def make_step(self, workload: Workload, seed: int = 0) -> Step:
        """``TorchImpl``'s step (run() ends in sync + wait), plus the HLO's custom calls as evidence."""
        import torch

        from attnbench.inputs import make_inputs

        step = super().make_step(workload, seed)
        x = make_inputs(workload, seed)
        dev = self.device()
        inputs = [to_tensor(a, dev) for a in (x.q, x.k, x.v)]
        self.synchronize()  # inputs on the device: the traced (never executed) graph reads device data
        with torch.no_grad():
            out = self.attention(*inputs, causal=workload.causal,
                                 scale=default_scale(workload.head_dim, None))
        targets = custom_calls([out])
        del out  # traced only: the graph is dropped unexecuted
        step.kernel_evidence = (f"forward HLO custom-calls: {', '.join(targets)}" if targets
                                else "forward HLO has no custom-call: XLA's own ops")
        return step


class XlaCompileMeter:
    """Counts XLA graph compiles while entered, from ``torch_xla.debug.metrics``' ``CompileTime``
    (count and total ns; its count moves with the ``UncachedCompile`` counter).

    The metrics are process-wide, so only deltas across a ``with`` block (one runner step) are
    kept; a ``metrics.clear_all()`` inside a step counts nothing for it. torch_xla's compile cache
    is process-wide too, keyed by graph hash: a shape some earlier code in this process already
    compiled (another runner, ``make_step``) is a cache hit, and this meter rightly counts 0 for it.
    """

    def __init__(self):
        self.compiles = 0
        self._ns = 0.0

    @staticmethod
    def _read() -> tuple[int, float]:
        import torch_xla.debug.metrics as met

        data = met.metric_data("CompileTime")  # None until the first compile of the process
        return (0, 0.0) if data is None else (int(data[0]), float(data[1]))

    def __enter__(self):
        self._start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        count, ns = self._read()
        if count >= self._start[0]:
            self.compiles += count - self._start[0]
            self._ns += ns - self._start[1]

    @property
    def seconds(self) -> float:
        return self._ns / 1e9
