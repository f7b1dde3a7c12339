"""Cost per step and per million tokens, from hand-computed prices."""

from __future__ import annotations

import pytest

from attnbench.hardware import Device, load_hardware_profiles
from attnbench.measure import cost

H200 = Device("gpu", "NVIDIA H200", 8, "Intel Xeon", 16)
V5E = Device("tpu", "TPU v5 lite", 4, "AMD EPYC", 112)
CPU = Device("cpu", "AMD EPYC", 1, "AMD EPYC", 2)
MYSTERY = Device("gpu", "NVIDIA L40S", 1, "AMD EPYC", 32)


@pytest.fixture(scope="module")
def profiles():
    return load_hardware_profiles()


def test_h200_ten_ms_step(profiles):
    pricing = cost.pricing_for(H200, hardware_profiles=profiles)
    assert pricing.hardware_profile == "h200-sxm" and pricing.units == 1 and pricing.unit == "chip-hour"
    out = cost.cost_per_step(0.010, pricing, tokens_per_step=4096)
    step = 9.31 / 3600 * 0.01
    assert out["usd_per_step_on_demand"] == pytest.approx(step, rel=1e-12)
    assert out["usd_per_million_tokens_on_demand"] == pytest.approx(step / 4096 * 1e6, rel=1e-12)
    assert out["usd_per_step_spot"] is None and out["usd_per_million_tokens_spot"] is None
    assert "spot" in out["cost_note"]  # no spot price published: said, not invented
    assert "9.31" in out["price_source"]


def test_chips_multiply_the_chip_price(profiles):
    pricing = cost.pricing_for(V5E, chips=4, hardware_profiles=profiles)
    assert pricing.on_demand_usd_per_hour == pytest.approx(4 * 1.20)
    assert pricing.spot_usd_per_hour == pytest.approx(4 * 0.213)
    out = cost.cost_per_step(0.5, pricing, tokens_per_step=1000)
    assert out["usd_per_step_spot"] == pytest.approx(4 * 0.213 / 3600 * 0.5)
    assert out["usd_per_million_tokens_spot"] == pytest.approx(4 * 0.213 / 3600 * 0.5 / 1000 * 1e6)
    assert out["cost_note"] is None


def test_cpu_is_priced_per_core(profiles):
    by_host = cost.pricing_for(CPU, hardware_profiles=profiles)
    assert by_host.hardware_profile == "cpu" and by_host.units == 2
    assert by_host.on_demand_usd_per_hour == pytest.approx(2 * 0.0474)
    pinned = cost.pricing_for(CPU, cores=1, hardware_profiles=profiles)
    assert pinned.on_demand_usd_per_hour == pytest.approx(0.0474)
    alt = cost.pricing_for(CPU, hardware_profile="cpu-n2d-highcpu", cores=4, hardware_profiles=profiles)
    assert alt.on_demand_usd_per_hour == pytest.approx(4 * 0.0312)
    out = cost.cost_per_step(2.0, alt, tokens_per_step=512)
    assert out["usd_per_step_on_demand"] == pytest.approx(4 * 0.0312 / 3600 * 2.0)


def test_unknown_hardware_has_no_price(profiles):
    pricing = cost.pricing_for(MYSTERY, hardware_profiles=profiles)
    assert not pricing.known and pricing.hardware_profile is None
    out = cost.cost_per_step(0.01, pricing, tokens_per_step=4096)
    for key in ("usd_per_step_on_demand", "usd_per_step_spot", "usd_per_million_tokens_on_demand",
                "usd_per_million_tokens_spot", "usd_per_hour_on_demand"):
        assert out[key] is None, key
    assert out["cost_note"] == ("unknown: no price for NVIDIA L40S; "
                                "pass --hardware-profile or --price-per-hour")


