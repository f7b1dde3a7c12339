"""Bring the fleet's results back and merge every machine's into ``results/<machine>/``: one history.

The source is the bucket (fetched with the cloud's own CLI) or a local folder. asv results are
merged benchmark by benchmark (the fleet's value wins); a file that does not parse or holds
another machine's results is a warning, and the rest is merged. Nothing here needs SkyPilot.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.core.atomic import atomic_write_text
from attnbench.fleet import BUCKET_PREFIX
from attnbench.fleet.runner import copy_atomic


@dataclass
class MergeReport:
    copied: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{len(self.copied)} copied, {len(self.merged)} merged, {len(self.unchanged)} unchanged, "
                f"{len(self.warnings)} warning(s)")


def fetch(source: str, staging: Path) -> Path:
    """A local folder holding the fleet's machine folders: ``source`` itself, or the bucket copied."""
    if source.startswith(("gs://", "s3://")):
        remote = f"{source.rstrip('/')}/{BUCKET_PREFIX}"
        if source.startswith("gs://"):
            cmd = ["gcloud", "storage", "rsync", "--recursive", remote, str(staging)]
            tool = "gcloud (Google Cloud SDK)"
        else:
            cmd, tool = ["aws", "s3", "sync", remote, str(staging)], "aws (AWS CLI v2)"
        if shutil.which(cmd[0]) is None:
            raise ValueError(f"fetching {source} needs {tool} on PATH, logged in (the credentials "
                             "`sky check` uses); or copy the bucket yourself and pass the folder")
        staging.mkdir(parents=True, exist_ok=True)
        subprocess.run(cmd, check=True)
        return staging
    root = Path(source)
    if not root.is_dir():
        raise ValueError(f"{source}: no such folder (and not a gs:// or s3:// bucket)")
    return root / BUCKET_PREFIX if (root / BUCKET_PREFIX).is_dir() else root


def _load(path: Path):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return None, f"does not parse ({type(exc).__name__}: {str(exc)[:120]})"
    if not isinstance(data, dict):
        return None, "is not a JSON object"
    return data, None


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(str(path), json.dumps(data, indent=1))


def _machine_sources(root: Path):
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        results = folder / "results" if (folder / "results").is_dir() else folder
        yield folder.name, results


def _merge_asv(src: Path, dst: Path, data: dict, report: MergeReport, name: str) -> None:
    if not dst.exists():
        copy_atomic(src, dst)
        report.copied.append(name)
        return
    mine, problem = _load(dst)
    if mine is None:
        report.warnings.append(f"{dst} {problem}: replaced by the fleet's copy")
        copy_atomic(src, dst)
        report.copied.append(name)
        return
    if mine.get("result_columns") != data.get("result_columns"):
        report.warnings.append(f"{name}: its result columns differ from {dst}'s (another asv version?): "
                               "the fleet's file replaces it")
        copy_atomic(src, dst)
        report.copied.append(name)
        return
    merged = dict(mine)
    for key in ("results", "durations"):
        merged[key] = {**(mine.get(key) or {}), **(data.get(key) or {})}
    if merged == mine:
        report.unchanged.append(name)
        return
    _write_json(dst, merged)
    report.merged.append(name)


def _merge_doc(src: Path, dst: Path, data: dict, report: MergeReport, name: str) -> None:
    """A sidecar (cases merged) or a .fleet file (attempts merged by id)."""
    mine, problem = _load(dst) if dst.exists() else ({}, None)
    if mine is None:
        report.warnings.append(f"{dst} {problem}: replaced by the fleet's copy")
        mine = {}
    merged = {**mine, **data}
    if "cases" in data or "cases" in mine:
        merged["cases"] = {**(mine.get("cases") or {}), **(data.get("cases") or {})}
    if "attempts" in data or "attempts" in mine:
        by_id = {a.get("id") or json.dumps(a, sort_keys=True): a for a in mine.get("attempts") or []}
        by_id.update({a.get("id") or json.dumps(a, sort_keys=True): a for a in data.get("attempts") or []})
        merged["attempts"] = sorted(by_id.values(), key=lambda a: str(a.get("started_utc")))
    if merged == mine:
        report.unchanged.append(name)
        return
    _write_json(dst, merged)
    (report.merged if mine else report.copied).append(name)


def merge(root: Path, results: Path, machines: list[str] | None = None) -> MergeReport:
    """Merge every machine folder under ``root`` into ``results/<machine>/``."""
    report = MergeReport()
    for machine, source in _machine_sources(root):
        if machines and machine not in machines:
            continue
        for src in sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith(".")):
            rel = src.relative_to(source)
            name = f"{machine}/{rel}"
            dst = results / machine / rel
            top = len(rel.parts) == 1
            if rel.parts[0] == "traces":
                if dst.exists() and dst.read_bytes() == src.read_bytes():
                    report.unchanged.append(name)
                else:
                    copy_atomic(src, dst)
                    report.copied.append(name)
                continue
            known = ((top and src.suffix == ".json")
                     or (rel.parts[0] == "sidecars" and src.suffix == ".sidecar")
                     or (rel.parts[0] == "fleet" and src.suffix == ".fleet"))
            if not known:
                report.warnings.append(f"{name}: not a results file the history keeps (asv results, "
                                       "machine.json, sidecars/, fleet/, traces/): skipped")
                continue
            data, problem = _load(src)
            if data is None:
                report.warnings.append(f"{name} {problem}: damaged, skipped (the rest is merged)")
                continue
            if top and rel.name == "machine.json":
                if data.get("machine") != machine:
                    report.warnings.append(f"{name} describes machine {data.get('machine')!r}, "
                                           f"not {machine!r}: skipped")
                elif dst.exists():
                    report.unchanged.append(name)
                else:
                    copy_atomic(src, dst)
                    report.copied.append(name)
                continue
            if top:
                owner = (data.get("params") or {}).get("machine")
                if owner != machine or "results" not in data:
                    why = (f"holds results of machine {owner!r}" if owner != machine
                           else "is not an asv results file (no 'results')")
                    report.warnings.append(f"{name} {why}, not {machine!r}'s: skipped")
                    continue
                _merge_asv(src, dst, data, report, name)
            else:
                _merge_doc(src, dst, data, report, name)
    return report


def collect(source: str, results: str | Path = "results", machines: list[str] | None = None) -> MergeReport:
    with tempfile.TemporaryDirectory(prefix="attnbench-collect-") as staging:
        root = fetch(source, Path(staging))
        if not root.is_dir() or not any(p.is_dir() for p in root.iterdir()):
            raise ValueError(f"{source}: no machine folders in it "
                             f"(expected {BUCKET_PREFIX}/<machine>/results/)")
        return merge(root, Path(results), machines)
