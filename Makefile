# The two commands of the README: `make bench` and `make test`. Everything else is set-up they call.
#
# The hardware decides the build (attnbench/hardware/accel.py: device files, PCI ids, nvidia-smi),
# printed first; an ACCEL that contradicts the host is refused unless ACCEL_FORCE=1:
#   cpu    CPU wheels: jax CPU, torch 2.13.0 CPU build, torch_xla on its PJRT CPU device
#   cuda   NVIDIA host: jax[cuda12], PyPI's CUDA torch; torch_xla stays on PJRT CPU (no PyPI GPU build)
#   tpu    Cloud TPU VM: jax[tpu], torch_xla[tpu] on PJRT TPU
# The measured environments (ENV):
#   (unset)   the venvs built here, run by asv as existing environments (on a CPU host named as
#             asv.conf.json's virtualenvs, whose pins they hold)
#   existing  the interpreter PYTHON as it is (a container's, a conda env's): `make bench ENV=existing
#             PYTHON=/path/to/python`; what it lacks is named, and installed only with ALLOW_INSTALL=1
#             (never jax or torch)
PYTHON ?= python3
ENV ?=
ALLOW_INSTALL ?=
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),setup)),)
ACCEL_CHOICE := $(shell $(PYTHON) attnbench/hardware/accel.py --requested '$(ACCEL)' --force '$(ACCEL_FORCE)' \
                  $(if $(filter 0,$(MAKELEVEL)),,--quiet))
