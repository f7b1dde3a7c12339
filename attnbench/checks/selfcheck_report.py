"""Speed benchmark of the results loader and the analysis, on synthetic asv results it writes itself.

Target (issue "pandas reports ..."), checked here and reported, never in a timed unit test:
100,000 tidy rows go through ``load_results`` + ``find_regressions`` + ``find_cost_spikes`` in at
most 3 s. The rows are real asv result files (``results/benchmarks.json`` and
``results/<machine>/<sha8>-<env>.json`` in asv 0.6.6's positional ``result_columns`` format) for the
commits of a throw-away git repository, so commit order comes from git as it does for real results.

    python -m attnbench selfcheck-report

The same generator builds ``tests/test_report.py``'s fixtures: a known cost step injected at one
commit, with host memory and one library version moving with it, checks detection and attribution.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import random
import subprocess
import tempfile
import time
from dataclasses import dataclass

import attention_impls
from attnbench.asv import sidecar
from attnbench.core import records
from attnbench.core.metrics import METRIC_VERSION, METRICS
from attnbench.core.workload import Workload
from attnbench.results.asv_results import load_results
from attnbench.results.spikes import find_cost_spikes
from attnbench.results.steps import find_regressions

ENV_MAIN = "virtualenv-py3.11-jax0.10.2-jaxlib0.10.2-numpy-torch2.13.0"
ENV_XLA = "virtualenv-py3.11-jax0.7.1-jaxlib0.7.1-numpy-torch2.9.0-torch-xla2.9.0"
ENV_REQUIREMENTS = {ENV_MAIN: {"jax": "0.10.2", "jaxlib": "0.10.2", "numpy": "", "torch": "2.13.0"},
                    ENV_XLA: {"jax": "0.7.1", "jaxlib": "0.7.1", "numpy": "", "torch": "2.9.0",
                              "torch-xla": "2.9.0"}}
ENV_FRAMEWORKS = {ENV_MAIN: ("numpy", "jax", "torch"), ENV_XLA: ("torch_xla",)}
RESULT_COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
                  "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]  # asv's
# Milliseconds per step at S=1024 on the 2-core CPU (README's first sweep), scaled by S^2.
BASE_MS = {"reference-float64": 585.0, "jax-xla": 46.0, "jax-pallas-tpu-flash": 2800.0,
           "jax-pallas-tpu-splash": 41.0, "jax-pallas-gpu-mha": 49.0, "jax-blockwise-flash": 19.0,
           "torch-sdpa-math": 49.6, "torch-sdpa-flash": 10.7, "torch-flex-attention": 16.4,
           "torch-blockwise-flash": 15.5, "torch-xla-sdpa": 47.2, "torch-xla-blockwise-flash": 23.6}
# machine -> (time scale against the CPU, USD per hour, peak TFLOP/s, platform)
MACHINES = {"cpu-2core": (1.0, 0.095, 0.3, "cpu"), "h200": (0.004, 3.72, 989.0, "gpu")}
STEPS = 6


@dataclass(frozen=True)
class Spike:
    """A cost step injected from ``commit`` (index into the commit list) on, for one case."""

    commit: int
    implementation: str = "jax-blockwise-flash"
    seq_len: int = 1024
    regime: str = "static"
    machine: str = "cpu-2core"
    factor: float = 1.4  # seconds (so cost) per step
    rss_factor: float = 1.6  # host_rss_growth_bytes
    library: str = "jax"
    version: str = "0.10.3"  # the library's version from ``commit`` on (versions sidecar)


def make_git_repo(path: str, n: int, touch: str | None = "attnbench/measure/engine.py") -> list[str]:
    """A repository with ``n`` commits; their hashes, oldest first. Each rewrites ``touch``, a path
    on every kernel's measurement path, so every series sees a code change (``touch=None``: empty
    commits)."""
    os.makedirs(path, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}

    def git(*args):
        return subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True,
                              text=True).stdout

    git("init", "-q", "-b", "main")
    for i in range(n):
        if touch:
            file = os.path.join(path, touch)
            os.makedirs(os.path.dirname(file), exist_ok=True)
            with open(file, "w", encoding="utf-8") as f:
                f.write(f"STEP = {i}\n")
            git("add", touch)
        git("commit", "-q", "--allow-empty", "--no-gpg-sign", "-m", f"commit {i}")
    return git("rev-list", "--reverse", "HEAD").split()


def _stream(seq_len: int, seed: int) -> list[int]:
    """Lengths between half and all of the maximum, a few of them repeating (so dynamic shapes have
    steady steps between their compiles)."""
    rng = random.Random(seed * 7919 + seq_len)
    lengths = rng.sample(range(seq_len // 2, seq_len + 1), 3)
    return [lengths[0], *(rng.choice(lengths) for _ in range(STEPS - 1))]


def _padded(lengths, regime, seq_len):
    if regime == "static":
        return [seq_len] * len(lengths)
    if regime == "bucketed":
        return [min(seq_len, -(-n // 128) * 128) for n in lengths]
    return list(lengths)


def _trace(impl, workload, seq_len, regime, seconds, compile_s, price, seed):
    """Per-step rows like ``attnbench.core.regimes.trace_to_rows`` (``usd`` filled in like the engine)."""
    lengths = _stream(seq_len, seed)
    padded = _padded(lengths, regime, seq_len)
    seen, rows = set(), []
    for step, (length, run) in enumerate(zip(lengths, padded, strict=True)):
        compiled = bool(compile_s) and run not in seen
        seen.add(run)
        t = seconds * (run / seq_len) ** 2 + (compile_s if compiled else 0.0)
        rows.append({"impl": impl, "regime": regime, "policy": "multiple-128" if regime == "bucketed" else "",
                     "workload": workload, "step": step, "length": length, "padded_length": run,
                     "tokens": length, "compiled": compiled, "seconds": t, "usd": price / 3600 * t})
    return rows


def _record(machine, impl_name, framework, mode, seq_len, regime, rng, noise, spike_on, seed):
    """One case's record (the engine's columns the suite's metrics read) and its per-step trace."""
    scale, price, peak, platform = MACHINES[machine]
    workload = Workload(batch=1, q_heads=8, head_dim=64, seq_q=seq_len, seq_k=seq_len, causal=True,
                        mode=mode)
    jitter = math.exp(rng.gauss(0.0, noise))
    seconds = BASE_MS[impl_name] * 1e-3 * scale * (seq_len / 1024) ** 2 * (3.5 if mode == "fwd_bwd" else 1)
    seconds *= jitter * (spike_on.factor if spike_on else 1.0)
    compiled = framework in ("jax", "torch_xla") or impl_name == "torch-flex-attention"
    compile_s = (0.3 if framework == "jax" else 0.9) * scale ** 0.5 if compiled else 0.0
    trace = _trace(impl_name, workload.describe(), seq_len, regime, seconds, compile_s, price, seed)
    steady = [r["seconds"] for r in trace if not r["compiled"]] or [seconds]
    step_s = sorted(steady)[len(steady) // 2]
    total = sum(r["seconds"] for r in trace)
    real = sum(r["length"] for r in trace)
    computed = sum(r["padded_length"] for r in trace)
    compiles = sum(r["compiled"] for r in trace)
    tflops = workload.flops / step_s / 1e12
    rss = seq_len * seq_len * 4 * 8 * (1.5 if framework == "numpy" else 0.5)
    rss *= spike_on.rss_factor if spike_on else 1.0
    record = records.new_record(
        status=records.OK, seconds_per_step=step_s, tokens_per_s=workload.tokens / step_s,
        seconds_per_million_tokens=step_s / workload.tokens * 1e6, tflops=tflops,
        mfu=tflops / peak, first_call_s=trace[0]["seconds"],
        compile_seconds_total=compiles * compile_s,
        compiles=compiles, padding_waste=1 - real / computed,
        useful_tokens_per_s=real / total,
        device_peak_bytes=rss * 1.1 if platform != "cpu" else None,
        compiler_temp_bytes=seq_len * seq_len * 4 * 8 if framework == "jax" else None,
        compiler_peak_bytes=seq_len * seq_len * 4 * 9 if framework == "jax" else None,
        host_profiler_peak_bytes=seq_len * seq_len * 4 * 8 if framework == "torch" else None,
        host_rss_growth_bytes=rss * math.exp(rng.gauss(0.0, noise / 4)) if platform == "cpu" else None,
        usd_per_step_on_demand=price / 3600 * step_s,
        usd_per_step_with_compiles_on_demand=price / 3600 * total / len(trace),
        usd_per_million_tokens_on_demand=price / 3600 * step_s / workload.tokens * 1e6,
        max_abs_err=2e-7)
    return record, trace


def write_synthetic_results(results_dir: str, commits: list[str], *, machines=("cpu-2core",),
                            envs=(ENV_MAIN, ENV_XLA), forward_seqs=(256, 1024), training_seqs=(512,),
                            spike: Spike | None = None, traces: str | None = "last", noise: float = 0.01,
                            seed: int = 0) -> int:
    """asv result files for every commit x machine x env, plus versions sidecars and (for the newest
    commit with ``traces="last"``, every commit with ``"all"``) per-step traces. Returns the number
    of grid cells written, measured or n/a (``load_results`` makes a row of each measured one)."""
    names = attention_impls.names()
    suites = {"Forward": (["implementation", "seq_len", "regime", "dtype"],
                          [names, list(forward_seqs), ["static", "dynamic", "bucketed"], ["float32"]]),
              "Training": (["implementation", "seq_len"], [names, list(training_seqs)])}
    benchmarks = {}
    for suite, (param_names, params) in suites.items():
        for metric in METRICS:
            name = f"attention.{suite}.track_{metric.name}"
            benchmarks[name] = {"code": "", "name": name, "param_names": param_names,
                                "params": [[repr(v) for v in p] for p in params], "timeout": 3600,
                                "type": "track", "unit": metric.unit, "version": METRIC_VERSION}
    benchmarks["version"] = 2
    _write_json(os.path.join(results_dir, "benchmarks.json"), benchmarks)
    rng = random.Random(seed)
    rows = 0
    start_ms = 1_790_000_000_000
    for machine in machines:
        platform = MACHINES[machine][3]
        _write_json(os.path.join(results_dir, machine, "machine.json"), {"machine": machine, "version": 1})
        for index, commit in enumerate(commits):
            last = index == len(commits) - 1
            for env in envs:
                results = {}
                for suite, (_, params) in suites.items():
                    combos = list(itertools.product(*params))
                    mode = "fwd" if suite == "Forward" else "fwd_bwd"
                    cases = []
                    for combo in combos:
                        impl_name, seq_len = combo[0], combo[1]
                        regime = combo[2] if len(combo) > 2 else "static"
                        impl = attention_impls.get(impl_name)
                        if (impl.framework not in ENV_FRAMEWORKS[env] or impl_name not in BASE_MS
                                or impl.platform_support[platform].status == "unsupported"):
                            cases.append(None)
                            continue
                        on = (spike if spike and index >= spike.commit and suite == "Forward"
                              and (machine, impl_name, seq_len, regime)
                              == (spike.machine, spike.implementation, spike.seq_len, spike.regime) else None)
                        record, trace = _record(machine, impl_name, impl.framework, mode, seq_len, regime,
                                                rng, noise, on, seed)
                        cases.append(record)
                        if suite == "Forward" and (traces == "all" or (traces == "last" and last)):
                            _write_trace(results_dir, machine, commit, env, impl_name, regime, seq_len, trace)
                    for metric in METRICS:
                        values = [math.nan if r is None else metric.value(r) for r in cases]
                        results[f"attention.{suite}.track_{metric.name}"] = [
                            values, [[repr(v) for v in p] for p in params], METRIC_VERSION,
                            start_ms + index * 3_600_000, 0.01]
                        rows += len(values)
                date = start_ms + index * 3_600_000
                payload = {"commit_hash": commit, "env_name": env, "date": date,
                           "params": {"machine": machine, "python": "3.11", **ENV_REQUIREMENTS[env]},
                           "python": "3.11", "requirements": ENV_REQUIREMENTS[env], "env_vars": {},
                           "result_columns": RESULT_COLUMNS, "results": results, "durations": {},
                           "version": 2}
                _write_json(os.path.join(results_dir, machine, f"{commit[:8]}-{env}.json"), payload)
                versions = {"numpy": "2.3.5", **{k.replace("-", "_"): v
                                                  for k, v in ENV_REQUIREMENTS[env].items() if v}}
                if spike and index >= spike.commit and machine == spike.machine and spike.library in versions:
                    versions[spike.library] = spike.version
                payload = {"commit_hash": commit, "env_name": env, "machine": machine, "versions": versions}
                _write_json(sidecar.path(results_dir, machine, commit, env), payload)
    return rows


def _write_json(path: str, payload) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f)  # NaN stays bare NaN, as asv writes it


