"""The asv suite's sizes (``ATTNBENCH_SUITE``: default, smoke, full, gpu) and what a size runs
here: its fields, dtypes, kernels and preset workloads, decided without initialising a device
(docs/suite.md). ``asv/suite.py`` plans and measures the cases; ``asv/machine.py`` names the machine.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import attention_impls
from attnbench.core import presets, traffic
from attnbench.core.workload import CUSTOM, PHASES, Workload
from attnbench.hardware import detection
from attnbench.hardware.dtypes import MACHINE_DTYPES
from attnbench.measure.engine import Options
from attnbench.run.adaptive import RoundPlan

# The default's two presets between them hold every mask and head structure of the catalogue.
DEFAULT_PRESETS = ("llama-3.1-8b", "gemma-2-9b")
# A GPU's flash kernels, whose bfloat16 forward at 4k and 16k tokens is the GPU run's headline.
GPU_HEADLINE_KERNELS = ("jax-cudnn", "torch-sdpa-cudnn", "torch-sdpa-flash", "torch-sdpa-efficient",
                        "torch-flex-attention", "jax-pallas-gpu-mha", "jax-pallas-mgpu-attention")
ALL_PRESETS = tuple(presets.PRESETS)
@dataclasses.dataclass(frozen=True)
class SuiteSize:
    """One suite size: what it measures and how long each case is timed. Every field a size leaves
    out has the default below, read from here only."""

    name: str
    forward_seqs: tuple[int, ...]
    training_seqs: tuple[int, ...]
    dtypes: tuple[str, ...]  # on a CPU; an accelerator has its own (ACCELERATOR_DTYPES)
    regime_steps: int
    min_seconds: float  # the first timing window, extended by up to max_extra_seconds while noisy
    max_extra_seconds: float
    max_interpret_seq: int | None  # an interpreted kernel's longest length; None: no limit
    regime_seqs: tuple[int, ...] | None  # the Forward lengths a regime stream runs at; None: every one
    max_reference_seq: int | None = None  # the float64 reference's longest length
    # Timing rounds of a static case (run/adaptive.py): at least ``rounds`` (its first window
    # included), paired by comparison group, then more for a group whose forced/native pairs are
    # neither decided nor equal within ``margin``, up to ``max_rounds`` or until ``round_budget_s``
    # (per environment's sweep) is spent. Each later round: one window of ``round_seconds`` per case.
    rounds: int = 1
    max_rounds: int | None = None  # None: rounds
    round_seconds: float = 0.1
    round_budget_s: float | None = None
    margin: float = 0.10
    # a static step's 99% relative half-width its rounds go on for (within the budget); None: off
    precision: float | None = None
    # "device": the device's own timer where the step's framework has one (torch on CUDA: events;
    # jax on a GPU or TPU: profiler device events), in the first window and the rounds; a CPU's is
    # the wall clock (Backend.device_clock)
    timer: str = "device"
    fresh_process: bool = True  # False: consecutive static cases share a worker
    preset_fresh_process: bool | None = None  # a preset's static case; None: as fresh_process
    static_first: bool = False  # measure static cases first, so they share workers
    length_first: bool = False  # shorter lengths first, so a run cut by its deadline keeps them whole
    first: tuple[dict, ...] = ()  # rules (a field: its values) whose cases go ahead of the rest
    model_presets: tuple[str, ...] = ()
    preset_size: str = "default"
    model_phases: tuple[str, ...] = PHASES
    preset_interpret: bool = True  # presets with interpreted kernels
    preset_reference: bool = True  # presets with the float64 reference
    preset_frameworks: tuple[str, ...] | None = None  # None: every framework
    regime_presets: tuple[str, ...] | None = None  # presets (or preset:phase) with regime streams
    preset_regimes: tuple[str, ...] | None = None  # None: every regime
    preset_stream_left_out: tuple[str, ...] = ()  # kernels whose presets run the static stream only
    regime_dtypes: tuple[str, ...] | None = None  # None: every dtype
    # kernels whose Forward case at the longest length is timed twice a round: an A/A control pair
    controls: tuple[str, ...] = ()
    kernels_for: str | None = None  # a size made for one kind of machine leaves out what cannot run there
    # the libraries beyond the frameworks (AttentionImpl.library: "tokamax") whose kernels the size
    # measures; None: every one
    libraries: tuple[str, ...] | None = None
    frameworks: tuple[str, ...] | None = None  # None: every framework
    # Each stream's lengths (core/traffic.py): a trace's name or "uniform", the synthetic baseline.
    # Forward and Training: B1 sequences from the code trace; the presets: the conversation trace for
    # prefill and for decode (continuous batching). ATTNBENCH_TRAFFIC replaces them all.
    forward_traffic: str = "azure-code"
    prefill_traffic: str = "azure-conv"
    decode_traffic: str = "azure-conv"
    stream_windows: int = 8  # a stream's trace windows, its interval's values (8: a 99% sign test)
    stream_budget_s: float | None = None  # a stream stops after the step that spends it
    # A static stream's steps run (None: all). Pad-to-max runs one shape, the call the rounds time, on
    # inputs placed once: the other steps are that call again, counted at the run steps' steady mean.
    static_stream_steps: int | None = None

    def traffic_for(self, workload: Workload) -> str:
        """The trace a case's stream takes its lengths from: the user's (``ATTNBENCH_TRAFFIC``), else
        the size's for the workload's phase."""
        user = user_traffic()
        if user:
            return user
        if workload.phase == "decode":
            return self.decode_traffic
        return self.forward_traffic if workload.name == CUSTOM else self.prefill_traffic

    def options(self, regime: str, *, trace_dir: str | None, compile_cache: str,
                workload: Workload | None = None) -> Options:
        """How a case of this size is measured."""
        return Options(regime=regime, regime_steps=self.regime_steps, min_seconds=self.min_seconds,
                       max_extra_seconds=self.max_extra_seconds, trace_dir=trace_dir,
                       compile_cache=compile_cache, timer=self.timer,
                       traffic=self.traffic_for(workload) if workload is not None else "uniform",
                       stream_windows=self.stream_windows, stream_budget_s=self.stream_budget_s,
                       static_stream_steps=self.static_stream_steps,
                       step_checks=regime == "static")  # a regime's static case checks its step

    def round_plan(self, *, budget_s: float | None = None, margin: float | None = None,
                   precision: float | None = None, controls: tuple[str, ...] = ()) -> RoundPlan | None:
        """The later rounds of this size's sweeps (None: one window per case), with the user's budget,
        margin and precision where given (``ATTNBENCH_BUDGET_S``, ``ATTNBENCH_MARGIN``,
        ``ATTNBENCH_PRECISION``)."""
        later = self.rounds - 1
        if later < 1:
            return None
        return RoundPlan(min_rounds=later, max_rounds=(self.max_rounds or self.rounds) - 1,
                         budget_s=self.round_budget_s if budget_s is None else budget_s,
                         margin=self.margin if margin is None else margin,
                         precision=self.precision if precision is None else precision,
                         window_s=self.round_seconds, controls=controls)

    @property
    def preset_fresh(self) -> bool:
        """Whether a preset's static case gets a worker of its own."""
        return self.fresh_process if self.preset_fresh_process is None else self.preset_fresh_process

    def own_process(self, workload: Workload, regime: str) -> bool:
        """Whether a case gets a worker of its own. A regime case always does: compile caches live per
        process (torch_xla's cannot be cleared), so its compile count is honest only there. Static cases
        may share one safely for timing, as jax and Inductor key their caches by shape."""
        if regime != "static":
            return True
        return self.preset_fresh if workload.name != CUSTOM else self.fresh_process