ifeq ($(ACCEL_CHOICE),)
$(error could not run $(PYTHON) attnbench/hardware/accel.py: missing system dependency $(PYTHON) (Python >= 3.11))
endif
ifeq ($(firstword $(ACCEL_CHOICE)),REFUSED:)
$(error $(wordlist 2,999,$(ACCEL_CHOICE)))
endif
override ACCEL := $(ACCEL_CHOICE)
endif
ifeq ($(filter $(ENV),existing),)
ifneq ($(ENV),)
$(error ENV must be unset (the project's own environments) or existing, got '$(ENV)')
endif
endif

VENV := .venv
XLA_VENV := .venv-xla
XLA_FLAVOUR := $(if $(filter tpu,$(ACCEL)),xla-tpu,xla-cpu)
PJRT_DEVICE ?= $(if $(filter tpu,$(ACCEL)),TPU,CPU)
MAIN_STAMP := $(VENV)/.installed-$(ACCEL)
XLA_STAMP := $(XLA_VENV)/.installed-$(XLA_FLAVOUR)
# Third venv: the compiled-for tier (attnbench/compiled_for/): jax 0.10.2 with libtpu and the CUDA 12
# plugin + ptxas + cuDNN wheels, compiling for TPUs and NVIDIA GPUs on any host (JAX_PLATFORMS=cpu).
TARGETS_VENV := .venv-targets
TARGETS_STAMP := $(TARGETS_VENV)/.installed-targets
TARGETS_TESTS := tests/test_compiled_for.py tests/test_compiled_for_compile.py tests/test_compile_tuning.py
# SkyPilot (the extra `fleet`) in the main venv: see fleet-deps
FLEET_STAMP := $(VENV)/.fleet-installed

MAIN_FRAMEWORKS := numpy,jax,torch
# The torch_xla venv has no pandas/asv: it runs the framework tests only.
XLA_TESTS := tests/test_correctness.py tests/test_mask_correctness.py tests/test_conformance.py tests/test_workload.py \
             tests/test_support_torch_xla.py tests/test_observability.py tests/test_flash_backward.py

export PJRT_DEVICE
# The asv suite reads ACCEL to choose its dtypes without initialising a device (GPU: float32 and
# bfloat16, TPU: bfloat16, CPU: the suite size's own).
export ACCEL

.PHONY: confirm headroom setup tune bench html serve-html sweep html-deps browser-deps existing-bench existing-test test lint test-main test-xla list matrix system-check clean \
        fleet-deps fleet-launch fleet-collect fleet-plan setup-targets test-targets releases notebook verdict test-fast \
        device-file rehearse-device published calibrate

setup: $(MAIN_STAMP) $(XLA_STAMP) $(TARGETS_STAMP)
setup-targets: $(TARGETS_STAMP)

# The main job: the asv suite (default size) for the current commit on this machine, in every measured
# environment, then the compiled-for tier, offline HTML, the report and a summary. The machine's name
# comes from `attnbench machine-name` run as its own process (it initialises the frameworks' devices:
# a name like h200 only when a framework really runs there) and is handed to asv as
# ATTNBENCH_MACHINE, so that the asv process itself never touches a device. One CPU GEMM probe
# directory for the whole run: every environment divides by the same CPU peak.
# ATTNBENCH_SUITE=full for the long suite; ASV_ARGS="-b Training" (asv's own selection) or
# ATTNBENCH_IMPLS=a,b for a subset. TRAFFIC=my-trace.csv (or azure-conv, azure-code, uniform): every
# production stream's lengths from that trace (ATTNBENCH_TRAFFIC; docs/workloads.md), checked first.
ASV_ARGS ?=
TRAFFIC ?=
ifneq ($(TRAFFIC),)
export ATTNBENCH_TRAFFIC := $(TRAFFIC)
endif
# Extra asv arguments for the compiled-for tier's run in .venv-targets (benchmarks/compiled_for.py).
TARGETS_ASV_ARGS ?=
# Steps smaller than this are not worth reporting (per metric: --threshold-metric m=0.05); whether a
# larger step is beyond the noise is the analysis' own test, against the figures' intervals over
# timing rounds (or their series' scatter where a figure has none): see docs/reports.md.
REPORT_ARGS ?= --threshold 0.1
# attnbench confirm: the report's threshold, and at most CONFIRM_BUDGET seconds inside make bench.
CONFIRM_ARGS ?= --threshold 0.1
CONFIRM_BUDGET ?= 90
# A case cache that lives for one run (attnbench/run/case_cache.py): the Forward class measures the
# Training cases in the same sweep and hands them over, so each environment starts one set of timing-
# round workers, not one per class. Not when ASV_ARGS selects benchmarks (-b): a Training-only run
# would otherwise measure Forward's cases too.
# It is kept until the asv runs end (CASES_DIR; within it each record is filed under its commit,
# environment and settings, run/case_cache.py): a run stopped with Ctrl-C keeps every case it
# measured, and `make bench` again goes on from them (the later rounds too, from the ones it kept).
HANDOVER = $(if $(filter -b% --bench%,$(ASV_ARGS)),,ATTNBENCH_CASE_CACHE=$$handover)
CASES_DIR = $(CURDIR)/.asv/cases
# The measured environments run the parameter combinations of benchmarks/attention.py each can run
# (attnbench/asv/selection.py; unless ASV_ARGS selects with -b): asv starts a process per benchmark
# and combination, and the others (the other environment's framework, the compiled-for classes,
# which need .venv-targets and have their own run below) would only be n/a cells, ~9,000 processes.
COMMIT = $$(git rev-parse HEAD)
ifeq ($(ENV),existing)
# The user's interpreter runs asv, the harness and the benchmarks; the checkout is put on its path
# (ASV_PYTHONPATH: asv drops PYTHONPATH in benchmark processes), nothing is installed into it.
HARNESS := PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON)
ASV_ENV := ASV_PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}
ASV := $(ASV_ENV) $(HARNESS) -m asv
BENCH_SETUP := existing-bench
EXISTING_PYTHONS := $(PYTHON)
else
HARNESS := $(VENV)/bin/python
ASV := $(VENV)/bin/asv
BENCH_SETUP := setup
# The venvs make builds are the measured environments, run by asv as existing ones: on a CPU host
# they hold exactly asv.conf.json's pins and carry its environments' names (asv/plugin.py), so asv
# builds no second copy of them (~3.3 min and ~10 GB here); on an accelerator asv's virtualenvs would
# run jax on the CPU anyway. torch_xla on a CPU or TPU host (on a GPU host it runs on PJRT CPU, and
# CPU figures are never filed under an accelerator's name).
EXISTING_PYTHONS := $(CURDIR)/$(VENV)/bin/python $(if $(filter cuda,$(ACCEL)),,$(CURDIR)/$(XLA_VENV)/bin/python)
endif
# The tuner (docs/tuning.md): each tiled kernel's candidate tile configs measured here, paired by
# round, the kept one filed in results/tuning/<machine>.tuning, which the suite runs at. `make tune`
# measures what the file lacks, in every measured environment (TUNE_ARGS=--force: everything again);
# `make bench` does the same within TUNE_BUDGET seconds (none, once the file holds this machine).
TUNE_ARGS ?=
TUNE_BUDGET ?= 120
TUNE = machine=$$($(HARNESS) -m attnbench machine-name) && \
	for py in $(EXISTING_PYTHONS); do PYTHONPATH=$(CURDIR) $$py -m attnbench tune --machine $$machine $(1) || exit 1; done
