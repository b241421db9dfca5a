# gymserve: `make demo` runs the embedded default stack end to end; `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install demo lint test test-fast bench up clean

install:
	@bash deploy/install.sh

demo: install
	$(PY) -m gymserve.demo

# ruff over all Python code, mypy over the typed packages listed in pyproject.toml
lint: install
	$(PY) -m ruff check --no-cache .
	$(PY) -m mypy

test: install lint
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

BENCHMARKS := pool_throughput verify_math verify_envs code_exec reward_model agent_run collect_routing model_hf

bench: install
	@for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py || exit 1; done

up: install
	$(VENV)/bin/gymserve up

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build *.egg-info