SIZES = {size.name: size for size in (
    # max_interpret_seq: an interpreter's speed says nothing about any hardware (the compiled-for
    # tier's). fresh_process False + static_first: static cases share a worker (its start costs more
    # than most cases; shapes still compile cold); a regime case gets its own, so its compile count
    # is cold. max_extra_seconds: how long the first window may run on while its IQR exceeds 5%.
    # rounds: windows per static case, in warm workers replaced every few rounds; more short rounds
    # beat longer windows because noise between processes dominates (run/adaptive.py; results/LOG.md).
    # regime_steps: each stream's steps, in stream_windows trace windows (docs/workloads.md);
    # stream_budget_s cuts a stream whose every step compiles (exact lengths in a compiled kernel).
    SuiteSize("default", forward_seqs=(256, 1024), training_seqs=(512,), dtypes=("float32",),
              regime_steps=200, stream_budget_s=15.0, static_stream_steps=16, min_seconds=0.1,
              max_extra_seconds=0.1,
              max_interpret_seq=256, max_reference_seq=256, regime_seqs=(1024,), rounds=13,
              max_rounds=41, round_seconds=0.05, round_budget_s=600.0, precision=0.05,
              controls=("jax-xla", "torch-sdpa-flash", "torch-xla-sdpa"),
              model_presets=DEFAULT_PRESETS, preset_size="default",
              preset_interpret=False, preset_reference=False, fresh_process=False,
              static_first=True, model_phases=("prefill", "decode"),
              preset_frameworks=("jax", "torch"),
              # the presets' length streams (a preset, or preset:phase) and their regimes here:
              # every preset has its static stream (pad to max), so every row has a production
              # cost; exact lengths for Llama's prefill and decode and Gemma-2's windowed,
              # soft-capped decode (buckets: full; the 2-core budget, results/LOG.md)
              regime_presets=("llama-3.1-8b", "gemma-2-9b:decode"),
              preset_regimes=("static", "dynamic"),
              # FlexAttention compiles each new shape afresh (~7 s here: Forward's dynamic stream
              # shows it), so exact lengths are its dearest way; its preset rows price pad-to-max
              preset_stream_left_out=("torch-flex-attention",),
              # make bench keeps its time: Tokamax's kernels are measured in full, and compiled for
              # the chips by the compiled-for tier (make published)
              libraries=()),
    SuiteSize("smoke", forward_seqs=(128, 256), training_seqs=(128,), dtypes=("float32",),  # the tests'
              regime_steps=3, forward_traffic="uniform", prefill_traffic="uniform", decode_traffic="uniform",
              min_seconds=0.05, max_extra_seconds=0.5,
              max_interpret_seq=256, max_reference_seq=None, regime_seqs=None, rounds=2,
              round_seconds=0.05, model_presets=("mistral-7b",), model_phases=("decode",),
              preset_size="smoke", preset_interpret=False, regime_presets=(), libraries=()),
    SuiteSize("full", forward_seqs=(256, 512, 1024, 2048, 4096, 8192), training_seqs=(512, 1024, 2048),
              dtypes=("float32", "bfloat16"), regime_steps=400, stream_windows=16, stream_budget_s=120.0,
              min_seconds=0.5,
              max_extra_seconds=3.0, max_interpret_seq=None, max_reference_seq=None,
              regime_seqs=None, rounds=9, round_seconds=0.2, model_presets=ALL_PRESETS,
              preset_size="real", preset_interpret=True),
    # One short GPU run (tools/device-run.sh): paired rounds as on a CPU, fewer, within the device's
    # budget (its deadline cuts them; what was timed is kept). The grid holds only kernels that can
    # give a number on a GPU (kernels_for, frameworks: the H200 image has no torch_xla); `first`
    # puts the headline cases ahead, then shortest lengths first, so a run cut by its deadline still
    # answers the headline.
    SuiteSize("gpu", forward_seqs=(1024, 4096, 16384), training_seqs=(4096,), dtypes=("bfloat16", "float32"),
              regime_steps=200, stream_budget_s=20.0, static_stream_steps=16, min_seconds=0.2,
              max_extra_seconds=0.3, max_interpret_seq=512,
              max_reference_seq=1024, regime_seqs=(4096,), regime_dtypes=("bfloat16",), rounds=5,
              max_rounds=9, round_seconds=0.1, round_budget_s=150.0, precision=0.05,
              controls=("jax-xla", "torch-sdpa-flash"), fresh_process=False, length_first=True,
              model_presets=DEFAULT_PRESETS, preset_size="real", preset_interpret=False,
              regime_presets=("llama-3.1-8b",), kernels_for="gpu",
              # the H200 image has no tokamax, and its wheel's dependencies (flax, qwix, orbax,
              # tensorstore) are not carried to it (docs/device.md)
              libraries=(),
              frameworks=("numpy", "jax", "torch"),
              first=({"impl": GPU_HEADLINE_KERNELS, "name": (CUSTOM,), "seq_q": (4096, 16384),
                      "dtype": ("bfloat16",), "mode": ("fwd",), "regime": ("static",)},
                     {"name": ("llama-3.1-8b",), "phase": ("prefill", "decode")})),
)}
FORWARD = Workload(batch=1, q_heads=8, head_dim=64, seq_q=1024, causal=True, mode="fwd")
TRAINING = FORWARD.replace(mode="fwd_bwd")
# Whatever the size. GPU: FlashAttention-2 and cuDNN refuse float32, so bfloat16 too. TPU: XLA
# computes float32 matmuls in bfloat16 passes by default (JAX "Matmul precision"), and no TPU
# publishes a float32 peak.
ACCELERATOR_DTYPES = {"gpu": ("bfloat16", "float32"), "tpu": MACHINE_DTYPES["tpu"]}
ACCEL_ENV = ("ATTNBENCH_ACCEL", "ACCEL")  # make exports ACCEL (cpu | cuda | tpu)
_ACCEL_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}


