"""Where the suite runs: the accelerator make builds for, the user's own interpreter (what it lacks,
its stable name), and results filed under that name."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.hardware import accel
from attnbench.run import environment

ROOT = Path(__file__).resolve().parents[1]


# -- the accelerator decides the build --------------------------------------------------------------
def _host(tmp_path, *, nvidia=(), pci=(), accel_files=(), vfio=()):
    dev, sys_pci = tmp_path / "dev", tmp_path / "pci"
    dev.mkdir(parents=True)
    sys_pci.mkdir()
    for name in nvidia:
        (dev / name).write_text("")
    for slot, (vendor, device) in enumerate(pci):
        folder = sys_pci / f"0000:00:{slot:02x}.0"
        folder.mkdir()
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "device").write_text(device + "\n")
    for name in accel_files:
        (dev / name).write_text("")
    if vfio:
        (dev / "vfio").mkdir()
        for name in vfio:
            (dev / "vfio" / name).write_text("")
    return {"dev": str(dev), "pci": str(sys_pci), "which": lambda _name: None}


def _fake_smi(listing: str):
    def run(cmd, **_kwargs):
        assert cmd[1:] == ["-L"]
        return subprocess.CompletedProcess(cmd, 0, stdout=listing, stderr="")

    return {"which": lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None, "run": run}


def test_detection_reads_device_files_pci_ids_and_nvidia_smi(tmp_path):
    assert accel.detect(**_host(tmp_path / "a"))[0] == "cpu"
    assert accel.detect(**_host(tmp_path / "b", nvidia=("nvidia0", "nvidiactl")))[0] == "cuda"
    tpu = accel.accelerator_present(**_host(tmp_path / "c", pci=[("0x1ae0", "0x006f")] * 4))
    assert (tpu.platform, tpu.count, tpu.version) == ("tpu", 4, "v6e") and "PCI" in tpu.evidence
    assert accel.detect(**_host(tmp_path / "d", accel_files=("accel0", "accel1")))[0] == "tpu"
    # vfio groups count as TPU chips only beside a Google PCI device: a vfio group alone is any passthrough
    assert accel.detect(**_host(tmp_path / "e", vfio=("0", "1", "vfio")))[0] == "cpu"
    assert accel.detect(**_host(tmp_path / "f", vfio=("0", "vfio"), pci=[("0x1ae0", "0x9999")]))[0] == "tpu"
    # the gVNIC shares Google's vendor id and is no TPU
    assert accel.detect(**_host(tmp_path / "g", pci=[("0x1ae0", "0x0042")]))[0] == "cpu"
    listing = "GPU 0: NVIDIA H200 (UUID: GPU-1234)\nGPU 1: NVIDIA H200\n"
    where = {**_host(tmp_path / "h"), **_fake_smi(listing)}
    found = accel.accelerator_present(**where)
    assert (found.platform, found.count) == ("gpu", 2) and "NVIDIA H200" in found.evidence


def test_an_accel_that_contradicts_the_host_is_refused_unless_forced(tmp_path):
    gpu_host = _host(tmp_path / "gpu", nvidia=("nvidia0",))
    cpu_host = _host(tmp_path / "cpu")
    assert accel.choose(None, **gpu_host)[0] == "cuda"
    assert accel.choose("CUDA", **gpu_host)[0] == "cuda"
    with pytest.raises(accel.Refused, match=r"ACCEL=cpu but this host has a GPU .*ACCEL_FORCE=1"):
        accel.choose("cpu", **gpu_host)
    with pytest.raises(accel.Refused, match="ACCEL=tpu but this host has no TPU"):
        accel.choose("tpu", **cpu_host)
    assert accel.choose("cpu", force=True, **gpu_host)[0] == "cpu"
    with pytest.raises(accel.Refused, match="ACCEL must be one of cpu, cuda, tpu, got 'gpu'"):
        accel.choose("gpu", force=True, **cpu_host)


def test_make_prints_its_choice_and_refuses_a_contradiction_in_one_line():
    if accel.detect()[0] != "cpu":
        pytest.skip("the refusal below is for a host without an accelerator")
    env = {k: v for k, v in os.environ.items() if k not in ("ACCEL", "ACCEL_FORCE", "MAKEFLAGS", "MAKELEVEL")}
    ok = subprocess.run(["make", "-n", "lint"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "ACCEL=cpu (detected:" in ok.stderr
    refused = subprocess.run(["make", "-n", "lint", "ACCEL=cuda"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0
    [line] = [x for x in refused.stderr.splitlines() if "***" in x]
    assert "ACCEL=cuda but this host has no NVIDIA GPU" in line and "ACCEL_FORCE=1" in line
    forced = subprocess.run(["make", "-n", "lint", "ACCEL=cuda", "ACCEL_FORCE=1"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0 and "forced (ACCEL_FORCE=1)" in forced.stderr
    bad_env = subprocess.run(["make", "-n", "bench", "ENV=conda"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    assert bad_env.returncode != 0 and "ENV must be unset" in bad_env.stderr


def test_make_in_existing_mode_uses_that_interpreter_and_never_builds_a_venv():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    plan = subprocess.run(["make", "-n", "bench", "ENV=existing", f"PYTHON={sys.executable}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert f"{sys.executable} -m attnbench.run.environment check --need bench" in plan.stdout
    assert "-m attnbench.asv.selection run --machine $machine" in plan.stdout  # one asv run per environment
    assert f"--existing {sys.executable} --" in plan.stdout
    assert "-m venv" not in plan.stdout and "pip install" not in plan.stdout
    # make -n prints the recipe and runs none of it: no report was written (its last line is echoed)
    assert "report: html/report/report.md, html/report/report.html" not in plan.stdout.splitlines()


# -- the user's interpreter ---------------------------------------------------------------------------
def test_the_stable_name_is_asv_naming_of_the_library_versions():
    from asv.environment import get_env_name

    named = {"jax": "0.11.2", "torch": "2.11.0", "torch-xla": "2.9.0"}
    name = environment.environment_name("3.12", named)
    assert name == "existing-py3.12-jax0.11.2-torch2.11.0-torch-xla2.9.0"
    assert environment.environment_name("3.12", named) == get_env_name("existing", "3.12", named, {})
    here = environment.versions()
    assert "+" not in "".join(here.values())  # 2.13.0+cpu is named 2.13.0
    facts = environment.probe(sys.executable)
    assert facts == {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "versions": here,
                     "pins": environment.pinned_versions()}


CONF_INCLUDE = [
    {"python": "3.11", "req": {"jax": "0.10.2", "jaxlib": "0.10.2", "torch": "2.13.0", "numpy": ""}},
    {"python": "3.11", "req": {"torch": "2.9.0", "torch-xla": "2.9.0", "jax": "0.7.1", "jaxlib": "0.7.1",
                               "numpy": ""}},
]


def test_a_venv_with_exactly_an_asv_environments_pins_is_that_environment():
    """make bench measures in the venvs make setup built with asv.conf.json's pins: asv's name for the
    entry continues its history; anything else (another version, another framework) is not it."""
    from asv.environment import get_env_name

    main = {"jax": "0.10.2", "jaxlib": "0.10.2", "torch": "2.13.0", "numpy": "2.4.6"}
    xla = {"jax": "0.7.1", "jaxlib": "0.7.1", "torch": "2.9.0", "torch-xla": "2.9.0", "numpy": "2.4.6"}
    assert environment.conf_environment(CONF_INCLUDE, "3.11", main) == CONF_INCLUDE[0]
    assert environment.conf_environment(CONF_INCLUDE, "3.11", xla) == CONF_INCLUDE[1]
    entry = CONF_INCLUDE[0]
    assert get_env_name("virtualenv", "3.11", entry["req"], {}) == \
        "virtualenv-py3.11-jax0.10.2-jaxlib0.10.2-numpy-torch2.13.0"  # the committed history's name
    assert environment.conf_environment(CONF_INCLUDE, "3.12", main) is None  # another Python
    assert environment.conf_environment(CONF_INCLUDE, "3.11", {**main, "torch": "2.14.1"}) is None
    assert environment.conf_environment(CONF_INCLUDE, "3.11", {**main, "libtpu": "0.0.42.1"}) is None
    targets = {"jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "2.4.6", "libtpu": "0.0.42.1"}
    assert environment.conf_environment(CONF_INCLUDE, "3.11", targets) is None  # .venv-targets: its own name


def test_requirements_come_from_pyproject_and_never_name_a_framework():
    bench, test = environment.requirements("bench"), environment.requirements("test")
    names = {r.split("=")[0].split(">")[0] for r in bench}
    assert {"numpy", "psutil", "asv", "asv_runner", "pandas"} <= names
    assert not names & {"pytest", "ruff", "jax", "torch"}
    assert any(r.startswith("pytest") for r in test) and not any(r.startswith("ruff") for r in test)
    assert environment.requirements("run") == ["numpy>=2.0", "psutil>=5.9", "asv_runner==0.3.2"]
    assert "asv_runner==0.3.2" in environment.requirements("measure")  # the median's interval
    with pytest.raises(ValueError, match="purpose must be one of"):
        environment.requirements("deploy")


@pytest.mark.parametrize("requirement, installed, ok", [
    ("asv==0.6.6", "0.6.6", True), ("asv==0.6.6", "0.6.4", False), ("numpy>=2.0", "2.5.2", True),
    ("numpy>=2.0", "1.26.4", False), ("ruff==0.17.*", "0.17.3", True), ("ruff==0.17.*", "0.18.0", False),
    ("tabulate", "0.9.0", True), ("pandas>=2.2", None, False), ("torch>=2.9", "2.11.0+cu130", True),
])
def test_a_pin_is_met_or_not(requirement, installed, ok):
    assert environment.satisfied(requirement, installed) is ok


def test_the_check_names_what_is_missing_with_the_command_and_installs_only_when_allowed(monkeypatch, capsys):
    real = environment._version
    monkeypatch.setattr(environment, "_version", lambda d: None if d in ("asv", "asv_runner") else real(d))
    calls = []
    monkeypatch.setattr(environment.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 1))
    assert environment.check("bench") == 1
    out = capsys.readouterr().out
    assert "missing for bench: asv_runner==0.3.2, asv==0.6.6" in out
    assert f"add them with: {sys.executable} -m pip install 'asv_runner==0.3.2' 'asv==0.6.6'" in out
    assert calls == []  # nothing installed without the user's word
    assert environment.check("bench", install=True) == 1  # the (fake) pip failed: still an error
    assert calls == [[sys.executable, "-m", "pip", "install", "asv_runner==0.3.2", "asv==0.6.6"]]
    frameworks = ("jax", "torch", "torch-xla")
    monkeypatch.setattr(environment, "_version", lambda d: None if d in frameworks else real(d))
    assert environment.check("bench") == 1
    assert "no framework to measure: install jax or torch yourself" in capsys.readouterr().out


# -- results under the stable name --------------------------------------------------------------------
def test_asv_names_an_existing_environment_by_what_it_holds():
    from asv import config as asv_config
    from asv import environment as asv_environment

    from attnbench.asv import plugin as asv_plugin

    asv_plugin.setup()
    conf = asv_config.Config()
    conf.project, conf.results_dir = "attnbench", "results"
    env = asv_environment.ExistingEnvironment(conf, sys.executable, {}, {})
    assert env.name == environment.environment_name()
    assert env.python == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert env.requirements == environment.versions()
    assert "/" not in env.name


def test_rename_env_moves_results_sidecars_and_traces_and_keeps_every_number(tmp_path):
    from attnbench.cli import main

    old, new = "existing-py_work_main_.venv-targets_bin_python", "existing-py3.11-jax0.10.2-libtpu0.0.42.1"
    machine = tmp_path / "cpu-2core"
    (machine / "sidecars").mkdir(parents=True)
    (machine / "traces" / f"abcdef12-{old}").mkdir(parents=True)
    path = "/work/main/.venv-targets/bin/python"
    result = {"commit_hash": "abcdef1234", "env_name": old, "date": 1, "python": path,
              "params": {"machine": "cpu-2core", "python": path},
              "requirements": {}, "result_columns": ["result"], "results": {"b.track": [[1.5, float("nan")]]}}
    (machine / f"abcdef12-{old}.json").write_text(json.dumps(result))  # bare NaN, as asv writes
    (machine / "sidecars" / f"abcdef12-{old}.sidecar").write_text(json.dumps({"env_name": old, "cases": {}}))
    other = machine / "abcdef12-virtualenv-py3.11-jax0.10.2.json"
    other.write_text(json.dumps({**result, "env_name": "virtualenv-py3.11-jax0.10.2"}))
    assert main(["rename-env", old, new, "--results", str(tmp_path)]) == 0
    assert sorted(p.name for p in machine.glob("*.json")) == [f"abcdef12-{new}.json", other.name]
    moved = json.loads((machine / f"abcdef12-{new}.json").read_text())
    assert moved["env_name"] == new and moved["python"] == "3.11"
    assert moved["requirements"] == {"jax": "0.10.2", "libtpu": "0.0.42.1"}
    assert moved["params"] == {"machine": "cpu-2core", "python": "3.11", "jax": "0.10.2",
                               "libtpu": "0.0.42.1"}
    assert moved["results"]["b.track"][0][0] == 1.5 and math.isnan(moved["results"]["b.track"][0][1])
    assert json.loads((machine / "sidecars" / f"abcdef12-{new}.sidecar").read_text())["env_name"] == new
    assert (machine / "traces" / f"abcdef12-{new}").is_dir()
    assert not (machine / "traces" / f"abcdef12-{old}").exists()
    assert main(["rename-env", old, "existing-py_tmp_python", "--results", str(tmp_path)]) == 2
