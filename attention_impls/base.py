"""What every kernel declares: what it is, never how it is run or measured.

``attention(q, k, v, causal=, scale=, **mask)`` gets only the mask features the workload uses:
``window`` (int), ``softcap`` (float), ``q_segment_ids`` / ``kv_segment_ids`` (int32 ``[B, S]``),
with ``attnbench.core.masks``' semantics. Where a kernel runs, whether it takes a workload here, the
conformance entry point (``run_numpy`` / ``grad_numpy``) and a timed step are its framework's
backend's answers, asked through ``attnbench.backends.here`` (docs/adding-a-kernel.md).

Framework imports happen inside methods, so the registry lists every kernel in a venv that lacks
some frameworks.
"""

from __future__ import annotations

import abc
import copy
import importlib
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from attnbench.core.masks import empty_rows
from attnbench.core.workload import Workload

PLATFORMS = ("cpu", "gpu", "tpu")
FORCED_FLASH = "forced-flash"
NATIVE = "native"
# The mask features a kernel may declare in ``supports`` (``Workload.mask_features``), in words.
MASK_FEATURES = {"window": "sliding window", "softcap": "logit soft-capping",
                 "segment_ids": "segment ids (packed documents, a ragged cache's padding)"}
# The segment ids a kernel may take (``segment_kinds``): ``documents`` (the same ids for queries and
# keys of one packed sequence, ``Workload.documents``) and ``ragged`` (a decode cache's left padding,
# ``Workload.ragged``).
SEGMENT_KINDS = ("documents", "ragged")


class Unsupported(NotImplementedError):
    """This implementation cannot run this workload here; ``reason`` says why in plain words."""

    def __init__(self, impl: str, reason: str):
        super().__init__(f"{impl}: {reason}")
        self.impl = impl
        self.reason = reason


@dataclass(frozen=True)
class PlatformSupport:
    """How an implementation runs on one platform: natively, only in an interpreter, or not at all."""

    status: Literal["runs", "interpret-only", "unsupported"]
    note: str = ""


RUNS = PlatformSupport("runs")


def interpret_only(note: str) -> PlatformSupport:
    return PlatformSupport("interpret-only", note)


def unsupported(reason: str) -> PlatformSupport:
    return PlatformSupport("unsupported", reason)


Config = tuple[tuple[str, int], ...]  # a kernel's tile knobs, in its search space's order; () = defaults
_KNOB = re.compile(r"^([a-z_]+)=(\S+)$")


@dataclass(frozen=True)
class SearchSpace:
    """A tiled kernel's knobs (tile or chunk sizes): the values it runs at by default and the
    candidate configs the tuner measures (``attnbench/run/tune.py``, docs/tuning.md). Each candidate
    names every knob; the defaults are one of the candidates."""

    defaults: Config
    candidates: tuple[Config, ...]

    def __post_init__(self):
        names = [name for name, _ in self.defaults]
        for candidate in self.candidates:
            if [name for name, _ in candidate] != names:
                raise ValueError(f"candidate {config_text(candidate)} must name the knobs {names} in order")
        if self.defaults not in self.candidates:
            raise ValueError(f"the defaults {config_text(self.defaults)} must be one of the candidates")

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.defaults)

    def check(self, config, kernel: str) -> Config:
        """``config`` (a mapping, pairs, or text ``block_q=64,block_k=128``) as a full ``Config``:
        knobs it leaves out at their defaults. ``ValueError`` names an unknown knob or a value that is
        not a positive integer."""
        if isinstance(config, str):
            config = parse_config(config)
        given = dict(config)
        unknown = sorted(set(given) - set(self.knobs))
        if unknown:
            raise ValueError(f"{kernel} has no knob {', '.join(unknown)}; its knobs: {', '.join(self.knobs)}")
        out = []
        for name, default in self.defaults:
            value = given.get(name, default)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{kernel}: {name} must be a positive integer, got {value!r}")
            out.append((name, value))
        return tuple(out)


