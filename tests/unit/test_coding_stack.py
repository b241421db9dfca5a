"""deploy/stacks/coding.yaml loads, names real server kinds, and its options validate against each
server's config (the agents' budgets included); the example rows route to its agents."""
from __future__ import annotations

import json
from pathlib import Path

from gymserve.launcher import check_kind
from services.core.config import load_stack
from services.core.loader import load_server

ROOT = Path(__file__).resolve().parents[2]


def test_coding_stack_loads_and_validates() -> None:
    stack = load_stack([str(ROOT / "deploy/stacks/coding.yaml")])
    for name, spec in stack.servers.items():
        check_kind(name, spec.kind, "stack")
        config = load_server(spec.kind).Config.model_validate({"name": name, **spec.options})
        if spec.kind == "agents/simple_agent":
            assert config.mask_on_budget is True and config.max_tool_calls
    for env in ("terminal", "swe"):
        rows = [json.loads(line) for line in (ROOT / f"datasets/{env}/example.jsonl").read_text().splitlines()]
        assert {row["agent_ref"]["name"] for row in rows} == {f"{env}_simple_agent"} <= set(stack.servers)