def test_price_override_is_for_the_whole_device(profiles):
    pricing = cost.pricing_for(MYSTERY, price_per_hour=1.86, price_kind="instance",
                               hardware_profiles=profiles)
    assert pricing.on_demand_usd_per_hour == 1.86 and pricing.spot_usd_per_hour is None
    assert pricing.kind == "instance"
    out = cost.cost_per_step(0.004, pricing, tokens_per_step=2048)
    assert out["usd_per_step_on_demand"] == pytest.approx(1.86 / 3600 * 0.004)
    assert "override" in out["price_source"] and "spot" in out["cost_note"]
    # an override is not multiplied by chips, and replaces only its own price
    chips = cost.pricing_for(V5E, price_per_hour=10.0, price_kind="instance", chips=4,
                             hardware_profiles=profiles)
    assert chips.on_demand_usd_per_hour == 10.0 and chips.spot_usd_per_hour == pytest.approx(4 * 0.213)
    spot = cost.pricing_for(H200, spot_price_per_hour=3.5, price_kind="accelerator",
                            hardware_profiles=profiles)
    assert (spot.on_demand_usd_per_hour, spot.spot_usd_per_hour) == (9.31, 3.5)
    # a user's spot price of another kind than the profile's on-demand one is left out, and said
    mixed = cost.pricing_for(H200, spot_price_per_hour=3.5, price_kind="instance", hardware_profiles=profiles)
    assert (mixed.on_demand_usd_per_hour, mixed.spot_usd_per_hour, mixed.kind) == (9.31, None, "accelerator")
    assert "spot price left out: it buys a whole instance, the on-demand price the accelerator alone" \
        in mixed.note


def test_every_price_says_what_it_buys(profiles):
    """The packaged profiles' kinds: GCP's GPU rows the accelerator alone, a TPU VM, Lambda's H100
    and a vCPU a whole instance; each record carries its kind."""
    kinds = {name: p.price_kind for name, p in profiles.items() if p.price_on_demand is not None}
    assert kinds["h200-sxm"] == kinds["l4"] == kinds["a100-40gb"] == kinds["b200"] == "accelerator"
    assert kinds["h100-sxm"] == kinds["h100-sxm-gcp"] == kinds["tpu-v5e"] == kinds["cpu"] == "instance"
    assert set(kinds.values()) == {"instance", "accelerator"}
    out = cost.cost_per_step(0.01, cost.pricing_for(H200, hardware_profiles=profiles))
    assert out["price_kind"] == "accelerator"


def test_named_profile_overrides_the_match(profiles):
    pricing = cost.pricing_for(MYSTERY, hardware_profile="h100-sxm", hardware_profiles=profiles)
    assert pricing.hardware_profile == "h100-sxm" and pricing.on_demand_usd_per_hour == 2.99
    with pytest.raises(KeyError, match="h300"):
        cost.pricing_for(MYSTERY, hardware_profile="h300", hardware_profiles=profiles)


def test_failed_run_or_missing_tokens(profiles):
    pricing = cost.pricing_for(H200, hardware_profiles=profiles)
    failed = cost.cost_per_step(float("nan"), pricing, tokens_per_step=4096)
    assert failed["usd_per_step_on_demand"] is None and "no time per step" in failed["cost_note"]
    no_tokens = cost.cost_per_step(0.01, pricing)
    assert no_tokens["usd_per_step_on_demand"] == pytest.approx(9.31 / 3600 * 0.01)
    assert no_tokens["usd_per_million_tokens_on_demand"] is None


@pytest.mark.parametrize("kwargs", [{"price_per_hour": -1.0}, {"spot_price_per_hour": float("inf")},
                                    {"chips": 0}, {"cores": 0}, {"price_per_hour": "9"},
                                    {"price_per_hour": 9.0}, {"spot_price_per_hour": 2.0},
                                    {"price_per_hour": 9.0, "price_kind": "chip"}])
def test_bad_arguments(profiles, kwargs):
    with pytest.raises(ValueError):
        cost.pricing_for(H200, hardware_profiles=profiles, **kwargs)
