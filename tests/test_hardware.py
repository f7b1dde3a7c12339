"""Hardware profiles, device detection and matching, the CPU GEMM probe, the MFU peak."""

from __future__ import annotations

import datetime
import importlib.util
import math

import pytest

from attnbench import hardware as hw
from attnbench.hardware import Device, peak_probe

REQUIRED = ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "a100-40gb", "a100-80gb", "h100-sxm", "h200-sxm",
            "l4", "b200", "cpu", "cpu-n2d-highcpu"]


@pytest.fixture(scope="module")
def profiles():
    return hw.load_hardware_profiles()


def gpu(name: str) -> Device:
    return Device("gpu", name, 1, "some host", 8)


def tpu(name: str) -> Device:
    return Device("tpu", name, 4, "some host", 8)


# -- the packaged file ------------------------------------------------------------------------------
def test_packaged_profiles_load_with_every_required_profile(profiles):
    assert set(REQUIRED) <= set(profiles)
    assert [p.kind for p in map(profiles.get, ["tpu-v5e", "h200-sxm", "cpu"])] == ["tpu", "gpu", "cpu"]


def test_every_number_has_a_source_and_a_date(profiles):
    counted = 0
    for profile in profiles.values():
        for fld, number in profile.numbers().items():
            assert number.value > 0 and math.isfinite(number.value), (profile.name, fld)
            assert number.source.strip(), (profile.name, fld)
            assert isinstance(number.date, datetime.date), (profile.name, fld)
            counted += 1
    assert counted >= 50  # the file is not silently empty of numbers


def test_reference_figures(profiles):
    h200 = profiles["h200-sxm"]
    assert h200.peak("bfloat16").value == 989 and h200.hbm_gb.value == 141
    assert h200.price_on_demand.value == 9.31 and h200.price_unit == "chip-hour"
    assert h200.price_spot is None  # no spot price recorded: absent, not invented
    assert h200.peak("float16") is None  # fp16 dense peak not recorded: absent, not guessed
    assert profiles["h100-sxm"].peak("fp32").value == 67
    assert profiles["a100-40gb"].peak("float32").value == 19.5
    # The suite runs float32 on GPUs: each GPU's fp32 (non-tensor) peak, from its datasheet
    assert profiles["a100-80gb"].peak("float32").value == 19.5  # the A100 datasheet: 40GB and 80GB alike
    assert h200.peak("float32").value == 67 and profiles["l4"].peak("fp32").value == 30.3
    assert profiles["b200"].peak("fp32").value == 75
    assert profiles["tpu-v5e"].peak("float32") is None  # no TPU publishes one: absent, not guessed
    v5e = profiles["tpu-v5e"]
    assert (v5e.peak("bf16").value, v5e.price_on_demand.value, v5e.price_spot.value) == (197, 1.20, 0.213)
    assert profiles["tpu-v4"].price_on_demand.value == pytest.approx(12.88 / 4)
    assert profiles["tpu-v5p"].price_on_demand.value == pytest.approx(16.80 / 4)


def test_cpu_profiles_are_per_vcpu_and_have_no_peak(profiles):
    assert profiles["cpu"].price_on_demand.value == 0.0474
    assert profiles["cpu-n2d-highcpu"].price_on_demand.value == 0.0312
    for name in ("cpu", "cpu-n2d-highcpu"):
        assert profiles[name].price_unit == "vcpu-hour"
        assert dict(profiles[name].peak_tflops) == {}


# -- a damaged file ---------------------------------------------------------------------------------
GOOD = """
[mychip]
kind = "gpu"
match = ["MyChip"]
price_unit = "chip-hour"
peak_tflops.bf16 = { value = 100, source = "spec", date = 2026-11-29 }
price.on_demand = { value = 1.5, source = "catalog", date = 2026-11-29 }
price.kind = "accelerator"
"""


def write(tmp_path, text):
    path = tmp_path / "hardware_profiles.toml"
    path.write_text(text)
    return path


def test_user_file_loads(tmp_path):
    profiles = hw.load_hardware_profiles(write(tmp_path, GOOD))
    assert list(profiles) == ["mychip"]
    assert profiles["mychip"].peak("bf16").value == 100.0


