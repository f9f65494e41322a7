# outbox CDC — developer entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install lint image helm test-deploy bench-deploy test test-matrix test-secure unit test-integration demo bench bench-consumer bench-consumer-memory bench-debezium bench-audit soak faults faults-cluster stack-up stack-down stack-status clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

# rustup puts cargo in ~/.cargo/bin, which only a new login shell adds to PATH: the install looks there too,
# to build the compiled hot path (rust/; without cargo the install is pure Python).
CARGO_BIN := $(HOME)/.cargo/bin

# Whether the compiled path is built is part of the install: its stamp names the cargo found and whether
# cdc/_fastpath*.so exists. A cargo installed (or upgraded) since the last install, or an extension that is
# gone, changes the name, so the install runs again and builds it; a build that failed with this very cargo is
# not retried at every make (the install said why, and it warns below).
CARGO_VERSION := $(word 2,$(shell PATH="$(CARGO_BIN):$$PATH" cargo --version 2>/dev/null))
fastpath_state = cargo-$(or $(CARGO_VERSION),none)-$(if $(wildcard cdc/_fastpath*.so),built,unbuilt)
FASTPATH_STAMP := $(VENV)/.fastpath-$(fastpath_state)

$(STAMP): pyproject.toml rust/Cargo.toml $(wildcard rust/src/*.rs) $(FASTPATH_STAMP)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	PATH="$(CARGO_BIN):$$PATH" $(BIN)/pip install -q -e '.[dev]'
	@rm -f $(VENV)/.fastpath-*; state=$$(ls cdc/_fastpath*.so >/dev/null 2>&1 && echo built || echo unbuilt); \
	touch "$(VENV)/.fastpath-cargo-$(or $(CARGO_VERSION),none)-$$state"; \
	if [ $$state = unbuilt ]; then echo "make install: the compiled hot path is not built ($(if \
	$(CARGO_VERSION),cargo $(CARGO_VERSION) failed: see the output above,no cargo in PATH or $(CARGO_BIN))); \
	cdc runs the pure-Python path (docs/compiled-loop.md)"; fi
	touch $(STAMP)

$(VENV)/.fastpath-%:
	@mkdir -p $(VENV) && touch $@

install: $(STAMP) ## create .venv with the project (editable) and the dev tools

lint: $(STAMP) ## ruff, and mypy strict on cdc/
	$(BIN)/ruff check cdc tests
	$(BIN)/ruff format --check cdc tests
	$(BIN)/mypy

image: ## build the container image with podman, on bases made from Debian's packages (deploy/image/image.sh; no registry needed)
	bash deploy/image/image.sh build

helm: ## build helm from the Go module proxy for the chart's tests (deploy/helm/install-helm.sh; cached in ~/.cache/outbox-cdc)
	bash deploy/helm/install-helm.sh >/dev/null

test-deploy: $(STAMP) image helm stack-up ## the image and the Helm chart: render, validate, run the chart's pods with podman (tests/deploy)
	. .stack/env && $(BIN)/pytest tests/deploy $(PYTEST_ARGS)

stack-up: ## start PostgreSQL, Kafka and the schema registry on loopback (idempotent; CDC_STACK_TRACING=1 adds Jaeger), write .stack/env
	@bash stack/stack.sh up

stack-down: ## stop the processes stack-up started
	@bash stack/stack.sh down

stack-status: ## what runs, and where its logs are
	@bash stack/stack.sh status

test: $(STAMP) stack-up ## start the stack, then run every test (unit and integration)
	. .stack/env && $(BIN)/pytest $(PYTEST_ARGS)

PG_VERSIONS ?= 13 14 15 16 17 18

test-matrix: $(STAMP) ## the core integration tests on each PostgreSQL version (PG_VERSIONS="13 18")
	@failed=""; for v in $(PG_VERSIONS); do \
		echo "== PostgreSQL $$v"; \
		CDC_STACK_PG_VERSION=$$v bash stack/stack.sh up || { failed="$$failed $$v"; continue; }; \
		( . .stack/env && $(BIN)/pytest tests/integration -m core $(PYTEST_ARGS) ) || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-matrix: FAILED on PostgreSQL$$failed"; exit 1; fi; \
	echo "test-matrix: passed on PostgreSQL $(PG_VERSIONS)"

test-secure: $(STAMP) ## the core integration tests and the misconfiguration refusals against the secure stack (TLS + SCRAM to PostgreSQL, SASL_SSL + ACLs to Kafka, HTTPS registry)
	CDC_STACK_SECURE=1 bash stack/stack.sh up
	. .stack/env && $(BIN)/pytest tests/integration -m "core or secure" $(PYTEST_ARGS)

unit: $(STAMP) ## only the tests that need no service
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

demo: $(STAMP) ## run the pipeline end to end on the local stack (stops the stack if it started it)
	@if bash stack/stack.sh status >/dev/null 2>&1; then was_up=1; else was_up=0; fi; \
	bash stack/stack.sh up && . .stack/env && $(BIN)/python examples/demo.py; rc=$$?; \
	if [ $$was_up = 0 ]; then bash stack/stack.sh down; fi; exit $$rc

bench: $(STAMP) stack-up ## bare reader, cdc run at-least-once and exactly-once drain pre-filled slots side by side, then latency; figures in bench-results/ (BENCH_ARGS="--events 200000 --repeat 2")
	. .stack/env && $(BIN)/python -m tests.bench.run $(BENCH_ARGS)

bench-consumer: $(STAMP) stack-up ## what exactly-once costs a downstream consumer (IdempotentConsumer vs plain)
	. .stack/env && $(BIN)/python -m tests.bench.consumer $(BENCH_ARGS)

bench-consumer-memory: $(STAMP) stack-up ## the idempotent consumer's RSS 2,500,000 records behind: its settings against librdkafka's (BENCH_ARGS="--events 500000")
	. .stack/env && $(BIN)/python -m tests.bench.consumer_memory $(BENCH_ARGS)

bench-debezium: $(STAMP) stack-up ## cdc run beside Debezium 3.6.1 (Kafka Connect standalone, Outbox Event Router): default, tuned, Avro (BENCH_ARGS="--events 20000")
	. .stack/env && $(BIN)/python -m tests.bench.debezium $(BENCH_ARGS)

bench-deploy: $(STAMP) image helm stack-up ## the chart's pod with podman: start, SIGTERM, a standby's takeover, Recreate's gap (BENCH_ARGS="--repeat 5")
	. .stack/env && $(BIN)/python -m tests.bench.deploy $(BENCH_ARGS)

bench-audit: $(STAMP) stack-up ## cdc audit's peak memory and time at 10 000 and 1 000 000 events, and with losses (BENCH_ARGS="--events 10000 --missing 4000000")
	. .stack/env && $(BIN)/python -m tests.bench.audit $(BENCH_ARGS)

soak: $(STAMP) stack-up ## 30 min at an offered 20 000 events/s through cdc run and the idempotent consumer: growth, p99 per minute, nothing missing; not in CI (SOAK_ARGS="--minutes 3 --rate 5000")
	. .stack/env && $(BIN)/python -m tests.bench.soak $(SOAK_ARGS)

faults: $(STAMP) ## the fault suite: kills and outages under load, then nothing lost? (FAULTS_ARGS="--seed N --duration S --runs K")
	$(BIN)/python -m tests.faults $(FAULTS_ARGS)

faults-cluster: $(STAMP) ## the fault suite on a three-broker cluster: leader kill, controlled shutdown, rolling restart, ISR below min (FAULTS_ARGS as for faults)
	$(BIN)/python -m tests.faults --brokers 3 --duration 150 $(FAULTS_ARGS)

clean: ## stop the stack and remove its state and the venv
	bash stack/stack.sh clean
	rm -rf $(VENV)
