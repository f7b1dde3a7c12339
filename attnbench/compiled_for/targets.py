"""Compile targets: which hardware, which hardware profile, and what its compiler is told.

Each target in ``targets.toml`` is tied to a hardware profile, which alone supplies HBM, peaks,
bandwidth and price, so no figure is written twice. A GPU target's ``GpuTargetConfig`` is built from
its chip's sourced spec-sheet figures (``[chips.*]``) plus the profile's memory. No jax import: the
CLI checks targets and the environment before any worker starts.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import tomllib
from dataclasses import dataclass, field
from importlib import resources

from attnbench.core.errors import UnknownName
from attnbench.hardware import HardwareProfile, get_hardware_profile

TARGETS_FILE = "targets.toml"
INSTALL_STEP = ("make setup-targets (it builds .venv-targets with pip install -e '.[targets]': jax[tpu] "
                "0.10.2 with libtpu, jax-cuda12-plugin/-pjrt, the nvcc and cuDNN wheels), then run "
                ".venv-targets/bin/python -m attnbench compile-for ...")
GPU_SPEC_FIELDS = (
    "threads_per_block_limit", "threads_per_warp", "shared_memory_per_block", "shared_memory_per_core",
    "threads_per_core_limit", "core_count", "fpus_per_core", "block_dim_limit_x", "block_dim_limit_y",
    "block_dim_limit_z", "l2_cache_size", "clock_rate_ghz", "shared_memory_per_block_optin",
    "registers_per_core_limit", "registers_per_block_limit",
)


@dataclass(frozen=True)
class SpecFigure:
    value: float | int | str
    source: str
    date: datetime.date


@dataclass(frozen=True)
class Target:
    """One compile target. ``hbm_bytes`` etc. are the hardware profile's, per device."""

    name: str
    platform: str  # "tpu" | "gpu"
    hardware_profile: str
    chips: int = 1
    topology: str = ""  # TPU: libtpu topology name
    single_host: bool = True  # TPU: chips_per_host_bounds=[1, 1, 1]
    chip: str = ""  # GPU: the [chips.*] table
    device_name: str = ""  # GPU: the name the device reports
    spec: dict[str, SpecFigure] = field(default_factory=dict, repr=False)  # GPU: per-SM figures
    notes: str = ""
    family: str = ""  # the time model's calibration family (attnbench/predicted)

    @property
    def profile(self) -> HardwareProfile:
        return get_hardware_profile(self.hardware_profile)

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        if self.platform != "gpu":
            return None
        major, minor = str(self.spec["compute_capability"].value).split(".")
        return int(major), int(minor)

    @property
    def chip_hbm_bytes(self) -> int | None:
        """HBM of one chip in bytes: the profile's ``hbm_gb`` x 1e9 (vendors' GB)."""
        hbm = self.profile.hbm_gb
        return int(round(hbm.value * 1e9)) if hbm else None

    def describe(self) -> str:
        where = self.topology if self.platform == "tpu" else f"{self.device_name}, sm_{self.chip_sm()}"
        chips = f"{self.chips} chip{'s' if self.chips > 1 else ''}"
        return f"{self.name} ({where}; {chips}; profile {self.hardware_profile})"

    def chip_sm(self) -> str:
        cc = self.compute_capability
        return f"{cc[0]}{cc[1]}" if cc else ""


def _figure(raw, where: str) -> SpecFigure:
    if not isinstance(raw, dict) or set(raw) != {"value", "source", "date"}:
        raise ValueError(f"{where}: must be {{value, source, date}}, got {raw!r}")
    if not str(raw["source"]).strip():
        raise ValueError(f"{where}: source is empty: every figure needs its source")
    if not isinstance(raw["date"], datetime.date):
        raise ValueError(f"{where}: date must be a date (YYYY-MM-DD), got {raw['date']!r}")
    return SpecFigure(raw["value"], raw["source"], raw["date"])


