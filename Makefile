# loosespec: set-up, tests, demo and benchmarks. Everything runs in ./.venv.
#   make demo   set up, prepare the default Qwen pair, run a speculative generation + AR baseline
#   make test   set up, prepare SmolLM2-135M, run the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch goes in first and pinned, so that nothing later pulls a multi-GB CUDA build by accident;
# override for your own build, e.g. make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: setup test demo bench-speed clean-venv

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/loosespec models pull smollm2-135m-instruct
	$(BIN)/python -m pytest -q

demo: setup
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/loosespec generate --compare-ar --max-new-tokens 128 --prompt-file examples/demo_prompt.txt

# issue #2 speed check: first 5 HumanEval prompts, 1.5B target, bf16, 128 new tokens, greedy
bench-speed: setup
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/python benchmarks/speed_vs_hf.py --limit 5 --max-new-tokens 128 --out results/speed_vs_hf.json

clean-venv:
	rm -rf $(VENV)
