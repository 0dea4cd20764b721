# Everything starts from a fresh machine: `make demo` and `make test` run scripts/setup.sh first.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test unit lint bench clean

setup:
	./scripts/setup.sh

demo: setup
	$(VENV)/bin/mgpu-cloud run --provider docker --nodes 2 examples/train_ddp.py --steps 50

# The suite in parallel: workers wait on containers, sshd and processes far more than they
# compute (tests/engine.py keeps workers and concurrent runs apart; tests sharing one cluster
# are one xdist_group). Bytecode first: every CLI the tests start imports the project, and
# PYTHONDONTWRITEBYTECODE machines would compile it again each time.
TEST_WORKERS ?= 4
test: setup
	$(PY) -m compileall -q provision remote
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15

unit:
	$(PY) -m pytest -q --ignore=tests/integration

lint:
	$(VENV)/bin/ruff check provision remote tests benchmarks
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/up_time.py
	$(PY) benchmarks/cli_start.py
	$(PY) benchmarks/dashboard_start.py
	$(PY) benchmarks/aws_api_calls.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Mutation testing of the trust-critical modules, each against its own fast tests
# (scripts/mutation.py: the scopes; docs/security.md: the scores; docs/mutation-survivors.md:
# the survivors explained as equivalent). `make mutation SCOPES="signing logins"` runs some;
# MUTATION_ARGS="--max-children 1" tests one mutant at a time (a machine shared with others).
.PHONY: mutation
mutation: setup
	$(VENV)/bin/pip install -q -e ".[mutation]"
	$(PY) scripts/mutation.py $(SCOPES) $(MUTATION_ARGS)