@pytest.mark.parametrize("old, new, field", [
    ('source = "spec", ', "", "peak_tflops.bf16.source"),
    (', date = 2026-11-29 }\nprice', " }\nprice", "peak_tflops.bf16.date"),
    ("value = 100", 'value = "fast"', "peak_tflops.bf16.value"),
    ("value = 100", "value = -3", "peak_tflops.bf16.value"),
    ('kind = "gpu"', 'kind = "fpga"', "kind"),
    ('match = ["MyChip"]', 'match = ["My(Chip"]', "match"),
    ('match = ["MyChip"]', 'match = "MyChip"', "match"),
    ("peak_tflops.bf16", "peak_tflops.int4", "peak_tflops.int4"),
    ('price_unit = "chip-hour"', 'price_unit = "vcpu-hour"', "price_unit"),
    ("value = 1.5", "value = 1.5, currency = 'EUR'", "price.on_demand"),
    ('kind = "gpu"', 'kind = "gpu"\nhbm = 3', "hbm"),
    ('date = 2026-11-29 }\nprice', 'date = "29/11/2026" }\nprice', "peak_tflops.bf16.date"),
    ('price.kind = "accelerator"', "", "price.kind"),  # a price must say what it buys
    ('price.kind = "accelerator"', 'price.kind = "chip"', "price.kind"),
])
def test_damaged_file_names_profile_and_field(tmp_path, old, new, field):
    assert old in GOOD
    with pytest.raises(ValueError) as err:
        hw.load_hardware_profiles(write(tmp_path, GOOD.replace(old, new, 1)))
    assert "'mychip'" in str(err.value) and f"'{field}'" in str(err.value)


def test_cpu_profile_with_a_peak_is_rejected(tmp_path):
    text = GOOD.replace('kind = "gpu"', 'kind = "cpu"').replace("chip-hour", "vcpu-hour")
    with pytest.raises(ValueError, match="'peak_tflops'"):
        hw.load_hardware_profiles(write(tmp_path, text))


def test_not_toml_is_a_value_error_naming_the_file(tmp_path):
    path = write(tmp_path, "[mychip\nkind = ")
    with pytest.raises(ValueError, match="not valid TOML") as err:
        hw.load_hardware_profiles(path)
    assert str(path) in str(err.value)


def test_get_hardware_profile(profiles):
    assert hw.get_hardware_profile("h200-sxm").name == "h200-sxm"
    assert hw.get_hardware_profile("H200-SXM", profiles).name == "h200-sxm"
    with pytest.raises(KeyError) as err:
        hw.get_hardware_profile("h300", profiles)
    assert "h300" in str(err.value) and "tpu-v5e" in str(err.value) and "cpu-n2d-highcpu" in str(err.value)


# -- matching ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device, expected", [
    (gpu("NVIDIA H200"), "h200-sxm"),  # torch.cuda.get_device_name and jax device_kind alike
    (gpu("NVIDIA H100 80GB HBM3"), "h100-sxm"),
    (gpu("NVIDIA A100-SXM4-40GB"), "a100-40gb"),
    (gpu("NVIDIA A100-SXM4-80GB"), "a100-80gb"),
    (gpu("NVIDIA L4"), "l4"),
    (gpu("NVIDIA B200"), "b200"),
    (tpu("TPU v4"), "tpu-v4"),
    (tpu("TPU v5 lite"), "tpu-v5e"),
    (tpu("TPU v5e"), "tpu-v5e"),
    (tpu("TPU v5"), "tpu-v5p"),  # what a v5p TPU VM reports
    (tpu("TPU v5p"), "tpu-v5p"),
    (tpu("TPU v6 lite"), "tpu-v6e"),
    (tpu("TPU v6e"), "tpu-v6e"),
    (Device("cpu", "AMD EPYC", 1, "AMD EPYC", 2), "cpu"),
    (Device("cpu", "AMD EPYC 7B13", 1, "AMD EPYC 7B13", 2), "cpu"),
    (Device("cpu", "Intel(R) Xeon(R) CPU @ 2.20GHz", 1, "x", 2), "cpu"),
])
def test_match_hardware_profile(profiles, device, expected):
    assert hw.match_hardware_profile(device, profiles).name == expected


@pytest.mark.parametrize("device", [
    gpu("NVIDIA H200 NVL"), gpu("NVIDIA H100 PCIe"), gpu("NVIDIA A100 80GB PCIe"), gpu("NVIDIA L40S"),
    gpu("NVIDIA GB200"), gpu("NVIDIA GeForce RTX 4090"), tpu("TPU v4 lite"), tpu("TPU7x"),
    Device("tpu", "NVIDIA H200", 1, "h", 1),  # a name only matches profiles of its own kind
    Device("cpu", "Frobnitz Q9000 Made-Up CPU", 1, "f", 2),  # no CPU row's price by default
    Device("cpu", "Apple M2", 1, "a", 8),
])
def test_unknown_devices_match_nothing(profiles, device):
    assert hw.match_hardware_profile(device, profiles) is None


def test_named_only_profiles_never_auto_match(profiles):
    assert profiles["cpu-n2d-highcpu"].match == () and profiles["h100-sxm-gcp"].match == ()


# -- detection --------------------------------------------------------------------------------------
def test_detect_host():
    host = hw.detect_host()
    assert host.cpu_model and host.cpu_model != "unknown CPU"
    assert 1 <= host.usable_cores <= host.logical_cores
    assert host.memory_bytes is None or host.memory_bytes > 2**20


@pytest.mark.parametrize("framework", ["numpy", "jax", "torch"])
def test_detect_accelerator_here_is_the_cpu(framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} not installed in this venv")
    device = hw.detect_accelerator(framework)
    assert device.platform == "cpu"
    assert device.host_cores >= 1 and device.count == 1
    assert device.name == device.host_cpu == hw.detect_host().cpu_model


