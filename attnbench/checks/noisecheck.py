"""``python -m attnbench noisecheck``: can this machine tell a real regression from noise?

A benchmark of the harness itself (not a test): in a throw-away clone of this repository it
makes three commits on top of HEAD and measures each with the real asv suite (the existing venv,
the clone first on the benchmark processes' path through ``ASV_PYTHONPATH``: asv drops a plain
``PYTHONPATH``; a few kernels of the default suite's forward cases):

* ``A`` = HEAD; ``B`` = A plus a README edit (no measured code changed): an **A/A** pair;
* ``C`` = B plus a deliberate slowdown of one kernel (it sleeps ``--slowdown`` of its own call time
  after every call): **sensitivity**;
* ``D`` = C plus a README edit, measured while another process keeps one core busy:
  **contention**.

Then it runs the report's regression analysis over the four points and ``attnbench compare`` on
A/B and B/C, and writes what it found (``--out``: Markdown, and JSON in a ``.noisecheck`` file):
the fraction of figures flagged between A and B (target: none), the A/A spread of
``seconds_per_step`` per uncontended case (target: within 5%), whether the slowdown was flagged
for that kernel only, whether D's figures were flagged contended and nothing was reported as a
regression there, and how long each asv run took.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnbench.core.atomic import atomic_write_text
from attnbench.core.workload import Workload
from attnbench.report import write_report
from attnbench.results.noise import is_kept, run_shifts
from attnbench.run.compare import compare

ROOT = Path(__file__).resolve().parents[2]
SLOWDOWN_PATCH = '''
    def attention(self, q, k, v, **features):  # noisecheck: a deliberate slowdown
        import time as _time

        start = _time.perf_counter()
        out = SdpaBackendKernel.attention(self, q, k, v, **features)
        _time.sleep({fraction} * (_time.perf_counter() - start))
        return out
'''


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=noisecheck", "-c",
                           "user.email=noisecheck@localhost", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _commit_readme_edit(repo: Path, note: str) -> str:
    with open(repo / "README.md", "a") as f:
        f.write(f"\n<!-- noisecheck: {note} -->\n")
    _git(repo, "commit", "-q", "-am", f"noisecheck: {note} (README only)")
    return _git(repo, "rev-parse", "HEAD")


def _commit_slowdown(repo: Path, impl: str, fraction: float) -> str:
    path = repo / "attention_impls" / f"{impl.replace('-', '_')}.py"
    text = path.read_text()
    if "class " not in text or "SdpaBackendKernel" not in text:
        raise ValueError(f"--slow-impl must be one of the torch-sdpa-* kernels (eager), got {impl!r}")
    path.write_text(text.rstrip() + "\n" + SLOWDOWN_PATCH.format(fraction=fraction))
    _git(repo, "commit", "-q", "-am", f"noisecheck: {impl} {fraction:.0%} slower")
    return _git(repo, "rev-parse", "HEAD")


def _asv_conf(repo: Path, work: Path) -> Path:
    text = "\n".join(line for line in (repo / "asv.conf.json").read_text().splitlines()
                     if not line.strip().startswith("//"))
    conf = json.loads(text)
    conf.update(repo=str(repo), benchmark_dir=str(repo / "benchmarks"), results_dir=str(work / "results"),
                html_dir=str(work / "html"), env_dir=str(work / "env"), environment_type="existing")
    conf.pop("include", None)
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf))
    return path


def _asv_run(repo: Path, work: Path, conf: Path, sha: str, env: dict) -> float:
    _git(repo, "checkout", "-q", sha)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "asv", "run", "--config", str(conf), "--python=same",
                           "--set-commit-hash", sha, "--machine", env["ATTNBENCH_MACHINE"], "-b", "Forward"],
                          capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode not in (0, 2):  # 2: some benchmark failed, which the results record
        raise RuntimeError(f"asv run {sha[:8]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def _check_ran_the_clone(results: Path, sha: str) -> None:
    """No sidecar under ``sha`` means asv's benchmark processes imported another checkout's code."""
    if not list((results / "sidecars").glob(f"{sha[:8]}-*.sidecar")):
        found = sorted(p.name for p in (results / "sidecars").glob("*.sidecar"))
        raise RuntimeError(f"the asv run of {sha[:8]} wrote no sidecar for it (found: {found}): its "
                           "benchmark processes did not import the clone's code")


def _burner(core: int) -> subprocess.Popen:
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def run(impls: list[str], slow_impl: str, slowdown: float, out: Path, rounds: int) -> dict:
    if slow_impl not in impls:
        impls = [*impls, slow_impl]
    with tempfile.TemporaryDirectory(prefix="attnbench-noisecheck-") as tmp:
        work, repo = Path(tmp), Path(tmp) / "repo"
        subprocess.run(["git", "clone", "--quiet", "--shared", str(ROOT), str(repo)], check=True)
        sha = {"A": _git(repo, "rev-parse", "HEAD")}
        sha["B"] = _commit_readme_edit(repo, "A/A")
        sha["C"] = _commit_slowdown(repo, slow_impl, slowdown)
        sha["D"] = _commit_readme_edit(repo, "under contention")
        machine = "noisecheck-" + subprocess.run([sys.executable, "-m", "attnbench", "machine-name"],
                                                 capture_output=True, text=True, check=True).stdout.strip()
        conf = _asv_conf(repo, work)
        # asv drops PYTHONPATH in its benchmark processes, putting ASV_PYTHONPATH first: without it
        # they would import this checkout, not the clone's commits.
        env = {**os.environ, "PYTHONPATH": str(repo), "ASV_PYTHONPATH": str(repo),
               "ATTNBENCH_IMPLS": ",".join(impls),
               "ATTNBENCH_MACHINE": machine, "ATTNBENCH_RESULTS_DIR": str(work / "results")}
        subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", machine, "--config",
                        str(conf)], check=True, capture_output=True, env=env, cwd=work)
        seconds = {}
        probes = work / "probes"
        probes.mkdir()
        env["ATTNBENCH_PROBE_DIR"] = str(probes)
        for label in ("A", "B", "C"):
            seconds[label] = _asv_run(repo, work, conf, sha[label], env)
            _check_ran_the_clone(work / "results" / machine, sha[label])
        burner = _burner(core=max(os.sched_getaffinity(0)))
        try:
            seconds["D"] = _asv_run(repo, work, conf, sha["D"], env)
        finally:
            burner.kill()
            burner.wait()
        _check_ran_the_clone(work / "results" / machine, sha["D"])
        _git(repo, "checkout", "-q", sha["D"])
        report = write_report(str(work / "results"), str(work / "report"), repo=str(repo))
        template = Workload(batch=1, q_heads=8, head_dim=64, seq_q=1024, causal=True)
        gate = {}
        for pair, (a, b) in {"A/B": ("A", "B"), "B/C": ("B", "C")}.items():
            (verdict,) = compare(sha[a], sha[b], [(slow_impl, template)], rounds=rounds, repo=str(repo),
                                 progress=lambda line: None)
            gate[pair] = {"ratio": verdict.ratio, "ci": [verdict.ci_low, verdict.ci_high],
                          "verdict": verdict.verdict}
        summary = summarize(report.frame, report.steps, sha, slow_impl)
    summary.update(asv_run_seconds=seconds, compare=gate, impls=impls, slow_impl=slow_impl, slowdown=slowdown,
                   date=dt.date.today().isoformat(), machine=machine)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{machine}-{summary['date']}"

    # Not *.json: asv publish would try to load any JSON under results/ as a result file.
    atomic_write_text(str(stem) + ".noisecheck", json.dumps(summary, indent=1, default=str))
    atomic_write_text(str(stem) + ".md", render(summary))
    return summary


def summarize(frame, steps, sha: dict, slow_impl: str) -> dict:
    """What the report found at each step (its verdicts), and the A/A spread of the timings."""
    short = {label: value[:8] for label, value in sha.items()}
    steps = steps if steps is not None else frame.iloc[0:0]
    by_step, verdicts = {}, {}
    for label in ("B", "C", "D"):
        here = steps[steps["commit_after"].astype(str).str.startswith(short[label])] if len(steps) else steps
        verdicts[label] = here["verdict"].value_counts().to_dict() if len(here) else {}
        flagged = here[here["verdict"] == "regression"] if len(here) else here
        by_step[label] = sorted({f"{r['implementation']} S={r['seq_len']} {r['regime']} {r['metric']}"
                                 for r in flagged.to_dict("records")})

    # The report judges each figure against its run's overall shift; what is left is the kernels' spread.
    shifts = run_shifts(frame)
    at_b = shifts[shifts["commit_after"].astype(str).str.startswith(short["B"])
                  & ~shifts["kept"].map(is_kept)]
    run_shift_b = float(at_b["shift"].iloc[0]) if len(at_b) else None
    timing = frame[(frame["metric"] == "seconds_per_step") & (frame["regime"] == "static")]
    spread = []
    for (impl, seq), group in timing.groupby(["implementation", "seq_len"]):
        at = {str(c)[:8]: row for c, row in zip(group["commit_hash"], group.to_dict("records"), strict=True)}
        a, b = at.get(short["A"]), at.get(short["B"])
        if a and b and a["value"] and b["value"]:
            ratio = b["value"] / a["value"]
            spread.append({"impl": impl, "seq": int(seq), "a_s": a["value"], "b_s": b["value"],
                           "b_over_a": ratio,
                           "against_run": ratio / (1 + run_shift_b) if run_shift_b is not None else None,
                           "contended": bool(a.get("contended") is True or b.get("contended") is True)})
    contention = {}
    for label in ("A", "B", "D"):  # the flag as the report reads it (sidecar), per static timing
        rows = timing[timing["commit_hash"].astype(str).str.startswith(short[label])].to_dict("records")
        flags = [row.get("contended") for row in rows]
        contention[label] = {"figures": len(flags), "recorded": sum(f is not None for f in flags),
                             "contended": sum(f is True for f in flags),
                             "reasons": sorted({str(row.get("contention_reason")) for row in rows
                                                if row.get("contended") is True})[:3]}
    recorded_d = contention["D"]["recorded"]
    return {"commits": short, "flagged": by_step, "verdicts": verdicts, "aa_spread": spread,
            "run_shift_at_B": run_shift_b,
            "figures_at_B": int(frame["commit_hash"].astype(str).str.startswith(short["B"]).sum()),
            "contention": contention,
            "contended_share_at_D": contention["D"]["contended"] / recorded_d if recorded_d else None,
            "slow_impl_flagged_at_C": any(line.startswith(slow_impl + " ") for line in by_step["C"]),
            "others_flagged_at_C": [line for line in by_step["C"] if not line.startswith(slow_impl + " ")]}


def render(s: dict) -> str:
    aa = s["aa_spread"]
    mine = [line for line in s["flagged"]["C"] if line.startswith(s["slow_impl"] + " ")]
    worst = max((abs(r["b_over_a"] - 1) for r in aa if not r["contended"]), default=None)
    shift = s.get("run_shift_at_B")  # absent in summaries written before it was recorded
    worst_run = max((abs(r["against_run"] - 1) for r in aa if not r["contended"]
                     and r.get("against_run") is not None), default=None)
    against = (f"; against its run (B moved {shift:+.1%} as a whole): worst {worst_run:.1%}, "
               f"{sum(abs(r['against_run'] - 1) <= 0.05 for r in aa if not r['contended'])} of "
               f"{sum(not r['contended'] for r in aa)} within 5%" if worst_run is not None else "")
    lines = [f"# Noise check on {s['machine']}, {s['date']}", "",
             f"Kernels: {', '.join(s['impls'])}; deliberate slowdown: {s['slow_impl']} "
             f"+{s['slowdown']:.0%} at commit C. asv run times (s): "
             + ", ".join(f"{k} {v:.0f}" for k, v in s["asv_run_seconds"].items()), "",
             f"- A/A (B = A + README): {len(s['flagged']['B'])} of {s['figures_at_B']} figures flagged as "
             f"regressions (target 0): {', '.join(s['flagged']['B']) or 'none'}; steps by verdict "
             f"{s['verdicts']['B'] or 'none'}",
             f"- A/A spread of seconds_per_step, uncontended cases: worst {worst:.1%}{against}"
             if worst is not None else "- A/A spread: no uncontended pair", *[
                 f"  - {r['impl']} S={r['seq']}: B/A {r['b_over_a']:.3f}"
                 + (f" ({r['against_run']:.3f} against the run)" if r.get("against_run") is not None else "")
                 + (" (contended)" if r["contended"] else "") for r in aa],
             f"- Sensitivity (C = B + {s['slow_impl']} {s['slowdown']:.0%} slower): flagged for it: "
             f"{s['slow_impl_flagged_at_C']} ({', '.join(mine) or 'no figure'}; its seconds_per_step: "
             f"{any(line.endswith(' seconds_per_step') for line in mine)}); flagged for others: "
             f"{s['others_flagged_at_C'] or 'none'}; steps by verdict {s['verdicts']['C'] or 'none'}",
             "- Contention flags on the static timings (the sidecar's, as the report reads them): "
             + "; ".join(
                 f"{label} {c['contended']} of {c['recorded']} recorded flags contended "
                 f"({c['figures'] - c['recorded']} unrecorded)" for label, c in s["contention"].items()),
             f"- Contention (D measured beside a busy core): contended share of D's figures "
             f"{s['contended_share_at_D']}; reasons: {s['contention']['D']['reasons'] or 'none'}; flagged as "
             f"regressions: {s['flagged']['D'] or 'none'}; steps by verdict {s['verdicts']['D'] or 'none'}",
             "- attnbench compare: " + "; ".join(
                 f"{pair}: B/A {g['ratio']:.3f} [{g['ci'][0]:.3f}, {g['ci'][1]:.3f}] {g['verdict']}"
                 for pair, g in s["compare"].items()), ""]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Its options, on ``attnbench noisecheck``'s parser and on this module's own."""
    parser.add_argument("--impls", default="torch-sdpa-flash,jax-xla,torch-blockwise-flash")
    parser.add_argument("--slow-impl", default="torch-sdpa-flash")
    parser.add_argument("--slowdown", type=float, default=0.15)
    parser.add_argument("--rounds", type=int, default=10, help="attnbench compare rounds")
    parser.add_argument("--out", default=str(ROOT / "results" / "noisecheck"))


def command(args: argparse.Namespace) -> int:
    summary = run(args.impls.split(","), args.slow_impl, args.slowdown, Path(args.out), args.rounds)
    print(render(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnbench noisecheck", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
