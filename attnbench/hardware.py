"""What a run ran on, what that hardware can do, and where those numbers come from.

* :func:`detect_host` / :func:`detect_accelerator` say what the run used (framework imports are lazy).
* :func:`load_profiles` reads ``profiles.toml`` (packaged, or the user's own file of the same
  schema): spec-sheet peaks, memory and prices, every number with its source and date.
  :func:`match_profile` picks the profile for a detected device, :func:`get_profile` one by name.
* :func:`cpu_peak_tflops` measures a CPU's peak with a GEMM probe; :func:`peak_tflops` gives the
  peak an MFU is taken against: the profile's spec figure on an accelerator, the probe on a CPU.

A CPU peak here is an *achieved-GEMM* peak, not a spec-sheet peak: the TFLOP/s one large square
matmul reaches on this machine, in this dtype, through this framework's own matmul (MKL/oneDNN for
torch, XLA:CPU for jax, the BLAS for numpy), with the threads the framework uses. An MFU against it
therefore means "fraction of this machine's own matmul speed", which answers "how far is attention
from the best this CPU does" and is not comparable with an accelerator's spec-sheet MFU.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform as _platform
import re
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from attnbench.timing import time_step

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

FRAMEWORKS = ("numpy", "jax", "torch", "torch_xla")
KINDS = ("cpu", "gpu", "tpu")
PRICE_UNITS = {"cpu": "vcpu-hour", "gpu": "chip-hour", "tpu": "chip-hour"}
PEAK_DTYPES = ("bf16", "fp16", "fp32")
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "single": "fp32",
}
_LONG_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def canonical_dtype(dtype) -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp32"`` for a dtype name or a torch/jax/numpy dtype object."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or getattr(
        dtype, "__name__", None) or str(dtype)
    key = str(name).lower().removeprefix("torch.").removeprefix("jnp.").removeprefix("np.")
    try:
        return _DTYPE_ALIASES[key]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_ALIASES)}") from None


# ------------------------------------------------------------------------------------------ detection
@dataclass(frozen=True)
class Host:
    cpu_model: str
    logical_cores: int  # os.cpu_count(): every logical CPU of the machine
    usable_cores: int  # os.sched_getaffinity(0): the ones this process may run on
    memory_bytes: int | None


@dataclass(frozen=True)
class Device:
    """The device a run's steps execute on.

    ``platform`` is ``"cpu"``, ``"gpu"`` or ``"tpu"``; ``name`` is what the framework calls it
    (``torch.cuda.get_device_name``, jax ``device_kind``, torch_xla device kind) or, on a CPU, the
    host CPU model; ``count`` is how many such devices the framework sees (1 for a CPU host);
    ``host_cores`` is the host's usable logical cores.
    """

    platform: str
    name: str
    count: int
    host_cpu: str
    host_cores: int


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "unknown CPU"


def _memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def detect_host() -> Host:
    """CPU model (``/proc/cpuinfo`` "model name", else ``platform.processor()``), cores, memory."""
    logical = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        usable = logical
    return Host(cpu_model=_cpu_model(), logical_cores=logical, usable_cores=max(1, usable),
                memory_bytes=_memory_bytes())


def _normalise_platform(name: str) -> str:
    name = str(name).lower()
    if name in ("cuda", "rocm", "gpu"):
        return "gpu"
    return name


def _cpu_device(host: Host) -> Device:
    return Device("cpu", host.cpu_model, 1, host.cpu_model, host.usable_cores)


def detect_accelerator(framework: str) -> Device:
    """The device ``framework``'s default placement runs on; the host CPU when it has no accelerator.

    * jax: ``jax.devices()[0]``: its ``platform`` and ``device_kind`` ("TPU v5 lite", "NVIDIA H200").
    * torch: ``torch.cuda.get_device_name(0)`` when CUDA (or ROCm) is available, else the CPU.
    * torch_xla: ``xla_device_hw`` ("TPU"/"CUDA"/"CPU") of the default XLA device and its device kind.
    * numpy: always the CPU.
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; expected one of {list(FRAMEWORKS)}")
    host = detect_host()
    if framework == "numpy":
        return _cpu_device(host)
    if framework == "jax":
        import jax

        first = jax.devices()[0]
        plat = _normalise_platform(first.platform)
        if plat == "cpu":
            return _cpu_device(host)
        count = sum(1 for d in jax.local_devices() if d.platform == first.platform)
        return Device(plat, str(first.device_kind), count, host.cpu_model, host.usable_cores)
    if framework == "torch":
        import torch

        if torch.cuda.is_available():
            return Device("gpu", torch.cuda.get_device_name(0), torch.cuda.device_count(),
                          host.cpu_model, host.usable_cores)
        return _cpu_device(host)
    return _detect_torch_xla(host)


