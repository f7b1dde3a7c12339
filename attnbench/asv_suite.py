"""What the asv suite measures and how it reads it: profiles, cases, metrics, provenance.

The classes in ``benchmarks/`` stay thin: each ``setup_cache`` calls ``measure_cases`` once per
environment and commit (every case in its own worker process, through ``attnbench.engine``), and
every ``track_*`` benchmark reads one column of that one measurement. Nothing here imports a
framework at import time: asv imports the suite in every benchmark process.

Profiles (``ATTNBENCH_PROFILE``): ``default`` fits this project's 2-core CPU machine in 10 minutes;
``full`` adds lengths up to 8192 and bfloat16. ``ATTNBENCH_IMPLS`` (comma-separated names) and
asv's own ``-b REGEX`` narrow a run.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass

from attnbench import records
from attnbench.workload import Workload

PROFILES = {
    # max_interpret_seq: Pallas kernels that only run here through an interpreter (100x slower than
    # native) are skipped above it, with that reason; it keeps the default profile within 10 minutes.
    # regime_seqs: lengths at which the dynamic and bucketed regimes run (None: every length); each
    # such case compiles once per length or bucket, cold. max_extra_seconds: how long timing may go
    # on past min_seconds while the IQR exceeds 5% (the record keeps the IQR it reached).
    "default": {"forward_seqs": (256, 1024), "training_seqs": (512,), "dtypes": ("float32",),
                "regime_steps": 6, "min_seconds": 0.2, "max_extra_seconds": 1.0,
                "max_interpret_seq": 512, "regime_seqs": (1024,)},
    "smoke": {"forward_seqs": (128, 256), "training_seqs": (128,), "dtypes": ("float32",),
              "regime_steps": 3, "min_seconds": 0.05, "max_extra_seconds": 0.5,
              "max_interpret_seq": 256, "regime_seqs": None},  # the tests' quick run
    "full": {"forward_seqs": (256, 512, 1024, 2048, 4096, 8192), "training_seqs": (512, 1024, 2048),
             "dtypes": ("float32", "bfloat16"), "regime_steps": 12, "min_seconds": 0.5,
             "max_extra_seconds": 3.0, "max_interpret_seq": None, "regime_seqs": None},
}
FORWARD = Workload(batch=1, q_heads=8, head_dim=64, seq_q=1024, causal=True, mode="fwd")
TRAINING = FORWARD.replace(mode="fwd_bwd")
CASE_TIMEOUT_S = 600.0


def profile_name() -> str:
    return os.environ.get("ATTNBENCH_PROFILE", "default")


def compile_cache() -> str:
    """``cold`` or ``warm`` (``ATTNBENCH_COMPILE_CACHE``): see ``attnbench/compiler_caches.py``."""
    return os.environ.get("ATTNBENCH_COMPILE_CACHE", "cold")


def profile() -> dict:
    name = profile_name()
    if name not in PROFILES:
        raise ValueError(f"ATTNBENCH_PROFILE must be one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]


def impl_names() -> list[str]:
    """Every registered name (params must not differ between asv environments), or a chosen subset."""
    import attention_impls

    chosen = os.environ.get("ATTNBENCH_IMPLS")
    names = attention_impls.names()
    if chosen:
        wanted = [n.strip() for n in chosen.split(",") if n.strip()]
        for name in wanted:
            attention_impls.get(name)  # unknown names fail loudly
        names = [n for n in names if n in wanted]
    return names


def this_env_frameworks() -> tuple[str, ...]:
    """The torch_xla environment measures torch_xla only; the main one everything else."""
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        return ("torch_xla",)
    return ("numpy", "jax", "torch")


def measure_cases(cases: list[tuple[str, Workload, str]]) -> dict:
    """Measure each (impl, workload, regime) once; returns {case key: record}.

    Cases of another environment's frameworks and cases the implementation refuses are recorded
    without starting a worker.
    """
    import attention_impls
    from attnbench.engine import Options
    from attnbench.isolation import pin_threads
    from attnbench.sweep import run_sweep

    threads = len(os.sched_getaffinity(0))
    pin_threads(threads)
    settings = profile()
    out, to_run = {}, []
    for name, workload, regime in cases:
        impl = attention_impls.get(name)
        key = case_key(name, workload, regime)
        if impl.framework not in this_env_frameworks():
            out[key] = {"status": records.UNSUPPORTED,
                        "reason": f"{impl.framework} is measured in the other asv environment"}
            continue
        reason = impl.check(workload) or outside_profile(impl, workload, regime, settings)
        if reason:
            out[key] = {"status": records.UNSUPPORTED, "reason": reason}
            continue
        to_run.append((name, workload, regime))

    traces = trace_dir()

    def options_for(regime):
        return Options(regime=regime, regime_steps=settings["regime_steps"],
                       min_seconds=settings["min_seconds"],
                       max_extra_seconds=settings["max_extra_seconds"], trace_dir=traces,
                       compile_cache=compile_cache())

    rows = run_sweep(to_run, options_for, timeout_s=CASE_TIMEOUT_S, threads=threads, progress=False)
    for (name, workload, regime), row in zip(to_run, rows, strict=True):
        out[case_key(name, workload, regime)] = row
    write_versions_sidecar()
    return out


def outside_profile(impl, workload: Workload, regime: str, settings: dict) -> str | None:
    """Why the profile leaves out a case the implementation could run (n/a with this reason)."""
    limit, regime_seqs = settings["max_interpret_seq"], settings["regime_seqs"]
    if limit and workload.seq_q > limit and impl.execution(impl.platform()) == "interpret":
        return (f"runs only in an interpreter here; the {profile_name()} profile stops interpreted "
                f"kernels at {limit} tokens (ATTNBENCH_PROFILE=full runs it)")
    if regime != "static" and regime_seqs and workload.seq_q not in regime_seqs:
        return (f"the {profile_name()} profile runs the {regime} regime at "
                f"{', '.join(map(str, regime_seqs))} tokens only (ATTNBENCH_PROFILE=full runs every length)")
    return None


def case_key(name: str, workload: Workload, regime: str) -> str:
    return f"{name}|{workload.describe()}|{regime}"


# -- metrics --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    name: str  # the track_<name> benchmark
    unit: str
    column: str | None  # record column read directly; None: derived by ``value``
    direction: str = "lower"  # what is better; asv itself only knows lower-is-better

    def value(self, record: dict) -> float:
        if self.name == "status":
            return float(STATUS_CODES[record["status"]])
        if self.name == "mfu_shortfall":
            return _num(1.0 - record["mfu"]) if record.get("mfu") is not None else math.nan
        if self.name == "seconds_per_pflop":
            return 1e-3 / record["tflops"] if record.get("tflops") else math.nan
        if self.name == "seconds_per_million_useful_tokens":
            rate = record.get("useful_tokens_per_s")
            return 1e6 / rate if rate else math.nan
        return _num(record.get(self.column))


# 0 = ok; the rest in rising order of trouble. Unsupported never reaches a metric (asv shows n/a).
STATUS_CODES = {records.OK: 0, records.NUMERICS_FAILED: 1, records.OOM: 2, records.TIMEOUT: 3,
                records.ERROR: 4}

METRICS = [
    Metric("seconds_per_step", "seconds", "seconds_per_step"),
    Metric("tokens_per_s", "tokens/s", "tokens_per_s", "higher"),
    Metric("seconds_per_million_tokens", "seconds", "seconds_per_million_tokens"),
    Metric("tflops", "TFLOP/s", "tflops", "higher"),
    Metric("seconds_per_pflop", "seconds", None),
    Metric("mfu", "fraction", "mfu", "higher"),
    Metric("mfu_shortfall", "fraction", None),
    Metric("first_call_seconds", "seconds", "first_call_s"),
    Metric("compile_seconds", "seconds", "compile_seconds_total"),
    Metric("compiles", "count", "compiles"),
    Metric("padding_waste", "fraction", "padding_waste"),
    Metric("useful_tokens_per_s", "tokens/s", "useful_tokens_per_s", "higher"),
    Metric("seconds_per_million_useful_tokens", "seconds", None),
    Metric("device_peak_bytes", "bytes", "device_peak_bytes"),
    Metric("compiler_temp_bytes", "bytes", "compiler_temp_bytes"),
    Metric("compiler_peak_bytes", "bytes", "compiler_peak_bytes"),
    Metric("host_profiler_peak_bytes", "bytes", "host_profiler_peak_bytes"),
    Metric("host_rss_growth_bytes", "bytes", "host_rss_growth_bytes"),
    Metric("usd_per_step", "USD", "usd_per_step_on_demand"),
    Metric("usd_per_step_with_compiles", "USD", "usd_per_step_with_compiles_on_demand"),
    Metric("usd_per_million_tokens", "USD", "usd_per_million_tokens_on_demand"),
    Metric("max_abs_error", "abs error", "max_abs_err"),
    Metric("status", "code", None),
]
METRIC_VERSION = "1"  # bump only when a metric's meaning changes (asv drops older history then)


def _num(value) -> float:
    return math.nan if value is None else float(value)


def record_for(cache: dict, key: str) -> dict:
    """The case's record, or ``NotImplementedError`` (asv: n/a) when it could not run here."""
    record = cache.get(key)
    if record is None:
        raise NotImplementedError(f"{key} is not in this profile's measurements")
    if record["status"] == records.UNSUPPORTED:
        raise NotImplementedError(record["reason"])
    return record


