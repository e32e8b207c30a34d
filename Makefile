# Tiny Data Server. `make help` lists the targets.
# The two set-up commands on a fresh machine: `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ARGS   ?=
# pytest-xdist workers for the tests that do not use Docker (the Docker tests run after, alone).
# Two on two cores: four took 275-300 s instead of 448 (most tests wait on the servers they
# start), but brought out a timing test's failure in four runs of eight (BENCHMARKS.md, "The
# test suite"). worksteal hands a free worker the tests another has not begun.
TEST_WORKERS ?= 2
# TESTS=all also runs the extended tests (`make test-all`): larger or repeated fault scenarios
# whose property a default test already proves (pyproject.toml's `extended` marker)
TESTS ?= default
ONLY  := $(if $(filter all,$(TESTS)),,and not extended)

.DEFAULT_GOAL := help
.PHONY: help run test test-all check sysdeps venv codec clean fuzz reliability bench bench-quick

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed ## create .venv from the pinned requirements (done by run and test)

# `maturin develop --skip-install` (pyproject.toml's [tool.maturin]) builds tiny._codec and puts
# it in tiny/ itself (git-ignored *.so), where `python app.py` and pytest import it from here.
CODEC_SOURCES := $(wildcard rust/tiny_codec/src/*.rs) rust/tiny_codec/Cargo.toml rust/tiny_codec/Cargo.lock pyproject.toml
$(VENV)/.codec: $(BIN)/.installed $(CODEC_SOURCES)
	@if command -v cargo >/dev/null 2>&1; then \
	  VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/maturin develop --release --locked --skip-install --target-dir rust/target && \
	  touch $@; \
	else echo "no cargo here: the pure-Python reference codec will run (make codec needs a Rust toolchain)"; fi

codec: $(VENV)/.codec ## build the compiled codec (Rust/PyO3, needs cargo) into tiny/ (tiny._codec)

# The server says why it stopped; on a first run that is most often a port another server (a
# `make run` in another shell) listens on, so the hint says how to get past it.
RUN_FAILED := make run: the server stopped; its last lines say why. "address already in use": another server \
  listens on that port (a make run in another shell?): stop it, or pass another port, make run ARGS="--port 8001"
run: venv codec ## serve on 127.0.0.1:8000 (data in ./data) until Ctrl-C; pass flags as ARGS="--port 8001 --processes 2"
	$(info $(BIN)/python app.py $(ARGS))
	@$(BIN)/python app.py $(ARGS) || { status=$$?; echo '$(RUN_FAILED)' >&2; exit $$status; }

sysdeps: ## install nginx, ab, supervisord, chromium (the dashboard test), R (the cranlogs client's test), strace, and PostgreSQL 15, Patroni and etcd (the cluster tests; their services disabled) when missing (apt-get)
	@command -v nginx >/dev/null && command -v ab >/dev/null && command -v supervisord >/dev/null && \
	  command -v strace >/dev/null && command -v chromium >/dev/null && command -v Rscript >/dev/null && \
	  Rscript -e 'for (p in c("httr", "jsonlite", "testthat")) loadNamespace(p)' >/dev/null 2>&1 || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    nginx apache2-utils supervisor strace chromium fonts-dejavu-core \
	    r-base-core r-cran-httr r-cran-jsonlite r-cran-testthat >/dev/null; }
	@command -v patroni >/dev/null && command -v etcd >/dev/null && [ -x /usr/lib/postgresql/15/bin/postgres ] || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    postgresql-15 patroni etcd-server >/dev/null && \
	  { $(SUDO) systemctl disable --now etcd.service patroni.service >/dev/null 2>&1 || true; }; }

check: venv ## ruff (lint and format) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: venv codec sysdeps check ## the whole suite: cargo's unit tests, the Python codec's run, then everything on the installed codec
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory compose-v2; fi
	@if command -v cargo >/dev/null 2>&1; then cd rust/tiny_codec && cargo test -q --lib --target-dir ../target; fi
	@if $(BIN)/python -c "import tiny._codec" 2>/dev/null; then \
	  echo "== the HTTP contract on the pure-Python reference codec (TINY_CODEC=python) =="; \
	  TINY_CODEC=python $(BIN)/python -m pytest -q app_tests.py tests/test_handlers.py tests/test_fuzz_http.py; fi
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not docker $(ONLY)" $(PYTEST_ARGS)
	@$(BIN)/python -m pytest -m "docker $(ONLY)" $(PYTEST_ARGS); rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ] # 5: none selected

test-all: ## make test with the extended tests too (about twice as long)
	@$(MAKE) --no-print-directory test TESTS=all

fuzz: venv ## a longer fuzz run of the codec and of /ingest over HTTP (TINY_FUZZ_EXAMPLES, default 20000)
	TINY_FUZZ_EXAMPLES=$${TINY_FUZZ_EXAMPLES:-20000} $(BIN)/python -m pytest -q \
	  tests/test_fuzz_http.py tests/test_codec_properties.py $(wildcard tests/test_codec_differential.py)

reliability: venv sysdeps ## longer fault runs and every hardening regression test; writes docs/reliability.md
	mkdir -p build && rm -f build/figures.jsonl
	TINY_FIGURES_FILE=build/figures.jsonl TINY_RELIABILITY_SCALE=$${TINY_RELIABILITY_SCALE:-4} \
	  TINY_FUZZ_EXAMPLES=$${TINY_FUZZ_EXAMPLES:-3000} $(BIN)/python -m pytest -q -m "reliability or hardening" \
	  app_tests.py tests
	$(BIN)/python tests/reliability_report.py build/figures.jsonl docs/reliability.md

bench: venv codec sysdeps ## the benchmark sweep (~20 min on 2 cores): bench/results/, images/bench_*.png, bench/results/tables.md
	$(BIN)/python bench/codec_bench.py
	$(BIN)/python bench/run.py $(BENCH_ARGS)
	$(BIN)/python bench/charts.py
	$(BIN)/python bench/report.py > /dev/null

bench-quick: venv codec sysdeps ## a smoke run of the benchmark harness (~4 min), into bench/results/quick/
	$(BIN)/python bench/run.py --quick
	$(BIN)/python bench/report.py --results bench/results/quick/results.json

clean: ## remove .venv, build output and caches (keeps ./data)
	rm -rf $(VENV) build var .pytest_cache .ruff_cache .mypy_cache .hypothesis tiny/_codec*.so

-include mk/*.mk
