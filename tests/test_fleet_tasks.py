"""The fleet's SkyPilot task files and catalog prices, offline, against a pinned catalog copy.

``tests/data/skypilot_catalog/v8/`` holds verbatim rows of SkyPilot's public catalog
(skypilot-org/skypilot-catalog ``catalogs/v8``: ``gcp/vms.csv`` at commit 006059e0, ``aws/vms.csv`` at
00148f2a, ``common/accelerators.csv``), enough to price a TPU v5e-8, v6e-8, H100 and H200 in a few
regions, with the catalog's real quirks: a 700.0 placeholder, blank spot cells, spot equal to
on-demand. SkyPilot runs in subprocesses with ``SKY_RUNTIME_DIR`` on a copy of it and ``HOME`` in a
temporary folder: no download, no credentials, nothing written to the user's ``~/.sky``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench import fleet

pytest.importorskip("sky", reason="SkyPilot (the extra `fleet`) is not installed in this venv: "
                                  "pip install -e '.[fleet]' (make test installs it)")

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "tests" / "data" / "skypilot_catalog"
TASKS = fleet.task_files()


def _clean_env(home: Path) -> dict:
    """No cloud credentials, whatever the developer's shell holds."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "SKY", "NEBIUS", "RUNPOD"))}
    env["HOME"] = str(home)
    return env


def _fleet(args: list[str], home: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnbench.fleet", *args], capture_output=True, text=True,
                          cwd=ROOT, env=_clean_env(home), timeout=timeout)


