# specmlx developer tasks. `make install` builds .venv/ here; every other target uses it.
PY      := .venv/bin/python
SPECMLX := .venv/bin/specmlx
# Debian's OpenBLAS, preloaded on Linux CPU for the memory-bound regime (see README).
OPENBLAS = $(firstword $(wildcard /usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3))

.PHONY: install test test-fast lint format models demo bench bench-overhead bench-draft-free bench-scripting bench-stock-blas bench-t1 bench-quantized cost-curves bench-gpu bench-heads bench-heads-qwen heads-vocab heads heads-smollm2 heads-smollm2-eagle1 heads-qwen openblas clean

install: .venv/.installed

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# Preload Debian's OpenBLAS when it is there (looked up when the recipe runs, so a
# `make openblas` earlier in the same run counts); nothing is preloaded elsewhere.
PRELOAD = LD_PRELOAD=$$(ls /usr/lib/*-linux-gnu/openblas-pthread/libblas.so.3 2>/dev/null | head -n 1)

test: install
	$(PRELOAD) $(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not real"

# ruff, and the floors' import contract (pyproject.toml [tool.importlinter]).
lint: install
	$(PY) -m ruff check specmlx tests
	$(PY) -m ruff format --check specmlx tests
	.venv/bin/lint-imports --no-cache

format: install
	$(PY) -m ruff format specmlx tests
	$(PY) -m ruff check --fix specmlx tests

models: install
	$(SPECMLX) fetch

demo: models openblas
	$(PRELOAD) $(SPECMLX) generate "Write a Python function that checks whether a number is prime." --max-tokens 96

# The benchmarks write results/<name>-<date>.{json,csv,md}. Regimes: OpenBLAS preloaded with
# fp32 weights is memory-bound (as Apple GPUs are); the stock BLAS is not (see README).
DATE := $(shell date +%F)
BENCH_OUT = --json results/$(1)-$(DATE).json --csv results/$(1)-$(DATE).csv --markdown results/$(1)-$(DATE).md

# The Qwen2.5-Coder 1.5B + 0.5B pair, all suites, greedy, fixed and adaptive k, mlx-lm (2
# prompts a suite x 2 draws; sampling: `make bench-t1`).
bench: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --suite all --limit 2 --repeats 2 --temp 0 \
		-k 1 -k 4 -k 8 -k auto --mlx-lm-k 4 --max-tokens 48 $(call BENCH_OUT,bench)

# Sampling (T=1) on the Qwen pair: the target alone, draft k=4 and -k auto on every suite,
# 4 prompts x 3 seeds each, interleaved (every row draws from the same seed per prompt).
bench-t1: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --suite all --limit 4 --temp 1.0 -k 4 -k auto --no-mlx-lm \
		--repeats 3 --max-tokens 48 $(call BENCH_OUT,bench-t1)

# specmlx's own cost per step (host ms, host syncs) on tiny random models: no real model.
bench-overhead: install
	mkdir -p results
	COLUMNS=140 $(SPECMLX) bench --overhead > results/overhead-$(DATE).txt.part
	mv results/overhead-$(DATE).txt.part results/overhead-$(DATE).txt
	cat results/overhead-$(DATE).txt

# On a GPU (Apple silicon, or CUDA with mlx[cuda13]): the pair in 4-bit, every method.
GPU_PAIR = models/local/qwen2.5-coder-1.5b-4bit models/local/qwen2.5-coder-0.5b-4bit
models/local/%-4bit: | models
	$(SPECMLX) convert models/gguf/$*.gguf $@ --dtype bfloat16 --quantize 4

bench-gpu: $(GPU_PAIR)
	mkdir -p results
	$(SPECMLX) bench --target $(word 1,$(GPU_PAIR)) --draft $(word 2,$(GPU_PAIR)) \
		--method draft --method ngram --method lookahead -k 4 -k auto --suite all --limit 2 \
		--temp 0 --temp 1.0 --max-tokens 64 $(call BENCH_OUT,bench-gpu)

# Prompt lookup and Lookahead (no draft model) on SmolLM2-135M and the Qwen 1.5B target.
bench-draft-free: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --target smollm2-135m --method ngram \
		--method lookahead -k 4 -k auto --suite extract --suite code --limit 4 --temp 0 \
		--max-tokens 64 $(call BENCH_OUT,draft-free-smollm2)
	$(PRELOAD) $(SPECMLX) bench --target qwen2.5-coder-1.5b --method ngram \
		--method lookahead -k 4 -k auto --suite extract --suite code --limit 2 --temp 0 \
		--max-tokens 48 $(call BENCH_OUT,draft-free-qwen)

# Suffix decoding on the scripting suite (run in order, each row with its own memory, reported
# by halves) beside prompt lookup, the draft model and both, and on chat and creative, where
# answers share little: SmolLM2-135M, then the Qwen pair.
SCRIPTING = --method ngram --method suffix -k auto --no-mlx-lm --warmup 1
bench-scripting: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --target smollm2-135m --suite scripting $(SCRIPTING) \
		--max-tokens 96 --repeats 2 $(call BENCH_OUT,scripting-smollm2)
	$(PRELOAD) $(SPECMLX) bench --target smollm2-135m --suite chat --suite creative --limit 2 \
		$(SCRIPTING) --max-tokens 64 --repeats 2 $(call BENCH_OUT,scripting-smollm2-chat)
	$(PRELOAD) $(SPECMLX) bench --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
		--suite scripting --limit 12 $(SCRIPTING) --method draft --method suffix+draft \
		--max-tokens 64 --repeats 2 $(call BENCH_OUT,scripting-qwen)
	$(PRELOAD) $(SPECMLX) bench --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
		--suite chat --suite creative --limit 2 --method suffix --method suffix+draft -k auto \
		--no-mlx-lm --warmup 1 --max-tokens 64 --repeats 2 $(call BENCH_OUT,scripting-qwen-chat)

# The Qwen pair quantized to 8 and 4 bits (float32 scales and activations, as the CPU runs
# fastest), beside fp32 in the same regime (OpenBLAS preloaded): the target alone, draft k=4
# and -k auto, mlx-lm k=4, T=0 and T=1, every suite, 2 prompts x 2 draws. On a 2-core CPU a
# 4-bit token takes seconds (MLX's CPU kernels for quantized weights run on one core): hours.
QUANTIZED = $(foreach b,q8 q4,models/local/qwen2.5-coder-1.5b-$(b) models/local/qwen2.5-coder-0.5b-$(b))
models/local/%-q8: | models
	$(SPECMLX) convert models/gguf/$*.gguf $@ --dtype float32 --quantize 8
models/local/%-q4: | models
	$(SPECMLX) convert models/gguf/$*.gguf $@ --dtype float32 --quantize 4

# Suites, prompts per suite, draws per prompt, tokens per answer, warm-up runs per row and
# temperatures.
# Quantized, each row prefills its prompt at ~2 s a token here (the extract prompts take
# minutes), so the README's slice, `make bench-quantized-q4 QUANT_SUITES=code QUANT_LIMIT=1
# QUANT_REPEATS=1 QUANT_TOKENS=32 QUANT_WARMUP=0`, takes about 35 minutes.
QUANT_SUITES ?= all
QUANT_LIMIT ?= 2
QUANT_REPEATS ?= 2
QUANT_TOKENS ?= 48
QUANT_WARMUP ?= 1
QUANT_TEMPS ?= 0 1.0
QUANT_BENCH = $(foreach s,$(QUANT_SUITES),--suite $(s)) --limit $(QUANT_LIMIT) \
	--repeats $(QUANT_REPEATS) $(foreach t,$(QUANT_TEMPS),--temp $(t)) -k 4 -k auto --mlx-lm-k 4 \
	--max-tokens $(QUANT_TOKENS) --warmup $(QUANT_WARMUP)
bench-quantized: bench-quantized-fp32 bench-quantized-q8 bench-quantized-q4
bench-quantized-fp32: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench $(QUANT_BENCH) $(call BENCH_OUT,bench-quantized-fp32)
bench-quantized-q%: models openblas $(QUANTIZED)
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --target models/local/qwen2.5-coder-1.5b-q$* \
		--draft models/local/qwen2.5-coder-0.5b-q$* $(QUANT_BENCH) $(call BENCH_OUT,bench-quantized-q$*)

# What a verify call costs: v(n) for n = 1..16 and c, for the fp32, 8-bit and 4-bit pair, with
# OpenBLAS preloaded and on the stock BLAS: results/costs-*.json, one table, docs/call-costs.png.
CALIBRATE = $(SPECMLX) calibrate --every-size --force --budget 90 --target $(2) --draft $(3) \
	--json results/costs-$(1)-$(DATE).json
COST_RUNS = fp32 q8 q4
cost-curves: models openblas $(QUANTIZED)
	mkdir -p results
	$(PRELOAD) $(call CALIBRATE,openblas-fp32,qwen2.5-coder-1.5b,qwen2.5-coder-0.5b)
	$(PRELOAD) $(call CALIBRATE,openblas-q8,models/local/qwen2.5-coder-1.5b-q8,models/local/qwen2.5-coder-0.5b-q8)
	$(PRELOAD) $(call CALIBRATE,openblas-q4,models/local/qwen2.5-coder-1.5b-q4,models/local/qwen2.5-coder-0.5b-q4)
	$(call CALIBRATE,stock-fp32,qwen2.5-coder-1.5b,qwen2.5-coder-0.5b)
	$(call CALIBRATE,stock-q8,models/local/qwen2.5-coder-1.5b-q8,models/local/qwen2.5-coder-0.5b-q8)
	$(call CALIBRATE,stock-q4,models/local/qwen2.5-coder-1.5b-q4,models/local/qwen2.5-coder-0.5b-q4)
	$(SPECMLX) cost-curves $(foreach r,openblas stock,$(foreach d,$(COST_RUNS),results/costs-$(r)-$(d)-$(DATE).json)) \
		--png docs/call-costs.png --markdown results/costs-$(DATE).md

# Adaptive k where verification is expensive: the stock BLAS, no preload. No warm-up run:
# calls here take seconds, and mlx-lm loads every weight into memory up front.
bench-stock-blas: models
	mkdir -p results
	$(SPECMLX) bench --suite code --suite creative --limit 1 --temp 0 \
		-k 1 -k 2 -k 4 -k auto --no-mlx-lm --max-tokens 24 --warmup 0 $(call BENCH_OUT,bench-stock-blas)

# Medusa, EAGLE and EAGLE-3-style heads, trained here (memory-bound regime: OpenBLAS
# preloaded, fp32). Each recipe has the target answer the shipped prompts and Magpie prompts
# (written by itself, or for the Qwen coder by SmolLM2-135M-Instruct) and tasks on functions
# of Python's own standard library, reads a seeded sample of that library, caches the
# target's features once under models/cache/heads/ (three layers' outputs and the final
# state: one cache trains all three kinds), then trains each kind until its held-out top-1
# stops rising (or its step budget ends); rerunning resumes where it stopped. SmolLM2's heads
# are committed (models/heads/); the Qwen ones are rebuilt by `make heads-qwen`.
STDLIB = $(shell $(PY) -c 'import json, os; print(os.path.dirname(os.path.dirname(json.__file__)))' 2>/dev/null)
STDLIB_CODE = --files '$(STDLIB)/**/*.py' --exclude '*/site-packages/*' --exclude '*/test/*' \
	--exclude '*/tests/*' --exclude '*/idlelib/*'
TRAIN_HEADS = $(PRELOAD) $(SPECMLX) train-heads
UNTIL_HELDOUT_STOPS = --patience 3 --checkpoint-every 100

heads: heads-smollm2 heads-qwen

# SmolLM2 (30 layers; EAGLE-3 reads layers 1, 14 and 26): 512 Magpie draws and 512 question draws
# (Magpie draws begun with a question's opening: answers of the kind chat asks for) beside the 159
# shipped prompts, greedy answers, and 200k tokens of the standard library. The 135M target
# answers 128 prompts at once (1.3x the tokens/s of 32 here: its weights are read once a call).
SMOL_DATA = --target smollm2-135m --data models/cache/heads/smollm2-135m --magpie 512 --questions 512 \
	$(STDLIB_CODE) --file-tokens 200000 --answer-tokens 256 --batch-size 128 $(UNTIL_HELDOUT_STOPS)

heads-smollm2: models openblas
	$(TRAIN_HEADS) $(SMOL_DATA) --kind eagle3 --out models/heads/smollm2-135m-eagle3 \
		--steps 400 --seq-len 512 --batch-tokens 2048 --draft-vocab 8192 --unroll 3 --save-dtype bfloat16 \
		--lr 1e-3
	$(TRAIN_HEADS) $(SMOL_DATA) --kind medusa --out models/heads/smollm2-135m-medusa \
		--steps 900 --seq-len 256 --batch-tokens 1024 --draft-vocab 4096

# EAGLE-1-style heads on the same cached data, for the comparison in docs/heads.md (the
# recipes train EAGLE-3-style heads instead: they scored as well and draft a third step).
heads-smollm2-eagle1: heads-smollm2
	$(TRAIN_HEADS) $(SMOL_DATA) --kind eagle --out models/heads/smollm2-135m-eagle \
		--steps 500 --seq-len 512 --batch-tokens 2048 --draft-vocab 8192

# On 2 cores (fp32, OpenBLAS) the 1.5B target reads about 45 tokens/s for features and
# answers a batch of 32 prompts in 3-5 minutes (longer prompts take longer): its data is
# what fits beside training in the recipe's 150 minutes (120 in one go on 2026-12-07,
# from an empty cache: data 62, EAGLE-3 33, Medusa 25): greedy answers to the shipped
# prompts, to 256 Magpie draws that
# SmolLM2-135M-Instruct writes (chat-like user turns; the coder itself writes few) and to 128
# tasks on functions of the standard library, and 20k tokens of it (Qwen2.5 has 28 layers;
# EAGLE-3 reads 1, 13 and 24).
QWEN_DATA = --target qwen2.5-coder-1.5b --data models/cache/heads/qwen2.5-coder-1.5b \
	--magpie 256@smollm2-135m --task-prompts 128 $(STDLIB_CODE) --file-tokens 20000 \
	--answer-tokens 128 --batch-size 32 --draft-vocab 8192 $(UNTIL_HELDOUT_STOPS)

heads-qwen: models openblas
	$(TRAIN_HEADS) $(QWEN_DATA) --kind eagle3 --out models/heads/qwen2.5-coder-1.5b-eagle3 \
		--steps 200 --seq-len 512 --batch-tokens 1024 --unroll 3
	$(TRAIN_HEADS) $(QWEN_DATA) --kind medusa --out models/heads/qwen2.5-coder-1.5b-medusa \
		--steps 600 --seq-len 256 --batch-tokens 1024

# What a reduced draft vocabulary saves (c of a Medusa and an EAGLE proposal) and gives up
# (coverage of the target's held-out next tokens), on the Qwen heads' cached data.
heads-vocab: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) draft-vocab --target qwen2.5-coder-1.5b \
		--data models/cache/heads/qwen2.5-coder-1.5b --json results/draft-vocab-qwen-$(DATE).json

# The heads beside prompt lookup on SmolLM2 (its committed heads: Medusa, and EAGLE-3-style
# heads, which draft as `--method eagle`), and beside the draft model on the Qwen target
# (after `make heads-qwen`).
SMOL_HEADS = models/heads/smollm2-135m
HEADS_BENCH = --suite all --limit 2 --temp 0 --max-tokens 64 --no-mlx-lm --repeats 2
bench-heads: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --target smollm2-135m --heads $(SMOL_HEADS)-medusa \
		--heads $(SMOL_HEADS)-eagle3 --method medusa --method eagle --method ngram -k 4 -k auto \
		$(HEADS_BENCH) $(call BENCH_OUT,bench-heads-smollm2)

bench-heads-qwen: models openblas
	mkdir -p results
	$(PRELOAD) $(SPECMLX) bench --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
		--heads models/heads/qwen2.5-coder-1.5b-medusa --heads models/heads/qwen2.5-coder-1.5b-eagle3 \
		--method medusa --method eagle --method draft --method ngram -k auto $(HEADS_BENCH) \
		$(call BENCH_OUT,bench-heads-qwen)

# Debian's OpenBLAS for the memory-bound regime on Linux CPUs (nothing to do elsewhere).
openblas:
	@if [ "$$(uname)" = "Linux" ] && [ -z "$(OPENBLAS)" ]; then \
		(apt-get update -q && apt-get install -y -q libopenblas0-pthread) >/dev/null 2>&1 || \
		(echo "error: could not install libopenblas0-pthread (Debian); install it as root" >&2; exit 1); \
	fi

clean:
	rm -rf .venv .pytest_cache .ruff_cache *.egg-info