tune: $(BENCH_SETUP)
	@$(call TUNE,$(TUNE_ARGS))
	@# The compile targets' candidates, compiled ahead of time (nothing runs there; about 5 min here).
	@if [ -x $(TARGETS_VENV)/bin/python ]; then JAX_PLATFORMS=cpu $(TARGETS_VENV)/bin/python -m attnbench tune-targets; \
	else echo "compile-target tuning skipped: $(TARGETS_VENV) is not built here (make setup-targets builds it)"; fi

bench: $(BENCH_SETUP) html-deps
	@$(ASV_ENV) $(HARNESS) -m attnbench.asv.selection check $(if $(EXISTING_PYTHONS),--existing $(EXISTING_PYTHONS))
	@$(call TUNE,--budget $(TUNE_BUDGET))
	@machine=$$($(HARNESS) -m attnbench machine-name) && \
	$(ASV) machine --yes --machine $$machine >/dev/null && \
	echo "asv run: machine $$machine, suite $${ATTNBENCH_SUITE:-$${ATTNBENCH_PROFILE:-default}}, environments: \
	  $(or $(EXISTING_PYTHONS),asv.conf.json's virtualenvs)" && \
	probes=$$(mktemp -d /tmp/attnbench-probes-XXXXXX) && \
	handover=$(CASES_DIR)/$$machine && mkdir -p $$handover && \
	( export ATTNBENCH_MACHINE=$$machine ATTNBENCH_PROBE_DIR=$$probes $(HANDOVER); \
	  $(ASV_ENV) $(HARNESS) -m attnbench.asv.selection run --machine $$machine \
	    $(if $(EXISTING_PYTHONS),--existing $(EXISTING_PYTHONS)) -- $(ASV_ARGS) ) && rm -rf $$handover; \
	rm -rf $$probes
	@# The compiled-for tier (benchmarks/compiled_for.py) needs libtpu and the CUDA plugin, which only
	@# .venv-targets has: asv runs that class there as an existing environment (n/a in the others).
	@if [ -x $(TARGETS_VENV)/bin/python ]; then \
	  machine=$$($(HARNESS) -m attnbench machine-name) && \
	  ( ATTNBENCH_MACHINE=$$machine $(ASV) run --machine $$machine \
	      -E existing:$(CURDIR)/$(TARGETS_VENV)/bin/python --set-commit-hash $(COMMIT) \
	      -b 'compiled_for\.CompiledFor' $(TARGETS_ASV_ARGS) || \
	    echo "asv run (compiled-for tier) reported failed benchmarks; publishing anyway" ); \
	else echo "compiled-for tier skipped: $(TARGETS_VENV) is not built here (make setup-targets builds it)"; fi
	@# The newest run's steps measured again, paired against the commit before each, so the report
	@# calls them regressions or dismisses them (attnbench/run/confirm.py), within CONFIRM_BUDGET seconds.
	$(HARNESS) -m attnbench confirm $(CONFIRM_ARGS) --budget $(CONFIRM_BUDGET)
	@# Nothing measures from here on: asv publish and the report (then the summary, from the same
	@# loaded results) run side by side on the two cores. asv publish empties html/, so the report is
	@# written beside it and moved in after. The sub-make is named through PUBLISH_HTML: a line that
	@# names $$(MAKE) itself runs even under make -n, and this one writes the report.
	@report=$$(mktemp -d /tmp/attnbench-report-XXXXXX) && \
	( $(PUBLISH_HTML) & publish=$$!; \
	  $(HARNESS) -m attnbench report $(REPORT_ARGS) --out $$report --summary; status=$$?; \
	  wait $$publish || status=1; \
	  rm -rf html/report && mkdir -p html && mv $$report html/report && \
	  echo "report: html/report/report.md, html/report/report.html"; exit $$status )

PUBLISH_HTML = $(MAKE) --no-print-directory html

# The newest run's steps beyond the threshold measured again, paired (the report names it when
# steps are left); then the report again.
confirm: $(MAIN_STAMP)
	$(HARNESS) -m attnbench confirm $(CONFIRM_ARGS)
	$(HARNESS) -m attnbench report $(REPORT_ARGS)

# ENV=existing: what PYTHON lacks for the job, with the command that adds it; ALLOW_INSTALL=1 installs it
# (never a framework). The stamp-free check runs every time: the user's interpreter can change.
existing-bench existing-test: existing-%:
	@PYTHONPATH=$(CURDIR) $(PYTHON) -m attnbench.run.environment check --need $* $(if $(ALLOW_INSTALL),--install)