def parse_config(text: str) -> Config:
    """``"block_q=64,block_k=128"`` as pairs; ``ValueError`` names the part that is malformed."""
    pairs = []
    for part in (p.strip() for p in text.split(",")):
        match = _KNOB.match(part)
        if not match or not match.group(2).isdigit():
            raise ValueError(f"malformed config {text!r}: {part!r} is not knob=positive-integer "
                             "(e.g. block_q=64,block_k=128)")
        pairs.append((match.group(1), int(match.group(2))))
    if len({name for name, _ in pairs}) != len(pairs):
        raise ValueError(f"malformed config {text!r}: a knob is named twice")
    return tuple(pairs)


def config_text(config: Config) -> str:
    """``block_q=64,block_k=128``; ``defaults`` for ``()``."""
    return ",".join(f"{name}={value}" for name, value in config) if config else "defaults"


def larger_than_length(config: Config, defaults: Config, lengths: dict[str, int]) -> str | None:
    """Why a candidate is refused for a workload: a tile or chunk (``lengths``: knob -> the length it
    tiles) longer than that length, where the default is not, only pads (or is clamped to the length:
    the same program as a smaller candidate). The default itself is always measured."""
    default = dict(defaults)
    for name, value in config:
        length = lengths.get(name)
        if length is not None and value > max(length, default[name]):
            return (f"{name}={value} is longer than the {length} positions it tiles (and than the default "
                    f"{default[name]}): it would only pad")
    return None


