"""`task_source` routing of rows without `agent_ref` (NeMo-Gym 0.7.0's flat rows)."""
from __future__ import annotations

import re

import pytest

from trainer.task_source import TaskSourceError, resolve_task_sources


def _agent(resources: str) -> dict:
    return {"responses_api_agents": {"simple_agent": {"resources_server": {"type": "resources_servers",
                                                                           "name": resources}}}}


CONFIG = {
    "math": {"resources_servers": {"math": {}}},
    "math_simple_agent": _agent("math"),
    "mcqa": {"resources_servers": {"mcqa": {}}},
    "mcqa_a": _agent("mcqa"),
    "mcqa_b": _agent("mcqa"),
    "lonely": {"resources_servers": {"exact_match": {}}},
    "policy_model": {"responses_api_models": {"stub": {}}},
}


def test_resources_server_routes_to_its_agent_and_agent_to_itself():
    rows = [{"task_source": "math"}, {"task_source": "mcqa_b"},
            {"task_source": "math", "agent_ref": {"name": "other"}}, {}]
    assert resolve_task_sources(rows, CONFIG) == 2
    assert [r.get("agent_ref", {}).get("name") for r in rows] == ["math_simple_agent", "mcqa_b", "other", None]


@pytest.mark.parametrize("source, message", [
    ("nope", "not in the head's config"), ("policy_model", "not an agent or resources server"),
    ("mcqa", "agents ['mcqa_a', 'mcqa_b']"), ("lonely", "no agent"),
])
def test_unroutable_task_source_is_an_error_naming_it(source, message):
    rows = [{"task_source": "math"}, {"task_source": source}]
    with pytest.raises(TaskSourceError, match=f"task_source {source!r}.*{re.escape(message)}"):
        resolve_task_sources(rows, CONFIG)
    assert "agent_ref" not in rows[0]  # nothing stamped when any row cannot be routed
