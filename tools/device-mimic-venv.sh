#!/usr/bin/env bash
# Build, here, a venv that mimics the lent H200 image's Python (docs/device.md):
# Python 3.12 with torch 2.11.0 (PyPI's CUDA build, which runs on the CPU), triton 3.6.0, jax/jaxlib 0.11.2,
# numpy, pandas, matplotlib, psutil, pytest, pyyaml, tabulate, jinja2, pyarrow, scipy; and, as there, no asv,
# no asv_runner, no absl-py, no threadpoolctl. About 5.6 GB; tools/device-rehearse.sh uses it.
#   bash tools/device-mimic-venv.sh [VENV]   (default .venv-device)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-device}
# A pyenv shim answers `command -v` and still fails when 3.12 is not the selected version: try each.
python=${DEVICE_MIMIC_PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    if "$candidate" -c 'import venv' >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
[ -n "$python" ] || { echo "device-mimic-venv: no working python3.12 here (pyenv install 3.12, or DEVICE_MIMIC_PYTHON=...)" >&2; exit 1; }
stamp=$venv/.mimic-h200-image
[ -f "$stamp" ] && { echo "device-mimic-venv: $venv is built ($(cat "$stamp"))"; exit 0; }
avail=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
[ "$avail" -ge 9 ] || { echo "device-mimic-venv: needs about 9 GB free here (5.6 GB installed), $avail GB left" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet torch==2.11.0 triton==3.6.0 jax==0.11.2 jaxlib==0.11.2 \
  'numpy>=2.4' 'pandas>=3' matplotlib psutil pytest pyyaml tabulate jinja2 pyarrow scipy
# The image has none of these: a dependency that pulled one in would hide what the run must carry.
"$venv/bin/python" -m pip uninstall --quiet -y asv asv_runner absl-py threadpoolctl 2>/dev/null || true
"$venv/bin/python" -c 'import sys, torch, jax, numpy; print(f"python {sys.version.split()[0]} torch {torch.__version__} jax {jax.__version__} numpy {numpy.__version__}")' > "$stamp"
echo "device-mimic-venv: built $venv: $(cat "$stamp"), $(du -sh "$venv" | cut -f1)"
