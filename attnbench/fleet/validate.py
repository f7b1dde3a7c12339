"""Validate a fleet task file offline: SkyPilot's own schema, then a feasible, priced option.

SkyPilot's client accepts unknown ``job_recovery`` keys (its server checks them later, after a
controller is up), so that schema is applied strictly here. ``from_yaml`` accepts any accelerator
name, so each ``resources`` entry is asked of its cloud as the optimizer would ask it, and priced.
Offline, a cloud with no catalog file here is reported as not checked, never downloaded. Import
SkyPilot only after ``SKY_RUNTIME_DIR`` is set.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.fleet import BUCKET_MOUNT, KINDS
from attnbench.hardware import catalog_prices as prices

# Imported where used: pandas (the torch_xla venv has no report libraries); sky (the fleet extra).

REQUIRED_ENVS = ("ACCEL", "ATTNBENCH_MACHINE", "ATTNBENCH_FLEET_KIND", "ATTNBENCH_MARKET", "COMMIT", "BUCKET")
ACCELS = ("tpu", "cuda")


class TaskInvalid(ValueError):
    """A task file the fleet cannot launch; the message names the file and the field."""


@dataclass(frozen=True)
class Option:
    """One launchable, priced place for a task: the catalog's USD/h for the whole machine."""

    cloud: str
    region: str
    instance_type: str | None
    accelerator: str
    count: int
    market: str
    on_demand_usd_per_hour: float | None
    spot_usd_per_hour: float | None
    chips: int
    notes: tuple[str, ...] = ()

    @property
    def billed_usd_per_hour(self) -> float | None:
        return self.spot_usd_per_hour if self.market == "spot" else self.on_demand_usd_per_hour


@dataclass
class TaskReport:
    path: Path
    kind: str
    machine: str
    accel: str
    market: str
    options: list[Option] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # why an alternative was not checked here
    infeasible: list[str] = field(default_factory=list)  # SkyPilot's words for an alternative with no offer

    @property
    def cheapest(self) -> Option | None:
        priced = [o for o in self.options if o.billed_usd_per_hour is not None]
        return min(priced, key=lambda o: o.billed_usd_per_hour) if priced else None


def _fail(path, message) -> TaskInvalid:
    return TaskInvalid(f"{path}: {message}")


def check_job_recovery(path, value) -> None:
    """SkyPilot's job_recovery schema applied strictly, and its strategy registry."""
    from sky.utils import common_utils, registry, schemas

    if value is None:
        raise _fail(path, "resources.job_recovery is missing: a spot job would not be relaunched "
                          "after a preemption")
    if isinstance(value, str):
        value = {"strategy": value}
    schema = copy.deepcopy(schemas.get_resources_schema()["properties"]["job_recovery"]["anyOf"][1])
    schema["additionalProperties"] = False
    try:
        common_utils.validate_schema(value, schema, "Invalid resources YAML: job_recovery: ")
        strategy = value.get("strategy")
        if strategy is not None:
            import sky.jobs.recovery_strategy  # noqa: F401  (registers the strategies)

            registry.JOBS_RECOVERY_STRATEGY_REGISTRY.from_str(strategy)
    except ValueError as exc:
        raise _fail(path, f"resources.job_recovery: {exc}") from None


def _catalog_file(cloud_name: str) -> str:
    from sky.catalog import common as catalog_common

    return catalog_common.get_catalog_path(f"{cloud_name}/vms.csv")


def _close_names(cloud_name: str, name: str) -> list[str]:
    """Catalog names close to ``name`` when it is a typo; none for a real one this cloud lacks
    (an H200 is no misspelt H100)."""
    import pandas as pd

    names = set(pd.read_csv(_catalog_file(cloud_name))["AcceleratorName"].dropna().astype(str))
    common = _catalog_file("common").replace("vms.csv", "accelerators.csv")
    if os.path.exists(common):
        names |= set(pd.read_csv(common)["AcceleratorName"].dropna().astype(str))
    family = re.sub(r"-\d+$", "", name) if name.lower().startswith("tpu-") else name
    if {name.lower(), family.lower()} & {n.lower() for n in names}:
        return []
    return difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.5)


def _resource_entries(config: dict) -> list[dict]:
    """The raw resources dicts (top level merged into each any_of/ordered entry)."""
    resources = dict(config.get("resources") or {})
    alternatives = resources.pop("any_of", None) or resources.pop("ordered", None)
    if not alternatives:
        return [resources]
    return [{**resources, **alt} for alt in alternatives]


