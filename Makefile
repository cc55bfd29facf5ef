# Two entry points that work on a fresh machine: `make demo` and `make test`.
# Both create .venv and install the project first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 is the CPU wheel already on this kind of machine; never pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0 -e '.[engine,dev]'
	touch $(STAMP)

.PHONY: install demo test bench
install: $(STAMP)

demo: $(STAMP)
	$(BIN)/lifeline demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench.engine
