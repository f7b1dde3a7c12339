"""Benchmark of the engine itself: is it fast, and does it agree with independent bare loops?

Targets (issue "measurement engine"), checked here and reported, never in a timed unit test:
  * one static case of a fast CPU kernel (jax-xla, B1 H8 S1024 D64 fp32) reaches a median whose
    IQR is within 5% in at most 3 s beyond compile;
  * the engine's median agrees within 5% with a bare ``block_until_ready`` loop (jax) and with
    ``torch.utils.benchmark.Timer.blocked_autorange`` (torch).

    python -m attnbench selfcheck
"""

from __future__ import annotations

import os
import statistics
import time

import attention_impls
from attention_impls.jax_xla import JaxXla
from attnbench.backends import here
from attnbench.core.inputs import make_inputs
from attnbench.core.workload import Workload
from attnbench.measure.process_env import pin_threads
from attnbench.measure.timing import time_step

# Imported where used: jax, torch (each venv holds only some frameworks, and the asv process none).

WORKLOAD = Workload(batch=1, q_heads=8, seq_q=1024, head_dim=64, dtype="float32", causal=False)


def engine_timing(name: str, min_seconds: float):
    step = here.make_step(attention_impls.get(name), WORKLOAD)
    step.run()  # compile outside the budget being checked
    start = time.perf_counter()
    timing = time_step(step.run, min_seconds=min_seconds, warmup=1, target_rel_iqr=0.05, max_seconds=2.5)
    return timing, time.perf_counter() - start


def bare_jax_median(reps: int = 15, number: int = 5) -> float:
    """The plainest loop: the same jitted call, blocked, best practice from jax's docs."""
    import jax


    x = make_inputs(WORKLOAD, 0)
    fn = jax.jit(lambda q, k, v: JaxXla().attention(q, k, v, causal=False, scale=0.125))
    args = [jax.device_put(a) for a in (x.q, x.k, x.v)]
    fn(*args).block_until_ready()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(number):
            fn(*args).block_until_ready()
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def torch_timer_median() -> float:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.benchmark import Timer


    x = make_inputs(WORKLOAD, 0)
    q, k, v = (torch.from_numpy(a).transpose(1, 2) for a in (x.q, x.k, x.v))

    def call():
        with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v)

    # Timer defaults to one thread; the engine runs with the pinned count, so match it.
    timer = Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=1.0).median


def main() -> int:

    pin_threads(len(os.sched_getaffinity(0)))
    results = []
    timing, wall = engine_timing("jax-xla", min_seconds=0.5)
    results.append(("jax-xla: engine seconds beyond compile", wall, 3.0, wall <= 3.0))
    results.append(("jax-xla: engine IQR / median", timing.relative_iqr, 0.05, timing.relative_iqr <= 0.05))
    bare = bare_jax_median()
    diff = abs(timing.median_s - bare) / bare
    results.append(("jax-xla: |engine - bare loop| / bare", diff, 0.05, diff <= 0.05))
    torch_timing, _ = engine_timing("torch-sdpa-flash", min_seconds=0.5)
    reference = torch_timer_median()
    diff = abs(torch_timing.median_s - reference) / reference
    results.append(("torch-sdpa-flash: |engine - Timer.blocked_autorange| / Timer", diff, 0.05, diff <= 0.05))
    print(f"# engine self-check, {WORKLOAD.describe()}")
    print(f"jax-xla engine median {timing.median_s * 1e3:.3f} ms (IQR {timing.iqr_s * 1e3:.3f} ms, "
          f"{timing.samples} samples x {timing.steps_per_sample}), bare loop {bare * 1e3:.3f} ms")
    print(f"torch-sdpa-flash engine median {torch_timing.median_s * 1e3:.3f} ms, "
          f"Timer {reference * 1e3:.3f} ms")
    for label, value, target, ok in results:
        print(f"{'PASS' if ok else 'MISS'}  {label}: {value:.4g} (target <= {target:g})")
    return 0 if all(ok for *_, ok in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
