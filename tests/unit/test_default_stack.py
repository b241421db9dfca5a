"""The embedded default stack (`gymserve up` with no -c, `make demo`) loads and every server's options check."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gymserve.commands.serve import load_config
from gymserve.commands.up import DEFAULT_STACK
from gymserve.launcher import check_kind
from services.core.config import ConfigError, Stack, load_stack
from trainer.client import agent_name
from trainer.jsonl import read_rows

REPO = Path(__file__).resolve().parents[2]


def check_stack(stack: Stack) -> None:
    """What `gymserve up` checks before it starts anything, plus each kind's own option model."""
    for name, spec in stack.servers.items():
        check_kind(name, spec.kind, "default stack")
        load_config(spec.kind, [], name=name, spec=spec.options)
        for ref in ("resources_server", "model_server"):
            if ref in spec.options:
                assert spec.options[ref] in stack.servers, f"servers.{name}.{ref}: no such server"


def test_default_stack_loads_and_every_option_checks() -> None:
    stack = load_stack([DEFAULT_STACK])
    check_stack(stack)
    assert stack.servers["reward_model"].options == {"model_name": "tiny", "device": "cpu"}


def outside_the_default_stack() -> set[str]:
    """Environments the environments page says the default stack leaves out (they need a judge or a sandbox
    service): `not in the default stack`, or an agent in another stack file."""
    index = (REPO / "docs" / "environments" / "index.md").read_text()
    rows = re.findall(r"^\| \[(\w+)\]\(\w+\.md\) \|.*\|(.*)\|\s*$", index, re.M)
    return {env for env, where in rows if "not in the default stack" in where or "deploy/stacks/" in where}


def test_every_example_dataset_routes_to_an_agent_of_the_default_stack_or_says_why_not() -> None:
    """`make demo` skips an environment whose agent is missing: only the ones the docs say are left out."""
    stack = load_stack([DEFAULT_STACK])
    datasets = sorted((REPO / "datasets").glob("*/example.jsonl"))
    outside = outside_the_default_stack()
    assert "reward_model" in {path.parent.name for path in datasets} and "reward_model" not in outside
    for path in datasets:
        env = path.parent.name
        agents = {agent_name(row) for row in read_rows(path)}
        missing = agents - set(stack.servers)
        assert agents and (not missing) == (env not in outside), (
            f"{env}: agents missing from the default stack {missing}; the environments page says "
            f"{'it is left out' if env in outside else 'it is served'}")


@pytest.mark.parametrize("override", ["servers.math.timeout_polcy=zero", "servers.reward_model.device=gpu0",
                                      "servers.math_simple_agent.max_step=3"])
def test_a_typo_in_the_default_stack_fails_the_check(override: str) -> None:
    key = override.split("=")[0].rsplit(".", 1)[1]
    with pytest.raises(ConfigError, match=key):
        check_stack(load_stack([DEFAULT_STACK], [override]))


def test_a_missing_kind_fails_the_check() -> None:
    with pytest.raises(ConfigError, match="resources/mathh"):
        check_stack(load_stack([DEFAULT_STACK], ["servers.math.kind=resources/mathh"]))


def test_the_documented_stub_policy_override_replaces_the_policy(tmp_path) -> None:
    """docs/getting-started.md's `stub_policy.yaml` on top of the default stack passes every check."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    block = text.split("# stub_policy.yaml", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    override = tmp_path / "stub_policy.yaml"
    override.write_text(block)
    stack = load_stack([DEFAULT_STACK, override])
    check_stack(stack)
    assert stack.servers["policy_model"].kind == "models/stub"
    assert set(stack.servers["policy_model"].options) == {"text", "script"}