def _detect_torch_xla(host: Host) -> Device:
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    plat = _normalise_platform(xm.xla_device_hw(dev))
    if plat == "cpu":
        return _cpu_device(host)
    kind = None
    if hasattr(xm, "xla_device_kind"):
        try:
            kind = xm.xla_device_kind(dev)
        except Exception:  # older runtimes: fall back to the hardware type
            kind = None
    try:
        import torch_xla.runtime as xr

        count = int(xr.global_runtime_device_count())
    except Exception:
        count = len(xm.get_xla_supported_devices() or [dev])
    return Device(plat, str(kind or plat.upper()), max(1, count), host.cpu_model, host.usable_cores)


# ------------------------------------------------------------------------------------------- profiles
@dataclass(frozen=True)
class Sourced:
    """A number, where it comes from, and when it was read."""

    value: float
    source: str
    date: datetime.date


@dataclass(frozen=True)
class Profile:
    name: str
    kind: str  # cpu | gpu | tpu
    label: str
    match: tuple[str, ...]
    price_unit: str  # chip-hour | vcpu-hour
    peak_tflops: Mapping[str, Sourced] = field(default_factory=dict)  # bf16 / fp16 / fp32
    hbm_gb: Sourced | None = None
    hbm_tb_s: Sourced | None = None
    price_on_demand: Sourced | None = None  # USD per price_unit
    price_spot: Sourced | None = None
    notes: str = ""

    def peak(self, dtype) -> Sourced | None:
        return self.peak_tflops.get(canonical_dtype(dtype))

    def numbers(self) -> dict[str, Sourced]:
        """Every sourced number of the profile, by field name."""
        out = {f"peak_tflops.{k}": v for k, v in self.peak_tflops.items()}
        for key, value in (("hbm_gb", self.hbm_gb), ("hbm_tb_s", self.hbm_tb_s),
                           ("price.on_demand", self.price_on_demand), ("price.spot", self.price_spot)):
            if value is not None:
                out[key] = value
        return out

    def match_length(self, name: str) -> int | None:
        """Length of the longest text a match pattern finds in ``name``; None when none matches."""
        best = None
        for pattern in self.match:
            found = re.search(pattern, name, re.IGNORECASE)
            if found and (best is None or len(found.group(0)) > best):
                best = len(found.group(0))
        return best


_PROFILE_KEYS = {"label", "kind", "match", "price_unit", "peak_tflops", "hbm_gb", "hbm_tb_s", "price",
                 "notes"}
_NUMBER_KEYS = {"value", "source", "date"}


def _fail(where: str, name: str, fld: str, problem: str) -> ValueError:
    return ValueError(f"{where}: profile {name!r}: field {fld!r}: {problem}")


def _sourced(raw, where: str, name: str, fld: str) -> Sourced:
    if not isinstance(raw, dict):
        raise _fail(where, name, fld, f"must be a table {{value, source, date}}, got {raw!r}")
    unknown = set(raw) - _NUMBER_KEYS
    if unknown:
        raise _fail(where, name, fld, f"unknown keys {sorted(unknown)}; expected value, source, date")
    value = raw.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise _fail(where, name, f"{fld}.value", f"must be a positive finite number, got {value!r}")
    source = raw.get("source")
    if not isinstance(source, str) or not source.strip():
        raise _fail(where, name, f"{fld}.source", "is missing or empty: every number needs its source")
    date = raw.get("date")
    if isinstance(date, str):
        try:
            date = datetime.date.fromisoformat(date)
        except ValueError:
            raise _fail(where, name, f"{fld}.date", f"must be a date (YYYY-MM-DD), got {date!r}") from None
    if isinstance(date, datetime.datetime):
        date = date.date()
    if not isinstance(date, datetime.date):
        raise _fail(where, name, f"{fld}.date", f"is missing or not a date (YYYY-MM-DD): {date!r}")
    return Sourced(float(value), source.strip(), date)


