#!/usr/bin/env bash
# The prepared accelerator run: one command on a lent machine with no network (docs/device.md),
# or here on the CPU as a rehearsal.
#   bash tools/device-run.sh                     the image's python3, the gpu suite, ACCEL=cuda
#   DEVICE_DRY_RUN=1 bash tools/device-run.sh    .venv/bin/python, the smoke suite, ACCEL=cpu
# Needs, where asv is missing, the wheels of tools/device-wheels.sh in .whl/ (carried there), and the
# history (.git, or .whl/head.bundle, whose commit the copied code must be: else it stops, unless
# DEVICE_ALLOW_DIRTY=1) to file results under HEAD. Writes under $OUT (a new temporary
# folder when unset): results-<machine>.tar.gz (results/<machine>/: asv results, sidecars, traces; and
# benchmarks.json), cases.tar.gz (every case's full record, kept even if asv does not finish) and
# device-run.log. Ends within DEVICE_BUDGET_S seconds (480): no case starts after the sweep's deadline,
# which leaves DEVICE_ASV_S (60: asv's own work after the measurements, ~30 s here) and the packing;
# asv is stopped at the budget whatever happens, and what finished is packed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
budget=${DEVICE_BUDGET_S:-480}
asv_after=${DEVICE_ASV_S:-60}
OUT=${OUT:-$(mktemp -d /tmp/attnbench-device-out-XXXXXX)}
mkdir -p "$OUT"
exec > >(tee "$OUT/device-run.log") 2>&1
left() { echo $((start + budget - $(date +%s))); }
say() { printf '\n== %s (%s s left)\n' "$*" "$(left)"; }

# The rehearsal measures a few kernels that cover each path (compiled, eager, interpreted, refused
# here) within 5 minutes on 2 cores; the real run measures every kernel (DEVICE_IMPLS narrows either).
rehearsal=reference-float64,jax-xla,jax-pallas-gpu-mha,jax-cudnn,jax-pallas-mgpu-attention,torch-sdpa-flash,torch-sdpa-cudnn
if [ -n "${DEVICE_DRY_RUN:-}" ]; then
  py=${DEVICE_PYTHON:-.venv/bin/python} suite=${DEVICE_SUITE:-smoke} accel=cpu probe_dtype=float32
  impls=${DEVICE_IMPLS-$rehearsal}
else
  py=${DEVICE_PYTHON:-python3} suite=${DEVICE_SUITE:-gpu} accel=cuda probe_dtype=bfloat16
  impls=${DEVICE_IMPLS-}
fi
[ -n "$impls" ] && export ATTNBENCH_IMPLS=$impls
py=$(command -v "$py") && py=$(realpath -s "$py") || { echo "device-run: no Python at ${DEVICE_PYTHON:-python3}"; exit 1; }
work=$(mktemp -d /tmp/attnbench-device-XXXXXX)
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} ACCEL=$accel ATTNBENCH_SUITE=$suite
export KINETO_LOG_LEVEL=5 PYTHONUNBUFFERED=1

say "the Python: what it has and lacks"
if ! "$py" -m attnbench.run.environment check --need bench; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "device-run: no carried wheels in .whl/ (bash tools/device-wheels.sh prepares them)"; exit 1
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
    .whl/*.whl || exit 1
  export PYTHONPATH=$PYTHONPATH:$work/site
  "$py" -m attnbench.run.environment check --need bench || echo "device-run: still missing: the report may fail"
fi

# asv files results under a commit of a git repository: this checkout's, or the carried bundle's.
if commit=$(git rev-parse HEAD 2>/dev/null); then
  repo=$root
  [ -z "$(git status --porcelain --untracked-files=no)" ] || echo "device-run: WARNING: uncommitted changes run under $commit"
elif [ -f .whl/head.bundle ]; then
  git init -q "$work/repo" && git -C "$work/repo" fetch -q "$root/.whl/head.bundle" "HEAD:refs/heads/main" &&
    git -C "$work/repo" symbolic-ref HEAD refs/heads/main || exit 1
  repo=$work/repo commit=$(git -C "$repo" rev-parse main)
  # The results are filed under the bundled commit: the code that runs must be that commit's.
  tree=(git --git-dir="$repo/.git" --work-tree="$root" -c core.fileMode=false)  # a copy may drop modes
  "${tree[@]}" read-tree main && "${tree[@]}" update-index -q --refresh >/dev/null
  changed=$("${tree[@]}" status --porcelain -- attnbench attention_impls benchmarks tools asv.conf.json pyproject.toml)
  if [ -n "$changed" ]; then
    echo "device-run: the code here is not the bundled commit $commit (run tools/device-wheels.sh again):"
    echo "$changed" | head -20
    [ -n "${DEVICE_ALLOW_DIRTY:-}" ] || exit 1
  fi
else
  echo "device-run: no git history here (.git or .whl/head.bundle): asv files results under a commit"; exit 1
fi
echo "commit $commit"

say "the machine"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
  --format=csv
"$py" -c 'import os, platform; print(platform.platform(), "|", os.cpu_count(), "CPUs")'
machine=$("$py" -m attnbench machine-name) || exit 1
echo "machine name: $machine"
"$py" -m attnbench list --seq 1024 --dtype "$probe_dtype"

conf=$work/asv.conf.json
"$py" - "$conf" "$repo" "$root" "$work" <<'PY' || exit 1
import json, sys
from asv import util
conf, repo, root, work = sys.argv[1:]
c = util.load_json(f"{root}/asv.conf.json", js_comments=True)
c.update(repo=repo, benchmark_dir=f"{root}/benchmarks", results_dir=f"{work}/results", html_dir=f"{work}/html",
         env_dir=f"{work}/env")
with open(conf, "w") as fh:
    json.dump(c, fh, indent=1)
PY
"$py" -m asv machine --yes --machine "$machine" --config "$conf" >/dev/null || exit 1

asv_left=$(( $(left) - 20 ))  # the packing's margin
deadline=$(( $(date +%s) + asv_left - asv_after ))
say "the $suite suite in $py (no case starts after $(date -d @"$deadline" +%T 2>/dev/null || echo "$deadline"))"
ATTNBENCH_DEADLINE=$deadline ATTNBENCH_CASE_CACHE=$work/cases ATTNBENCH_MACHINE=$machine \
  ATTNBENCH_RESULTS_DIR=$work/results ATTNBENCH_COMMIT=$commit \
  ASV_PYTHONPATH=$PYTHONPATH timeout -k 10 "$asv_left" \
  "$py" -m asv run --config "$conf" --machine "$machine" -E "existing:$py" --set-commit-hash "$commit" \
  ${DEVICE_ASV_ARGS:--b ^attention\.}  # the measured suite only: not the compiled-for tier or make releases' matrix
echo "asv run: exit $? after $(( $(date +%s) - start )) s"

say "what ran, and the evidence of which kernel"
"$py" -m attnbench cases "$work/cases"
"$py" -m attnbench summary --results "$work/results" || true

say "packing"
[ -d "$work/cases" ] && tar -czf "$OUT/cases.tar.gz" -C "$work" cases
status=1
if ls "$work/results/$machine"/*-existing-*.json >/dev/null 2>&1; then
  tar -czf "$OUT/results-$machine.tar.gz" -C "$work/results" "$machine" benchmarks.json && status=0
else
  echo "device-run: asv wrote no results for $machine; cases.tar.gz holds every record that finished"
fi
ls -l "$OUT"
[ -n "${DEVICE_KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
echo "device-run: done in $(( $(date +%s) - start )) s"
exit $status
