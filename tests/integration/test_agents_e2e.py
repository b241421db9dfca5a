"""End-to-end `/run` THROUGH THE HEAD with `gymserve up -c <test stack>`: real head, real agents,
real resource servers, names resolved by the head's directory.

- `test_names_resolve_through_the_head`: a stack with the scripted `models/stub` upstream (fast,
  deterministic; it is not a model) checks routing by instance name only.
- The code tool-mode test runs `models/hf` with the tiny model taught to call `execute_python`
  on the row's task: the rollout must really run the tool in the code environment's sandbox and
  get the program's stdout back.
- The slow tests run the embedded SmolLM2-135M policy (`models/hf`, no options) on math and
  workplace rows. A 135M model does not solve these tasks, so they assert structure (a numeric
  reward, unmasked, token ids on the trajectory, one tool output per tool call), not success.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from services.models.hf.tiny import CODE_CALL, CODE_RESULT, CODE_STDOUT, CODE_SYSTEM, EXECUTE_PYTHON, tiny_code_model
from tests.integration.up_helpers import Up

ROOT = Path(__file__).resolve().parents[2]
KEY = "agents-e2e-key-3b9d"
AUTH = {"Authorization": f"Bearer {KEY}"}


def rows(env: str, n: int) -> list[dict]:
    lines = (ROOT / "datasets" / env / "example.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[:n]]


def start(tmp_path: Path, stack: str, servers: int, timeout_s: float) -> Up:
    path = tmp_path / "stack.yaml"
    path.write_text(stack)
    up = Up("-c", str(path), env={"GYMSERVE_API_KEY": KEY})
    try:
        up.wait_for(rf"all {servers} servers ready", timeout_s=timeout_s)
        up.head = up.wait_for(r"head on (http://\S+)").group(1)
    except BaseException:
        up.kill()
        raise
    return up


def run_via_head(head: str, row: dict, timeout_s: float = 600.0) -> dict:
    agent = row["agent_ref"]["name"]
    response = httpx.post(f"{head}/servers/{agent}/run", json=row, headers=AUTH, timeout=timeout_s)
    assert response.status_code == 200, response.text[:2000]
    return response.json()


STUB_STACK = """
head: {host: 127.0.0.1, port: 0}
servers:
  stub_model: {kind: models/stub, text: Paris}
  exact_match: {kind: resources/exact_match}
  exact_match_simple_agent: {kind: agents/simple_agent, resources_server: exact_match, model_server: stub_model}
  lost_agent: {kind: agents/simple_agent, resources_server: no_such_env, model_server: stub_model}
"""


def test_names_resolve_through_the_head(tmp_path):
    up = start(tmp_path, STUB_STACK, 5, timeout_s=180)
    try:
        row = rows("exact_match", 1)[0]
        reply = run_via_head(up.head, row)
        assert reply["reward"] == 1.0 and reply["mask_sample"] is False and reply["num_turns"] == 1
        lost = run_via_head(up.head, {**row, "agent_ref": {"type": "responses_api_agents", "name": "lost_agent"}})
        assert lost["mask_sample"] is True and lost["failure_kind"] == "upstream"
        assert "no_such_env" in lost["failure_reason"]
    finally:
        up.kill()


EMBEDDED_STACK = """
head: {host: 127.0.0.1, port: 0}
servers:
  policy_model: {kind: models/hf, max_batch_size: 4}
  math: {kind: resources/math, workers: 1}
  math_simple_agent: {kind: agents/simple_agent, resources_server: math, model_server: policy_model,
                      max_output_tokens: 48, max_steps: 2}
  math_multi_turn_agent: {kind: agents/multi_turn_agent, resources_server: math, model_server: policy_model,
                          max_output_tokens: 32, max_user_turns: 1}
  workplace: {kind: resources/workplace}
  workplace_simple_agent: {kind: agents/simple_agent, resources_server: workplace, model_server: policy_model,
                           max_output_tokens: 64, max_steps: 2}