# asv's stock pages load their scripts from CDNs; serve them locally so the HTML works offline.
html: $(if $(filter existing,$(ENV)),existing-bench,$(MAIN_STAMP)) html-deps
	$(ASV) publish
	$(HARNESS) -m attnbench.offline_html html
	@echo "HTML: $(CURDIR)/html/index.html (serve it: make serve-html, http://127.0.0.1:8080)"

serve-html: html
	$(HARNESS) -m attnbench.offline_html html --serve 8080

# Re-executes notebooks/cost_spikes.ipynb in place on the committed results/ (saved only if no cell failed).
notebook: $(MAIN_STAMP)
	$(VENV)/bin/python -m attnbench.report.notebook notebooks/cost_spikes.ipynb

# The verdict from the results (README "The verdict"): the table the README shows, and its picture.
verdict: $(MAIN_STAMP)
	$(VENV)/bin/python -m attnbench verdict --markdown --width 0 --png docs/verdict.png --forest docs/verdict-forest.png

# The sweep CLI outside asv (results/runs/<stamp>-<host>/): every runnable implementation x
# lengths x static/dynamic/bucketed, in both venvs.
SWEEP_ARGS ?= --seq 256 1024 --steps 200 --traffic azure-code --min-seconds 0.2 --quiet
sweep: setup
	$(VENV)/bin/python -m attnbench run --framework numpy jax torch $(SWEEP_ARGS)
	$(XLA_VENV)/bin/python -m attnbench run --framework torch_xla $(SWEEP_ARGS)

# The offline HTML needs npm to fetch jQuery, Flot, ...; the browser test needs Debian's chromium too.
html-deps: $(if $(filter existing,$(ENV)),existing-bench,$(MAIN_STAMP))
	@command -v npm >/dev/null 2>&1 || { apt-get update && apt-get install -y npm; } \
	  || { echo "missing system dependency: npm (Debian: apt-get install npm)"; exit 1; }
	@$(HARNESS) -c 'from attnbench.offline_html import fetch_vendor; fetch_vendor()'

browser-deps: html-deps
	@command -v chromium >/dev/null 2>&1 || { apt-get update && apt-get install -y chromium; } \
	  || { echo "missing system dependency: chromium (Debian: apt-get install chromium)"; exit 1; }

ifeq ($(ENV),existing)
# The tests in PYTHON, for the frameworks it has (numpy plus those of jax, torch, torch_xla there).
test: existing-test browser-deps
	ATTNBENCH_TEST_FRAMEWORKS=$$(PYTHONPATH=$(CURDIR) $(PYTHON) -m attnbench.run.environment frameworks) \
	  PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m pytest $(PYTEST_ARGS)
else
test: lint test-main test-xla test-targets
endif

lint: $(MAIN_STAMP)
	$(VENV)/bin/ruff check .

test-main: $(MAIN_STAMP) $(FLEET_STAMP) browser-deps
	ATTNBENCH_TEST_FRAMEWORKS=$(MAIN_FRAMEWORKS) $(VENV)/bin/python -m pytest

# The fast loop: the main venv's unit tests, without the slow, asv, compiler and browser ones
# (docs/testing.md: under 3 minutes here). make test still runs everything.
test-fast: $(MAIN_STAMP)
	ATTNBENCH_TEST_FRAMEWORKS=$(MAIN_FRAMEWORKS) $(VENV)/bin/python -m pytest -q \
	  -m "not slow and not asv and not compilers and not browser"

# The fleet (attnbench/fleet/, docs/fleet.md): the suite on TPU/GPU cloud machines through
# SkyPilot, spot-safe and resumable, every machine's results merged into results/<machine>/.
#   make fleet-launch KIND=tpu-v5e FLEET_BUCKET=my-bucket  (checks `sky check` credentials first)
#   make fleet-collect FLEET_FROM=gs://my-bucket            (merge into results/, then publish)
# SkyPilot is the extra `fleet` (~455 MB, no change to the pinned jax/torch); test-main installs it
# into the main venv so the offline fleet tests run.
KIND ?=
FLEET_BUCKET ?=
FLEET_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
FLEET_FROM ?=
FLEET_ARGS ?=
fleet-deps: $(FLEET_STAMP)
$(FLEET_STAMP): pyproject.toml $(MAIN_STAMP)
	$(VENV)/bin/python -m pip install --quiet -e '.[fleet]'
	touch $@

