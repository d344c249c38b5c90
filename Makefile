# Every target sets up its own virtualenv from pyproject.toml: a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo bench real-model docs lint clean clients

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,chart,serve,postgres,langchain,pydantic-ai,openai-agents,mcp,ui,otel,browser-tests]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check ragent_memory tests benchmarks
	$(BIN)/ruff format --check ragent_memory tests benchmarks
	$(BIN)/mypy ragent_memory

# The real Claude Code and Codex CLIs that tests/serve/test_clients.py drives through the proxy, pinned
# in clients/package-lock.json and installed once into clients/node_modules (npm registry only).
CLIENTS := clients/node_modules/.installed

$(CLIENTS): clients/package.json clients/package-lock.json
	cd clients && npm ci --no-audit --no-fund --loglevel=error
	clients/node_modules/.bin/claude --version && clients/node_modules/.bin/codex --version
	touch $(CLIENTS)

clients: $(CLIENTS)

test: lint $(CLIENTS)
	$(BIN)/pytest -q

$(VENV)/.chart: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[chart]'
	touch $(VENV)/.chart

demo: $(VENV)/.chart
	$(BIN)/ragent-memory demo

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,serve,postgres,langchain,pydantic-ai,openai-agents,bench]'
	touch $(VENV)/.bench

# run, versus, locomo, proxy, pg, facts in turn; prints each one's wall and CPU time at the end and
# writes docs/benchmarks.md from benchmarks/results/ (python -m benchmarks.report).
bench: $(VENV)/.bench
	$(BIN)/python -m benchmarks

# Not part of bench: a long session against a real OpenAI-compatible model, by hand, e.g.
# make real-model URL=http://127.0.0.1:8079/v1 B=12000 (MODEL=local TURNS=100 WORKLOAD=rag by
# default; WORKLOAD=orders: a model that repeats itself must still move every summary on);
# adds its figures to benchmarks/results/real_model.json (see docs/real-model.md).
real-model: $(STAMP)
	test -n "$(URL)" || (echo "usage: make real-model URL=http://host:port/v1 [B=12000]" && false)
	$(BIN)/python -m benchmarks.real_model --url $(URL) --model $(or $(MODEL),local) \
		--budget $(or $(B),12000) --turns $(or $(TURNS),100) --workload $(or $(WORKLOAD),rag)

$(VENV)/.docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(VENV)/.docs

# The docs site (mkdocs.yml, docs/) into site/; a broken link or anchor fails the build.
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache *.egg-info clients/node_modules