SUITE_ENV = "ATTNBENCH_SUITE"
TRAFFIC_ENV = "ATTNBENCH_TRAFFIC"  # a trace (built-in name or CSV path) every stream takes its lengths from


def user_traffic() -> str | None:
    """``ATTNBENCH_TRAFFIC``: the user's trace for every stream of the suite, None when unset."""
    return os.environ.get(TRAFFIC_ENV, "").strip() or None


def check_user_traffic(size: SuiteSize | None = None) -> None:
    """The user's trace read and checked before anything runs: ``TraceError`` (a ``ValueError``)
    naming the file and line of a malformed row, or of a request longer than the context of a model
    the suite runs (for decode, its context plus its generated tokens), or of a file without
    ``GeneratedTokens`` where the suite runs a decode stream (every stream takes the user's trace)."""
    source = user_traffic()
    if not source or not traffic.is_trace(source):
        return
    trace = traffic.load(source)
    size = suite_size() if size is None else size
    for name in size.model_presets:
        for phase in size.model_phases:
            if phase in presets.get(name).phases:
                traffic.check_context(trace, presets.get(name).context, phase)
BUDGET_ENV = "ATTNBENCH_BUDGET_S"  # seconds the later rounds of one environment's sweep may take
MARGIN_ENV = "ATTNBENCH_MARGIN"  # "equal within +-margin" (0.1: 10%)
PRECISION_ENV = "ATTNBENCH_PRECISION"  # a static step's 99% relative half-width to time down to (0.05: 5%)


