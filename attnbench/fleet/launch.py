"""``make fleet-launch KIND=...``: check the credentials a kind needs, then ``sky jobs launch`` it.

The check (``sky check``'s ``Cloud.check_credentials``, compute and the bucket's storage) fails
before anything is provisioned. A managed job is relaunched after a preemption and the run
resumes from the bucket.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from attnbench.fleet import BUCKET_MOUNT, Kind

# Imported where used: sky (the fleet extra).


def credential_problems(task_file: Path) -> tuple[list[str], list[str]]:
    """``(clouds ready, problems)``; each problem names the ``sky check`` step and SkyPilot's reason."""
    import sky
    from sky.clouds import cloud as cloud_lib
    from sky.utils import registry, yaml_utils

    task = sky.Task.from_yaml(str(task_file))
    mounts = yaml_utils.safe_load(task_file.read_text()).get("file_mounts") or {}
    store = str((mounts.get(BUCKET_MOUNT) or {}).get("store", "")).lower()
    store = {"gcs": "gcp", "s3": "aws", "r2": "cloudflare", "azure": "azure"}.get(store)
    ready, problems = [], []
    for resources in task.resources:
        cloud = resources.cloud
        if cloud is None:
            continue
        name = str(cloud).lower()
        missing = []
        ok, reason = cloud.check_credentials(cloud_lib.CloudCapability.COMPUTE)
        if not ok:
            missing.append(f"sky check {name}: {cloud} [compute] is not enabled: {_flat(reason)}")
        bucket_cloud = registry.CLOUD_REGISTRY.from_str(store) if store else cloud
        try:
            ok, reason = bucket_cloud.check_credentials(cloud_lib.CloudCapability.STORAGE)
        except Exception as exc:  # a cloud without storage: the bucket must live on another one
            ok, reason = False, f"{exc}; put the bucket on a cloud with storage (store: gcs or s3)"
        if not ok:
            missing.append(f"sky check {str(bucket_cloud).lower()}: {bucket_cloud} [storage] (the results "
                           f"bucket) is not enabled: {_flat(reason)}")
        if missing:
            problems.extend(missing)
        else:
            ready.append(name)
    return ready, problems


def _flat(reason) -> str:
    if isinstance(reason, dict):
        reason = "; ".join(f"{k}: {v}" for k, v in reason.items())
    return " ".join(str(reason or "no reason given").split())


def launch_command(kind: Kind, commit: str, bucket: str, envs: dict[str, str] | None = None) -> list[str]:
    cmd = ["sky", "jobs", "launch", "--yes", "--name", f"attnbench-{kind.name}-{commit[:8]}",
           "--env", f"COMMIT={commit}", "--env", f"BUCKET={bucket}"]
    for key, value in (envs or {}).items():
        cmd += ["--env", f"{key}={value}"]
    return [*cmd, str(kind.task_file)]


def launch(kind: Kind, commit: str, bucket: str, envs: dict[str, str] | None = None,
           dry_run: bool = False, repo: Path | None = None) -> int:
    if not commit or not bucket:
        raise ValueError("fleet-launch needs the commit to measure and a results bucket "
                         "(FLEET_BUCKET=<name>)")
    ready, problems = credential_problems(kind.task_file)
    if not ready:
        steps = "\n  ".join(problems)
        raise ValueError(f"cannot launch {kind.name}: no cloud it can run on has working credentials here.\n"
                         f"  {steps}\nFix a step above until `sky check` lists that cloud as enabled, then "
                         f"run make fleet-launch KIND={kind.name} again.")
    cmd = launch_command(kind, commit, bucket, envs)
    print(f"clouds ready: {', '.join(ready)}" + (f" (not ready: {len(problems)} checks)" if problems else ""))
    print("$ " + shlex.join(cmd))
    if dry_run:
        return 0
    return subprocess.run(cmd, cwd=repo).returncode