def test_detect_accelerator_rejects_unknown_framework():
    with pytest.raises(ValueError, match="tensorflow"):
        hw.detect_accelerator("tensorflow")


# -- CPU probe --------------------------------------------------------------------------------------
@pytest.fixture
def fresh_probe_cache():
    hw.clear_cpu_peak_cache()
    yield
    hw.clear_cpu_peak_cache()


@pytest.mark.parametrize("framework, dtype", [("torch", "float32"), ("torch", "bfloat16"),
                                              ("jax", "float32"), ("numpy", "float32")])
def test_cpu_probe_measures_a_positive_rate(fresh_probe_cache, framework, dtype):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} not installed in this venv")
    probe = hw.cpu_peak_tflops(dtype, framework, max_size=512, rounds=2)
    assert math.isfinite(probe.tflops) and probe.tflops > 0
    assert probe.median_tflops <= probe.best_tflops == probe.tflops
    assert probe.size in (256, 512) and probe.dtype == hw.canonical_dtype(dtype)
    assert probe.threads is None or probe.threads >= 1


def test_cpu_probe_is_memoised(fresh_probe_cache, monkeypatch):
    calls = []
    real = peak_probe.time_step

    def counting(run, **kwargs):
        calls.append(1)
        return real(run, **kwargs)

    monkeypatch.setattr(peak_probe, "time_step", counting)
    first = hw.cpu_peak_tflops("float32", "numpy", size=64, rounds=2)
    assert len(calls) == 2
    second = hw.cpu_peak_tflops("fp32", "numpy", size=64, rounds=2)
    assert second is first and len(calls) == 2  # not measured again
    hw.clear_cpu_peak_cache()
    hw.cpu_peak_tflops("float32", "numpy", size=64, rounds=2)
    assert len(calls) == 4


def test_cpu_probe_is_shared_through_the_run_directory(fresh_probe_cache, monkeypatch, tmp_path):
    """A sweep's workers are fresh processes: the first one's probe serves the others."""
    calls = []
    real = peak_probe.time_step
    monkeypatch.setattr(peak_probe, "time_step", lambda run, **kw: calls.append(1) or real(run, **kw))
    monkeypatch.setenv(hw.PROBE_DIR_ENV, str(tmp_path))
    first = hw.cpu_peak_tflops("float32", "numpy", size=64, rounds=2)
    [shared] = tmp_path.iterdir()
    hw.clear_cpu_peak_cache()  # as in the next worker process
    assert hw.cpu_peak_tflops("float32", "numpy", size=64, rounds=2) == first and len(calls) == 2
    shared.write_text("{not json")  # damaged: measured again, never a crash
    hw.clear_cpu_peak_cache()
    hw.cpu_peak_tflops("float32", "numpy", size=64, rounds=2)
    assert len(calls) == 4


def test_numpy_has_no_bf16_probe():
    with pytest.raises(ValueError, match="bfloat16"):
        hw.cpu_peak_tflops("bfloat16", "numpy")


# -- the peak an MFU uses ---------------------------------------------------------------------------
def test_peak_from_profile_for_accelerators(profiles):
    peak = hw.peak_tflops(gpu("NVIDIA H200"), profiles["h200-sxm"], "bfloat16")
    assert peak.tflops == 989 and peak.source.startswith("spec:")
    missing = hw.peak_tflops(gpu("NVIDIA H200"), profiles["h200-sxm"], "float16")
    assert missing.tflops is None and "float16" in missing.source and "bf16" in missing.source
    unknown = hw.peak_tflops(gpu("NVIDIA L40S"), None, "bf16")
    assert unknown.tflops is None and "NVIDIA L40S" in unknown.source \
        and "--hardware-profile" in unknown.source


def test_peak_on_cpu_comes_from_the_probe(fresh_probe_cache, monkeypatch, profiles):
    fake = hw.GemmProbe("torch", "fp32", 1024, 2, best_tflops=0.123, median_tflops=0.1, rounds=3)
    seen = []
    monkeypatch.setattr(peak_probe, "cpu_peak_tflops", lambda dtype, fw: seen.append((dtype, fw)) or fake)
    cpu = Device("cpu", "AMD EPYC", 1, "AMD EPYC", 2)
    peak = hw.peak_tflops(cpu, profiles["cpu"], "float32")
    assert peak.tflops == 0.123 and peak.probe is fake and "probe" in peak.source
    assert seen == [("fp32", "torch")]  # torch's matmul for every framework's run: one peak per run


def test_canonical_dtype():
    assert [hw.canonical_dtype(d) for d in ("bfloat16", "BF16", "float16", "float32")] == \
        ["bf16", "bf16", "fp16", "fp32"]
    with pytest.raises(ValueError):
        hw.canonical_dtype("int8")