# -- provenance -----------------------------------------------------------------------------------
def machine_name() -> str:
    """The name results are filed under: states the accelerator (cpu-2core, h200, tpu-v5e-1)."""
    override = os.environ.get("ATTNBENCH_MACHINE")
    if override:
        return override
    from attnbench import hardware

    for framework in ("jax", "torch", "torch_xla"):
        try:
            device = hardware.detect_accelerator(framework)
        except Exception:  # framework missing in this env
            continue
        if device.platform != "cpu":
            slug = "".join(c if c.isalnum() else "-" for c in device.name.lower()).strip("-")
            slug = slug.replace("nvidia-", "")
            return f"{slug}-{device.count}" if device.platform == "tpu" else slug
    return f"cpu-{hardware.detect_host().usable_cores}core"


def asv_context() -> dict | None:
    """Where this asv run files its results: results dir, machine, commit and environment name.

    asv sets ``ASV_ENV_NAME`` and ``ASV_COMMIT`` for virtualenv runs; in existing-environment mode
    (``--python=same``) it sets neither, so the name is rebuilt the way asv builds it
    (``existing-py<executable>``) and the commit is the checkout's HEAD (the run's
    ``--set-commit-hash``). asv runs benchmarks in a scratch cwd, so the results dir is
    ``ATTNBENCH_RESULTS_DIR``, else ``$ASV_CONF_DIR/results``, else the checkout's ``results/``.
    ``None`` outside asv.
    """
    from attnbench.sweep import git_commit

    env = os.environ.get("ASV_ENV_NAME")
    # asv starts every benchmark process as `python .../asv/benchmark.py ...` (forkserver children
    # inherit its argv); a process that merely imported asv (pytest, a notebook) is not a run.
    in_asv = bool(sys.argv) and os.path.abspath(sys.argv[0]).endswith(os.path.join("asv", "benchmark.py"))
    if env is None and in_asv:
        from asv.environment import get_env_name

        env = get_env_name("existing", sys.executable, {}, {})
    commit = os.environ.get("ASV_COMMIT") or (git_commit() if env else None)  # editable checkout
    if not commit or not env:
        return None
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = (os.environ.get("ATTNBENCH_RESULTS_DIR")
            or os.path.join(os.environ.get("ASV_CONF_DIR", checkout), "results"))
    return {"results_dir": root, "machine": machine_name(), "commit": commit, "env": env}


def trace_dir() -> str | None:
    """``results/<machine>/traces/<commit8>-<env>/``: the engine's per-step regime traces."""
    ctx = asv_context()
    if ctx is None:
        return None
    return os.path.join(ctx["results_dir"], ctx["machine"], "traces", f"{ctx['commit'][:8]}-{ctx['env']}")


def write_versions_sidecar() -> str | None:
    """Library versions of this asv environment, and the measurement settings, beside its results
    (asv's existing mode records no versions).

    Written to ``results/<machine>/versions/<commit8>-<env>.json``; ``None`` outside asv.
    """
    from attnbench.atomic import atomic_write_text
    from attnbench.sweep import library_versions

    ctx = asv_context()
    if ctx is None:
        return None
    name = f"{ctx['commit'][:8]}-{ctx['env']}.json"
    path = os.path.join(ctx["results_dir"], ctx["machine"], "versions", name)
    payload = {"commit_hash": ctx["commit"], "env_name": ctx["env"], "machine": ctx["machine"],
               "versions": {k.removeprefix("version_"): v for k, v in library_versions().items() if v},
               # measurement settings that change what a number means, attributed like versions
               "settings": {"compile_cache": compile_cache()}}
    atomic_write_text(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path
