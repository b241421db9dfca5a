"""Agent logic with REAL servers: simple_agent / multi_turn_agent against real resource servers
(resources/workplace, resources/exact_match) over HTTP.

The model upstream here is `models/stub`, a scripted zero-latency server (NOT a model): the
agent logic under test (tool-call loops, invalid JSON arguments, unknown tools, tool errors,
max_steps, the token budget, model failures -> mask_sample, deadlines -> timeout) must be
exercised deterministically, which a sampled model cannot do. Each row carries its script in
`responses_create_params.metadata.stub_script`. End-to-end runs with the real embedded model
through the head are in tests/integration/test_agents_e2e.py.
"""
from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from gymserve.testing import ServerProcess
from services.core.ports import free_port
from services.resources.workplace.dataset import build_rows

WORKPLACE_ROWS = build_rows()


def scripted(row: dict, script: list[dict]) -> dict:
    params = {**row["responses_create_params"], "metadata": {"stub_script": json.dumps(script)}}
    return {**row, "responses_create_params": params}


def row_for(prefix: str) -> dict:
    return next(r for r in WORKPLACE_ROWS if r["responses_create_params"]["input"][1]["content"].startswith(prefix))


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": json.dumps(arguments)}


def items_of(reply: dict, kind: str) -> list[dict]:
    return [i for i in reply["response"]["output"] if i.get("type") == kind]


@pytest.fixture(scope="module")
def stub():
    with ServerProcess("models/stub") as proc:
        yield proc


@pytest.fixture(scope="module")
def workplace():
    with ServerProcess("resources/workplace") as proc:
        yield proc


@pytest.fixture(scope="module")
def exact():
    with ServerProcess("resources/exact_match") as proc:
        yield proc


@pytest.fixture(scope="module")
def agent(stub, workplace):
    with ServerProcess("agents/simple_agent", f"resources_url={workplace.url}", f"model_url={stub.url}",
                       "max_steps=4", "max_total_tokens=5000", "step_deadline_s=30", name="workplace_agent") as proc:
        yield proc


@pytest.fixture(scope="module")
def fast_agent(stub, exact):
    """Short deadlines, for the deadline tests."""
    with ServerProcess("agents/simple_agent", f"resources_url={exact.url}", f"model_url={stub.url}",
                       "step_deadline_s=1.5", "rollout_deadline_s=4", name="fast_agent") as proc:
        yield proc


def test_tool_loop_reaches_the_right_state_and_scores_one(agent, workplace):
    row = scripted(row_for("Reassign all of Carla"), [
        {"tool_calls": [call("search_tasks", assigned_to_email="carla.rossi@lumen.io", status="Backlog")]},
        {"tool_calls": [call("update_task", task_id="T006", assigned_to_email="emma.novak@lumen.io"),
                        call("update_task", task_id="T009", assigned_to_email="emma.novak@lumen.io")]},
        {"tool_calls": [call("update_task", task_id="T010", assigned_to_email="emma.novak@lumen.io")]},
        {"text": "All three tasks now belong to Emma."},
    ])
    reply = agent.post("/run", row).json()
    assert reply["mask_sample"] is False and reply["reward"] == 1.0, reply
    assert reply["num_turns"] == 4 and reply["stop_reason"] == "completed"
    kinds = [i["type"] for i in reply["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "function_call", "function_call",
                     "function_call_output", "function_call_output", "function_call", "function_call_output",
                     "message"]
    calls, outputs = items_of(reply, "function_call"), items_of(reply, "function_call_output")
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls]
    found = json.loads(outputs[0]["output"])
    assert sorted(t["task_id"] for t in found) == ["T006", "T009", "T010"]
    assert reply["ground_truth"] == row["ground_truth"]  # row fields echoed
    # the session is closed after the rollout (in the background)
    for _ in range(50):
        gone = workplace.post("/search_tasks", {}, headers={"X-Session-Id": reply["session_id"]})
        if gone.status_code == 409:
            break
        time.sleep(0.1)
    assert gone.status_code == 409