def user_round_settings() -> dict:
    """``{"budget_s": ..., "margin": ..., "precision": ...}`` the user set (``ATTNBENCH_BUDGET_S``,
    ``ATTNBENCH_MARGIN``, ``ATTNBENCH_PRECISION``), each None when unset; ``ValueError`` naming the
    variable for a budget of 0 or less, or a margin or precision outside (0, 1)."""
    out = {}
    for key, var in (("budget_s", BUDGET_ENV), ("margin", MARGIN_ENV), ("precision", PRECISION_ENV)):
        raw = os.environ.get(var, "").strip()
        if not raw:
            out[key] = None
            continue
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{var} must be a number, got {raw!r}") from None
        if key == "budget_s" and not value > 0:
            raise ValueError(f"{var} must be more than 0 seconds, got {raw}")
        if key == "margin" and not 0 < value < 1:
            raise ValueError(f"{var} must be a fraction between 0 and 1 (0.1 for +-10%), got {raw}")
        if key == "precision" and not 0 < value < 1:
            raise ValueError(f"{var} must be a fraction between 0 and 1 (0.05 for +-5%), got {raw}")
        out[key] = value
    return out
DEPRECATED_SUITE_ENV = "ATTNBENCH_PROFILE"  # its old name; still read, with a note on stderr
_warned_deprecated = False




def suite_name() -> str:
    """``ATTNBENCH_SUITE`` (default ``default``); else the deprecated ``ATTNBENCH_PROFILE``."""
    global _warned_deprecated
    name = os.environ.get(SUITE_ENV)
    if name:
        return name
    old = os.environ.get(DEPRECATED_SUITE_ENV)
    if old:
        if not _warned_deprecated:  # once per process: asv imports the suite in every benchmark process
            print(f"attnbench: {DEPRECATED_SUITE_ENV} is deprecated, use {SUITE_ENV}={old}", file=sys.stderr)
            _warned_deprecated = True
        return old
    return "default"


def compile_cache() -> str:
    """``cold`` or ``warm`` (``ATTNBENCH_COMPILE_CACHE``): see ``attnbench/measure/compiler_caches.py``."""
    return os.environ.get("ATTNBENCH_COMPILE_CACHE", "cold")


def suite_size() -> SuiteSize:
    """The chosen suite size (``SIZES[suite_name()]``)."""
    name = suite_name()
    if name not in SIZES:
        raise ValueError(f"{SUITE_ENV} must be one of {sorted(SIZES)}, got {name!r}")
    return SIZES[name]


def accelerator_kind() -> str:
    """``cpu``, ``gpu`` or ``tpu``: the accelerator this machine's suite is sized for, decided
    without initialising any device, from ``ACCEL_ENV`` else device files, so both asv environments
    agree on their parameters."""
    for var in ACCEL_ENV:
        value = os.environ.get(var, "").strip().lower()
        if value:
            if value not in _ACCEL_PLATFORM:
                raise ValueError(f"{var} must be one of {sorted(_ACCEL_PLATFORM)}, got {value!r}")
            return _ACCEL_PLATFORM[value]

    attached = detection.accelerator_present()
    return attached.platform if attached else "cpu"