def _profile(name: str, raw, where: str) -> Profile:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: profile {name!r}: must be a table, got {type(raw).__name__}")
    unknown = set(raw) - _PROFILE_KEYS
    if unknown:
        raise _fail(where, name, sorted(unknown)[0],
                    f"unknown field (known: {', '.join(sorted(_PROFILE_KEYS))})")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise _fail(where, name, "kind", f"must be one of {list(KINDS)}, got {kind!r}")
    match = raw.get("match")
    if not isinstance(match, list) or not all(isinstance(p, str) for p in match):
        raise _fail(where, name, "match", f"must be a list of regex strings, got {match!r}")
    for pattern in match:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _fail(where, name, "match", f"bad regex {pattern!r}: {exc}") from None
    unit = raw.get("price_unit", PRICE_UNITS[kind])
    if unit != PRICE_UNITS[kind]:
        raise _fail(where, name, "price_unit",
                    f"must be {PRICE_UNITS[kind]!r} for kind {kind!r}, got {unit!r}")
    peaks_raw = raw.get("peak_tflops", {})
    if not isinstance(peaks_raw, dict):
        raise _fail(where, name, "peak_tflops", f"must be a table of dtypes, got {peaks_raw!r}")
    if kind == "cpu" and peaks_raw:
        raise _fail(where, name, "peak_tflops",
                    "a cpu profile has no peak: a CPU's peak comes from the GEMM probe")
    peaks = {}
    for dtype, entry in peaks_raw.items():
        if dtype not in PEAK_DTYPES:
            raise _fail(where, name, f"peak_tflops.{dtype}", f"unknown dtype; expected {list(PEAK_DTYPES)}")
        peaks[dtype] = _sourced(entry, where, name, f"peak_tflops.{dtype}")
    price = raw.get("price", {})
    if not isinstance(price, dict) or set(price) - {"on_demand", "spot"}:
        raise _fail(where, name, "price", f"must be a table with on_demand and/or spot, got {price!r}")
    if "spot" in price and "on_demand" not in price:
        raise _fail(where, name, "price.on_demand", "is missing while price.spot is given")
    for key in ("label", "notes"):
        if key in raw and not isinstance(raw[key], str):
            raise _fail(where, name, key, f"must be a string, got {raw[key]!r}")
    return Profile(
        name=name, kind=kind, label=raw.get("label", name), match=tuple(match), price_unit=unit,
        peak_tflops=peaks,
        hbm_gb=_sourced(raw["hbm_gb"], where, name, "hbm_gb") if "hbm_gb" in raw else None,
        hbm_tb_s=_sourced(raw["hbm_tb_s"], where, name, "hbm_tb_s") if "hbm_tb_s" in raw else None,
        price_on_demand=_sourced(price["on_demand"], where, name, "price.on_demand")
        if "on_demand" in price else None,
        price_spot=_sourced(price["spot"], where, name, "price.spot") if "spot" in price else None,
        notes=raw.get("notes", ""),
    )


def load_profiles(path: str | os.PathLike | None = None) -> dict[str, Profile]:
    """Profiles by name, in file order. ``path=None`` reads the packaged ``profiles.toml``.

    Raises ``ValueError`` naming the file, the profile and the field for anything malformed: a
    number without ``source`` or ``date``, an unknown field or dtype, a bad regex, a wrong kind.
    """
    if path is None:
        where = "attnbench/profiles.toml"
        data = resources.files("attnbench").joinpath("profiles.toml").read_bytes()
    else:
        where = str(path)
        data = Path(path).read_bytes()
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: not valid TOML: {exc}") from None
    if not raw:
        raise ValueError(f"{where}: no profiles")
    return {name: _profile(name, entry, where) for name, entry in raw.items()}