def test_model_mistakes_go_back_to_the_model_not_crash(agent):
    row = scripted(row_for("Cancel the vendor call"), [
        {"tool_calls": [{"name": "delete_event", "arguments": "{\"event_id\": \"EV004\""}]},   # invalid JSON
        {"tool_calls": [call("drop_database"), call("verify")]},                                  # unknown tools
        {"tool_calls": [call("delete_event", event_id="EV999"), call("delete_event", id="EV004")]},  # tool 4xx
        {"tool_calls": [call("delete_event", event_id="EV004")]},
    ])
    reply = agent.post("/run", row).json()
    outputs = [o["output"] for o in items_of(reply, "function_call_output")]
    assert "not valid JSON" in outputs[0]
    assert "unknown tool 'drop_database'" in outputs[1] and "unknown tool 'verify'" in outputs[2]
    assert "EV999" in outputs[3] and "id" in outputs[4] and outputs[4].startswith("Error")
    assert json.loads(outputs[5])["status"] == "deleted"
    # 4 model calls = max_steps, the last one still had a tool call: stopped by max_steps, still scored
    assert reply["stop_reason"] == "max_steps" and reply["num_turns"] == 4
    assert reply["mask_sample"] is False and reply["reward"] == 1.0
    assert reply["response"]["incomplete_details"] == {"reason": "max_steps"}


def test_token_budget_stops_the_loop(agent):
    row = scripted(row_for("Cancel the vendor call"), [
        {"tool_calls": [call("list_projects")], "usage": {"input_tokens": 1500, "output_tokens": 500}},
        {"tool_calls": [call("list_projects")], "usage": {"input_tokens": 4000, "output_tokens": 1500}},
        {"tool_calls": [call("delete_event", event_id="EV004")]},
    ])
    reply = agent.post("/run", row).json()
    assert reply["stop_reason"] == "max_total_tokens" and reply["num_turns"] == 2
    assert reply["mask_sample"] is False and reply["reward"] == 0.0  # the event was never deleted
    assert reply["response"]["usage"]["total_tokens"] == 7500


@pytest.mark.parametrize("status,kind", [(500, "upstream"), (400, "bad_request")])
def test_model_failure_masks_the_sample(agent, status, kind):
    row = scripted(row_for("Cancel the vendor call"), [
        {"tool_calls": [call("delete_event", event_id="EV004")]},
        {"status": status, "error": "scripted model failure"},
    ])
    reply = agent.post("/run", row).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == kind
    assert "scripted model failure" in reply["failure_reason"] and "model call 2" in reply["failure_reason"]
    assert len(items_of(reply, "function_call_output")) == 1  # the partial trajectory is kept


def test_unreachable_model_server_is_an_upstream_failure(workplace):
    dead = f"http://127.0.0.1:{free_port()}"
    with ServerProcess("agents/simple_agent", f"resources_url={workplace.url}", f"model_url={dead}",
                       "step_deadline_s=5", name="orphan_agent") as orphan:
        reply = orphan.post("/run", row_for("Cancel the vendor call")).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] in ("upstream", "timeout")
    assert "model" in reply["failure_reason"]


@pytest.mark.timeout(60)
def test_step_deadline_times_out(fast_agent):
    row = scripted({"responses_create_params": {"input": "q"}, "expected_answer": "42"}, [{"sleep": 30}])
    reply = fast_agent.post("/run", row).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == "timeout"
    assert "model call 1" in reply["failure_reason"] and "the 1.5s deadline" in reply["failure_reason"]


@pytest.mark.timeout(60)
def test_rollout_deadline_times_out(fast_agent):
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    script = [{"sleep": 1.0, "tool_calls": [call("lookup")]} for _ in range(10)]
    row = scripted({"responses_create_params": {"input": "q", "tools": tools}, "expected_answer": "42"}, script)
    reply = fast_agent.post("/run", row).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == "timeout"
    # the rollout's 4 s ran out: either between calls, or during a call given only what was left of it
    reason = reply["failure_reason"]
    assert "rollout deadline of 4.0s exceeded" in reason or re.search(r"the [0-2]\.\d+s deadline", reason), reason