def timer_here(size: SuiteSize | None = None, accelerator: str | None = None) -> str:
    """The clock the size's ``timer`` is on this machine, as the sidecar records it: a CPU's "device"
    timer is the wall clock (``Backend.device_clock``), so a CPU's history keeps one timer setting."""
    size = suite_size() if size is None else size
    accelerator = accelerator_kind() if accelerator is None else accelerator
    return "wall" if accelerator == "cpu" and size.timer == "device" else size.timer


def suite_dtypes(size: SuiteSize | None = None, accelerator: str | None = None) -> tuple[str, ...]:
    """The dtypes the suite runs here: the size's own on a CPU, ``ACCELERATOR_DTYPES`` on a GPU/TPU."""
    size = suite_size() if size is None else size
    accelerator = accelerator_kind() if accelerator is None else accelerator
    return tuple(ACCELERATOR_DTYPES.get(accelerator, size.dtypes))


def impl_names(size: SuiteSize | None = None) -> list[str]:
    """The kernels of the size's grid: every registered name (params must not differ between asv
    environments), or the ``ATTNBENCH_IMPLS`` subset, less ``left_out_kernels``."""

    chosen = os.environ.get("ATTNBENCH_IMPLS")
    names = attention_impls.names()
    if chosen:
        wanted = [n.strip() for n in chosen.split(",") if n.strip()]
        for name in wanted:
            attention_impls.get(name)  # unknown names fail loudly
        names = [n for n in names if n in wanted]
    left_out = left_out_kernels(size)
    return [n for n in names if n not in left_out]


def left_out_kernels(size: SuiteSize | None = None) -> dict[str, str]:
    """``{kernel: reason}`` of those a size leaves out of its grid, from declarations only: a kernel
    from a library the size does not measure (``libraries``), and in a size made for one kind of
    machine (``kernels_for``) a kernel that cannot give a number there (interpreted, unsupported) or
    whose framework the size does not run. asv starts no process for them; the sidecar
    keeps the reasons (``left_out``)."""
    size = suite_size() if size is None else size
    platform, frameworks, libraries = size.kernels_for, size.frameworks, size.libraries
    out = {}
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        if impl.library and libraries is not None and impl.library not in libraries:
            out[name] = (f"the {suite_name()} suite leaves out {impl.library}'s kernels: {SUITE_ENV}=full "
                         "measures them, and make published compiles them for the chips "
                         "(docs/kernels.md#tokamaxs-kernels)")
            continue
        if not platform:
            continue
        support = impl.platform_support[platform]
        if frameworks and impl.framework not in frameworks:
            out[name] = (f"the {suite_name()} suite runs {', '.join(frameworks)} only: {impl.framework} "
                         f"is not in the {platform.upper()} image it was made for")
        elif support.status != "runs":
            out[name] = f"{support.status} on a {platform.upper()}: {support.note}"
    return out


def this_env_frameworks() -> tuple[str, ...]:
    """The torch_xla environment measures torch_xla only; the main one everything else."""

    if importlib.util.find_spec("torch_xla") is not None:
        return ("torch_xla",)
    return ("numpy", "jax", "torch")


def preset_impl_names(size: SuiteSize | None = None) -> list[str]:
    """The Models class's implementations: ``impl_names()`` less those this size leaves out of every
    preset, from declarations only, so both asv environments agree. A kernel that refuses one
    preset's mask stays in, n/a with its reason there."""

    size = suite_size() if size is None else size
    platform = accelerator_kind()
    frameworks = size.preset_frameworks

    def kept(name: str) -> bool:
        impl = attention_impls.get(name)
        if frameworks and impl.framework not in frameworks + ("numpy",):
            return False
        if impl.framework == "numpy":
            return size.preset_reference
        return size.preset_interpret or impl.platform_support[platform].status == "runs"

    return [name for name in impl_names() if kept(name)]


def case_length(workload: Workload) -> int | str:
    """The sidecar's length field: the sequence length, or ``<preset>:<phase>`` for a preset's."""
    return workload.seq_q if workload.name == CUSTOM else f"{workload.name}:{workload.phase}"


def preset_workloads(size: SuiteSize | None = None,
                     dtype: str = "float32") -> dict[tuple[str, str], Workload]:
    """``{(preset, phase): Workload}`` the Models class measures at this suite size."""
    size = suite_size() if size is None else size
    return {(name, phase): presets.workload(name, phase, size=size.preset_size, dtype=dtype)
            for name in size.model_presets for phase in presets.get(name).phases
            if phase in size.model_phases}
