"""Schemathesis against the head, a model server of every backend, and an agent (real servers).

- head: every endpoint but `POST /register` (a fuzzed registration would make the head probe
  made-up hosts; registration has its own tests);
- models/stub and models/openai_proxy (upstream: a stub, in Responses mode);
- agents/simple_agent running rollouts against the stub model and exact_match;
- models/hf: generation on CPU is slow, so only its endpoints that do not generate
  (`/v1/models`, `/health`, `/ready`) are fuzzed; its generating endpoints are covered by
  the schema checks of tests/contract/test_openapi_schemas.py and the model tests.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from gymserve.testing import ServerProcess

from .fuzz import fuzz
from .servers import start_all, stop_all


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, ServerProcess]]:
    servers = {"head": ServerProcess("head", name="contract-head"),
               "stub": ServerProcess("models/stub", "text=Paris", name="contract-stub"),
               "exact": ServerProcess("resources/exact_match", name="contract-exact")}
    start_all(list(servers.values()))
    dependants = {
        "proxy": ServerProcess("models/openai_proxy", f"base_url={servers['stub'].url}/v1", "upstream_api=responses",
                               "training_mode=false", name="contract-proxy"),
        "agent": ServerProcess("agents/simple_agent", f"resources_url={servers['exact'].url}",
                               f"model_url={servers['stub'].url}", name="contract-agent"),
    }
    try:
        start_all(list(dependants.values()))
    except BaseException:
        stop_all(list(servers.values()))
        raise
    servers.update(dependants)
    try:
        yield servers
    finally:
        stop_all(list(servers.values()))


def test_head_conforms(stack):
    failures = fuzz(stack["head"].url, max_examples=5, skip=lambda method, path: path == "/register")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("name", ["stub", "proxy", "agent"])
def test_server_conforms(stack, name):
    failures = fuzz(stack[name].url, max_examples=12)
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_hf_model_server_non_generating_endpoints_conform():
    with ServerProcess("models/hf", "max_model_len=256", name="contract-hf", ready_timeout_s=300) as server:
        try:
            failures = fuzz(server.url, max_examples=5,
                            skip=lambda method, path: method == "POST")
        finally:
            from pathlib import Path

            Path(server._logfile.name).unlink(missing_ok=True)
    assert not failures, "\n\n".join(failures)
