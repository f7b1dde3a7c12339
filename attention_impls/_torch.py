"""torch side of the shared entry point: numpy <-> tensors, autograd, device sync.

``TorchImpl`` runs on CUDA when torch sees a GPU and on the CPU otherwise; ``torch_xla`` subclasses
swap the device and the synchronisation (``_torch_xla.py``).
"""

from __future__ import annotations

import abc

import numpy as np

from attention_impls.base import AttentionImpl, Step, default_scale, workload_of
from attnbench.workload import Workload


def to_tensor(x: np.ndarray, device):
    import torch

    if x.dtype.name == "bfloat16":  # torch cannot wrap ml_dtypes' bfloat16; the float32 detour is exact
        return torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device)


def to_float64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


class TorchImpl(AttentionImpl):
    framework = "torch"
    module = "torch"

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

    def run_numpy(self, q, k, v, *, causal, scale=None):
        self.require(workload_of(q, k, v, causal=causal))
        import torch

        dev = self.device()
        with torch.no_grad():
            out = self.attention(to_tensor(q, dev), to_tensor(k, dev), to_tensor(v, dev),
                                 causal=causal, scale=default_scale(q.shape[3], scale))
        return to_float64(out)

    def grad_numpy(self, q, k, v, do, *, causal, scale=None):
        self.require(workload_of(q, k, v, causal=causal, mode="fwd_bwd"))
        dev = self.device()
        _, grads = self._grads(*(to_tensor(x, dev) for x in (q, k, v, do)), causal,
                               default_scale(q.shape[3], scale))
        return tuple(to_float64(g) for g in grads)

    def make_step(self, workload: Workload, seed: int = 0) -> Step:
        import torch

        from attnbench.inputs import make_inputs

        platform = self.require(workload)
        dev = self.device()
        x = make_inputs(workload, seed)
        q, k, v, do = (to_tensor(a, dev) for a in (x.q, x.k, x.v, x.do))
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

        return Step(run=run, execution=self.execution(platform))
