#!/usr/bin/env bash
# The prepared accelerator run: one command on a lent machine with no network (docs/device.md),
# or here on the CPU as a rehearsal.
#   bash tools/device-run.sh                     the image's python3, the gpu suite, ACCEL=cuda
#   DEVICE_DRY_RUN=1 bash tools/device-run.sh    .venv/bin/python, the smoke suite, ACCEL=cpu
# It measures and nothing else: asv's bookkeeping (a process per benchmark and parameter combination,
# minutes for the gpu grid) runs back here, where `python -m attnbench.asv.carried file` files the
# carried records with asv (make device-file). Needs, where the Python lacks what measuring needs
# (absl-py, threadpoolctl, asv_runner), the wheels of tools/device-wheels.sh in .whl/ (carried there;
# installed with pip, or unpacked when the Python has no pip), and the history (.git, or .whl/head.bundle,
# whose commit the copied code must be: else it stops, unless DEVICE_ALLOW_DIRTY=1). Writes under
# $OUT (a new temporary folder when unset): measured-<machine>.tar.gz (every case's record, the
# sidecar, the traces, the machine's facts) and device-run.log. Ends within DEVICE_BUDGET_S seconds
# (480): no case starts after the deadline, which leaves DEVICE_PACK_S (30) for the listing and the
# packing; the measuring is stopped at the budget whatever happens, and what finished is packed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
budget=${DEVICE_BUDGET_S:-480}
pack_s=${DEVICE_PACK_S:-30}
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
if ! "$py" -m attnbench.run.environment check --need measure; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "device-run: no carried wheels in .whl/ (bash tools/device-wheels.sh prepares them)"; exit 1
  fi
  if "$py" -m pip --version >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
      .whl/*.whl || exit 1
  else  # a system Python without pip: a wheel is a zip of what goes on the path
    echo "device-run: $py has no pip; unpacking the wheels"
    for wheel in .whl/*.whl; do "$py" -m zipfile -e "$wheel" "$work/site" || exit 1; done
  fi
  export PYTHONPATH=$PYTHONPATH:$work/site
  "$py" -m attnbench.run.environment check --need measure || echo "device-run: still missing: some kernels may be refused"
fi

# Results are filed under a commit: this checkout's, or the carried bundle's.
if commit=$(git rev-parse HEAD 2>/dev/null); then
  [ -z "$(git status --porcelain --untracked-files=no)" ] || echo "device-run: WARNING: uncommitted changes run under $commit"
elif [ -f .whl/head.bundle ]; then
  repo=$work/repo
  git init -q "$repo" && git -C "$repo" fetch -q "$root/.whl/head.bundle" "HEAD:refs/heads/main" &&
    git -C "$repo" symbolic-ref HEAD refs/heads/main || exit 1
  commit=$(git -C "$repo" rev-parse main)
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
  echo "device-run: no git history here (.git or .whl/head.bundle): results are filed under a commit"; exit 1
fi
echo "commit $commit"

say "the machine"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
  --format=csv
"$py" -c 'import os, platform; print(platform.platform(), "|", os.cpu_count(), "CPUs")'
machine=$("$py" -m attnbench machine-name) || exit 1
echo "machine name: $machine"
"$py" -m attnbench list --seq 1024 --dtype "$probe_dtype"

measure_left=$(( $(left) - pack_s ))
deadline=$(( $(date +%s) + measure_left ))
say "measuring the $suite suite in $py: no case starts after $(date -d @"$deadline" +%T 2>/dev/null || echo "$deadline") ($measure_left s of the $budget s budget)"
ATTNBENCH_DEADLINE=$deadline timeout -k 10 "$(( measure_left + pack_s / 2 ))" \
  "$py" -m attnbench.asv.carried measure --into "$work/carried" --machine "$machine" --commit "$commit"
echo "measuring: exit $? after $(( $(date +%s) - start )) s"

say "what ran, and the evidence of which kernel"
timeout 20 "$py" -m attnbench cases "$work/carried/cases" || true

say "packing"
status=1
if [ -n "$(find "$work/carried/cases" -name '*.case' -print -quit 2>/dev/null)" ]; then  # no pipe: pipefail
  tar -czf "$OUT/measured-$machine.tar.gz" -C "$work/carried" . && status=0
  echo "device-run: file it with asv where the tree has asv: make device-file FROM=$OUT/measured-$machine.tar.gz"
else
  echo "device-run: no case finished for $machine: nothing to file"
fi
ls -l "$OUT"
[ -n "${DEVICE_KEEP:-}" ] && echo "kept $work" || rm -rf "$work"
echo "device-run: done in $(( $(date +%s) - start )) s"
exit $status
