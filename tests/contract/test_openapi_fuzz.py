"""Schemathesis against every environment's resource server (real servers on 127.0.0.1).

The session, metrics and health endpoints are the same code in every environment: they are
fuzzed on exact_match; every environment gets its own `/verify`, `/verify/batch` and tools
(code's execute_python, a few of workplace's and of workplace_assistant's), whose schemas are its own.
"""
from __future__ import annotations

import pytest

from .fuzz import fuzz
from .servers import ENVIRONMENTS

ENVS = sorted(ENVIRONMENTS)
SHARED = {"/seed_session", "/close_session", "/aggregate_metrics", "/health", "/ready"}
WORKPLACE_TOOLS = {"/send_email", "/search_tasks", "/tools"}
WORKPLACE_ASSISTANT_TOOLS = {"/email_send_email", "/customer_relationship_manager_search_customers",
                             "/calendar_update_event", "/tools"}


def skip_for(env: str):
    def skip(method: str, path: str) -> bool:
        if env == "exact_match":
            return False
        if env == "workplace" and path not in ("/verify", "/verify/batch"):
            return path not in WORKPLACE_TOOLS
        if env == "workplace_assistant" and path not in ("/verify", "/verify/batch"):
            return path not in WORKPLACE_ASSISTANT_TOOLS
        return path in SHARED

    return skip


@pytest.mark.parametrize("env", ENVS)
def test_resource_server_conforms_to_its_schema(env_servers, env):
    failures = fuzz(env_servers[env].url, max_examples=6, skip=skip_for(env))
    assert not failures, "\n\n".join(failures)
