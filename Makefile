# The set-up promise: every target creates .venv when it is missing and installs the project
# from the pinned versions in requirements/constraints.txt, so a fresh machine gets exactly
# the versions the tests ran with.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := requirements/constraints.txt
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest crash fuzz bench clean test-pg

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "turnkeeper needs Python 3.11+")'
	PIP_CONSTRAINT=$(CONSTRAINTS) $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

demo: $(STAMP)
	$(BIN)/turnkeeper demo

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest

# Every kill point (durable writes, mid-stream, mid-tool, mid-queue) of every library scenario:
# kill there, recover, check; then the kill -9 loop (docs/development.md). Both run to the end.
crash: $(STAMP)
	$(BIN)/python -m agent_session.harness.crashpoints docs/scenarios/*.toml; sweep=$$?; \
	$(BIN)/python -m agent_session.harness.killloop --sessions 24 --kills 60 --seed 24; \
	loop=$$?; test $$sweep -eq 0 && test $$loop -eq 0

# The fuzz and sweep suites at full size (docs/development.md); make test runs a bounded sample.
fuzz: $(STAMP)
	TURNKEEPER_FUZZ=full $(BIN)/python -m pytest -q tests/harness/test_scenario_fuzz.py \
		tests/scenarios/test_crash_sweep.py tests/scenarios/test_failed_writes.py \
		tests/persistence/test_corrupt_store.py tests/test_redaction.py \
		tests/operations/test_secret_leaks.py

# Many engine processes on one PostgreSQL at full size (docs/deploying.md): the recovery storm
# of 1,000 sessions over four engines, the kill -9 and SIGSTOP processes, the leases and the
# engine's recovery on PostgreSQL. `make test` runs them too, the storm at 200 sessions. The
# tests start their own throwaway server (tests/pg_server.py).
test-pg: $(STAMP)
	TURNKEEPER_STORM=1000 TURNKEEPER_FLEET=1000 $(BIN)/python -m pytest -q -s \
		tests/persistence/test_pg_storm.py tests/persistence/test_pg_fleet.py \
		tests/persistence/test_pg_processes.py tests/persistence/test_pg_leases.py \
		tests/persistence/test_pg_open.py tests/persistence/test_pg_faults.py \
		tests/persistence/test_pg_batches.py tests/agent_session/test_engine_leases.py \
		tests/agent_session/test_engine_inbox.py

# The peers are installed for benchmarking only (the `bench` extra); `test` and `demo` never need them.
bench: $(STAMP)
	PIP_CONSTRAINT=$(CONSTRAINTS) $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis build *.egg-info

# The real-server MCP cases (tests/mcp/test_mcp_real_servers.py) against mcp-server-time, then
# against @modelcontextprotocol/server-everything from npm (needs node; installed into
# .mcp-servers/, which is not committed). `make test` runs the first half only.
MCP_SERVERS := .mcp-servers
EVERYTHING := $(MCP_SERVERS)/node_modules/.bin/mcp-server-everything

.PHONY: test-mcp

$(EVERYTHING):
	npm install --prefix $(MCP_SERVERS) --no-audit --no-fund --silent \
		@modelcontextprotocol/server-everything@2026.8.31

test-mcp: $(STAMP) $(EVERYTHING)
	$(BIN)/python -m pytest -q tests/mcp/test_mcp_real_servers.py
	TURNKEEPER_MCP_SERVER='["$(EVERYTHING)", "stdio"]' TURNKEEPER_MCP_TOOL=echo \
		TURNKEEPER_MCP_ARGS='{"message": "Lima"}' TURNKEEPER_MCP_OTHER_TOOL=get-sum \
		$(BIN)/python -m pytest -q tests/mcp/test_mcp_real_servers.py
