# One target per job. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
PORT ?= 3000
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo dev test lint typecheck bench clean

$(BIN)/stevora: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[server,test]'
	@touch $@

## Set up, start the embedded stack (embedded PostgreSQL, in-process broker + worker, API) and run
## the example workflows end to end, printing their event timelines.
demo: $(BIN)/stevora
	$(BIN)/stevora demo
	@echo "The stevora command is $(BIN)/stevora (or run: source $(BIN)/activate)."

## Embedded stack for development: API + UI on http://127.0.0.1:$(PORT) until Ctrl-C. Writes the
## API key to .stevora/dev-api-key, which `stevora` commands run in this folder use by default.
## Loads the examples' tools, so every example in docs/tool-calling.md runs as documented there,
## and examples/mcp.json's MCP servers (docs/mcp.md): the time server and the filesystem server.
dev: $(BIN)/stevora .mcp-node/node_modules/.bin/mcp-server-filesystem
	$(BIN)/stevora dev --tools examples.tools --tools examples.refund_desk --tools examples.toolbox --mcp-config examples/mcp.json --port $(PORT)

## The reference MCP filesystem server from npm (Node.js 18+), for `make dev` and the MCP tests.
.mcp-node/node_modules/.bin/mcp-server-filesystem:
	npm install --no-audit --no-fund --prefix .mcp-node @modelcontextprotocol/server-filesystem

## Set up and run the whole test suite (PostgreSQL: STEVORA_TEST_DATABASE_URL or embedded).
test: $(BIN)/stevora .mcp-node/node_modules/.bin/mcp-server-filesystem
	$(BIN)/pytest

lint: $(BIN)/stevora
	$(BIN)/ruff check stevora workers tests bench examples
	$(BIN)/ruff format --check stevora workers tests bench examples

typecheck: $(BIN)/stevora
	$(BIN)/mypy stevora workers

bench: $(BIN)/stevora
	$(BIN)/python -m bench.tool_loop
	$(BIN)/python -m bench.concurrency
	$(BIN)/python -m bench.api
	$(BIN)/python -m bench.mcp

clean:
	rm -rf $(VENV) .stevora test-artifacts .pytest_cache .mypy_cache .ruff_cache