def get_profile(name: str, profiles: Mapping[str, Profile] | None = None) -> Profile:
    profiles = load_profiles() if profiles is None else profiles
    if name in profiles:
        return profiles[name]
    folded = {k.lower(): v for k, v in profiles.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    raise KeyError(f"unknown hardware profile {name!r}; known: {', '.join(profiles)}")


def match_profile(device: Device, profiles: Mapping[str, Profile] | None = None) -> Profile | None:
    """The profile of ``device``'s kind whose pattern matches its name (longest match, then file order)."""
    profiles = load_profiles() if profiles is None else profiles
    best, best_len = None, -1
    for profile in profiles.values():
        if profile.kind != device.platform:
            continue
        length = profile.match_length(device.name)
        if length is not None and length > best_len:
            best, best_len = profile, length
    return best


# ------------------------------------------------------------------------------------------ CPU probe
@dataclass(frozen=True)
class GemmProbe:
    """An achieved square-GEMM rate of this CPU: ``2 * size**3`` FLOPs per matmul."""

    framework: str
    dtype: str  # bf16 | fp16 | fp32
    size: int  # n of the n x n x n matmul
    threads: int | None  # threads the framework's matmul uses (None: unknown)
    best_tflops: float  # best of the rounds' medians
    median_tflops: float  # median of the rounds' medians
    rounds: int

    @property
    def tflops(self) -> float:
        """The figure used as the CPU's peak: the best round."""
        return self.best_tflops


_PROBE_CACHE: dict[tuple, GemmProbe] = {}
# A directory where probes are shared between the processes of one run (``run_sweep`` sets it):
# each case runs in a fresh worker, and re-probing there cost ~3 s per case and gave each case
# of the run a slightly different peak.
PROBE_DIR_ENV = "ATTNBENCH_PROBE_DIR"


def _shared_probe_path(key: tuple) -> str | None:
    directory = os.environ.get(PROBE_DIR_ENV)
    if not directory:
        return None
    return os.path.join(directory, f"gemm-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.json")


def _load_shared_probe(path: str | None) -> GemmProbe | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return GemmProbe(**json.load(f))
    except (TypeError, OSError, ValueError):  # not probed yet, or a damaged file: probe again
        return None


def clear_cpu_peak_cache() -> None:
    _PROBE_CACHE.clear()


def _xla_cpu_threads() -> int | None:
    flags = os.environ.get("XLA_FLAGS", "")
    if re.search(r"--xla_cpu_multi_thread_eigen=(false|0)\b", flags):
        return 1
    found = re.search(r"intra_op_parallelism_threads=(\d+)", flags)
    if found:
        return int(found.group(1))
    return detect_host().usable_cores  # XLA:CPU's default pool: one thread per usable core


def _numpy_threads() -> int | None:
    try:
        from threadpoolctl import threadpool_info

        blas = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
        if blas:
            return max(blas)
    except Exception:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def _gemm_runner(framework: str, dtype: str):
    """``(make(n) -> run, threads)``: ``run()`` does one blocking n x n x n matmul on the CPU."""
    if framework == "torch":
        import torch

        tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]

        def make(n):
            gen = torch.Generator().manual_seed(0)
            a = torch.randn(n, n, generator=gen).to(tdtype)
            b = torch.randn(n, n, generator=gen).to(tdtype)
            out = torch.empty(n, n, dtype=tdtype)
            return lambda: torch.matmul(a, b, out=out)

        return make, torch.get_num_threads()
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        jdtype = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}[dtype]
        cpu = jax.devices("cpu")[0]
        matmul = jax.jit(jnp.matmul)

        def make(n):
            ka, kb = jax.random.split(jax.random.PRNGKey(0))
            a = jax.device_put(jax.random.normal(ka, (n, n), jnp.float32).astype(jdtype), cpu)
            b = jax.device_put(jax.random.normal(kb, (n, n), jnp.float32).astype(jdtype), cpu)
            return lambda: matmul(a, b).block_until_ready()

        return make, _xla_cpu_threads()
    if framework == "numpy":
        import numpy as np

        if dtype == "bf16":
            raise ValueError("numpy has no native bfloat16 matmul: probe bf16 with torch or jax")
        ndtype = {"fp16": np.float16, "fp32": np.float32}[dtype]

        def make(n):
            rng = np.random.default_rng(0)
            a = rng.standard_normal((n, n)).astype(ndtype)
            b = rng.standard_normal((n, n)).astype(ndtype)
            out = np.empty((n, n), dtype=ndtype)
            return lambda: np.matmul(a, b, out=out)

        return make, _numpy_threads()
    raise ValueError(f"cpu_peak_tflops: framework must be torch, jax or numpy, got {framework!r}")


