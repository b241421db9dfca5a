"""The agent loop on coding environments with REAL servers: a scripted policy (`models/stub`, a
scripted zero-latency server standing in for a model, NOT a model) that applies a SWE task's gold
patch scores 1 and one that submits nothing 0; a tool reply that ends the episode
(`terminate_on_evaluation` of resources/code) stops the loop; step and tool-call budgets exhausted
with `mask_on_budget` are masked (`timeout`), never a 0."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess
from tests.integration.sandbox_helpers import sandbox_dir

ROOT = Path(__file__).resolve().parents[2]
SWE = [json.loads(line) for line in (ROOT / "datasets/swe/example.jsonl").read_text().splitlines()]


def scripted(row: dict[str, Any], script: list[dict[str, Any]]) -> dict[str, Any]:
    return {**row, "responses_create_params": {**row["responses_create_params"],
                                               "metadata": {"stub_script": json.dumps(script)}}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments)}


@pytest.fixture(scope="module")
def stub() -> Iterator[ServerProcess]:
    with ServerProcess("models/stub") as proc:
        yield proc


@pytest.fixture(scope="module")
def swe(stub: ServerProcess) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    with sandbox_dir() as where, \
            ServerProcess("resources/swe", "warm_pool=1", env={"GYMSERVE_SANDBOX_DIR": str(where)}) as env, \
            ServerProcess("agents/simple_agent", f"resources_url={env.url}", f"model_url={stub.url}", "max_steps=6",
                          "max_tool_calls=3", "mask_on_budget=true", name="swe_agent") as agent:
        yield env, agent
        agent.stop()
        env.stop()
        assert not list(where.iterdir()), "workspace folders left behind"


def test_gold_patch_policy_scores_1_and_empty_policy_0(swe: tuple[ServerProcess, ServerProcess]) -> None:
    _, agent = swe
    row = SWE[1]
    gold = scripted(row, [{"tool_calls": [call("bash", command="python3 -m pytest -q -p no:cacheprovider")]},
                          {"tool_calls": [call("apply_patch", patch=row["patch"])]},
                          {"text": "Fixed: touching intervals merge now."}])
    reply = agent.post("/run", gold, timeout=180).json()
    assert reply["mask_sample"] is False and reply["reward"] == 1.0, reply
    assert reply["patch_source"] == "session" and reply["stop_reason"] == "completed"
    empty = agent.post("/run", scripted(row, [{"text": "I give up."}]), timeout=180).json()
    assert empty["mask_sample"] is False and empty["reward"] == 0.0 and empty["resolved"] is False


def test_exhausted_budgets_are_masked_not_zero(swe: tuple[ServerProcess, ServerProcess]) -> None:
    _, agent = swe
    looping = scripted(SWE[0], [{"tool_calls": [call("bash", command="ls")]}] * 8)
    reply = agent.post("/run", looping, timeout=180).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == "timeout", reply
    assert "tool-call budget of 3" in reply["failure_reason"]
    many_steps = scripted(SWE[0], [{"tool_calls": [call("bash", command="true"), call("bash", command="true"),
                                                   call("bash", command="true")]}] * 8)
    reply = agent.post("/run", many_steps, timeout=180).json()
    assert reply["mask_sample"] is True and "budget" in reply["failure_reason"]


def test_terminal_tool_reply_ends_the_episode(stub: ServerProcess) -> None:
    row = json.loads((ROOT / "datasets/code/example.jsonl").read_text().splitlines()[0])
    params = {**row["responses_create_params"], "tools": [
        {"type": "function", "name": "execute_python", "parameters": {"type": "object", "properties": {
            "code": {"type": "string"}}}}]}
    row = {**row, "responses_create_params": params, "terminate_on_evaluation": True}
    script = [{"tool_calls": [call("execute_python", code="x = 1")]},
              {"tool_calls": [call("execute_python", code="x + 1")]},
              {"tool_calls": [call("execute_python", code="x + 2")]},
              {"text": "never reached"}]
    with ServerProcess("resources/code") as env, \
            ServerProcess("agents/simple_agent", f"resources_url={env.url}", f"model_url={stub.url}",
                          name="code_agent") as agent:
        reply = agent.post("/run", scripted(row, script), timeout=120).json()
    assert reply["stop_reason"] == "terminated" and reply["num_turns"] == 2, reply
    assert reply["response"]["status"] == "completed"
    assert sum(i["type"] == "function_call_output" for i in reply["response"]["output"]) == 2
