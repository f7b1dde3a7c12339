"""``attnbench noisecheck``'s summary: what it reads from the report's frame and steps (synthetic)."""

from __future__ import annotations

import pytest

from attnbench.checks.noisecheck import render, summarize

pd = pytest.importorskip("pandas")
SHA = {label: label.lower() * 40 for label in "ABCD"}


def _frame():
    """Run B moved +2% as a whole (torch-blockwise-flash +10%); C slowed torch-sdpa-flash by 15%."""
    rows = []
    for position, (label, scale, contended) in enumerate((("A", 1.0, False), ("B", 1.02, False),
                                                          ("C", 1.15, False), ("D", 1.15, True))):
        for impl, seq in (("torch-sdpa-flash", 1024), ("jax-xla", 1024), ("torch-blockwise-flash", 1024)):
            slow = scale if impl == "torch-sdpa-flash" or label in "AB" else 1.0
            if impl == "torch-blockwise-flash" and label == "B":
                slow = 1.10
            rows.append({"metric": "seconds_per_step", "regime": "static", "implementation": impl,
                         "seq_len": seq, "commit_hash": SHA[label], "value": 0.01 * slow, "status": "ok",
                         "machine": "m", "env_name": "env", "benchmark": "Forward",
                         "commit_position": position,
                         "contended": None if (label == "D" and impl != "torch-sdpa-flash") else contended,
                         "contention_reason": "other processes used 0.98 cores" if contended else None})
    return pd.DataFrame(rows)


def test_summary_counts_recorded_contention_flags_and_the_slowdown_steps():
    steps = pd.DataFrame([
        {"commit_after": SHA["C"], "verdict": "regression", "implementation": "torch-sdpa-flash",
         "seq_len": 1024, "regime": "static", "metric": "seconds_per_step"},
        {"commit_after": SHA["B"], "verdict": "within noise", "implementation": "jax-xla",
         "seq_len": 1024, "regime": "static", "metric": "seconds_per_step"}])
    s = summarize(_frame(), steps, SHA, "torch-sdpa-flash")
    # D: one figure flagged contended, one with no recorded flag: 1 of 1 recorded, not 1 of 2.
    assert s["contention"]["D"] == {"figures": 3, "recorded": 1, "contended": 1,
                                    "reasons": ["other processes used 0.98 cores"]}
    assert s["contended_share_at_D"] == 1.0 and s["contention"]["A"]["contended"] == 0
    assert s["slow_impl_flagged_at_C"] and s["others_flagged_at_C"] == []
    assert s["flagged"]["B"] == [] and s["verdicts"]["B"] == {"within noise": 1}
    spread = {r["impl"]: r for r in s["aa_spread"]}
    assert {k: round(r["b_over_a"], 3) for k, r in spread.items()} == \
        {"jax-xla": 1.02, "torch-blockwise-flash": 1.1, "torch-sdpa-flash": 1.02}
    # against the run: B's median move (+2%) divided out, the one kernel that moved on its own is left
    assert s["run_shift_at_B"] == pytest.approx(0.02)
    assert {k: round(r["against_run"], 3) for k, r in spread.items()} == \
        {"jax-xla": 1.0, "torch-blockwise-flash": 1.078, "torch-sdpa-flash": 1.0}
    s.update(asv_run_seconds={"A": 60.0},
             compare={"A/B": {"ratio": 1.0, "ci": [0.99, 1.01], "verdict": "no change"}},
             impls=["torch-sdpa-flash", "jax-xla"], slow_impl="torch-sdpa-flash", slowdown=0.15,
             date="2026-11-30", machine="noisecheck-test")
    text = render(s)
    assert "D 1 of 1 recorded flags contended (2 unrecorded)" in text
    assert "worst 10.0%; against its run (B moved +2.0% as a whole): worst 7.8%, 2 of 3 within 5%" in text
    assert ("flagged for it: True (torch-sdpa-flash S=1024 static seconds_per_step; "
            "its seconds_per_step: True)") in text


def test_the_planted_slowdown_passes_every_keyword_through():
    """The throw-away slowdown wraps a kernel's ``attention`` whatever a case hands it: causal and
    scale, and the segment ids of a packed stream or a decode's ragged caches (a patch that named only
    ``causal`` and ``scale`` broke those cases with a TypeError)."""
    import ast

    from attnbench.checks.noisecheck import SLOWDOWN_PATCH

    [method] = ast.parse("class Kernel:\n" + SLOWDOWN_PATCH.format(fraction=0.15)).body[0].body
    assert method.name == "attention" and method.args.kwarg.arg == "features"
    assert not method.args.kwonlyargs
    [call] = [n for n in ast.walk(method)
              if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "attention"]
    assert [k.arg for k in call.keywords] == [None]  # **features, forwarded whole
