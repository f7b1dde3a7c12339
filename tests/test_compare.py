"""``attnbench compare``: the verdict arithmetic, and a real interleaved comparison of two commits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from attnbench.core.workload import Workload
from attnbench.run.compare import compare, judge

ROOT = Path(__file__).resolve().parents[1]


def test_judge_by_hand():
    a = [1.0] * 10
    # B is 1.2x A in every round: the interval is [1.2, 1.2], far above 1 and above 1 + 5%.
    assert judge(a, [1.2] * 10, 0.05) == pytest.approx((1.2, 1.2, 1.2, "slower"))
    # B/A ratios 0.9 .. 1.1 around 1: at 99% ranks 1 and 10 of 10 bound the interval, which holds 1
    # but reaches beyond +-5%: neither a change nor shown equal.
    ratios = [0.90, 0.92, 0.95, 0.98, 0.99, 1.01, 1.02, 1.05, 1.08, 1.10]
    ratio, low, high, verdict = judge(a, ratios, 0.05)
    assert (low, high) == pytest.approx((0.90, 1.10)) and verdict == "can't tell"
    assert ratio == pytest.approx((0.99 * 1.01) ** 0.5)
    assert judge(a, [r ** 0.2 for r in ratios], 0.05)[3] == "no change"  # within 0.98..1.02
    # A 3% slowdown seen in every round is real but within the gate's 5%: no change that matters.
    assert judge(a, [1.03] * 10, 0.05)[3] == "no change"
    assert judge(a, [0.8] * 10, 0.05)[3] == "faster"
    # Above 1 beyond the margin's reach but with its median under the threshold: not called slower.
    assert judge(a, [1.04, 1.045, 1.03, 1.06, 1.04, 1.035, 1.05, 1.04, 1.045, 1.04], 0.05)[3] == "can't tell"
    with pytest.raises(ValueError, match="as many B rounds as A rounds"):
        judge(a, [1.0], 0.05)


@pytest.fixture
def clone_with_a_slower_commit(tmp_path):
    """A clone of this repository's HEAD plus one commit that makes the reference kernel sleep
    30 ms per call (its step takes well under 5 ms at this size)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout of this project")
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(ROOT), str(clone)], check=True)
    kernel = clone / "attention_impls" / "reference_float64.py"
    signature = "    def attention(self, q, k, v, *, causal, scale, **mask):\n"
    text = kernel.read_text().replace(
        signature + "        return attention_fwd(",
        signature + "        __import__('time').sleep(0.03)\n        return attention_fwd(")
    assert "sleep(0.03)" in text
    kernel.write_text(text)
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "--quiet", "-am", "slower reference"], check=True)
    return clone


@pytest.mark.slow
def test_compare_flags_a_deliberate_slowdown_and_cleans_up(clone_with_a_slower_commit):
    clone = clone_with_a_slower_commit
    template = Workload(batch=1, q_heads=1, seq_q=64, head_dim=16, causal=True)
    lines = []
    verdicts = compare("HEAD~1", "HEAD", [("reference-float64", template.replace(seq_q=64, seq_k=64))],
                       rounds=8, window_s=0.05, restart_every=4, repo=str(clone), progress=lines.append)
    (verdict,) = verdicts
    assert verdict.verdict == "slower" and verdict.ratio > 2 and verdict.ci_low > 1, lines
    # Rounds 1-4 in the first pair of workers, 5-8 in a fresh pair: each revision saw two processes.
    assert verdict.processes == 2 and "in 2 processes each" in lines[0]
    assert "slower" in lines[0] and "99% [" in lines[0]
    worktrees = subprocess.run(["git", "-C", str(clone), "worktree", "list"], capture_output=True,
                               text=True, check=True).stdout.strip().splitlines()
    assert len(worktrees) == 1  # only the clone itself: both revision worktrees were removed


def test_compare_refuses_an_unknown_revision():
    with pytest.raises(ValueError, match="unknown revision 'no-such-rev'"):
        compare("HEAD", "no-such-rev", [("reference-float64", Workload(seq_q=64))], rounds=2, repo=str(ROOT))