fleet-launch: $(FLEET_STAMP)
	@test -n "$(KIND)" || { echo "KIND is required: make fleet-launch KIND=<$$(ls attnbench/fleet/tasks | sed 's/.yaml$$//' | paste -sd'|')> FLEET_BUCKET=<name>"; exit 2; }
	@test -n "$(FLEET_BUCKET)" || { echo "FLEET_BUCKET is required: the bucket the results go to (make fleet-launch KIND=$(KIND) FLEET_BUCKET=<name>)"; exit 2; }
	$(VENV)/bin/python -m attnbench.fleet launch --kind $(KIND) --bucket $(FLEET_BUCKET) --commit $(FLEET_COMMIT) $(FLEET_ARGS)

fleet-collect: $(MAIN_STAMP)
	@test -n "$(FLEET_FROM)" || { echo "FLEET_FROM is required: gs://<bucket>, s3://<bucket> or a folder holding its copy"; exit 2; }
	$(VENV)/bin/python -m attnbench.fleet collect --from $(FLEET_FROM)
	$(MAKE) --no-print-directory html

# Every kind's options and prices from SkyPilot's live catalog (FLEET_ARGS="--catalog DIR": a copy).
fleet-plan: $(FLEET_STAMP)
	$(VENV)/bin/python -m attnbench.fleet plan --online $(FLEET_ARGS)

test-xla: $(XLA_STAMP)
	ATTNBENCH_TEST_FRAMEWORKS=torch_xla $(XLA_VENV)/bin/python -m pytest $(XLA_TESTS)

# The compiled-for tier's tests with the real TPU and GPU compilers (JAX_PLATFORMS=cpu: no device is
# used); ATTNBENCH_TEST_TARGETS=1 makes a missing compiler a failure here, not a skip.
test-targets: $(TARGETS_STAMP)
	JAX_PLATFORMS=cpu ATTNBENCH_TEST_TARGETS=1 ATTNBENCH_TEST_FRAMEWORKS=jax \
	  $(TARGETS_VENV)/bin/python -m pytest $(TARGETS_TESTS)

list: setup
	$(VENV)/bin/python -m attnbench list
	$(XLA_VENV)/bin/python -m attnbench list --framework torch_xla

# The release matrix (attnbench/releases/, docs/releases.md): every jax and torch
# kernel over five jax releases, four torch releases and three libtpu releases; its own command, not
# part of make bench. asv builds and caches the jax releases' venvs (.asv/releases-env); the torch
# releases are the venvs make setup builds. Writes results/releases/releases.csv and html/releases/.
releases: $(MAIN_STAMP) $(XLA_STAMP) html-deps
	$(HARNESS) -m attnbench releases $(RELEASES_ARGS)

# The presets' headroom on the compile targets: the largest batch that compiles and fits, at the
# presets' real lengths, on v5e, v6e and the H200 (the verdict's compile-target preset rows read
# results/compiled-for/runs/). Compiler output, deterministic for the compilers' versions; about
# 8 minutes here, so a command of its own beside make bench (whose CompiledForModels class tracks
# batch 1 per commit).
HEADROOM_IMPLS := jax-xla jax-xla-chunked jax-blockwise-flash jax-pallas-tpu-flash jax-pallas-tpu-splash \
                  jax-pallas-tpu-ragged-paged jax-cudnn jax-pallas-gpu-decode