class AttentionImpl(abc.ABC):
    """Base of every kernel: a kernel file subclasses it, sets the declarations and ``attention``.

    Optional hooks a backend reads: ``trace_context(platform)`` (jax), ``compiled_by`` and
    ``evidence_from_ops`` (torch: how we know this kernel ran), ``attention_grads`` (numpy has no
    autodiff).
    """

    name: str  # stable kebab-case registry name
    framework: str  # "numpy" | "jax" | "torch" | "torch_xla"
    # Imports beyond the framework; one a release lacks makes ``check`` refuse, not fail mid-sweep.
    requires_modules: tuple[str, ...] = ()
    # The library's public names the kernel's call uses (``module:attribute``), each with the keywords
    # the call passes. The release matrix reads their presence and signatures in each release
    # (attnbench/releases/api.py): an API change is told from the releases themselves.
    public_calls: dict[str, tuple[str, ...]] = {}
    # The library beyond the framework the kernel comes from ("tokamax"), pinned in the project's venvs:
    # the release matrix varies the framework alone and leaves such kernels out (docs/releases.md).
    library: str = ""
    # Names only the project's way into an interpreter on a CPU uses, never the call on the kernel's
    # own hardware: a release that lacks one breaks the project's adapter, not the kernel.
    interpreter_calls: dict[str, tuple[str, ...]] = {}
    designed_for: frozenset[str] = frozenset()  # platforms the kernel was written for; empty = portable
    is_flash: bool = False  # a tiled online-softmax (FlashAttention-style) kernel
    # What the kernel re-implements in its framework's own ops ("" for a vendor or library kernel):
    # its win or loss is this project's port's, not the original kernel's (the verdict says so).
    reimplements: str = ""
    summary: str = ""
    platform_support: dict[str, PlatformSupport] = {p: RUNS for p in PLATFORMS}
    # Keys of MASK_FEATURES ``attention`` takes; another is refused in one sentence said here
    # (``feature_reason``): "<call_name> takes no <feature>: <feature_notes[feature]>", the note
    # saying only what the call offers instead.
    supports: frozenset[str] = frozenset()
    call_name: str = ""  # the library call a refusal names ("Pallas TPU flash_attention"); the kernel's name
    feature_notes: dict[str, str] = {}
    # How it runs where it runs natively: "compiled" (jit, torch.compile, XLA) or "eager" (op by op).
    executes: str = "compiled"
    # "native": each kv head is read once for its query group; "repeated": kv heads are repeated first;
    # "refused": grouped heads are refused (``shape_reason`` says why).
    gqa: str = "repeated"
    # With "segment_ids" in ``supports``: which segment ids the kernel expresses, of SEGMENT_KINDS.
    segment_kinds: frozenset[str] = frozenset({"documents", "ragged"})
    # The tile knobs the tuner may set (``None``: none) and the config this instance runs at (the
    # registry's instance: ``()``, its defaults; ``with_config`` makes a configured twin).
    search_space: SearchSpace | None = None
    config: Config = ()

    @abc.abstractmethod
    def attention(self, q, k, v, *, causal: bool, scale: float, **mask):
        """``[B, S, H, D]`` arrays -> ``[B, Sq, Hq, D]`` in q's dtype, bottom-right causal."""

    def shape_reason(self, workload: Workload, platform: str) -> str | None:
        """Why this kernel cannot run ``workload`` (shapes, dtype, masking); ``None`` when it can."""
        return None

    def feature_reason(self, workload: Workload) -> str | None:
        """Why this kernel cannot take ``workload``'s mask: the first feature it does not support."""
        for feature in workload.mask_features:
            if feature not in self.supports:
                why = self.feature_notes.get(feature) or "the kernel has no such option"
                return f"{self.call_name or self.name} takes no {MASK_FEATURES[feature]}: {why}"
        return None

    def gqa_mode(self, workload: Workload) -> str | None:
        """How this kernel runs ``workload``'s grouped heads (``None``: not grouped)."""
        return self.gqa if workload.is_gqa else None

    # -- its tile config ---------------------------------------------------------------------
    def knob(self, name: str) -> int:
        """The value of knob ``name`` this instance runs at."""
        return dict(self.config).get(name, dict(self.search_space.defaults)[name])

    def with_config(self, config) -> AttentionImpl:
        """A twin of this kernel running at ``config`` (checked: ``SearchSpace.check``); ``()`` or
        ``None``: this instance. A kernel without knobs refuses any config."""
        if not config:
            return self
        if self.search_space is None:
            raise ValueError(f"{self.name} has no tile knobs to configure")
        twin = copy.copy(self)
        twin.config = self.search_space.check(config, self.name)
        return twin

    @property
    def config_now(self) -> Config:
        """Every knob with the value this instance runs at (``()`` for a kernel without knobs)."""
        return self.search_space.check(self.config, self.name) if self.search_space else ()

    def config_reason(self, config: Config, workload: Workload) -> str | None:
        """Why this kernel does not take ``config`` for ``workload`` (``None``: it does)."""
        return None

    def candidates(self, workload: Workload) -> list[tuple[Config, str | None]]:
        """Every candidate config, each with the reason ``workload`` refuses it (``None``: measured)."""
        if self.search_space is None:
            return []
        return [(c, None if c == self.search_space.defaults else self.config_reason(c, workload))
                for c in self.search_space.candidates]

    # -- what the kernel is -------------------------------------------------------------------
    def label(self, platform: str) -> str:
        """``forced-flash`` when a flash kernel runs off the hardware it was designed for."""
        if self.is_flash and self.designed_for and platform not in self.designed_for:
            return FORCED_FLASH
        return NATIVE

    def execution(self, platform: str) -> str:
        """How this kernel executes on ``platform``: ``interpret`` where it runs only in an
        interpreter there, else ``executes``."""
        return "interpret" if self.platform_support[platform].status == "interpret-only" else self.executes

    def designed_for_text(self) -> str:
        return "/".join(sorted(self.designed_for)) if self.designed_for else "portable"

    # -- its own imports -----------------------------------------------------------------------
    def api_missing(self) -> str | None:
        """Why ``requires_modules`` do not import on this release, or ``None``.

        The import is tried, since a module can exist and fail to import."""
        for module in self.requires_modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # ImportError, or a module that breaks at import on this release
                from importlib import metadata

                version = metadata.version(self.framework.replace("_", "-"))
                return (f"{module} does not import in {self.framework} {version}: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
        return None

    def __repr__(self) -> str:
        config = f" {config_text(self.config)}" if self.config else ""
        return f"<{type(self).__name__} {self.name!r}{config}>"


def top_left_causal_reason(workload: Workload, mask: str, remedy: str = "") -> str | None:
    """The refusal of a kernel whose causal mask is top-left aligned (``mask``: its own test, such as
    ``q_pos >= k_pos``): ours is bottom-right, the same only where ``seq_q == seq_k``; ``None`` there
    or without causal. ``remedy``: what it would take instead."""
    if not workload.causal or workload.seq_q == workload.seq_k:
        return None
    return (f"its causal mask is top-left aligned ({mask}); bottom-right causal with seq_q={workload.seq_q} "
            f"!= seq_k={workload.seq_k} is not what it computes" + (f" ({remedy})" if remedy else ""))


def mask_kwargs(q, k, *, causal: bool, window=None, q_segment_ids=None, kv_segment_ids=None,
                softcap=None) -> dict:
    """The mask features that are set, checked against q and k; ``ValueError`` names what is wrong."""
    mask = {}
    if window is not None:
        if isinstance(window, bool) or int(window) != window or window <= 0:
            raise ValueError(f"window must be a positive integer (keys), got {window!r}")
        if not causal:
            raise ValueError("window needs causal=True: a sliding window is the last W keys up to the query")
        mask["window"] = int(window)
    if softcap is not None:
        if isinstance(softcap, bool) or not np.isfinite(softcap) or softcap <= 0:
            raise ValueError(f"softcap must be a positive number, got {softcap!r}")
        mask["softcap"] = float(softcap)
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("q_segment_ids and kv_segment_ids go together: pass both or neither")
    if q_segment_ids is not None:
        q_ids, kv_ids = np.asarray(q_segment_ids), np.asarray(kv_segment_ids)
        for label, ids, x in (("q_segment_ids", q_ids, q), ("kv_segment_ids", kv_ids, k)):
            if ids.shape != x.shape[:2] or ids.dtype.kind not in "iu":
                raise ValueError(f"{label} must be an integer array [B, S] = {x.shape[:2]}, "
                                 f"got {ids.dtype} {ids.shape}")

        empty = empty_rows(q.shape[1], k.shape[1], causal=causal, window=mask.get("window"),
                           q_segment_ids=q_ids, kv_segment_ids=kv_ids)
        if empty:
            raise ValueError(f"the mask leaves {empty} query row(s) with no visible key: their softmax "
                             "is undefined and kernels disagree on it (0, NaN, mean of V)")
        mask["q_segment_ids"], mask["kv_segment_ids"] = q_ids.astype(np.int32), kv_ids.astype(np.int32)
    return mask


def workload_of(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool, mode: str = "fwd",
                window=None, softcap=None, q_segment_ids=None, kv_segment_ids=None) -> Workload:
    """The workload that numpy inputs describe; shape mismatches raise ``ValueError``.

    Segment ids count as ``documents`` when Sq == Sk, else as a ``ragged`` cache.
    """
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be [B, S, H, D]; got shapes {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must agree on batch and head_dim; got {q.shape} and {k.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    segments = {}
    if q_segment_ids is not None:
        if q.shape[1] == k.shape[1]:
            segments["documents"] = min(q.shape[1], max(1, len(np.unique(q_segment_ids))))
        else:
            segments["ragged"] = True
    return Workload(batch=q.shape[0], seq_q=q.shape[1], q_heads=q.shape[2], head_dim=q.shape[3],
                    seq_k=k.shape[1], kv_heads=k.shape[2], dtype=str(q.dtype), causal=causal, mode=mode,
                    window=window, softcap=softcap, **segments)


def static_mask(workload: Workload) -> dict:
    """The mask features a kernel takes as Python values (traced as constants): window, softcap."""
    return {name: value for name, value in (("window", workload.window), ("softcap", workload.softcap))
            if value is not None}


def mask_call(static: dict, arrays: tuple) -> dict:
    """``attention``'s mask keywords from the static features and the placed segment-id arrays."""
    mask = dict(static)
    if arrays:
        mask["q_segment_ids"], mask["kv_segment_ids"] = arrays
    return mask


def default_scale(head_dim: int, scale: float | None) -> float:
    return float(scale) if scale is not None else 1.0 / float(np.sqrt(head_dim))
