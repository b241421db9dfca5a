# gymserve: `make demo` runs every environment end to end (the demo stack); `make test` runs every test.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install demo lint test test-fast docs bench up clean image compose-up compose-down catalogue

install:
	@bash deploy/install.sh

demo: install
	$(PY) -m gymserve.demo

# ruff over all Python code, mypy over the typed packages listed in pyproject.toml
lint: install
	$(PY) -m ruff check --no-cache .
	$(PY) -m mypy

test: install lint docs
	$(PY) -m pytest -q -p no:cacheprovider --durations=40 $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): --strict makes a broken link or a missing page fail.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict  # not --quiet: it hides the warnings --strict fails on

test-fast: install
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS)

# NeMo-Gym 0.7.0's whole catalogue behind gymserve: every resources server classified, tried and compared
# with NeMo-Gym's own agent (long: builds each server's virtualenv); writes docs/catalogue.md
catalogue: install
	$(PY) -m tests.compat.catalogue_run $(CATALOGUE_ARGS)

BENCHMARKS := pool_throughput verify_math verify_envs code_exec reward_model agent_run collect_routing model_hf model_hf_mixed model_vllm head_proxy head_cpu versus_revision tail_latency tail_mix batch_completion ray_backend

bench: install
	@for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py || exit 1; done

up: install
	$(VENV)/bin/gymserve up

# Docker: one CPU image for every server; the stack in docker-compose.yml (docs/deployment/docker-compose.md).
image:
	@bash deploy/docker/build.sh

compose-up:
	@bash deploy/docker/compose.sh up

compose-down:
	@bash deploy/docker/compose.sh down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache build site *.egg-info
