# Tiny Data Server. `make help` lists the targets.
# The two set-up commands on a fresh machine: `make run` and `make test`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ARGS   ?=

.DEFAULT_GOAL := help
.PHONY: help run test check sysdeps venv clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed ## create .venv from the pinned requirements (done by run and test)

run: venv ## serve on 127.0.0.1:8000 (data in ./data); pass flags as ARGS="--processes 2"
	$(BIN)/python app.py $(ARGS)

sysdeps: ## install nginx, ab and supervisord when missing (apt-get)
	@command -v nginx >/dev/null && command -v ab >/dev/null && command -v supervisord >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	    nginx apache2-utils supervisor >/dev/null; }

check: venv ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/mypy

test: venv sysdeps check ## the whole test suite (real servers on 127.0.0.1)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean: ## remove .venv, build output and caches (keeps ./data)
	rm -rf $(VENV) build var .pytest_cache .ruff_cache .mypy_cache .hypothesis