"""

@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    up = start(tmp_path_factory.mktemp("e2e"), EMBEDDED_STACK, 7, timeout_s=600)
    try:
        yield up
    finally:
        up.kill()


def assert_rollout_structure(reply: dict) -> list[dict]:
    assert reply["mask_sample"] is False, reply.get("failure_reason")
    assert isinstance(reply["reward"], (int, float))
    assert reply["num_turns"] >= 1 and reply["session_id"]
    output = reply["response"]["output"]
    assert output, "empty trajectory"
    with_tokens = [i for i in output if i.get("generation_token_ids")]
    assert len(with_tokens) == reply["num_turns"], "every model call carries its token ids"
    for item in with_tokens:
        assert item["prompt_token_ids"] and len(item["generation_log_probs"]) == len(item["generation_token_ids"])
    calls = [i for i in output if i["type"] == "function_call"]
    outputs = [i for i in output if i["type"] == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]
    return output


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_math_row_end_to_end(embedded):
    row = rows("math", 1)[0]
    reply = run_via_head(embedded.head, row)
    assert_rollout_structure(reply)
    assert reply["expected_answer"] == row["expected_answer"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_multi_turn_keeps_token_continuity(embedded):
    """Two model calls in one session (a scripted follow-up user turn): the model server sees the agent's
    session id, so call 2's prompt ids begin with call 1's prompt + generated ids."""
    row = {**rows("math", 1)[0], "agent_ref": {"type": "responses_api_agents", "name": "math_multi_turn_agent"},
           "user_turns": ["Check your work and give the final answer again in \\boxed{}."]}
    reply = run_via_head(embedded.head, row)
    output = assert_rollout_structure(reply)
    assert reply["num_turns"] == 2 and reply["num_user_turns"] == 1
    first, second = [i for i in output if i.get("generation_token_ids")]
    assert [i["role"] for i in output if i["type"] == "message"] == ["assistant", "user", "assistant"]
    prefix = first["prompt_token_ids"] + first["generation_token_ids"]
    assert second["prompt_token_ids"][:len(prefix)] == prefix
    assert not second.get("token_continuity_broken")


CODE_STACK = """
head: {{host: 127.0.0.1, port: 0}}
servers:
  policy_model: {{kind: models/hf, model: {model}, max_batch_size: 2, max_model_len: 1024}}
  code: {{kind: resources/code}}
  code_simple_agent: {{kind: agents/simple_agent, resources_server: code, model_server: policy_model,
                      max_output_tokens: 64, max_steps: 3}}
"""


@pytest.mark.timeout(900)
def test_code_tool_mode_end_to_end(tmp_path):
    """The policy calls `execute_python`, the code environment runs it in its sandbox and the
    program's stdout goes back to the model; then the row is verified (greedy decoding)."""
    row = rows("code", 1)[0]
    task = row["responses_create_params"]["input"]
    model = tiny_code_model(task)
    params = {**row["responses_create_params"], "tools": [EXECUTE_PYTHON], "temperature": 0,
              "input": [{"role": "system", "content": CODE_SYSTEM}, *task]}
    up = start(tmp_path, CODE_STACK.format(model=json.dumps(str(model))), 4, timeout_s=600)
    try:
        reply = run_via_head(up.head, {**row, "responses_create_params": params})
    finally:
        up.kill()
    output = assert_rollout_structure(reply)
    calls = [i for i in output if i["type"] == "function_call"]
    assert calls and calls[0]["name"] == "execute_python"
    assert json.loads(calls[0]["arguments"]) == CODE_CALL["arguments"]
    text = next(i for i in output if i["type"] == "function_call_output")["output"]
    result = json.loads(text)
    assert result["exit_code"] == 0 and result["stdout"] == CODE_STDOUT  # the sandbox ran the program
    if text == CODE_RESULT:  # the taught tool reply (a bubblewrap sandbox): the taught answer follows
        assert reply["reward"] == 1.0 and reply["num_turns"] == 2


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_workplace_row_end_to_end(embedded):
    # A real example row; only the tools this task needs are offered, which keeps the CPU prompt short.
    row = next(r for r in rows("workplace", 30) if r["ground_truth"][0]["name"] == "delete_event")
    params = dict(row["responses_create_params"])
    params["tools"] = [t for t in params["tools"] if t["name"] in ("search_events", "delete_event")]
    reply = run_via_head(embedded.head, {**row, "responses_create_params": params})
    output = assert_rollout_structure(reply)
    assert reply["state_source"] == "session" and reply["ground_truth"] == row["ground_truth"]
    print("workplace trajectory:", [i["type"] for i in output], "reward", reply["reward"])


def test_moved_server_is_found_again_by_name():
    """A name that points at a dead address, then at the live server: the agent re-resolves after the
    transport failure instead of failing every later rollout (real head, registrations by hand)."""
    from gymserve.testing import ServerProcess
    from services.core.ports import free_port

    env = {"GYMSERVE_HEAD_URL": ""}
    with ServerProcess("head", env=env) as head, ServerProcess("models/stub", "text=Paris", env=env) as stub, \
            ServerProcess("resources/exact_match", env=env) as em:
        leases: dict[str, str] = {}

        def register(name: str, port: int) -> None:  # the same registrant each time: it holds the lease
            r = head.post("/register", {"name": name, "host": "127.0.0.1", "port": port, "ttl_s": 600,
                                        "kind": "resources/exact_match", "lease": leases.get(name)})
            assert r.status_code == 200, r.text
            leases[name] = r.json()["lease"]

        register("stub_model", stub.port)
        register("em", free_port())  # nothing listens there
        with ServerProcess("agents/simple_agent", f"head_url={head.url}", "resources_server=em",
                           "model_server=stub_model", "step_deadline_s=10", env=env) as agent:
            row = rows("exact_match", 1)[0]
            dead = agent.post("/run", row).json()
            assert dead["mask_sample"] is True and dead["failure_kind"] == "upstream"
            register("em", em.port)  # the server "moved"
            alive = agent.post("/run", row).json()
            assert alive["mask_sample"] is False and alive["reward"] == 1.0