def _write_trace(results_dir, machine, commit, env, impl, regime, seq_len, trace) -> None:
    folder = os.path.join(results_dir, machine, "traces", f"{commit[:8]}-{env}")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{impl}__{regime}__S{seq_len}__fwd__float32.csv"), "w", newline="",
              encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(trace[0]))
        writer.writeheader()
        writer.writerows(trace)


def rows_per_commit() -> int:
    """The tidy rows one commit's synthetic results make: its measured cells (the grid's n/a ones are
    counted, not rows), read back from one commit written aside."""
    with tempfile.TemporaryDirectory(prefix="attnbench-selfcheck-probe-") as tmp:
        write_synthetic_results(tmp, ["0" * 40], traces=None)
        return len(load_results(tmp, repo=tmp))


def main(rows: int = 100_000, target_s: float = 3.0) -> int:
    n_commits = max(4, -(-rows // rows_per_commit()))  # a spike held two runs: one run is unconfirmed
    spike = Spike(commit=n_commits // 2)
    with tempfile.TemporaryDirectory(prefix="attnbench-selfcheck-report-") as tmp:
        repo = os.path.join(tmp, "repo")
        commits = make_git_repo(repo, n_commits)
        results = os.path.join(repo, "results")
        written = write_synthetic_results(results, commits, spike=spike, traces=None)
        start = time.perf_counter()
        frame = load_results(results, repo=repo)
        loaded = time.perf_counter()
        regressions = find_regressions(frame)
        regressed = time.perf_counter()
        spikes = find_cost_spikes(frame)
        done = time.perf_counter()
    total = done - start
    found = spikes[(spikes["implementation"] == spike.implementation) & (spikes["seq_len"] == spike.seq_len)
                   & (spikes["regime"] == spike.regime)
                   & (spikes["commit_after"] == commits[spike.commit])] if not spikes.empty else spikes
    print(f"# results loader + analysis self-check: {len(frame):,} tidy rows (of {written:,} grid cells "
          f"written) from {n_commits} commits x 2 envs of synthetic asv results")
    print(f"load_results      {loaded - start:7.3f} s")
    print(f"find_regressions  {regressed - loaded:7.3f} s  ({len(regressions)} regressions)")
    print(f"find_cost_spikes  {done - regressed:7.3f} s  ({len(spikes)} cost spikes)")
    print(f"injected +{spike.factor - 1:.0%} cost step at commit {spike.commit} "
          f"({spike.implementation} S{spike.seq_len} {spike.regime}): "
          + (f"found, attributed to {found.iloc[0]['attribution']}" if len(found) else "NOT found"))
    ok = total <= target_s and len(found) > 0
    print(f"{'PASS' if ok else 'MISS'}  load + regressions + cost spikes: {total:.3f} s "
          f"(target <= {target_s:g} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
