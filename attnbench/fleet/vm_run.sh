#!/usr/bin/env bash
# The `run` of every fleet task: the resumable loop of attnbench/fleet/runner.py, from the synced
# workdir's code, measuring the checkout vm_setup.sh prepared at $COMMIT. It records where the job
# landed and the catalog price there, checks that the frameworks see the accelerator, then runs
# every benchmark group in both asv environments, publishing to the bucket after each group.
set -euo pipefail
workdir=$(cd "$(dirname "$0")/../.." && pwd)
checkout=${ATTNBENCH_CHECKOUT:-$HOME/attnbench-measure}
cd "$workdir"
exec "$HOME/attnbench-fleet-venv/bin/python" -m attnbench.fleet run \
  --machine "$ATTNBENCH_MACHINE" --commit "$(git -C "$checkout" rev-parse HEAD)" --checkout "$checkout" \
  --bucket /attnbench-bucket --task "attnbench/fleet/tasks/$ATTNBENCH_FLEET_KIND.yaml" \
  --market "$ATTNBENCH_MARKET" --check-machine
