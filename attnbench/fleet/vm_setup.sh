#!/usr/bin/env bash
# The `setup` of every fleet task (attnbench/fleet/tasks/*.yaml), run by SkyPilot on each (re)launch,
# on a fresh VM, from the synced workdir (the launcher's checkout, .git included).
#
#   1. Python >= 3.11 (the project's floor; cloud images ship 3.10): uv installs one.
#   2. The commit under measurement in its own clean checkout ($ATTNBENCH_CHECKOUT, a git worktree):
#      uncommitted edits in the launcher's checkout are never measured under that commit's name.
#   3. `make setup ACCEL=$ACCEL` there: the two measured venvs (.venv, .venv-xla) with the
#      accelerator builds (asv_runner in both, a dependency of the project: asv runs benchmarks in
#      .venv-xla as an existing env).
#   4. A venv of its own for the fleet's tools (SkyPilot, for the catalog price), apart from the
#      measured venvs, so that nothing measured changes with it.
set -euo pipefail
: "${COMMIT:?COMMIT is empty: launch with make fleet-launch (it passes --env COMMIT=<sha>)}"
: "${BUCKET:?BUCKET is empty: launch with make fleet-launch FLEET_BUCKET=<name>}"
: "${ACCEL:?ACCEL is empty: the task file sets it (tpu or cuda)}"
workdir=$(cd "$(dirname "$0")/../.." && pwd)
checkout=${ATTNBENCH_CHECKOUT:-$HOME/attnbench-measure}

command -v g++ >/dev/null 2>&1 || { sudo apt-get update -q && sudo apt-get install -y -q g++ make git; }
python3 -m pip install --user --quiet uv
export PATH="$HOME/.local/bin:$PATH"
uv python install 3.11
py=$(uv python find 3.11)

git -C "$workdir" cat-file -e "$COMMIT^{commit}" || {
  echo "commit $COMMIT is not in the synced checkout: launch from a checkout that has it"; exit 1; }
if [ ! -e "$checkout/.git" ]; then
  git -C "$workdir" worktree prune
  git -C "$workdir" worktree add --force --detach "$checkout" "$COMMIT"
fi
git -C "$checkout" checkout --quiet --detach "$COMMIT"

make -C "$checkout" setup ACCEL="$ACCEL" PYTHON="$py"

"$py" -m venv "$HOME/attnbench-fleet-venv"
"$HOME/attnbench-fleet-venv/bin/python" -m pip install --quiet -e "$workdir[fleet]"
