"""Which frameworks this test run covers.

The Makefile runs the suite twice: the main venv with ``ATTNBENCH_TEST_FRAMEWORKS=numpy,jax,torch``
and ``.venv-xla`` with ``torch_xla``. A framework named there but not importable is an error, not a
skip, so that a broken install can never pass as "nothing to test".
"""

from __future__ import annotations

import importlib.util
import os

import pytest

ALL_FRAMEWORKS = ("numpy", "jax", "torch", "torch_xla")


def frameworks_under_test() -> tuple[str, ...]:
    raw = os.environ.get("ATTNBENCH_TEST_FRAMEWORKS")
    if raw is None:  # a developer's plain `pytest`: whatever is importable here
        return tuple(f for f in ALL_FRAMEWORKS if importlib.util.find_spec(f) is not None)
    chosen = tuple(f.strip() for f in raw.split(",") if f.strip())
    unknown = set(chosen) - set(ALL_FRAMEWORKS)
    if unknown:
        raise pytest.UsageError(f"ATTNBENCH_TEST_FRAMEWORKS names unknown frameworks {sorted(unknown)}")
    missing = [f for f in chosen if importlib.util.find_spec(f) is None]
    if missing:
        raise pytest.UsageError(f"ATTNBENCH_TEST_FRAMEWORKS names {missing}, not installed in this venv")
    return chosen


FRAMEWORKS = frameworks_under_test()


def mask_of(workload, x) -> dict:
    """The conformance call's mask keywords of ``workload`` on its inputs ``x`` (those set)."""
    mask = {"window": workload.window, "softcap": workload.softcap}
    if workload.segmented:
        mask.update(q_segment_ids=x.q_segment_ids, kv_segment_ids=x.kv_segment_ids)
    return {k: v for k, v in mask.items() if v is not None}


def impls_under_test():
    import attention_impls

    return [n for n in attention_impls.names() if attention_impls.get(n).framework in FRAMEWORKS]


@pytest.fixture(scope="session")
def committed_results(tmp_path_factory):
    """git's copy of results/ at HEAD, in a folder of its own: a test of the committed results reads
    them, whatever a local `make bench` has filed beside them since."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("committed")
    archive = subprocess.run(["git", "archive", "HEAD", "results"], cwd=root, capture_output=True)
    if archive.returncode:
        pytest.skip("needs this project's git checkout (git's copy of results/)")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "results"
