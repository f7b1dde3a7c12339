#!/usr/bin/env bash
# Prepare, on a machine with a package registry, what tools/device-run.sh needs on a lent accelerator
# machine that has none (the H200 image: Python 3.12 with torch, jax, numpy, pandas, matplotlib,
# psutil, pytest, pyyaml, tabulate, but no absl-py, no threadpoolctl, no asv, maybe no pip):
#   .whl/*.whl        what measuring needs and the image lacks (`environment check --need measure`):
#                     absl-py (jax's Mosaic GPU attention imports it through jax._src.test_util, else
#                     the Hopper kernel is refused), threadpoolctl (the reference's BLAS threads) and
#                     asv_runner (the median's interval, core/stats.py), pure Python; asv is not
#                     needed there: the records are filed with asv back here
#   .whl/head.bundle  this checkout's history up to HEAD (git bundle): the results are filed under a
#                     commit, and the copied tree may travel without .git
#   .whl/COMMIT       HEAD and its date, for the log
# .whl/ is git-ignored; pass it to the device run as a carried path. Refuses a tree with uncommitted
# changes to tracked files: results are filed under HEAD, so HEAD must be the code that runs.
#   bash tools/device-wheels.sh [PYTHON_VERSION]   (default 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
py_version=${1:-3.12}
out=.whl
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "device-wheels: tracked files have uncommitted changes; commit them first (results are filed under HEAD)" >&2
  git status --short --untracked-files=no >&2
  exit 1
fi
pip=(python3 -m pip)
[ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
rm -rf "$out" && mkdir -p "$out"
# --no-deps: each needed package is named; the image has the rest (see KINDS.md of the device tool).
"${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version "$py_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$out" \
  absl-py==2.5.1 threadpoolctl==3.6.0 asv_runner==0.3.2
git bundle create --quiet "$out/head.bundle" HEAD
printf '%s %s\n' "$(git rev-parse HEAD)" "$(git log -1 --format=%cI HEAD)" > "$out/COMMIT"
travels=$(( $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1) + $(du -sb "$out" | cut -f1) ))
echo "device-wheels: $(ls "$out"/*.whl | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out; commit $(cut -c1-8 "$out/COMMIT");" \
     "tracked tree + $out: $((travels / 1048576)) MiB (the device run takes at most 64 MiB)"
if [ "$travels" -gt $((64 * 1048576)) ]; then echo "device-wheels: over the 64 MiB limit" >&2; exit 1; fi
