# llmtools — `make pretrain` runs the whole chain on the embedded default; `make test` runs the tests.
# Both set up .venv first (idempotent). Variables point the pipeline at real data:
#   make pretrain CORPUS="a.jsonl b.jsonl" WEIGHTS=0.7,0.3 CONFIG=configs/train/tiny.yaml DS=configs/deepspeed/zero2.json NPROC=2

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.setup-stamp

# DeepSpeed's accelerator: CUDA where the machine has an NVIDIA GPU, else the CPU (and gloo).
export DS_ACCELERATOR ?= $(if $(wildcard /dev/nvidia0),cuda,cpu)
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup test test-fast test-kernels bench lint pretrain curate clean help

help:
	@echo "make setup     create .venv and install llmtools with its test extras"
	@echo "make pretrain  built-in corpus -> tokenizer -> json2bin -> mix -> train -> checkpoint -> logs (out/pretrain/)"
	@echo "make curate    llm-prep filter over the sample corpus: language, PII, length; prints the stats (out/curate/)"
	@echo "make test      run the test suite (in parallel across the cores)"
	@echo "make test-fast the unit tests and one real process of every command (a few minutes)"
	@echo "make test-kernels  run the suite once per CPU kernel level (docs/cpu-kernels.md; slow)"
	@echo "make lint      ruff check and format check (installs ruff into .venv on first use)"
	@echo "make bench     run the benchmarks in benchmarks/ (slow; quiet machine please)"

setup: $(STAMP)

# torch first, pinned: the CPU build lies on disk; letting pip resolve torch would fetch a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e '.[test]'
	touch $@

# The test target: the whole suite across the cores (pytest-xdist), then the tests that must run alone (marked
# serial in tests/conftest.py, which says why); a time limit per test, so a hang fails by name instead of
# stalling CI (25 min: the longest, the first README example, carries the set-up all examples share);
# the 25 slowest tests listed at the end. --dist loadfile: a file's tests share a worker, so a
# module's set-up (the README examples' folder, the installed wheel) is built once.
# The test-fast target: the unit tests and one real process of every command (tests/cli/test_smoke.py).
JOBS ?= auto
PYTEST := $(PY) -m pytest --timeout=1500 --durations=25
FAST := tests/test_layering.py tests/test_comments.py tests/test_fsutil.py tests/formats tests/model \
	tests/tokenize tests/logs tests/data tests/train/test_config.py tests/train/test_config_traps.py \
	tests/train/test_schedule.py tests/train/test_deepspeed_config.py tests/prep/test_jsonl.py \
	tests/prep/test_chat_template.py tests/cli/test_smoke.py

# Last, the quick floating-point equivalences again on scalar kernels, which differ from every CPU's native ones.
test: setup
	$(PYTEST) -n $(JOBS) --dist loadfile -m "not serial" tests
	$(PYTEST) -m serial tests
	tests/kernel_levels.sh --quick default

test-kernels: setup
	tests/kernel_levels.sh $(LEVELS)

test-fast: setup
	$(PYTEST) -n $(JOBS) --dist loadfile -m "not serial and not slow" $(FAST)

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# ruff is a lint-time tool, not a test dependency: installed on first use.
lint: setup
	test -x $(VENV)/bin/ruff || $(PIP) install -q 'ruff>=0.6'
	$(VENV)/bin/ruff check llmtools tests benchmarks
	$(VENV)/bin/ruff format --check llmtools tests benchmarks

# Curation on the embedded sample corpus (out/curate/): filter (length, language, PII), dedup, then
# decontaminate against the sample task; each step's stats say what it kept, removed and why.
CURATE_OUT := out/curate
curate: setup
	$(VENV)/bin/llm-prep sample-corpus -o $(CURATE_OUT)/raw --docs 500 --force
	$(VENV)/bin/llm-prep filter "$(CURATE_OUT)/raw/*.jsonl" -o $(CURATE_OUT)/clean.jsonl --language en \
		--pii email,ip,phone --min-chars 200 --force
	$(VENV)/bin/llm-prep dedup $(CURATE_OUT)/clean.jsonl -o $(CURATE_OUT)/dedup --force
	$(VENV)/bin/llm-prep sample-task -o $(CURATE_OUT)/tasks/arith_sums.jsonl --force
	$(VENV)/bin/llm-prep decontaminate run $(CURATE_OUT)/dedup/kept/corpus/000000-clean.jsonl \
		--eval $(CURATE_OUT)/tasks/arith_sums.jsonl -o $(CURATE_OUT)/curated.jsonl --force
	cat $(CURATE_OUT)/clean.jsonl.stats.json $(CURATE_OUT)/dedup/stats.json $(CURATE_OUT)/curated.jsonl.stats.json

clean:
	rm -rf out build dist *.egg-info .pytest_cache

include mk/pretrain.mk
