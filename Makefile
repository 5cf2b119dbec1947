# Bootstraps its own virtual environment: on a machine with only python3,
# `make demo` and `make test` work with nothing run before them.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Restate's server (testbed/engines/restate/agent.py) comes from npm: a Linux x64 binary in the package's platform part.
RESTATE_VERSION ?= 1.7.12
RESTATE := $(VENV)/restate/.installed

.PHONY: help venv demo test run clean clean-runs gc chaos chaos-engines bench bench-quick report system-deps restate-server \
	example-ai-sdk example-pydantic-ai example-openai-agents example-pydantic-ai-nested example-openai-agents-triage \
	example-ts-signal ts-replay-sdks

help:
	@echo "make demo   start the embedded Temporal server, a worker, the scripted model and a REPL"
	@echo "make chaos  the chaos suite: every named fault scenario, checked; exit 1 on any fail or unknown (~3 min)"
	@echo "           CHAOS_ARGS='--shard 2/4 --seeds 1-3' passes options (.venv/bin/dah-chaos suite --help)"
	@echo "make chaos-engines   the twin scenarios on DBOS (SQLite, PostgreSQL) and Restate: kill, outage, crash,"
	@echo "           database/server restart, partition (6-8 min)"
	@echo "make test   run the test suite against a real embedded Temporal dev server (installs system-deps first)"
	@echo "make bench  the benchmarks (Table 2, overhead breakdown, tuning, scaling, recovery, micro; < 10 min)"
	@echo "           BENCH_ARGS='--only table2 --turns 20' passes options (.venv/bin/dah-bench --help)"
	@echo "make bench-quick   the same pipeline in under a minute (proves it works, not the numbers)"
	@echo "make report reports/out/: Markdown, HTML, CSV, LaTeX tables and figures from every saved run"
	@echo "make run PROMPT='What is 25 * 4?'   one-shot run"
	@echo "make system-deps   Debian packages: bubblewrap (shell_local), chromium (browser_local), docker.io (Docker backend),"
	@echo "           postgresql (DBOS on PostgreSQL), npm (Restate's server)"
	@echo "make restate-server   Restate's server binary from npm into .venv/restate (make test and make chaos-engines do it)"
	@echo "make example-ai-sdk   the TypeScript agent's node_modules (examples/ai_sdk_agent, npm ci from its package-lock.json)"
	@echo "make ts-replay-sdks   plugins/temporal-replay (dah-replay) installed beside each Temporal TypeScript SDK it claims"
	@echo "           ($(TS_REPLAY_SDKS)), in .venv/ts-replay/: what tests/test_ts_replay.py runs (make test does it)"
	@echo "make example-pydantic-ai    examples/pydantic_ai_agent's own virtual environment (Pydantic AI on Temporal)"
	@echo "make example-openai-agents  examples/openai_agents_agent's own virtual environment (OpenAI Agents SDK on Temporal)"
	@echo "make example-ts-signal   examples/ts_signal_agent's node_modules (TypeScript: Signals with message ids, a calculator)"
	@echo "make example-pydantic-ai-nested   examples/pydantic_ai_nested's (Pydantic AI: tools taking nested objects)"
	@echo "make example-openai-agents-triage examples/openai_agents_triage's (Temporal's customer-service sample: handoffs)"
	@echo "make clean  remove the virtual environment and build clutter (keeps runs/ and reports/out/)"
	@echo "make gc     remove saved runs no longer needed: each runs/ folder keeps its newest 20, latest, every run that"
	@echo "           did not pass and every run a soak, summary or report names (every run does this after itself;"
	@echo "           --keep-runs all or DAH_KEEP_RUNS=all turns that off). GC_ARGS='--dry-run' or '--keep 5 --older-than 7d'"
	@echo "make clean-runs   remove every saved run (runs/), the built report (reports/out/) and the demo's state (.dah/)"

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	@touch $(STAMP)

restate-server: $(RESTATE)

$(RESTATE):
	@command -v npm >/dev/null || { echo "Restate's server comes from npm, which is missing: make system-deps (or apt-get install -y npm)" >&2; exit 1; }
	npm install --silent --no-audit --no-fund --prefix $(VENV)/restate @restatedev/restate-server@$(RESTATE_VERSION)
	@test -x $(VENV)/restate/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server \
		|| { echo "npm installed no restate-server binary for this platform (Linux x64 only)" >&2; exit 1; }
	@touch $(RESTATE)

# The TypeScript agent on Temporal's TypeScript SDK and the Vercel AI SDK: its own node_modules, exactly its lock file.
AI_SDK_AGENT := examples/ai_sdk_agent
example-ai-sdk: $(AI_SDK_AGENT)/node_modules/.installed

# The TypeScript agent driven by Signals (examples/ts_signal_agent): its own node_modules, from its lock file.
example-ts-signal: examples/ts_signal_agent/node_modules/.installed

examples/ts_signal_agent/node_modules/.installed: examples/ts_signal_agent/package-lock.json
	@command -v npm >/dev/null || { echo "the TypeScript agent comes from npm, which is missing: make system-deps (or apt-get install -y npm)" >&2; exit 1; }
	cd examples/ts_signal_agent && npm ci --silent --no-audit --no-fund
	@touch $@

$(AI_SDK_AGENT)/node_modules/.installed: $(AI_SDK_AGENT)/package-lock.json
	@command -v npm >/dev/null || { echo "the TypeScript agent comes from npm, which is missing: make system-deps (or apt-get install -y npm)" >&2; exit 1; }
	cd $(AI_SDK_AGENT) && npm ci --silent --no-audit --no-fund
	@node -e 'require("./$(AI_SDK_AGENT)/node_modules/@temporalio/worker")' \
		|| { echo "the TypeScript SDK's native bridge does not load here (its package ships Linux, macOS and Windows builds)" >&2; exit 1; }
	@touch $@