def _sky_script(script: str, runtime: Path, home: Path) -> dict:
    """Run ``script`` (it prints one JSON object last) with SkyPilot reading the catalog in ``runtime``."""
    env = {**_clean_env(home), "SKY_RUNTIME_DIR": str(runtime)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_there_is_a_task_file_per_kind():
    assert sorted(p.stem for p in TASKS) == sorted(fleet.KINDS)
    for kind in ("tpu-v5e", "tpu-v6e", "h100", "h200"):
        assert fleet.kind(kind).offline_priced


LOOKUPS = [  # (accelerator, count, cloud, region, market)
    ("tpu-v5litepod-8", 1, "gcp", "us-central1", "spot"),
    ("tpu-v6e-8", 1, "gcp", "us-central1", "spot"),
    ("tpu-v6e-8", 1, "gcp", "asia-east1", "spot"),
    ("H100", 1, "gcp", "us-central1", "spot"),
    ("H100", 1, "aws", "us-east-1", "spot"),
    ("H100", 1, "aws", "eu-west-2", "spot"),
    ("H200", 8, "aws", "us-east-2", "spot"),
]

SCRIPT = """
import json, sys
import sky
from attnbench import fleet
from attnbench.hardware import catalog_prices as prices
out = {"from_yaml": {}, "prices": []}
for path in fleet.task_files():
    task = sky.Task.from_yaml(str(path))  # SkyPilot's own schema, offline
    out["from_yaml"][path.stem] = [str(r) for r in task.resources]
for acc, count, cloud, region, market in LOOKUPS:
    out["prices"].append(json.loads(prices.lookup(acc, count, cloud, region=region, market=market).to_json()))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sky_answers(tmp_path_factory):
    runtime = fleet.sky_runtime_dir_for(CATALOG)
    home = tmp_path_factory.mktemp("home")
    return _sky_script(f"LOOKUPS = {LOOKUPS!r}\n" + SCRIPT, runtime, home)


@pytest.mark.slow
def test_every_task_file_loads_through_sky_task_from_yaml(sky_answers):
    assert sorted(sky_answers["from_yaml"]) == sorted(fleet.KINDS)
    assert any("Spot" in r and "tpu-v5litepod-8" in r for r in sky_answers["from_yaml"]["tpu-v5e"])


def _raw(cloud: str):
    import pandas as pd

    return pd.read_csv(CATALOG / "v8" / cloud / "vms.csv")


def test_price_lookups_return_the_catalogs_values(sky_answers):
    gcp, aws = _raw("gcp"), _raw("aws")
    got = {(p["accelerator"], p["cloud"], p["region"]): p for p in sky_answers["prices"]}

    def row(frame, **match):
        sel = frame
        for k, v in match.items():
            sel = sel[sel[k] == v]
        assert len(sel) == 1, match
        return sel.iloc[0]

    v5e = row(gcp, AcceleratorName="tpu-v5litepod-8", Region="us-central1")
    p = got[("tpu-v5litepod-8", "gcp", "us-central1")]
    assert (p["on_demand_usd_per_hour"], p["spot_usd_per_hour"]) == (v5e.Price, v5e.SpotPrice)
    assert p["instance_type"] == "TPU-VM" and p["chips"] == 8 and p["notes"] == []
    v6e = row(gcp, AcceleratorName="tpu-v6e-8", Region="us-central1")
    p = got[("tpu-v6e-8", "gcp", "us-central1")]
    assert (p["on_demand_usd_per_hour"], p["spot_usd_per_hour"]) == (v6e.Price, v6e.SpotPrice)
    # GCP prices a GPU apart from its host VM: the machine is both rows
    gpu, host = row(gcp, AcceleratorName="H100", Region="us-central1"), \
        row(gcp, InstanceType="a3-highgpu-1g", Region="us-central1")
    p = got[("H100", "gcp", "us-central1")]
    assert p["instance_type"] == "a3-highgpu-1g"
    assert p["on_demand_usd_per_hour"] == pytest.approx(gpu.Price + host.Price, rel=1e-12)
    assert p["spot_usd_per_hour"] == pytest.approx(gpu.SpotPrice + host.SpotPrice, rel=1e-12)
    h200 = row(aws, InstanceType="p5en.48xlarge", Region="us-east-2")
    p = got[("H200", "aws", "us-east-2")]
    assert (p["on_demand_usd_per_hour"], p["spot_usd_per_hour"]) == (h200.Price, h200.SpotPrice)
    assert p["chips"] == 8  # sold as an 8-GPU machine: a step is charged one GPU's share
    for p in sky_answers["prices"]:  # provenance recorded with each price
        assert len(p["catalog_sha256"]) == 64 and p["catalog_date"] and p["catalog_file"].endswith("/vms.csv")
        assert p["catalog_origin"].startswith("pinned") and p["market"] == "spot"


def test_catalog_quirks_give_a_note_never_a_silent_figure(sky_answers):
    got = {(p["accelerator"], p["cloud"], p["region"]): p for p in sky_answers["prices"]}
    placeholder = got[("tpu-v6e-8", "gcp", "asia-east1")]  # 700.0, 700.0 in the catalog
    assert placeholder["on_demand_usd_per_hour"] is None and placeholder["spot_usd_per_hour"] is None
    assert any("700" in n and "placeholder" in n for n in placeholder["notes"])
    blank = got[("H100", "aws", "us-east-1")]  # 6.88, blank spot cell
    assert blank["on_demand_usd_per_hour"] == 6.88 and blank["spot_usd_per_hour"] is None
    assert any("blank cell" in n for n in blank["notes"])
    equal = got[("H100", "aws", "eu-west-2")]  # 8.944 both
    assert equal["spot_usd_per_hour"] == 8.944 and any("equals its on-demand" in n for n in equal["notes"])


@pytest.mark.slow
def test_spot_above_on_demand_is_not_used(tmp_path):
    # A synthetic variant of the pinned rows: us-west4's v5e spot cell raised above its on-demand price.
    catalog = tmp_path / "catalog"
    (catalog / "v8" / "gcp").mkdir(parents=True)
    text = (CATALOG / "v8" / "gcp" / "vms.csv").read_text()
    row = ",,,tpu-v5litepod-8,1,tpu-v5litepod-8,us-west4,us-west4-a,9.6,3.84"
    assert row in text
    (catalog / "v8" / "gcp" / "vms.csv").write_text(text.replace(row, row.replace("3.84", "12.5")))
    script = ("from attnbench.hardware import catalog_prices as prices; "
              "price = prices.lookup('tpu-v5litepod-8', 1, 'gcp', region='us-west4'); "
              "print(price.to_json().replace(chr(10), ''))")
    got = _sky_script(script, fleet.sky_runtime_dir_for(catalog), tmp_path)
    assert got["on_demand_usd_per_hour"] == 9.6 and got["spot_usd_per_hour"] is None
    assert any("above its on-demand" in n for n in got["notes"])


@pytest.mark.slow
def test_every_kind_validates_and_the_big_four_find_a_feasible_priced_option(tmp_path):
    proc = _fleet(["validate", "--catalog", str(CATALOG)], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {Path(line.split()[1].rstrip(":")).stem: line for line in proc.stdout.splitlines()
             if line.startswith("ok ")}
    assert sorted(lines) == sorted(fleet.KINDS)
    for kind in ("tpu-v5e", "tpu-v6e", "h100", "h200"):
        assert "cheapest" in lines[kind] and "USD/h spot" in lines[kind], lines[kind]
    assert "tpu-v5litepod-8:1 1.96 USD/h" in lines["tpu-v5e"]
    assert "aws/us-east-2 p5en.48xlarge H200:8 16.24 USD/h" in lines["h200"]
    # the neocloud and SSH-pool variants: SkyPilot's schema only, with the reason it stops there
    assert "not checked: RunPod: no runpod/vms.csv" in proc.stdout
    assert "not checked: SSH: a node pool of your own" in proc.stdout


BAD = {  # kind: (edit of its task file, what the error must say)
    "tpu-v5e": (("tpu-v5litepod-8", "tpu-v5e-8"),
                "resources.accelerators: No resource satisfying GCP([Spot], {'tpu-v5e-8': 1}"),
    "h200": (("use_spot: true", "use_spott: true"), "Instead of 'use_spott', did you mean 'use_spot'?"),
    "tpu-v6e": (("max_restarts_on_errors", "max_restart_on_errors"),
                "resources.job_recovery: Invalid resources YAML: job_recovery: Instead of "
                "'max_restart_on_errors', did you mean 'max_restarts_on_errors'?"),
    "h100": (("strategy: EAGER_NEXT_REGION", "strategy: EAGER_NEXT_REGON"),
             "Jobs recovery strategy 'EAGER_NEXT_REGON' is not a valid jobs recovery strategy"),
    "h200-ssh": (("ACCEL: cuda", "ACCEL: gpu"), "envs.ACCEL must be one of ('tpu', 'cuda')"),
    "h200-neocloud": (("/attnbench-bucket:", "/results:"), "file_mounts: the results bucket must be mounted"),
}


@pytest.mark.slow
def test_a_wrong_accelerator_or_a_typo_fails_with_skypilots_message_naming_the_field(tmp_path):
    files = []
    for kind, ((old, new), _) in BAD.items():
        text = fleet.kind(kind).task_file.read_text()
        assert old in text, (kind, old)
        path = tmp_path / "bad" / f"{kind}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text.replace(old, new, 1))
        files.append(str(path))
    proc = _fleet(["validate", "--catalog", str(CATALOG), *files], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for kind, (_, message) in BAD.items():
        prefix = f"INVALID {tmp_path}/bad/{kind}.yaml"
        [line] = [line for line in proc.stdout.splitlines() if line.startswith(prefix)]
        assert message in line, line
    assert "Did you mean: ['tpu-v5litepod-8'" in proc.stdout  # the catalog's name for a v5e-8


@pytest.mark.slow
def test_fleet_launch_without_credentials_names_the_sky_check_step(tmp_path):
    proc = _fleet(["launch", "--kind", "tpu-v5e", "--bucket", "attnbench-test", "--commit", "0" * 40,
                   "--dry-run"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "cannot launch tpu-v5e: no cloud it can run on has working credentials here" in err
    assert "sky check gcp: GCP [compute] is not enabled" in err
    assert "sky check gcp: GCP [storage] (the results bucket) is not enabled" in err
    assert "gcloud auth application-default login" in err or "pip install" in err  # SkyPilot's own advice
    proc = _fleet(["launch", "--kind", "h200", "--bucket", "b", "--commit", "0" * 40, "--dry-run"], tmp_path)
    assert proc.returncode == 2 and "sky check aws: AWS [compute]" in proc.stderr


@pytest.mark.slow
def test_the_run_prices_itself_where_it_landed_and_records_it(tmp_path):
    """The job's runner on a VM SkyPilot put in GCP us-central1-a: the catalog price of the machine
    there, handed to the suite (ATTNBENCH_CATALOG_PRICE) and recorded in the .fleet file."""
    from tests import fleet_fake_asv as fake

    checkout, bucket = tmp_path / "checkout", tmp_path / "bucket"
    (checkout / "results").mkdir(parents=True)
    (checkout / "asv.conf.json").write_text("{}")
    bucket.mkdir()
    env = {**_clean_env(tmp_path), "SKY_RUNTIME_DIR": str(fleet.sky_runtime_dir_for(CATALOG)),
           "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": "c", "cloud": "GCP", "region": "us-central1",
                                                "zone": "us-central1-a"}),
           "FAKE_ASV_LEDGER": str(tmp_path / "ledger")}
    proc = subprocess.run([sys.executable, "-m", "attnbench.fleet", "run", "--machine", "tpu-v5-lite-8",
                           "--commit", "ab" * 20, "--checkout", str(checkout), "--bucket", str(bucket),
                           "--asv", sys.executable, fake.__file__, "--env", "existing:main", "--group", ".",
                           "--task", str(fleet.kind("tpu-v5e").task_file), "--market", "spot"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((bucket / "attnbench" / "tpu-v5-lite-8" / "results" / "fleet" / "abababab.fleet")
                        .read_text())
    [attempt] = record["attempts"]
    assert attempt["cluster"]["zone"] == "us-central1-a" and attempt["price_note"] is None
    price = attempt["price"]
    assert (price["on_demand_usd_per_hour"], price["spot_usd_per_hour"]) == (9.6, 1.95941)
    assert (price["zone"], price["chips"], price["market"]) == ("us-central1-a", 8, "spot")
    handed = {line.split("=", 1)[1] for line in (tmp_path / "ledger.env").read_text().splitlines()}
    [path] = handed  # the same price file for every asv run of the job
    assert json.loads(Path(path).read_text()) == price
