#!/usr/bin/env bash
# make rehearse-device: the prepared GPU run, rehearsed here on the CPU as the lent machine will run it.
#   1. a venv that mimics the H200 image (tools/device-mimic-venv.sh: Python 3.12, torch 2.11, jax 0.11.2,
#      no asv, no absl-py, no threadpoolctl; about 5.6 GB, built once);
#   2. tools/device-wheels.sh in a clean clone of HEAD, and the tree copied without .git, as it travels;
#   3. tools/device-run.sh there (DEVICE_DRY_RUN=1) with the gpu suite's real grid and every kernel, in
#      the mimic's Python, within DEVICE_BUDGET_S (480 s);
#   4. what it brought back filed here with asv (python -m attnbench.asv.carried file), into a scratch
#      results folder (the checkout's results/ are not touched).
# Prints each step's seconds and fails when the device part overran its budget or nothing was filed.
# Not part of make test (it installs several GB); its last result goes in results/LOG.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
budget=${DEVICE_BUDGET_S:-480}
bash tools/device-mimic-venv.sh .venv-device
mimic=$root/.venv-device/bin/python
scratch=$(mktemp -d /tmp/attnbench-rehearse-XXXXXX)
trap 'code=$?; if [ $code -eq 0 ]; then rm -rf "$scratch"; else echo "rehearse-device: failed; kept $scratch" >&2; fi' EXIT
git clone -q "$root" "$scratch/clone"
(cd "$scratch/clone" && bash tools/device-wheels.sh)
mkdir "$scratch/tree"
(cd "$scratch/clone" && git ls-files -z | xargs -0 cp --parents -t "$scratch/tree" && cp -r .whl "$scratch/tree/")
echo "rehearse-device: the tree travels as $(du -sh "$scratch/tree" | cut -f1), without .git"

start=$(date +%s)
code=0
env -u ATTNBENCH_IMPLS OUT="$scratch/out" DEVICE_DRY_RUN=1 DEVICE_PYTHON="$mimic" DEVICE_SUITE=gpu DEVICE_IMPLS= \
  DEVICE_BUDGET_S="$budget" bash "$scratch/tree/tools/device-run.sh" >/dev/null 2>&1 || code=$?
device_s=$(( $(date +%s) - start ))
if [ "$code" -ne 0 ]; then
  echo "rehearse-device: tools/device-run.sh exited $code after ${device_s} s:" >&2
  tail -40 "$scratch/out/device-run.log" >&2; exit 1
fi
grep -E '^(== |measuring: |device-run: |machine name: )' "$scratch/out/device-run.log"

start=$(date +%s)
tarball=$(ls "$scratch"/out/measured-*.tar.gz)
.venv/bin/python -m attnbench.asv.carried file "$tarball" --results "$scratch/results" > "$scratch/file.log" 2>&1 ||
  { tail -30 "$scratch/file.log"; exit 1; }
grep -E '^(· Running|attnbench: filed)' "$scratch/file.log"
file_s=$(( $(date +%s) - start ))
.venv/bin/python - "$scratch/results" <<'PY'
import collections, glob, json, sys
for path in glob.glob(f"{sys.argv[1]}/*/sidecars/*.sidecar"):
    data = json.load(open(path))
    statuses = collections.Counter(entry["status"] for entry in data["cases"].values())
    print(f"rehearse-device: {data['env_name']}: {len(data['cases'])} cases {dict(statuses)}, "
          f"{len(data['left_out'])} kernels left out of the grid")
results = [p for p in glob.glob(f"{sys.argv[1]}/*/*.json") if not p.endswith("machine.json")]
filled = sum(v is not None for p in results for r in json.load(open(p))["results"].values()
             for v in (r[0] if isinstance(r[0], list) else [r[0]]) if v == v)
print(f"rehearse-device: {len(results)} asv result file(s), {filled} figures")
sys.exit(0 if results and filled else 1)
PY
echo "rehearse-device: the device part took ${device_s} s of its ${budget} s budget; filing it with asv here took ${file_s} s"
[ "$device_s" -le $(( budget + 15 )) ] || { echo "rehearse-device: the device part overran its budget" >&2; exit 1; }
