# Bootstraps its own virtual environment: on a machine with only python3,
# `make demo` and `make test` work with nothing run before them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help venv demo test run clean chaos bench bench-quick report

help:
	@echo "make demo   start the embedded Temporal server, a worker, the scripted model and a REPL"
	@echo "make chaos  the chaos suite: every named fault scenario, checked; exit 1 on any fail or unknown"
	@echo "make test   run the test suite against a real embedded Temporal dev server"
	@echo "make bench  the benchmarks (Table 2, overhead breakdown, tuning, scaling, recovery, micro; < 10 min)"
	@echo "make bench-quick   the same pipeline in under a minute (proves it works, not the numbers)"
	@echo "make report reports/out/: Markdown, HTML, CSV, LaTeX tables and figures from every saved run"
	@echo "make run PROMPT='What is 25 * 4?'   one-shot run"
	@echo "make clean  remove the virtual environment and run artefacts"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m agent demo

PROMPT ?= What is 25 * 4?
run: $(STAMP)
	$(PY) -m agent run "$(PROMPT)"

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .dah runs reports/out *.egg-info

.PHONY: chaos
chaos: $(STAMP)
	$(PY) -m chaos suite

bench: $(STAMP)
	$(PY) -m benchmarks

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

report: $(STAMP)
	$(PY) -m reports