def load_targets(text: str | None = None) -> dict[str, Target]:
    """Targets by name, in file order (``text``: a TOML document of the same schema, for tests)."""
    where = f"attnbench/compiled_for/{TARGETS_FILE}"
    if text is None:
        text = resources.files("attnbench.compiled_for").joinpath(TARGETS_FILE).read_text()
    raw = tomllib.loads(text)
    chips = raw.get("chips", {})
    out = {}
    for name, table in raw.get("targets", {}).items():
        table = dict(table)
        platform = table.pop("platform", None)
        if platform not in ("tpu", "gpu"):
            raise ValueError(f"{where}: target {name!r}: platform must be 'tpu' or 'gpu', got {platform!r}")
        spec = {}
        if platform == "gpu":
            chip = table.get("chip")
            if chip not in chips:
                raise ValueError(f"{where}: target {name!r}: chip {chip!r} has no [chips.{chip}] table")
            spec = {key: _figure(value, f"{where}: chips.{chip}.{key}") for key, value in chips[chip].items()}
            missing = [f for f in (*GPU_SPEC_FIELDS, "compute_capability") if f not in spec]
            if missing:
                raise ValueError(f"{where}: chips.{chip}: missing {missing}")
        elif not table.get("topology"):
            raise ValueError(f"{where}: target {name!r}: a TPU target needs a topology")
        try:
            out[name] = Target(name=name, platform=platform, spec=spec, **table)
        except TypeError as exc:
            raise ValueError(f"{where}: target {name!r}: {exc}") from None
        get_hardware_profile(out[name].hardware_profile)  # unknown profile: KeyError naming the known ones
    return out


def get_targets(names: list[str], targets: dict[str, Target] | None = None) -> list[Target]:
    """The targets called ``names`` (``all``: every one); an unknown name lists the known ones."""
    targets = load_targets() if targets is None else targets
    if "all" in names:
        return list(targets.values())
    unknown = [n for n in names if n not in targets]
    if unknown:
        raise UnknownName(f"unknown compile target {', '.join(map(repr, unknown))}; known: "
                       f"{', '.join(targets)} (or all)")
    return [targets[n] for n in dict.fromkeys(names)]


# -------------------------------------------------------------------------- the environment
def environment_problem(platform: str) -> str | None:
    """Why this Python cannot compile for ``platform`` targets, naming the install step; or None."""
    if importlib.util.find_spec("jax") is None:
        return f"jax is not installed in this environment; {INSTALL_STEP}"
    if platform == "tpu":
        if importlib.util.find_spec("libtpu") is None:
            return ("libtpu is not installed in this environment (TPU targets need the TPU compiler "
                    f"it ships); {INSTALL_STEP}")
        return None
    needed = {"jax_plugins.xla_cuda12": "jax-cuda12-plugin (the CUDA PJRT plugin)",
              "nvidia.cuda_nvcc": "nvidia-cuda-nvcc-cu12 (ptxas)",
              "nvidia.cudnn": "nvidia-cudnn-cu12 (cuDNN)"}
    missing = [what for module, what in needed.items() if _find(module) is None]
    if missing:
        return (f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in this "
                f"environment (GPU targets need the CUDA compiler stack); {INSTALL_STEP}")
    return None


def _find(module: str):
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:  # its parent package is absent
        return None


def library_versions() -> dict[str, str | None]:
    """The compiler stack's versions, as installed (no import)."""
    out = {}
    for dist in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "nvidia-cudnn-cu12",
                 "nvidia-cuda-nvcc-cu12"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _version_triple(dist: str, fallback: tuple[int, int, int]) -> tuple[int, int, int]:
    try:
        parts = [int(p) for p in importlib.metadata.version(dist).split(".")[:3]]
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return fallback
    return tuple((parts + [0, 0, 0])[:3])


def gpu_target_config(target: Target) -> str:
    """XLA's ``GpuTargetConfig`` text proto for ``target``, with the installed cuDNN / CUDA versions
    (what the compile will link against)."""
    if target.platform != "gpu":
        raise ValueError(f"{target.name} is not a GPU target")
    profile = target.profile
    if profile.hbm_gb is None or profile.hbm_tb_s is None:
        raise ValueError(f"hardware profile {profile.name!r} lacks hbm_gb or hbm_tb_s, which target "
                         f"{target.name!r} needs")
    lines = ["gpu_device_info {"]
    for key in GPU_SPEC_FIELDS:
        value = target.spec[key].value
        lines.append(f"  {key}: {value}")
    major, minor = target.compute_capability
    lines.append(f"  memory_bandwidth: {int(round(profile.hbm_tb_s.value * 1e12))}")
    lines.append(f"  device_memory_size: {target.chip_hbm_bytes}")
    lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor} }}")
    lines.append("}")
    dnn = _version_triple("nvidia-cudnn-cu12", (9, 0, 0))
    cuda = _version_triple("nvidia-cuda-nvcc-cu12", (12, 0, 0))
    lines.append('platform_name: "CUDA"')
    lines.append(f"dnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} patch: {dnn[2]} }}")
    lines.append(f"runtime_version {{ major: {cuda[0]} minor: {cuda[1]} patch: 0 }}")
    lines.append(f'device_description_str: "{target.device_name}"')
    return "\n".join(lines) + "\n"