def test_run_rejects_bad_rows_with_a_clear_4xx(agent):
    cases = [
        ([1, 2], "JSON object"),
        ({"expected_answer": "x"}, "responses_create_params"),
        ({"responses_create_params": {"input": []}}, "input"),
        ({"responses_create_params": {"input": "q", "tools": [{"type": "function"}]}}, "tools[0]"),
        ({"responses_create_params": {"input": 5}}, "input"),
    ]
    for body, needle in cases:
        r = agent.post("/run", body)
        assert 400 <= r.status_code < 500 and needle in r.json()["detail"], (body, r.text)
    malformed = httpx.post(f"{agent.url}/run", content=b"{not json", timeout=30)
    assert malformed.status_code == 400 and "JSON" in malformed.json()["detail"]
    rejected = agent.post("/run", {**row_for("Cancel the vendor call"), "initial_state": {"invoices": []}})
    assert rejected.status_code == 400 and "invoices" in rejected.json()["detail"]


def test_forwarding_endpoints(agent):
    r = agent.post("/v1/responses", {"input": "hi"})
    assert r.status_code == 200 and r.json()["output"][0]["type"] == "message"
    replies = [{"reward": 1.0}, {"reward": 0.0}, {"reward": 0.0, "mask_sample": True, "failure_kind": "timeout"}]
    metrics = agent.post("/aggregate_metrics", replies).json()
    assert metrics["num_scored"] == 2 and metrics["failures"] == {"timeout": 1}
    assert agent.post("/v1/responses", ["x"]).status_code == 400


# ---------------------------------------------------------------------------- #
# multi_turn_agent
# ---------------------------------------------------------------------------- #
def test_multi_turn_scripted_user_turns(stub, workplace):
    row = scripted(row_for("Cancel the vendor call"), [
        {"text": "Which vendor call?"},
        {"tool_calls": [call("delete_event", event_id="EV004")]},
        {"text": "Cancelled."},
    ])
    row["user_turns"] = ["The one on March 19 with paperco.", "Thanks!"]
    with ServerProcess("agents/multi_turn_agent", f"resources_url={workplace.url}", f"model_url={stub.url}",
                       "max_user_turns=1", name="mt_agent") as mt:
        reply = mt.post("/run", row).json()
        bad = mt.post("/run", {**row, "user_turns": "not a list"})
    assert reply["reward"] == 1.0 and reply["mask_sample"] is False
    assert reply["num_turns"] == 3 and reply["num_user_turns"] == 1  # max_user_turns stops the script
    users = [i for i in reply["response"]["output"] if i.get("role") == "user"]
    assert len(users) == 1 and users[0]["content"][0]["text"] == "The one on March 19 with paperco."
    assert bad.status_code == 400 and "user_turns" in bad.json()["detail"]


def test_multi_turn_user_simulator(stub, workplace):
    """The simulator is a second stub server whose script asks once more and then ends the conversation."""
    sim_script = json.dumps([{"text": "Please cancel the vendor call on the 19th."}, {"text": "END_CONVERSATION"}])
    row = scripted(row_for("Cancel the vendor call"), [
        {"text": "What should I cancel?"},
        {"tool_calls": [call("delete_event", event_id="EV004")]},
        {"text": "Done."},
    ])
    with ServerProcess("models/stub", f"script={sim_script}", name="user_sim") as sim, \
            ServerProcess("agents/multi_turn_agent", f"resources_url={workplace.url}", f"model_url={stub.url}",
                          f"user_model_url={sim.url}", "max_user_turns=5", name="mt_sim_agent") as mt:
        reply = mt.post("/run", row).json()
    assert reply["mask_sample"] is False and reply["reward"] == 1.0
    assert reply["num_user_turns"] == 1 and reply["num_turns"] == 3
    texts = [(i.get("role"), i["content"][0]["text"]) for i in reply["response"]["output"] if i["type"] == "message"]
    assert texts == [("assistant", "What should I cancel?"), ("user", "Please cancel the vendor call on the 19th."),
                     ("assistant", "Done.")]


