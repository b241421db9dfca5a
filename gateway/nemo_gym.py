"""What NeMo-Gym 0.7.0's clients read from a head, beyond the shared config shape.

- Server references as `{type, name}` (0.7.0 reads `resources_server.name`, not a bare string).
- One `environment_servers` entry per agent: 0.7.0's collector (`ng_collect_rollouts`,
  `gym eval run --no-serve`) posts `/run` and `/aggregate_metrics` only to an environment server
  that fronts the agent. NeMo-Gym's own `legacy_agent` environment server relays both unchanged
  to the agent, so the entry gives the agent's own address: same requests, one hop fewer.
- `process_name` (and `config_path`, `start_time`) on `/server_instances` rows, which
  `gym env status` reads.
"""
from __future__ import annotations

from typing import Any

AGENT_TYPE = "responses_api_agents"
ENVIRONMENT_TYPE = "environment_servers"
ENVIRONMENT_SUFFIX = "_environment_server"

# options that name another server instance, and the server type of that instance
REFERENCE_OPTIONS = {
    "resources_server": "resources_servers",
    "model_server": "responses_api_models",
    "judge_model_server": "responses_api_models",
    "agent_server": AGENT_TYPE,
}


def with_references(options: dict[str, Any]) -> dict[str, Any]:
    """Options with bare instance names written as NeMo-Gym's `{type, name}` references."""
    out = dict(options)
    for key, server_type in REFERENCE_OPTIONS.items():
        if isinstance(out.get(key), str) and out[key]:
            out[key] = {"type": server_type, "name": out[key]}
    return out


def environment_server_name(agent: str, impl: str) -> str:
    """0.7.0's name for an agent's relay: `math_simple_agent` -> `math_environment_server`."""
    stem = agent.removesuffix(f"_{impl}").removesuffix(impl).rstrip("_")
    if stem == agent:
        stem = agent.removesuffix("_agent").rstrip("_")
    return f"{stem or impl}{ENVIRONMENT_SUFFIX}"


def environment_servers(agents: list[tuple[str, str, dict[str, Any]]], taken: set[str]) -> dict[str, Any]:
    """Config entries of one `legacy_agent` environment server per agent `(name, impl, address)`.

    A name taken by another instance falls back to `<agent>_environment_server`.
    """
    out: dict[str, Any] = {}
    for name, impl, address in agents:
        entry = environment_server_name(name, impl)
        if entry in taken or entry in out:
            entry = f"{name}{ENVIRONMENT_SUFFIX}"
        if entry in taken or entry in out:
            continue
        out[entry] = {ENVIRONMENT_TYPE: {"legacy_agent": {
            **address, "entrypoint": "app.py", "agent_server": {"type": AGENT_TYPE, "name": name}}}}
    return out


def instance_fields(name: str) -> dict[str, Any]:
    """`/server_instances` fields that NeMo-Gym's status command reads (its process is the instance)."""
    return {"process_name": name, "config_path": name}
