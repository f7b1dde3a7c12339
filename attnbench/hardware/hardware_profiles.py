"""Hardware profiles: what a chip can do (spec sheet) and what an hour of it costs.

A *hardware profile* is one table of ``hardware_profiles.toml`` (packaged, or the user's own file of
the same schema), every number with its source and date; not the asv suite's size profile. The schema
*is* the dataclasses below (:func:`_from_toml` builds them by their type hints); a failure names the
file, the profile, the field and the problem.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

from attnbench.core.errors import UnknownName
from attnbench.hardware.detection import Device
from attnbench.hardware.dtypes import PeakDtype, canonical_dtype

Kind = Literal["cpu", "gpu", "tpu"]
PriceUnit = Literal["chip-hour", "vcpu-hour"]
# What a price buys: a whole instance (the accelerator with its host VM, as a TPU VM, a Lambda GPU
# instance or a cloud vCPU is sold) or the accelerator alone (GCP's GPU rows, without the VM). Two
# kinds differ by the host's share, so a cost compared across machines is one kind or says so.
PriceKind = Literal["instance", "accelerator"]
PRICE_KINDS: tuple[str, ...] = get_args(PriceKind)
KINDS: tuple[str, ...] = get_args(Kind)
PRICE_UNITS: dict[str, str] = {"cpu": "vcpu-hour", "gpu": "chip-hour", "tpu": "chip-hour"}
PACKAGED_FILE = "hardware_profiles.toml"  # beside this module


class _Invalid(ValueError):
    """A field of a table is wrong: ``field`` is its dotted path within the profile."""

    def __init__(self, field: str, problem: str):
        super().__init__(field, problem)
        self.field, self.problem = field, problem


# -- checks fields declare in their metadata: value -> the problem, or None ----------------------
def _positive_finite(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else f"must be a positive finite number, got {value!r}"


def _not_blank(text: str) -> str | None:
    return None if text.strip() else "is missing or empty: every number needs its source"


def _regexes(patterns: tuple[str, ...]) -> str | None:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"bad regex {pattern!r}: {exc}"
    return None


@dataclass(frozen=True)
class Sourced:
    """A number, where it comes from, and when it was read: ``{value, source, date}`` in the file."""

    value: float = field(metadata={"check": _positive_finite})
    source: str = field(metadata={"check": _not_blank,
                                  "missing": "is missing or empty: every number needs its source"})
    date: datetime.date = field(metadata={"missing": "is missing or not a date (YYYY-MM-DD)"})

    def __post_init__(self):
        object.__setattr__(self, "source", self.source.strip())


@dataclass(frozen=True)
class Prices:
    """USD per the profile's ``price_unit``: ``price.on_demand`` and ``price.spot``, and ``price.kind``:
    what both buy (``PriceKind``), required with a price."""

    on_demand: Sourced | None = None
    spot: Sourced | None = None
    kind: PriceKind | None = None

    def __post_init__(self):
        if self.spot is not None and self.on_demand is None:
            raise _Invalid("on_demand", "is missing while price.spot is given")
        if self.on_demand is not None and self.kind is None:
            raise _Invalid("kind", f"is missing: say what the price buys, one of {list(PRICE_KINDS)} "
                                   "(a whole instance, or the accelerator without its host)")


@dataclass(frozen=True)
class HardwareProfile:
    """One table of the file; its table name is ``name``. See the file's header for each field."""

    name: str = field(metadata={"toml": False})  # the table's name, not a key of it
    kind: Kind
    match: tuple[str, ...] = field(metadata={"check": _regexes})
    label: str = ""  # default: the name
    price_unit: PriceUnit | None = None  # default: the kind's (chip-hour for gpu/tpu, vcpu-hour for cpu)
    peak_tflops: dict[PeakDtype, Sourced] = field(default_factory=dict)
    hbm_gb: Sourced | None = None
    hbm_tb_s: Sourced | None = None
    price: Prices = field(default_factory=Prices)
    notes: str = ""

    def __post_init__(self):
        unit = PRICE_UNITS[self.kind]
        if self.price_unit not in (None, unit):
            raise _Invalid("price_unit", f"must be {unit!r} for kind {self.kind!r}, got {self.price_unit!r}")
        if self.kind == "cpu" and self.peak_tflops:
            raise _Invalid("peak_tflops", "a cpu profile has no peak: a CPU's peak comes from the GEMM probe")
        object.__setattr__(self, "price_unit", unit)
        object.__setattr__(self, "label", self.label or self.name)

    @property
    def price_on_demand(self) -> Sourced | None:
        return self.price.on_demand

    @property
    def price_spot(self) -> Sourced | None:
        return self.price.spot

    @property
    def price_kind(self) -> str | None:
        return self.price.kind

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


