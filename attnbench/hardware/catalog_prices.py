"""USD per hour from SkyPilot's price catalog, for the cloud/region a fleet job runs in.

``lookup`` asks SkyPilot for the price, then reads the same CSV cells to guard against the
catalog's quirks, each named in ``notes`` rather than turned into a silent figure: SkyPilot's
``700.0`` placeholder (no published TPU v6e price), a blank spot cell (SkyPilot would silently
return the on-demand price), spot above on-demand. A guarded price is ``None``, and
``attnbench.measure.cost.pricing_for`` falls back to the hardware profile.

Import SkyPilot only after ``SKY_RUNTIME_DIR`` is set: it fixes its catalog folder at import.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field

# Imported where used: pandas (the torch_xla venv has no report libraries); sky (the fleet extra).

CATALOG_PRICE_ENV = "ATTNBENCH_CATALOG_PRICE"
PLACEHOLDER_PRICES = (700.0,)  # sky/catalog/data_fetchers/fetch_gcp.py: TPU_V6E_MAX_PRICE
MARKETS = ("spot", "on-demand")


@dataclass(frozen=True)
class CatalogPrice:
    """The catalog's hourly price of one machine, for the whole machine (host + accelerators)."""

    cloud: str
    region: str | None
    zone: str | None
    instance_type: str | None
    accelerator: str
    accelerator_count: int
    chips: int  # accelerator chips on the machine (a TPU v4/v5p slice name counts TensorCores: 2 per chip)
    market: str  # what the run is billed at: "spot" or "on-demand"
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    catalog_file: str  # e.g. "gcp/vms.csv"
    catalog_sha256: str
    catalog_date: str  # ISO date-time (UTC) of the file: when it was downloaded or copied
    catalog_origin: str  # "downloaded by SkyPilot" | "pinned or hand-edited (no .meta md5)"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def platform(self) -> str:
        return "tpu" if self.accelerator.lower().startswith("tpu-") else "gpu"

    def per_chip(self, usd_per_hour: float | None) -> float | None:
        return None if usd_per_hour is None else usd_per_hour / self.chips

    def describe(self) -> str:
        """Where the price is from, in one line (the record's ``price_source`` quotes it)."""
        where = "/".join(x for x in (self.cloud, self.region, self.zone) if x)
        return (f"SkyPilot catalog {self.catalog_file} (sha256 {self.catalog_sha256[:12]}, "
                f"{self.catalog_date[:10]}, {self.catalog_origin}) {where} "
                f"{self.instance_type or '-'} {self.accelerator}:{self.accelerator_count}, "
                f"{self.chips} chips, billed {self.market}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> CatalogPrice:
        try:
            data = json.loads(text)
            data["notes"] = tuple(data.get("notes") or ())
            price = cls(**data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{source}: not a catalog price file ({exc})") from None
        for name in ("on_demand_usd_per_hour", "spot_usd_per_hour"):
            value = getattr(price, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"{source}: {name} must be a finite number >= 0 or null, got {value!r}")
        if price.market not in MARKETS:
            raise ValueError(f"{source}: market must be one of {MARKETS}, got {price.market!r}")
        if not isinstance(price.chips, int) or price.chips <= 0:
            raise ValueError(f"{source}: chips must be a positive integer, got {price.chips!r}")
        return price


def tpu_chips(accelerator: str) -> int | None:
    """Chips in a TPU slice name: v5e/v6e suffixes count chips, v2-v5p count TensorCores (2 a chip)."""
    name = accelerator.lower()
    if not name.startswith("tpu-"):
        return None
    try:
        size = int(name.rsplit("-", 1)[1])
    except ValueError:
        return None
    return size if ("v5litepod" in name or "v6e" in name) else max(1, size // 2)


def file_provenance(path: str) -> dict:
    """sha256, date and origin of a catalog CSV (SkyPilot stores the md5 of what it downloaded)."""
    data = open(path, "rb").read()
    sha = hashlib.sha256(data).hexdigest()
    mtime = dt.datetime.fromtimestamp(os.path.getmtime(path), dt.UTC).isoformat(timespec="seconds")
    folder, name = os.path.split(path)
    cloud_dir, cloud = os.path.split(folder)
    md5_file = os.path.join(cloud_dir, ".meta", cloud, name + ".md5")
    origin = "pinned or hand-edited (no .meta md5)"
    if os.path.exists(md5_file):
        recorded = open(md5_file, encoding="utf-8").read().strip()
        origin = ("downloaded by SkyPilot" if recorded == hashlib.md5(data, usedforsecurity=False).hexdigest()
                  else "hand-edited after download (md5 differs)")
    return {"catalog_sha256": sha, "catalog_date": mtime, "catalog_origin": origin}


def _num(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _rows(frame, **match):
    out = frame
    for column, value in match.items():
        if value is None:
            continue
        if column in ("AcceleratorName", "Region"):
            out = out[out[column].astype(str).str.lower() == str(value).lower()]
        else:
            out = out[out[column] == value]
    return out


def _guard(label: str, values: list[float | None], what: str, notes: list[str]) -> bool:
    """False (with a note) when a raw catalog cell behind a price is blank or a placeholder."""
    if any(v is None for v in values):
        notes.append(f"catalog has no {label} price for {what} (blank cell): not priced from the catalog")
        return False
    placeholders = [v for v in values if v in PLACEHOLDER_PRICES]
    if placeholders:
        notes.append(f"catalog {label} price for {what} is {placeholders[0]:g}, SkyPilot's placeholder for a "
                     "price GCP does not publish (fetch_gcp TPU_V6E_MAX_PRICE): not a price, not used")
        return False
    return True


def lookup(accelerator: str, count: int, cloud: str, region: str | None = None, zone: str | None = None,
           market: str = "spot", instance_type: str | None = None) -> CatalogPrice:
    """On-demand and spot USD/h of the machine SkyPilot would launch (cheapest region when none).

    Raises ``ValueError`` when the catalog has no such offer.
    """
    import sky
    from sky.catalog import common as catalog_common
    from sky.utils import registry, resources_utils

    if market not in MARKETS:
        raise ValueError(f"market must be one of {MARKETS}, got {market!r}")
    cloud_obj = registry.CLOUD_REGISTRY.from_str(cloud)
    canonical = str(cloud_obj).lower()
    notes: list[str] = []

    if instance_type is None:
        infra = "/".join(x for x in (canonical, region, zone) if x)
        request = sky.Resources(infra=infra, accelerators={accelerator: count})
        feasible = cloud_obj.get_feasible_launchable_resources(request, 1)
        if not feasible.resources_list:
            fuzzy = sorted(feasible.fuzzy_candidate_list)
            hint = f" Did you mean: {fuzzy}" if fuzzy else ""
            raise ValueError(f"No resource satisfying {request.repr_with_region_zone} in the {canonical} "
                             f"catalog.{hint}")
        instance_type = feasible.resources_list[0].instance_type
    if region is None:  # the cheapest region offering it, on the billed market, as SkyPilot would pick
        base = sky.Resources(infra=canonical, instance_type=instance_type, accelerators={accelerator: count},
                             use_spot=market == "spot")
        options = resources_utils.make_launchables_for_valid_region_zones(base)
        if not options:
            raise ValueError(f"{canonical} catalog offers {accelerator}:{count} on {instance_type} in no "
                             f"region on the {market} market")
        best = min(options, key=lambda r: r.get_cost(3600))
        region = best.region

    catalog_file = f"{canonical}/vms.csv"
    path = catalog_common.get_catalog_path(catalog_file)
    import pandas as pd

    frame = pd.read_csv(path)
    what = f"{accelerator}:{count} on {instance_type} in {canonical} {region}"

    def sky_price(use_spot: bool) -> float | None:
        total = cloud_obj.instance_type_to_hourly_cost(instance_type, use_spot, region, zone)
        total += cloud_obj.accelerators_to_hourly_cost({accelerator: count}, use_spot, region, zone)
        return float(total)

    # The raw cells behind each price: the host row (GCP, AWS; a TPU VM's host is free) and, where the
    # catalog prices accelerators apart (GCP), the accelerator row.
    raw: dict[str, list[float | None]] = {"Price": [], "SpotPrice": []}
    host = _rows(frame, InstanceType=instance_type, Region=region, AvailabilityZone=zone) \
        if instance_type != "TPU-VM" else frame.iloc[0:0]
    if instance_type != "TPU-VM" and host.empty:
        raise ValueError(f"{catalog_file} has no row for {instance_type} in {region}")
    acc = frame.iloc[0:0]
    if canonical == "gcp":
        acc = _rows(frame[frame["InstanceType"].isna()], AcceleratorName=accelerator, AcceleratorCount=count,
                    Region=region, AvailabilityZone=zone)
        if acc.empty:
            raise ValueError(f"{catalog_file} has no {accelerator}:{count} row in {region}")
    for column in raw:
        for part in (host, acc):
            if not part.empty:
                values = [_num(v) for v in part[column]]
                # SkyPilot takes the cheapest zone of the region; the guard reads that same cell
                priced = [v for v in values if v is not None]
                raw[column].append(min(priced) if priced else None)

    on_demand = sky_price(False) if _guard("on-demand", raw["Price"], what, notes) else None
    spot = None
    if _guard("spot", raw["SpotPrice"], what, notes):
        spot = sky_price(True)
        if on_demand is not None and spot > on_demand:
            notes.append(f"catalog spot price {spot:g} USD/h for {what} is above its on-demand price "
                         f"{on_demand:g}: not used")
            spot = None
        elif on_demand is not None and spot == on_demand:
            notes.append(f"catalog spot price for {what} equals its on-demand price ({spot:g} USD/h)")
    if market == "spot" and spot is None:
        notes.append(f"the run is billed spot but the catalog gives no usable spot price for {what}")

    chips = tpu_chips(accelerator) or int(count)
    return CatalogPrice(cloud=canonical, region=region, zone=zone, instance_type=instance_type,
                        accelerator=accelerator, accelerator_count=int(count), chips=chips, market=market,
                        on_demand_usd_per_hour=on_demand, spot_usd_per_hour=spot, catalog_file=catalog_file,
                        **file_provenance(path), notes=tuple(notes))


# -- the record's side: read by attnbench.measure.cost.pricing_for, never imports SkyPilot ----------------

def from_env() -> CatalogPrice | None:
    """The catalog price the fleet run handed to this process (``ATTNBENCH_CATALOG_PRICE``), if any."""
    path = os.environ.get(CATALOG_PRICE_ENV)
    if not path:
        return None
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise ValueError(f"{CATALOG_PRICE_ENV}={path}: cannot read it ({exc})") from None
    return CatalogPrice.from_json(text, source=path)


def catalog_prices_for(device, chips: int = 1) -> dict | None:
    """Catalog prices for ``device`` (per-chip x ``chips``), sources and notes, for ``pricing_for``.

    ``None`` without a handed-over price or for another platform (a CPU case keeps its CPU profile).
    """
    price = from_env()
    if price is None or device.platform != price.platform:
        return None
    per_chip_od = price.per_chip(price.on_demand_usd_per_hour)
    per_chip_spot = price.per_chip(price.spot_usd_per_hour)

    def source(label, machine, per_chip):
        if per_chip is None:
            return None
        return (f"{label}: {price.describe()}: {machine:g} USD/h / {price.chips} chips = {per_chip:g} "
                f"USD/chip-hour x {chips}")

    return {"on_demand": None if per_chip_od is None else per_chip_od * chips,
            "spot": None if per_chip_spot is None else per_chip_spot * chips,
            "on_demand_source": source("on-demand", price.on_demand_usd_per_hour, per_chip_od),
            "spot_source": source("spot", price.spot_usd_per_hour, per_chip_spot),
            "notes": list(price.notes), "describe": price.describe()}