# The TypeScript replayer (plugins/temporal-replay) on every Temporal TypeScript SDK version it claims: a throwaway
# node project per version, the package as a file: dependency beside that SDK (tests/test_ts_replay.py).
TS_REPLAY_SDKS ?= 1.17.0 1.24.0
TS_REPLAY_DIR := $(VENV)/ts-replay
ts-replay-sdks: $(foreach v,$(TS_REPLAY_SDKS),$(TS_REPLAY_DIR)/sdk-$(v)/.installed)

$(TS_REPLAY_DIR)/sdk-%/.installed: plugins/temporal-replay/package.json
	@command -v npm >/dev/null || { echo "the TypeScript SDK comes from npm, which is missing: make system-deps (or apt-get install -y npm)" >&2; exit 1; }
	@mkdir -p $(@D) && echo '{"name": "ts-replay-sdk-$*", "private": true}' > $(@D)/package.json
	npm install --silent --no-audit --no-fund --save-exact --prefix $(@D) @temporalio/worker@$* @temporalio/workflow@$* \
		@temporalio/client@$* @temporalio/activity@$* @temporalio/common@$* file:$(CURDIR)/plugins/temporal-replay
	@touch $@

# The framework agents in examples/, each in a virtual environment of its own: their pins never meet the harness's
# (Pydantic AI needs openai>=3.31, which LiteLLM's openai<3 forbids here).
example-pydantic-ai: examples/pydantic_ai_agent/.venv/.installed
example-openai-agents: examples/openai_agents_agent/.venv/.installed
example-pydantic-ai-nested: examples/pydantic_ai_nested/.venv/.installed
example-openai-agents-triage: examples/openai_agents_triage/.venv/.installed

examples/%/.venv/.installed: examples/%/requirements.txt
	@test -x examples/$*/.venv/bin/python || $(PYTHON) -m venv examples/$*/.venv
	examples/$*/.venv/bin/python -m pip install --quiet --disable-pip-version-check -r $<
	@touch $@

demo: $(STAMP)
	$(PY) -m testbed demo

PROMPT ?= What is 25 * 4?
run: $(STAMP)
	$(PY) -m testbed run "$(PROMPT)"

# The system packages first (installed where this is root with apt-get), the TypeScript agents' node_modules
# (tests/test_ai_sdk_agent.py runs one as a chaos run), the OpenAI Agents SDK example's environment
# (tests/test_slow_detection_agent.py) and the TypeScript replayer on each SDK it claims
# (tests/test_ts_replay.py), so nothing skips for want of one;
# SYSTEM_DEPS=no runs the suite without them (their tests skip, each with the reason).
SYSTEM_DEPS ?= yes
# The suite runs on TEST_WORKERS pytest-xdist processes: most tests wait on servers, workers and kills more than
# they compute, so more processes than cores keeps both cores busy. The Docker engine's tests share one worker
# (--dist loadgroup: tests/conftest.py).
TEST_WORKERS ?= 4
test: $(STAMP)
	@if [ "$(SYSTEM_DEPS)" != no ]; then $(MAKE) --no-print-directory system-deps restate-server example-ai-sdk \
		example-openai-agents \
		ts-replay-sdks; fi
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The environments' system packages (Debian/Ubuntu): bubblewrap (shell_local), chromium (browser_local, and the
# browser image's Chromium), docker.io (the Docker backend and browser_docker: the engine; the harness starts
# dockerd when it needs it and stops it after, and builds its images from this machine's files: testbed/images.py).
# Installed with apt-get where this is root; otherwise the exact command is printed and the target fails.
system-deps:
	@missing=""; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v dockerd >/dev/null || missing="$$missing docker.io"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -z "$$missing" ]; then \
		echo "system packages present: bubblewrap, chromium, docker.io, postgresql, npm"; \
	elif [ "$$(id -u 2>/dev/null)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing$$missing (apt-get) ..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null \
			&& echo "installed:$$missing"; \
	else \
		echo "missing system packages:$$missing; install them (as root): apt-get install -y$$missing" >&2; \
		echo "(or run the suite without them, their tests skipped: make test SYSTEM_DEPS=no)" >&2; exit 1; \
	fi

# Saved runs and reports are results, not clutter: clean keeps them. Each runs folder keeps its newest 20 runs and
# every protected one after every run (harness/retention.py); gc collects by hand; clean-runs removes them all.
clean:
	rm -rf $(VENV) *.egg-info build dist .pytest_cache .hypothesis
	find . -name __pycache__ -type d -not -path './runs/*' -prune -exec rm -rf {} +

clean-runs:
	rm -rf runs reports/out .dah

GC_ARGS ?=
gc: $(STAMP)
	$(PY) -m testbed gc $(GC_ARGS)

CHAOS_ARGS ?=
chaos: $(STAMP)
	$(PY) -m chaos suite $(CHAOS_ARGS)

# The same agent on the other engines (testbed/engines): every twin scenario on DBOS (SQLite, PostgreSQL) and Restate.
# Not in `make chaos`: it needs PostgreSQL and Restate's server, which a Temporal-only CI need not install.
chaos-engines: $(STAMP) $(RESTATE)
	$(PY) -m chaos suite --engines dbos,dbos-postgres,restate --summary runs/chaos-engines-summary.json \
		--junit runs/chaos-engines-junit.xml $(CHAOS_ARGS)

BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

report: $(STAMP)
	$(PY) -m reports
