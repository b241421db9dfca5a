"""Route rows that carry no `agent_ref` but a `task_source` (NeMo-Gym 0.7.0's flat rows) to an agent.

`task_source` names the server instance whose dataset the row came from. As in NeMo-Gym, it is
resolved against the head's config (`/global_config_dict_yaml`, which our head and NeMo-Gym's
both serve): an agent instance routes to itself; a resources server instance routes to the one
agent whose `resources_server` it is. An unknown instance, or a resources server with no agent or
several, is an error naming the `task_source`: no row is sent anywhere by guess.
"""
from __future__ import annotations

from typing import Any

from .client import agent_name

AGENT_TYPE = "responses_api_agents"
RESOURCES_TYPE = "resources_servers"


class TaskSourceError(ValueError):
    pass


def _inner(block: Any, server_type: str) -> dict[str, Any] | None:
    """The settings of an instance block `{server_type: {impl: settings}}`, or None."""
    impls = block.get(server_type) if isinstance(block, dict) else None
    if not isinstance(impls, dict) or not impls:
        return None
    settings = next(iter(impls.values()))
    return settings if isinstance(settings, dict) else None


def _reference_name(ref: Any) -> str | None:
    """A server reference's instance name: NeMo-Gym's `{type, name}` or a bare name."""
    name = ref.get("name") if isinstance(ref, dict) else ref
    return name if isinstance(name, str) and name else None


def agent_for(task_source: str, config: dict[str, Any]) -> str:
    block = config.get(task_source)
    if _inner(block, AGENT_TYPE) is not None:
        return task_source
    if _inner(block, RESOURCES_TYPE) is None:
        what = "not in the head's config" if block is None else "not an agent or resources server instance"
        raise TaskSourceError(f"task_source {task_source!r}: {what}")
    agents = sorted(name for name, other in config.items()
                    if _reference_name((_inner(other, AGENT_TYPE) or {}).get("resources_server")) == task_source)
    if len(agents) != 1:
        found = f"agents {agents}" if agents else "no agent"
        raise TaskSourceError(f"task_source {task_source!r}: {found} use this resources server; "
                              "give the rows an agent_ref or use --agent NAME")
    return agents[0]


def resolve_task_sources(rows: list[dict[str, Any]], config: dict[str, Any]) -> int:
    """Stamp `agent_ref` on rows that have none but a `task_source`, in place; how many were stamped.
    Rows with an `agent_ref` are left as they are. Raises `TaskSourceError` before any row is stamped."""
    pending = [row for row in rows if agent_name(row) is None and isinstance(row.get("task_source"), str)]
    resolved = {source: agent_for(source, config) for source in {row["task_source"] for row in pending}}
    for row in pending:
        row["agent_ref"] = {"type": AGENT_TYPE, "name": resolved[row["task_source"]]}
    return len(pending)


def needs_resolution(rows: list[dict[str, Any]]) -> bool:
    return any(agent_name(row) is None and isinstance(row.get("task_source"), str) for row in rows)