def cpu_peak_tflops(dtype="float32", framework: str = "torch", *, size: int | None = None,
                    max_size: int = 2048, min_call_seconds: float = 0.05, rounds: int = 3) -> GemmProbe:
    """Measure this CPU's achieved GEMM TFLOP/s in ``dtype`` through ``framework``'s matmul.

    The matrix size, unless given, grows 256, 512, ... up to ``max_size`` until one matmul takes
    ``min_call_seconds`` (compute bound, timer noise negligible; a dtype the CPU runs slowly, e.g.
    torch fp16 without native support, stops early instead of taking minutes). Then ``rounds``
    rounds of :func:`attnbench.timing.time_step` (blocked, median per round); ``best_tflops`` is the
    best round, ``median_tflops`` the median round.

    The result is memoised per process (keyed by every argument and the framework's thread count),
    and shared through ``$ATTNBENCH_PROBE_DIR`` between the worker processes of one sweep, so a run
    pays for the probe once per framework and dtype; :func:`clear_cpu_peak_cache` forgets the
    process's copy. This is an achieved-GEMM peak, not a spec-sheet peak: MFU against it is
    "fraction of this machine's own matmul speed".
    """
    dtype = canonical_dtype(dtype)
    make, threads = _gemm_runner(framework, dtype)
    key = (framework, dtype, size, max_size, min_call_seconds, rounds, threads)
    shared = _shared_probe_path(key)
    probe = _PROBE_CACHE.get(key) or _load_shared_probe(shared)
    if probe is not None:
        _PROBE_CACHE[key] = probe
        return probe
    if size is None:
        n = 256
        while True:
            run = make(n)
            run()  # warm (and, for jax, compile)
            elapsed = _clock_one(run)
            if elapsed >= min_call_seconds or n * 2 > max_size:
                break
            n *= 2
    else:
        if size <= 0:
            raise ValueError(f"cpu_peak_tflops: size must be positive, got {size}")
        n = size
        run = make(n)
    flops = 2.0 * n ** 3
    rates = []
    for r in range(max(1, rounds)):
        timing = time_step(run, warmup=1 if r == 0 else 0, block_seconds=min_call_seconds,
                           min_seconds=0.2, min_samples=3, max_seconds=10.0)
        rates.append(flops / timing.median_s / 1e12)
    probe = GemmProbe(framework=framework, dtype=dtype, size=n, threads=threads,
                      best_tflops=max(rates), median_tflops=statistics.median(rates), rounds=len(rates))
    _PROBE_CACHE[key] = probe
    if shared:
        from attnbench.atomic import atomic_write_text

        atomic_write_text(shared, json.dumps(dataclasses.asdict(probe)))
    return probe


def _clock_one(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------ the peak
@dataclass(frozen=True)
class Peak:
    """The peak an MFU is taken against; ``tflops`` None means unknown and ``source`` says why."""

    tflops: float | None
    source: str
    probe: GemmProbe | None = None

    @property
    def known(self) -> bool:
        return self.tflops is not None


def peak_tflops(device: Device, profile: Profile | None, dtype, *, framework: str = "torch") -> Peak:
    """Spec-sheet peak from ``profile`` for an accelerator; the GEMM probe for a CPU.

    On a CPU ``framework`` picks the probe's matmul (use the run's framework; torch_xla probes with
    torch, its venv's eager CPU matmul).
    """
    dt = canonical_dtype(dtype)
    if device.platform == "cpu":
        probe_fw = "torch" if framework == "torch_xla" else framework
        try:
            probe = cpu_peak_tflops(dt, probe_fw)
        except (ValueError, ImportError) as exc:
            return Peak(None, f"unknown: CPU GEMM probe unavailable ({exc})")
        return Peak(probe.tflops, f"probe: achieved {probe_fw} {_LONG_DTYPE[dt]} GEMM n={probe.size}, "
                    f"{probe.threads if probe.threads is not None else '?'} threads (not a spec peak)",
                    probe)
    if profile is None:
        return Peak(None, f"unknown: no hardware profile matches {device.name!r}; pass --profile")
    entry = profile.peak(dt)
    if entry is None:
        have = ", ".join(profile.peak_tflops) or "none"
        return Peak(None, f"unknown: profile {profile.name!r} gives no {_LONG_DTYPE[dt]} peak (has: {have})")
    return Peak(entry.value, f"spec: {entry.source} ({entry.date.isoformat()})")
