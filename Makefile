# Every target sets up its own virtualenv from pyproject.toml: a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo bench docs lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,chart,serve,postgres,langchain,pydantic-ai,openai-agents]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check ragent_memory tests benchmarks
	$(BIN)/ruff format --check ragent_memory tests benchmarks
	$(BIN)/mypy ragent_memory

test: lint
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

$(VENV)/.docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(VENV)/.docs

# The docs site (mkdocs.yml, docs/) into site/; a broken link or anchor fails the build.
docs: $(VENV)/.docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) site .pytest_cache .mypy_cache .ruff_cache *.egg-info
