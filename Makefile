# The two commands of the README: `make bench` and `make test`. Everything else is set-up they call.
#
#   ACCEL=cpu   (default) CPU wheels: jax CPU, torch 2.13.0 CPU build, torch_xla on its PJRT CPU device
#   ACCEL=cuda  NVIDIA host: jax[cuda12], PyPI's CUDA torch; torch_xla stays on PJRT CPU (no PyPI GPU build)
#   ACCEL=tpu   Cloud TPU VM: jax[tpu], torch_xla[tpu] on PJRT TPU
ACCEL ?= cpu
PYTHON ?= python3

VENV := .venv
XLA_VENV := .venv-xla
XLA_FLAVOUR := $(if $(filter tpu,$(ACCEL)),xla-tpu,xla-cpu)
PJRT_DEVICE ?= $(if $(filter tpu,$(ACCEL)),TPU,CPU)
MAIN_STAMP := $(VENV)/.installed-$(ACCEL)
XLA_STAMP := $(XLA_VENV)/.installed-$(XLA_FLAVOUR)

MAIN_FRAMEWORKS := numpy,jax,torch
# The torch_xla venv has no pandas/asv: it runs the framework tests only.
XLA_TESTS := tests/test_correctness.py tests/test_conformance.py tests/test_workload.py \
             tests/test_support_torch_xla.py

export PJRT_DEVICE
# The asv suite reads ACCEL to choose its dtypes without initialising a device (GPU: float32 and
# bfloat16, TPU: bfloat16, CPU: the suite size's own).
export ACCEL

.PHONY: setup bench html serve-html sweep browser-deps test lint test-main test-xla list matrix system-check clean

setup: $(MAIN_STAMP) $(XLA_STAMP)

# The main job: the asv suite (default size) for the current commit on this machine, in both asv
# environments (main and torch_xla), then offline HTML and a summary. The machine's name comes from
# `attnbench machine-name` run as its own process (it initialises the frameworks' devices) and is
# handed to asv as ATTNBENCH_MACHINE, so that the asv process itself never touches a device. One
# CPU GEMM probe directory for the whole run: both asv environments divide by the same CPU peak.
# ATTNBENCH_SUITE=full for the long suite; ASV_ARGS="-b Training" (asv's own selection) or
# ATTNBENCH_IMPLS=a,b for a subset.
ASV := $(VENV)/bin/asv
ASV_ARGS ?=
# Steps smaller than this are not reported; on this shared 2-core CPU, run-to-run noise on timing
# reaches tens of percent, so the default sits above it (per metric: --threshold-metric m=0.1).
REPORT_ARGS ?= --threshold 0.25
bench: setup browser-deps
	@machine=$$($(VENV)/bin/python -m attnbench machine-name) && \
	$(ASV) machine --yes --machine $$machine >/dev/null && \
	echo "asv run: machine $$machine, suite $${ATTNBENCH_SUITE:-$${ATTNBENCH_PROFILE:-default}}" && \
	probes=$$(mktemp -d /tmp/attnbench-probes-XXXXXX) && \
	( ATTNBENCH_MACHINE=$$machine ATTNBENCH_PROBE_DIR=$$probes $(ASV) run --machine $$machine $(ASV_ARGS) HEAD^! || \
	  echo "asv run reported failed benchmarks (status failed in the results); publishing anyway" ); \
	rm -rf $$probes
	$(MAKE) --no-print-directory html
	$(VENV)/bin/python -m attnbench report $(REPORT_ARGS)
	$(VENV)/bin/python -m attnbench summary

# asv's stock pages load their scripts from CDNs; serve them locally so the HTML works offline.
html: $(MAIN_STAMP) browser-deps
	$(ASV) publish
	$(VENV)/bin/python -m attnbench.offline_html html
	@echo "HTML: $(CURDIR)/html/index.html (serve it: make serve-html, http://127.0.0.1:8080)"

serve-html: html
	$(VENV)/bin/python -m attnbench.offline_html html --serve 8080

# The sweep CLI outside asv (results/runs/<stamp>-<host>/): every runnable implementation x
# lengths x static/dynamic/bucketed, in both venvs.
SWEEP_ARGS ?= --seq 256 1024 --steps 6 --min-seconds 0.2 --quiet
sweep: setup
	$(VENV)/bin/python -m attnbench run --framework numpy jax torch $(SWEEP_ARGS)
	$(XLA_VENV)/bin/python -m attnbench run --framework torch_xla $(SWEEP_ARGS)

# The browser test needs Debian's chromium; the offline HTML needs npm to fetch jQuery, Flot, ...
browser-deps: $(MAIN_STAMP)
	@command -v chromium >/dev/null 2>&1 || { apt-get update && apt-get install -y chromium; } \
	  || { echo "missing system dependency: chromium (Debian: apt-get install chromium)"; exit 1; }
	@command -v npm >/dev/null 2>&1 || { apt-get update && apt-get install -y npm; } \
	  || { echo "missing system dependency: npm (Debian: apt-get install npm)"; exit 1; }
	@$(VENV)/bin/python -c 'from attnbench.offline_html import fetch_vendor; fetch_vendor()'

test: lint test-main test-xla

lint: $(MAIN_STAMP)
	$(VENV)/bin/ruff check .

test-main: $(MAIN_STAMP) browser-deps
	ATTNBENCH_TEST_FRAMEWORKS=$(MAIN_FRAMEWORKS) $(VENV)/bin/python -m pytest

test-xla: $(XLA_STAMP)
	ATTNBENCH_TEST_FRAMEWORKS=torch_xla $(XLA_VENV)/bin/python -m pytest $(XLA_TESTS)

list: setup
	$(VENV)/bin/python -m attnbench list
	$(XLA_VENV)/bin/python -m attnbench list --framework torch_xla

matrix: $(MAIN_STAMP)
	$(VENV)/bin/python -m attnbench matrix --markdown

# pip unpacks next to the downloaded wheels, so the check asks for more than the venv's final size
# (.venv ~2 GB; .venv-xla ~7.6 GB, mostly the CUDA wheels PyPI's torch 2.9.0 depends on).
define need_disk
	@avail=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	if [ "$$avail" -lt $(1) ]; then \
	  echo "not enough disk for $(2): it needs about $(1) GB free here, $$avail GB are left (df -h .)"; exit 1; fi
endef

$(MAIN_STAMP): pyproject.toml | system-check
	$(if $(wildcard $(VENV)/bin/python),,$(call need_disk,4,$(VENV)))
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[$(ACCEL)]'
	rm -f $(VENV)/.installed-* && touch $@

$(XLA_STAMP): pyproject.toml | system-check
	$(if $(wildcard $(XLA_VENV)/bin/python),,$(call need_disk,11,$(XLA_VENV)))
	test -x $(XLA_VENV)/bin/python || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(XLA_VENV)/bin/python -m pip install --quiet -e '.[$(XLA_FLAVOUR)]'
	rm -f $(XLA_VENV)/.installed-* && touch $@

# A missing system dependency gets a message naming it, not a pip traceback.
system-check:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "missing system dependency: $(PYTHON) (Python >= 3.11)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(PYTHON) is older than 3.11"; exit 1; }
	@$(PYTHON) -c 'import venv, ensurepip' 2>/dev/null || { echo "missing system dependency: Python's venv/ensurepip (Debian: apt-get install python3-venv)"; exit 1; }
	@command -v g++ >/dev/null 2>&1 || { echo "missing system dependency: g++ (torch.compile builds C++ kernels on the CPU; Debian: apt-get install g++)"; exit 1; }

clean:
	rm -rf $(VENV) $(XLA_VENV) .asv html
