"""A rollout resumed from its checkpoint on another agent process: real workplace, stub model and
simple_agent servers (`gymserve serve` subprocesses on 127.0.0.1) sharing one journal folder.

The checkpoint is the one a replica that died right after sending its second tool call leaves: the
session seeded, two model outputs, one tool output; the second call reached the resource server
(it is in the session's journal) but its answer never came back. The resumed rollout must not call
the model for the outputs it has, must not send the email twice, and must score 1.0. The Ray test
(`test_up_ray_sessions.py`) SIGKILLs a real agent replica mid-collect.
"""
from __future__ import annotations

import json

import pytest

from gymserve.testing import ServerProcess
from services.agents.checkpoint import ROLLOUT_HEADER, Checkpoints
from services.core.affinity import CALL_SEQ_HEADER
from services.resources.workplace.dataset import build_rows

BASE = next(r for r in build_rows() if [c["name"] for c in r["ground_truth"]] == ["send_email"])
TRUTH = json.loads(BASE["ground_truth"][0]["arguments"])
LOOKUP = {"name": "Bob"}
SCRIPT = [{"tool_calls": [{"name": "find_email_address", "arguments": LOOKUP}]},
          {"tool_calls": [{"name": "send_email", "arguments": TRUTH}]},
          {"text": "Sent."}]
ROW = {**BASE, "responses_create_params": {**BASE["responses_create_params"], "metadata": {
    "stub_script": json.dumps(SCRIPT), "stub_turn": "input"}}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    with ServerProcess("resources/workplace", f"session_store={store}") as wp, \
            ServerProcess("models/stub", "text=Sent.") as stub:
        with ServerProcess("agents/simple_agent", f"resources_url={wp.url}", f"model_url={stub.url}",
                           f"rollout_store={store}") as agent:
            yield store, wp, stub, agent


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments)}


def test_a_rollout_goes_on_from_its_last_completed_step(servers):
    store, wp, stub, agent = servers
    # what the replica that died had done: seeded, two model calls, one tool call answered and a
    # second sent (the resource server applied and journaled it) but not answered
    sid = wp.post("/seed_session", ROW).json()["session_id"]
    found = wp.post("/find_email_address", LOOKUP, headers={"X-Session-Id": sid, CALL_SEQ_HEADER: "1"})
    sent = wp.post("/send_email", TRUTH, headers={"X-Session-Id": sid, CALL_SEQ_HEADER: "2"})
    assert found.status_code == sent.status_code == 200
    first, second = _call("c1", "find_email_address", LOOKUP), _call("c2", "send_email", TRUTH)
    first_out = {"type": "function_call_output", "call_id": "c1", "output": found.text}
    marks = [{"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}]
    first, second = {**first, **marks[0]}, {**second, **marks[0]}
    state = {"usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}, "context_tokens": 12}
    checkpoints = Checkpoints(store)
    rollout_id = "resume-test-1"
    checkpoints.append(rollout_id, {"step": "seed", "session_id": sid, "session_url": wp.url, "items": [],
                                    "state": {"num_turns": 0, "tool_calls": 0}})
    checkpoints.append(rollout_id, {"step": "model", "session_id": sid, "items": [first],
                                    "state": {**state, "num_turns": 1, "tool_calls": 0}})
    checkpoints.append(rollout_id, {"step": "tool", "session_id": sid, "items": [first_out],
                                    "state": {**state, "num_turns": 1, "tool_calls": 1}})
    checkpoints.append(rollout_id, {"step": "model", "session_id": sid, "items": [second],
                                    "state": {**state, "num_turns": 2, "tool_calls": 1}})
    calls_before = stub.get("/stats").json()["calls"]

    reply = agent.post("/run", ROW, headers={ROLLOUT_HEADER: rollout_id}, timeout=120)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["reward"] == 1.0 and not body.get("mask_sample"), body
    assert body["session_id"] == sid and body["num_turns"] == 3
    assert stub.get("/stats").json()["calls"] == calls_before + 1, "only the missing model call is made"
    output = body["response"]["output"]
    assert output[0]["generation_token_ids"] == [3], "already-sampled outputs keep their token data"
    resent = [o for o in output if o.get("type") == "function_call_output" and o["call_id"] == "c2"]
    assert len(resent) == 1 and json.loads(resent[0]["output"]) == sent.json(), "the journal answered the repeat"
    assert checkpoints.load(rollout_id) is None and not (store / "rollouts" / f"{rollout_id}.jsonl").exists()
    assert not list(store.glob("*.jsonl")), "the finished session's journal is gone"


def test_a_rollout_without_checkpoint_runs_whole(servers):
    _store, _wp, _stub, agent = servers
    reply = agent.post("/run", ROW, headers={ROLLOUT_HEADER: "fresh-1"}, timeout=120).json()
    assert reply["reward"] == 1.0 and reply["num_turns"] == 3
    plain = agent.post("/run", ROW, timeout=120).json()  # no rollout id: no checkpoint
    assert plain["reward"] == 1.0
    assert not list((_store / "rollouts").iterdir())
