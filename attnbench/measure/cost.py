"""What a step costs, from its time and the price of the hardware it ran on.

A :class:`Pricing` is USD per hour for everything the run is charged for: an accelerator profile's
chip-hour price times ``chips`` (default 1: a step runs on one device), a CPU profile's vCPU-hour
price times the cores charged. User overrides are USD per hour for the whole charged device, used as
given, each replacing only its own price. No known price gives ``None`` costs and a ``cost_note``:
never a made-up price.

Every price says what it buys (``Pricing.kind``: ``instance``, the accelerator with its host, or
``accelerator``, the chip alone; ``hardware.PRICE_KINDS``): a user's price comes with its kind, the
catalog's is an instance's, a profile's is its ``price.kind``. One record's two markets are one kind:
a spot price of another kind than the on-demand one is left out, with a note.

On a fleet run SkyPilot's catalog price (``attnbench/hardware/catalog_prices.py``) comes before the profile,
unless it fails a guard; the ``cost_note`` says which and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from attnbench.hardware import Device, HardwareProfile, get_hardware_profile, match_hardware_profile
from attnbench.hardware.catalog_prices import catalog_prices_for
from attnbench.hardware.hardware_profiles import PRICE_KINDS

SECONDS_PER_HOUR = 3600.0
BUYS = {"instance": "a whole instance", "accelerator": "the accelerator alone"}  # what a price kind buys


@dataclass(frozen=True)
class Pricing:
    device_name: str
    on_demand_usd_per_hour: float | None  # for the whole charged device (chips x or cores x unit price)
    spot_usd_per_hour: float | None
    units: float | None  # chips or vCPUs the profile's unit price is multiplied by (None: no profile)
    unit: str | None  # "chip-hour" | "vcpu-hour" | None
    hardware_profile: str | None  # the hardware profile used, if any
    source: str  # where each price comes from
    note: str | None = None  # why a price is missing, if one is
    kind: str | None = None  # what the prices buy: "instance" | "accelerator" (None: no price)

    @property
    def known(self) -> bool:
        return self.on_demand_usd_per_hour is not None or self.spot_usd_per_hour is not None


def _check_price(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (USD per hour), got {value!r}")
    return float(value)


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def unknown_price_note(device_name: str) -> str:
    return f"unknown: no price for {device_name}; pass --hardware-profile or --price-per-hour"


def check_price_kind(price_per_hour, spot_price_per_hour, price_kind) -> None:
    """``ValueError`` for a user's price without its kind (or an unknown kind): what it buys decides
    what it can be compared with."""
    if price_kind is not None and price_kind not in PRICE_KINDS:
        raise ValueError(f"--price-kind must be one of {', '.join(PRICE_KINDS)}, got {price_kind!r}")
    given = [name for name, value in (("--price-per-hour", price_per_hour),
                                      ("--spot-price-per-hour", spot_price_per_hour)) if value is not None]
    if given and price_kind is None:
        raise ValueError(f"{given[0]} needs --price-kind: instance (the accelerator with its host) or "
                         "accelerator (the chip alone)")


def pricing_for(device: Device, hardware_profile: str | None = None, price_per_hour: float | None = None,
                spot_price_per_hour: float | None = None, *, price_kind: str | None = None,
                cores: int | None = None, chips: int = 1,
                hardware_profiles: Mapping[str, HardwareProfile] | None = None) -> Pricing:
    """Prices for ``device`` from the named or matched hardware profile, with the user's overrides
    (``price_kind``: what they buy, required with them).

    ``cores``: vCPUs charged (pass the run's pinned thread count; default ``device.host_cores``).
    An unknown ``hardware_profile`` raises ``KeyError`` listing the known names.
    """
    price_per_hour = _check_price("price_per_hour", price_per_hour)
    spot_price_per_hour = _check_price("spot_price_per_hour", spot_price_per_hour)
    check_price_kind(price_per_hour, spot_price_per_hour, price_kind)
    chips = _check_count("chips", chips)
    cores = _check_count("cores", device.host_cores if cores is None else cores)
    profile = (get_hardware_profile(hardware_profile, hardware_profiles) if hardware_profile
               else match_hardware_profile(device, hardware_profiles))

    # Precedence: user override, then the fleet's catalog price, then the profile.
    catalog = catalog_prices_for(device, chips=chips) or {}
    units = unit = None
    if profile is not None:
        unit = profile.price_unit
        units = float(cores if unit == "vcpu-hour" else chips)
    elif catalog:
        unit, units = "chip-hour", float(chips)

    def price(override: float | None, entry, label: str) -> tuple[float | None, str, str | None]:
        if override is not None:
            return override, f"{label}: user override {override:g} USD/h for the whole device", price_kind
        key = "on_demand" if label == "on-demand" else "spot"
        if catalog.get(key) is not None:  # a whole machine's price, per chip
            return catalog[key], catalog[f"{key}_source"], "instance"
        if entry is not None:
            return entry.value * units, (f"{label}: profile {profile.name} {entry.value:g} USD/{unit} x "
                                         f"{units:g} ({entry.source}, {entry.date.isoformat()})"), \
                profile.price_kind
        return None, f"{label}: none", None

    on_demand, src_od, kind = price(price_per_hour, profile and profile.price_on_demand, "on-demand")
    spot, src_spot, spot_kind = price(spot_price_per_hour, profile and profile.price_spot, "spot")
    mixed = None
    if on_demand is None:
        kind = spot_kind
    elif spot is not None and spot_kind != kind:  # one record, one kind: never a ratio across two
        mixed = f"spot price left out: it buys {BUYS[spot_kind]}, the on-demand price {BUYS[kind]}"
        spot, src_spot = None, f"spot: none (the {spot_kind} price left out)"

    note = None
    if on_demand is None and spot is None:
        note = unknown_price_note(device.name)
    elif on_demand is None:
        note = f"no on-demand price for {device.name}; pass --price-per-hour"
    elif spot is None:
        where = f" in profile {profile.name}" if profile is not None and price_per_hour is None else ""
        note = f"no spot price for {device.name}{where}; pass --spot-price-per-hour"
    if mixed:
        note = "; ".join(filter(None, [mixed, note]))
    if catalog.get("notes"):  # the catalog's quirks (placeholder, blank spot, spot above on-demand)
        note = "; ".join([*catalog["notes"], *([note] if note else [])])
    return Pricing(device_name=device.name, on_demand_usd_per_hour=on_demand, spot_usd_per_hour=spot,
                   units=units, unit=unit, hardware_profile=profile.name if profile else None,
                   source=f"{src_od}; {src_spot}", note=note, kind=kind)


def cost_per_step(seconds_per_step: float | None, pricing: Pricing,
                  tokens_per_step: float | None = None) -> dict:
    """USD per step and per million tokens, on demand and spot; what a missing price, time or token
    count prevents is ``None``, and ``cost_note`` says why."""
    notes = [pricing.note] if pricing.note else []
    seconds = seconds_per_step
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not math.isfinite(seconds) or seconds < 0):
        seconds = None
    if seconds is None:
        notes.append(f"no time per step ({seconds_per_step!r})")
    if tokens_per_step is not None:  # a mean over a stream's steps need not be whole
        if (isinstance(tokens_per_step, bool) or not isinstance(tokens_per_step, (int, float))
                or not math.isfinite(tokens_per_step) or tokens_per_step <= 0):
            raise ValueError(f"tokens_per_step must be a positive number, got {tokens_per_step!r}")

    def per_step(usd_per_hour: float | None) -> float | None:
        if usd_per_hour is None or seconds is None:
            return None
        return usd_per_hour / SECONDS_PER_HOUR * seconds

    def per_million(usd: float | None) -> float | None:
        if usd is None or tokens_per_step is None:
            return None
        return usd / tokens_per_step * 1e6

    step_od = per_step(pricing.on_demand_usd_per_hour)
    step_spot = per_step(pricing.spot_usd_per_hour)
    return {
        "usd_per_hour_on_demand": pricing.on_demand_usd_per_hour,
        "usd_per_hour_spot": pricing.spot_usd_per_hour,
        "usd_per_step_on_demand": step_od,
        "usd_per_step_spot": step_spot,
        "usd_per_million_tokens_on_demand": per_million(step_od),
        "usd_per_million_tokens_spot": per_million(step_spot),
        "price_source": pricing.source,
        "price_kind": pricing.kind,
        "cost_note": "; ".join(notes) if notes else None,
    }