HEADROOM_OUT ?= results/compiled-for/runs
HEADROOM_CASES ?= llama-3.1-8b:prefill:8k,32k llama-3.1-8b:decode:32k,128k gemma-2-9b:prefill:8k
headroom: $(TARGETS_STAMP)
	@stamp=$$(date -u +%Y%m%dT%H%M%SZ); for case in $(HEADROOM_CASES); do \
	  preset=$${case%%:*}; rest=$${case#*:}; phase=$${rest%%:*}; seqs=$$(echo $${rest#*:} | tr , ' '); \
	  echo "headroom: $$preset $$phase $$seqs"; \
	  JAX_PLATFORMS=cpu $(TARGETS_VENV)/bin/python -m attnbench compile-for --target tpu-v5e tpu-v6e h200 \
	    --workload $$preset --phase $$phase --seq $$seqs --impl $(HEADROOM_IMPLS) --dtype bfloat16 \
	    --max-batch 4096 --timeout 900 --quiet --out $(HEADROOM_OUT)/$$stamp-$$preset-$$phase || exit 1; \
	done

# Published evidence (docs/published.md): Tokamax's device timings read into results/published/tokamax.csv,
# then the aligned shapes they were timed at (attnbench/published/shapes.py) compiled for the chips with
# Tokamax's kernels and this project's, into results/compiled-for/runs/<stamp>-published-{tpu,gpu}/: the
# verdict's compile-target rows at those shapes put the chip's published figure beside the compiler's
# evidence. The TPU and GPU kernels go to their own targets (an interpreter off its chip says nothing);
# torch-sdpa-flash on the TPUs is the refused record of torch on a TPU without a chip.
PUBLISHED_TPU_IMPLS := jax-tokamax-mosaic-tpu jax-tokamax-xla-chunked jax-tokamax-xla jax-pallas-tpu-splash torch-sdpa-flash \
                       jax-pallas-tpu-flash jax-xla jax-xla-chunked jax-blockwise-flash
PUBLISHED_GPU_IMPLS := jax-tokamax-cudnn jax-tokamax-mosaic-gpu jax-tokamax-triton jax-tokamax-xla-chunked \
                       jax-tokamax-xla jax-cudnn jax-pallas-gpu-mha jax-xla jax-xla-chunked jax-blockwise-flash
published: $(MAIN_STAMP) $(TARGETS_STAMP)
	$(VENV)/bin/python -m attnbench published
	@stamp=$$(date -u +%Y%m%dT%H%M%SZ); \
	JAX_PLATFORMS=cpu $(TARGETS_VENV)/bin/python -m attnbench compile-for --published-shapes \
	  --target tpu-v5e tpu-v6e tpu-v5p --impl $(PUBLISHED_TPU_IMPLS) --timeout 900 --quiet \
	  --out $(HEADROOM_OUT)/$$stamp-published-tpu && \
	JAX_PLATFORMS=cpu $(TARGETS_VENV)/bin/python -m attnbench compile-for --published-shapes \
	  --target h100-sxm h200 --impl $(PUBLISHED_GPU_IMPLS) --timeout 900 --quiet \
	  --out $(HEADROOM_OUT)/$$stamp-published-gpu

# The compile targets' time model (docs/compiled-for.md#predicted-speed): each published forward row's
# kernel compiled at its shape for its chip, joined to the published time, fitted per chip family and
# scored leave-one-shape-out, into results/compiled-for/calibration/ (8 min 25 s here, 717 compiles).
calibrate: $(MAIN_STAMP) $(TARGETS_STAMP)
	JAX_PLATFORMS=cpu $(TARGETS_VENV)/bin/python -m attnbench calibrate --quiet

# The prepared run on a lent accelerator (docs/device.md): tools/device-run.sh measures there and brings
# back measured-<machine>.tar.gz; device-file files it here with asv (FROM=that tarball or its folder).
FROM ?=
device-file: $(MAIN_STAMP)
	@test -n "$(FROM)" || { echo "FROM is required: make device-file FROM=<measured-MACHINE.tar.gz from tools/device-run.sh>"; exit 2; }
	$(VENV)/bin/python -m attnbench.asv.carried file $(FROM)
	@# The time model scored against what the device measured, appended to results/LOG.md (when the
	@# device is a calibrated compile target with predicted records: else it says why, and filing stands).
	-$(VENV)/bin/python -m attnbench calibrate --score-device

# The device run rehearsed here in a mimic of the H200 image's Python (tools/device-rehearse.sh; builds
# .venv-device, about 5.6 GB, once). Not part of make test.
rehearse-device: $(MAIN_STAMP)
	bash tools/device-rehearse.sh

matrix: $(MAIN_STAMP)
	$(VENV)/bin/python -m attnbench matrix --markdown
	$(VENV)/bin/python -m attnbench matrix --features --markdown

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

# .venv-targets: 4.1 GB installed (2.2 GB of it nvidia-* wheels, 0.7 GB libtpu) from 1.9 GB of wheels.
$(TARGETS_STAMP): pyproject.toml | system-check
	$(if $(wildcard $(TARGETS_VENV)/bin/python),,$(call need_disk,7,$(TARGETS_VENV)))
	test -x $(TARGETS_VENV)/bin/python || $(PYTHON) -m venv $(TARGETS_VENV)
	$(TARGETS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TARGETS_VENV)/bin/python -m pip install --quiet -e '.[targets]'
	rm -f $(TARGETS_VENV)/.installed-* && touch $@

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
	rm -rf $(VENV) $(XLA_VENV) $(TARGETS_VENV) .venv-device .asv html