def test_swapped_conversation_for_the_simulator():
    from services.agents.multi_turn_agent.app import Config, MultiTurnAgent, MultiTurnRollout

    agent = MultiTurnAgent(Config(resources_url="http://x", model_url="http://y", user_model_url="http://z"))
    rollout = MultiTurnRollout(agent, {"responses_create_params": {"input": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "book a room"}]}})
    rollout.items = [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
                     {"type": "function_call_output", "call_id": "c", "output": "{}"},
                     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "which?"}]}]
    assert rollout.swapped_conversation() == [{"role": "assistant", "content": "book a room"},
                                              {"role": "user", "content": "which?"}]


def test_resource_server_dying_mid_rollout_masks_the_sample(stub):
    """The model's second turn is slow; meanwhile the resource server is killed, so its tool call
    finds nobody: an infrastructure failure (masked), not an error output for the model."""
    import threading

    with ServerProcess("resources/workplace", name="doomed_workplace") as doomed, \
            ServerProcess("agents/simple_agent", f"resources_url={doomed.url}", f"model_url={stub.url}",
                          "step_deadline_s=20", name="doomed_agent") as agent:
        row = scripted(row_for("Cancel the vendor call"), [
            {"tool_calls": [call("list_projects")]},
            {"sleep": 8, "tool_calls": [call("delete_event", event_id="EV004")]},
        ])
        killer = threading.Timer(3.0, doomed.stop)
        killer.start()
        try:
            reply = agent.post("/run", row).json()
        finally:
            killer.cancel()
    assert reply["mask_sample"] is True and reply["failure_kind"] in ("upstream", "timeout")
    assert "tool delete_event" in reply["failure_reason"]
    outputs = items_of(reply, "function_call_output")
    assert len(outputs) == 1 and "Website Redesign" in outputs[0]["output"]  # the first tool call worked


def test_agent_config_errors_name_the_option():
    from services.agents.simple_agent.app import Config

    with pytest.raises(RuntimeError) as info:
        ServerProcess("agents/simple_agent", "model_url=http://127.0.0.1:9", name="misconfigured").start()
    assert "resources_server" in str(info.value)
    nemo = Config(resources_server={"type": "resources_servers", "name": "math"},
                  model_server={"type": "responses_api_models", "name": "policy_model"})
    assert (nemo.resources_server, nemo.model_server) == ("math", "policy_model")


def test_happy_path_with_a_real_model(exact):
    """The stub replaced by `models/hf` (a tiny model taught the weather conversation): the agent sends the
    row's conversation, the model's own answer comes back with its token ids, and exact_match scores it 1."""
    from services.models.hf.tiny import WEATHER_ANSWER, WEATHER_QUESTION, WEATHER_RESULT, WEATHER_TOOLS, \
        tiny_tool_model

    tools = [{"type": "function", **WEATHER_TOOLS[0]["function"]}]
    history = [{"role": "user", "content": WEATHER_QUESTION},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": WEATHER_RESULT}]
    with ServerProcess("models/hf", f"model={tiny_tool_model()}", "max_model_len=1024") as model, \
            ServerProcess("agents/simple_agent", f"resources_url={exact.url}", f"model_url={model.url}",
                          name="real_model_agent") as real:
        right = real.post("/run", {"responses_create_params": {"input": history, "tools": tools, "temperature": 0,
                                                               "max_output_tokens": 32},
                                   "expected_answer": WEATHER_ANSWER}).json()
        wrong = real.post("/run", {"responses_create_params": {"input": history, "tools": tools, "temperature": 0,
                                                               "max_output_tokens": 32},
                                   "expected_answer": "It is raining in Paris."}).json()
    assert right["reward"] == 1.0 and right["mask_sample"] is False, right
    message = items_of(right, "message")[-1]
    assert message["content"][0]["text"] == WEATHER_ANSWER
    assert message["generation_token_ids"] and len(message["generation_log_probs"]) == len(
        message["generation_token_ids"])
    assert wrong["reward"] == 0.0 and wrong["mask_sample"] is False