def validate_task(path: str | os.PathLike, offline: bool = True) -> TaskReport:
    """Validate ``path``; ``offline``: never download a catalog."""
    import sky
    from sky.utils import resources_utils, yaml_utils


    path = Path(path)
    try:
        task = sky.Task.from_yaml(str(path))
    except Exception as exc:  # SkyPilot's own message, naming the field
        raise _fail(path, f"{type(exc).__name__}: {exc}") from None
    config = yaml_utils.safe_load(path.read_text())
    entries = _resource_entries(config)
    for entry in entries:
        if "use_spot" not in entry:
            raise _fail(path, "resources.use_spot is not written out: say true (spot) or false")
        check_job_recovery(path, entry.get("job_recovery"))

    envs = task.envs
    missing = [name for name in REQUIRED_ENVS if name not in envs]
    if missing:
        raise _fail(path, f"envs: missing {', '.join(missing)} (the fleet's run script reads them)")
    if envs["ACCEL"] not in ACCELS:
        raise _fail(path, f"envs.ACCEL must be one of {ACCELS} (the Makefile's accelerator builds), "
                          f"got {envs['ACCEL']!r}")
    kind_name = envs["ATTNBENCH_FLEET_KIND"]
    if kind_name != path.stem or kind_name not in KINDS:
        raise _fail(path, f"envs.ATTNBENCH_FLEET_KIND is {kind_name!r}: it must be the file's name "
                          f"{path.stem!r}, one of {sorted(KINDS)}")
    if envs["ATTNBENCH_MACHINE"] != KINDS[kind_name].machine:
        raise _fail(path, f"envs.ATTNBENCH_MACHINE is {envs['ATTNBENCH_MACHINE']!r}; kind {kind_name} files "
                          f"its results under {KINDS[kind_name].machine!r}")
    spot = {bool(entry["use_spot"]) for entry in entries}
    market = envs["ATTNBENCH_MARKET"]
    if spot != {market == "spot"}:
        raise _fail(path, f"envs.ATTNBENCH_MARKET is {market!r} but resources.use_spot is "
                          f"{' and '.join(map(str, sorted(spot)))}")
    mount = (config.get("file_mounts") or {}).get(BUCKET_MOUNT)
    if not isinstance(mount, dict) or not re.fullmatch(r"\$\{?BUCKET\}?", str(mount.get("name", ""))):
        raise _fail(path, f"file_mounts: the results bucket must be mounted at {BUCKET_MOUNT} with "
                          "name: ${BUCKET}")
    if mount.get("mode", "MOUNT") != "MOUNT":
        raise _fail(path, f"file_mounts.{BUCKET_MOUNT}.mode must be MOUNT (every file written through "
                          f"at once; a copy or a cached mount could lose the last group on preemption)")

    report = TaskReport(path=path, kind=kind_name, machine=envs["ATTNBENCH_MACHINE"], accel=envs["ACCEL"],
                        market=market)
    for resources in task.resources:
        cloud = resources.cloud
        cloud_name = str(cloud).lower() if cloud is not None else None
        if cloud_name is None:
            report.unchecked.append(f"{resources}: no cloud named; pin one with infra:")
            continue
        if cloud_name in ("ssh", "kubernetes"):
            report.unchecked.append(f"{cloud}: a node pool of your own: what it offers is known only once "
                                    "it is up (sky ssh up; sky check ssh)")
            continue
        if offline and not os.path.exists(_catalog_file(cloud_name)):
            report.unchecked.append(f"{cloud}: no {cloud_name}/vms.csv in this catalog copy: not checked "
                                    "offline (SkyPilot downloads it when you launch)")
            continue
        [(accelerator, count)] = resources.accelerators.items()
        feasible = cloud.get_feasible_launchable_resources(resources, task.num_nodes)
        if not feasible.resources_list:
            hint = list(feasible.fuzzy_candidate_list) or _close_names(cloud_name, accelerator)
            report.infeasible.append(f"No resource satisfying {resources.repr_with_region_zone} on {cloud}."
                                     + (f" Did you mean: {sorted(hint)}" if hint else ""))
            continue
        best = feasible.resources_list[0]
        regions = sorted({r.region for r in resources_utils.make_launchables_for_valid_region_zones(best)})
        for region in regions:
            price = prices.lookup(accelerator, int(count), cloud_name, region=region, market=market,
                                  instance_type=best.instance_type)
            report.options.append(Option(cloud=cloud_name, region=region, instance_type=best.instance_type,
                                         accelerator=accelerator, count=int(count), market=market,
                                         on_demand_usd_per_hour=price.on_demand_usd_per_hour,
                                         spot_usd_per_hour=price.spot_usd_per_hour, chips=price.chips,
                                         notes=price.notes))
    if not report.options and not report.unchecked:
        raise _fail(path, "resources.accelerators: " + " ".join(report.infeasible))
    return report
