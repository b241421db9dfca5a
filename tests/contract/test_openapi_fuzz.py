"""Schemathesis against every environment's resource server (real servers on 127.0.0.1)."""
from __future__ import annotations

import pytest

from .fuzz import fuzz
from .servers import ENVIRONMENTS

ENVS = sorted(ENVIRONMENTS)


@pytest.mark.parametrize("env", ENVS)
def test_resource_server_conforms_to_its_schema(env_servers, env):
    failures = fuzz(env_servers[env].url, max_examples=8)
    assert not failures, "\n\n".join(failures)
