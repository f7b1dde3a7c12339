"""Cost per step from the catalog price a fleet run hands over (ATTNBENCH_CATALOG_PRICE), the
hardware profile as the fallback, and the catalog's quirks always in the cost note. No SkyPilot
needed: the price file is what ``attnbench.hardware.catalog_prices.lookup`` writes."""

from __future__ import annotations

import dataclasses

import pytest

from attnbench.hardware import Device
from attnbench.hardware import catalog_prices as prices
from attnbench.measure import cost

V5E = Device(platform="tpu", name="TPU v5 lite", count=8, host_cpu="x", host_cores=112)
H200 = Device(platform="gpu", name="NVIDIA H200", count=8, host_cpu="x", host_cores=192)
CPU = Device(platform="cpu", name="AMD EPYC 7B13", count=1, host_cpu="AMD EPYC 7B13", host_cores=2)

TPU_PRICE = prices.CatalogPrice(
    cloud="gcp", region="us-central1", zone=None, instance_type="TPU-VM", accelerator="tpu-v5litepod-8",
    accelerator_count=1, chips=8, market="spot", on_demand_usd_per_hour=9.6, spot_usd_per_hour=1.95941,
    catalog_file="gcp/vms.csv", catalog_sha256="5fcafcc6" + "0" * 56,
    catalog_date="2026-11-30T06:52:00+00:00", catalog_origin="pinned or hand-edited (no .meta md5)")


def _hand_over(monkeypatch, tmp_path, price: prices.CatalogPrice) -> None:
    path = tmp_path / "price.json"
    path.write_text(price.to_json())
    monkeypatch.setenv(prices.CATALOG_PRICE_ENV, str(path))


def test_the_catalog_price_per_chip_comes_before_the_profile(monkeypatch, tmp_path):
    _hand_over(monkeypatch, tmp_path, TPU_PRICE)
    pricing = cost.pricing_for(V5E)
    assert pricing.on_demand_usd_per_hour == pytest.approx(9.6 / 8)
    assert pricing.spot_usd_per_hour == pytest.approx(1.95941 / 8)
    assert "SkyPilot catalog gcp/vms.csv (sha256 5fcafcc60000" in pricing.source
    assert "gcp/us-central1 TPU-VM tpu-v5litepod-8:1, 8 chips, billed spot" in pricing.source
    assert pricing.note is None
    out = cost.cost_per_step(0.5, pricing, tokens_per_step=1000)
    assert out["usd_per_step_spot"] == pytest.approx(1.95941 / 8 / 3600 * 0.5)
    four = cost.pricing_for(V5E, chips=4)  # chips charged, as with a profile
    assert four.on_demand_usd_per_hour == pytest.approx(4 * 1.2)


def test_user_overrides_still_win_and_cpu_cases_keep_their_profile(monkeypatch, tmp_path):
    _hand_over(monkeypatch, tmp_path, TPU_PRICE)
    pricing = cost.pricing_for(V5E, price_per_hour=3.0, price_kind="instance")
    assert pricing.on_demand_usd_per_hour == 3.0 and pricing.spot_usd_per_hour == pytest.approx(1.95941 / 8)
    assert pricing.kind == "instance"
    # the catalog's spot price is a whole machine's: beside an accelerator-only on-demand price it is
    # left out, never one record of two kinds
    alone = cost.pricing_for(V5E, price_per_hour=3.0, price_kind="accelerator")
    assert alone.spot_usd_per_hour is None and alone.kind == "accelerator"
    assert "spot price left out: it buys a whole instance" in alone.note
    cpu = cost.pricing_for(CPU, cores=2)  # the host CPU of the TPU VM: its own profile, per vCPU
    assert cpu.unit == "vcpu-hour" and "SkyPilot catalog" not in cpu.source


def test_a_quirk_falls_back_to_the_profile_and_says_so(monkeypatch, tmp_path):
    placeholder = dataclasses.replace(
        TPU_PRICE, accelerator="tpu-v6e-8", region="asia-east1", on_demand_usd_per_hour=None,
        spot_usd_per_hour=None,
        notes=("catalog on-demand price for tpu-v6e-8:1 on TPU-VM in gcp asia-east1 is 700, SkyPilot's "
               "placeholder for a price GCP does not publish (fetch_gcp TPU_V6E_MAX_PRICE): not a price, "
               "not used",))
    _hand_over(monkeypatch, tmp_path, placeholder)
    v6e = Device(platform="tpu", name="TPU v6 lite", count=8, host_cpu="x", host_cores=180)
    pricing = cost.pricing_for(v6e)
    assert pricing.on_demand_usd_per_hour == pytest.approx(2.70)  # the tpu-v6e profile
    assert "profile tpu-v6e" in pricing.source
    assert "700" in pricing.note and "placeholder" in pricing.note
    out = cost.cost_per_step(0.01, pricing)
    assert "placeholder" in out["cost_note"]


def test_blank_spot_with_no_profile_spot_is_none_with_a_note(monkeypatch, tmp_path):
    blank = dataclasses.replace(
        TPU_PRICE, cloud="aws", region="us-east-1", instance_type="p5en.48xlarge", accelerator="H200",
        accelerator_count=8, on_demand_usd_per_hour=63.296, spot_usd_per_hour=None,
        notes=("catalog has no spot price for H200:8 on p5en.48xlarge in aws us-east-1 (blank cell): "
               "not priced from the catalog",))
    _hand_over(monkeypatch, tmp_path, blank)
    pricing = cost.pricing_for(H200)
    assert pricing.on_demand_usd_per_hour == pytest.approx(63.296 / 8)  # one GPU's share of the machine
    assert pricing.spot_usd_per_hour is None  # the h200-sxm profile has no spot price either
    assert "blank cell" in pricing.note and "no spot price" in pricing.note


def test_a_damaged_price_file_is_refused_by_name(monkeypatch, tmp_path):
    path = tmp_path / "price.json"
    path.write_text('{"cloud": "gcp"')
    monkeypatch.setenv(prices.CATALOG_PRICE_ENV, str(path))
    with pytest.raises(ValueError, match="price.json: not a catalog price file"):
        cost.pricing_for(V5E)
    path.write_text(TPU_PRICE.to_json().replace('"market": "spot"', '"market": "cheap"'))
    with pytest.raises(ValueError, match="market must be one of"):
        cost.pricing_for(V5E)


def test_tpu_slice_names_count_chips_the_way_google_does():
    assert prices.tpu_chips("tpu-v5litepod-8") == 8 and prices.tpu_chips("tpu-v6e-4") == 4
    assert prices.tpu_chips("tpu-v4-8") == 4 and prices.tpu_chips("tpu-v5p-16") == 8
    assert prices.tpu_chips("H100") is None