# ------------------------------------------------------------------- TOML -> the dataclasses
def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _from_toml(cls, raw, path: str = "", **given):
    """``cls`` built from the TOML table ``raw`` at ``path``; ``given`` are fields not read from it."""
    fields = [f for f in dataclasses.fields(cls) if f.metadata.get("toml", True)]
    known = [f.name for f in fields]
    if not isinstance(raw, dict):
        raise _Invalid(path, f"must be a table {{{', '.join(known)}}}, got {raw!r}")
    unknown = sorted(set(raw) - set(known))
    if unknown:  # named by the table it is in; a profile's own unknown key by itself
        if path:
            raise _Invalid(path, f"unknown keys {unknown}; expected {', '.join(known)}")
        raise _Invalid(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
    hints = typing.get_type_hints(cls)
    values = dict(given)
    for f in fields:
        where = _join(path, f.name)
        if f.name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _Invalid(where, f.metadata.get("missing", "is missing"))
            continue
        value = _convert(hints[f.name], raw[f.name], where)
        check = f.metadata.get("check")
        problem = check(value) if check else None
        if problem:
            raise _Invalid(where, problem)
        values[f.name] = value
    try:
        return cls(**values)
    except _Invalid as exc:  # a cross-field check of __post_init__, relative to this table
        raise _Invalid(_join(path, exc.field), exc.problem) from None


def _convert(hint, raw, path: str):
    """``raw`` (a TOML value) as ``hint`` says, or ``_Invalid`` naming ``path``."""
    origin, args = typing.get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: TOML has no null, so it is X
        (hint,) = [a for a in args if a is not type(None)]
        return _convert(hint, raw, path)
    if dataclasses.is_dataclass(hint):
        return _from_toml(hint, raw, path)
    if origin is Literal:
        if raw not in args:
            raise _Invalid(path, f"must be one of {list(args)}, got {raw!r}")
        return raw
    if origin is tuple:  # tuple[X, ...]: a TOML array
        if not isinstance(raw, list):
            raise _Invalid(path, f"must be a list, got {raw!r}")
        try:
            return tuple(_convert(args[0], item, path) for item in raw)
        except _Invalid as exc:
            raise _Invalid(path, f"must be a list of {args[0].__name__}: {exc.problem}") from None
    if origin is dict:  # dict[K, V]: a TOML table whose keys K allows
        if not isinstance(raw, dict):
            raise _Invalid(path, f"must be a table, got {raw!r}")
        keys = get_args(args[0]) if typing.get_origin(args[0]) is Literal else None
        out = {}
        for key, value in raw.items():
            if keys is not None and key not in keys:
                raise _Invalid(_join(path, key), f"unknown key; expected one of {list(keys)}")
            out[key] = _convert(args[1], value, _join(path, key))
        return out
    if hint is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise _Invalid(path, f"must be a number, got {raw!r}")
        return float(raw)
    if hint is str:
        if not isinstance(raw, str):
            raise _Invalid(path, f"must be a string, got {raw!r}")
        return raw
    if hint is datetime.date:
        if isinstance(raw, str):
            try:
                raw = datetime.date.fromisoformat(raw)
            except ValueError:
                raise _Invalid(path, f"must be a date (YYYY-MM-DD), got {raw!r}") from None
        if isinstance(raw, datetime.datetime):
            raw = raw.date()
        if not isinstance(raw, datetime.date):
            raise _Invalid(path, f"must be a date (YYYY-MM-DD), got {raw!r}")
        return raw
    raise TypeError(f"no TOML conversion for {hint!r}")  # a schema bug, not a file's


def load_hardware_profiles(path: str | os.PathLike | None = None) -> dict[str, HardwareProfile]:
    """Hardware profiles by name, in file order (``path=None``: the packaged file). Raises
    ``ValueError`` naming the file, the profile and the field for anything malformed."""
    if path is None:
        where = f"attnbench/hardware/{PACKAGED_FILE}"
        data = resources.files("attnbench.hardware").joinpath(PACKAGED_FILE).read_bytes()
    else:
        where = str(path)
        data = Path(path).read_bytes()
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: not valid TOML: {exc}") from None
    if not raw:
        raise ValueError(f"{where}: no hardware profiles")
    profiles = {}
    for name, table in raw.items():
        try:
            profiles[name] = _from_toml(HardwareProfile, table, name=name)
        except _Invalid as exc:
            at = f"field {exc.field!r}: " if exc.field else ""
            raise ValueError(f"{where}: profile {name!r}: {at}{exc.problem}") from None
    return profiles


def get_hardware_profile(name: str, profiles: Mapping[str, HardwareProfile] | None = None
                         ) -> HardwareProfile:
    """The profile called ``name`` (case-insensitive); ``KeyError`` listing the known names."""
    profiles = load_hardware_profiles() if profiles is None else profiles
    if name in profiles:
        return profiles[name]
    folded = {k.lower(): v for k, v in profiles.items()}
    if name.lower() in folded:
        return folded[name.lower()]
    raise UnknownName(f"unknown hardware profile {name!r}; known: {', '.join(profiles)}")


def match_hardware_profile(device: Device, profiles: Mapping[str, HardwareProfile] | None = None
                           ) -> HardwareProfile | None:
    """The profile of ``device``'s kind whose pattern matches its name (longest match, then file order)."""
    profiles = load_hardware_profiles() if profiles is None else profiles
    best, best_len = None, -1
    for profile in profiles.values():
        if profile.kind != device.platform:
            continue
        length = profile.match_length(device.name)
        if length is not None and length > best_len:
            best, best_len = profile, length
    return best
