"""An MCP server from the package index (`mcp-server-time`, in a virtualenv of its own, spoken to over
stdio by gymserve's `mcp` 2.3.0 client) as a gymserve tool environment (`kind: gymserve:mcp_environment`): its
tools are routes with the server's schemas, each session runs its own server process, the named
verifier scores `/verify`, and a verifier that raises or a server that cannot start is a masked
failure, never a 0."""
from __future__ import annotations

import json

import httpx
import pytest

from gymserve.testing import ServerProcess
from services.core.bindings.episode import response_object
from tests.integration.protocol_clients import client_venv

TIME_SERVER = ("mcp-server-time", "2026.10.19")
KIND = "gymserve:mcp_environment"  # a module:attribute kind (the module gymserve.mcp_environment)
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "It is 12:00 in UTC. What time is it in "
                                                                          "Asia/Tokyo? Use the tools."}]},
       "expected_answer": "21:00"}
CALL = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}


@pytest.fixture(scope="module")
def command():
    python = client_venv(*TIME_SERVER) / "bin" / "python"
    return json.dumps([str(python), "-m", "mcp_server_time", "--local-timezone", "UTC"])


@pytest.fixture(scope="module")
def server(command):
    with ServerProcess(KIND, f"server_command={command}",
                       "verifier=tests.integration.mcp_verifiers:converted_time", name="time_env") as proc:
        yield proc


def _rollout(url: str, answer: str, call: bool = True) -> dict:
    with httpx.Client(base_url=url, timeout=120) as http:
        sid = http.post("/seed_session", json=ROW).json()["session_id"]
        items = []
        if call:
            reply = http.post("/convert_time", json=CALL, headers={"X-Session-Id": sid})
            assert reply.status_code == 200, reply.text
            assert "21:00" in reply.json()["content"] and reply.json()["is_error"] is False
            items = [{"type": "function_call", "call_id": "c0", "name": "convert_time", "arguments": json.dumps(CALL),
                      "status": "completed"}, {"type": "function_call_output", "call_id": "c0", "output": reply.text}]
        verified = http.post("/verify", json={**ROW, "response": response_object(items, answer)},
                             headers={"X-Session-Id": sid, "X-Close-Session": "1"})
        assert verified.status_code == 200, verified.text
        return verified.json()


def test_tools_are_the_servers_with_their_schemas(server):
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    assert {"/get_current_time", "/convert_time"} <= set(spec["paths"])
    body = spec["paths"]["/convert_time"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["required"]) == set(CALL)


def test_the_named_verifier_scores_rollouts(server):
    right = _rollout(server.url, "It is 21:00 in Tokyo.")
    assert right["reward"] == 1.0 and right["used_convert_time"] is True and not right["mask_sample"]
    assert _rollout(server.url, "It is 20:00 in Tokyo.")["reward"] == 0.0
    assert _rollout(server.url, "It is 21:00 in Tokyo.", call=False)["reward"] == 0.0  # guessed, no tool call


def test_a_refused_tool_call_is_the_policys_to_see(server):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        sid = http.post("/seed_session", json=ROW).json()["session_id"]
        reply = http.post("/convert_time", json={**CALL, "target_timezone": "Mars/Olympus"}, headers={"X-Session-Id": sid})
        assert reply.status_code == 200 and reply.json()["is_error"] is True
        http.post("/close_session", json={"session_id": sid})


def test_verifier_and_server_failures_are_masked(command):
    with ServerProcess(KIND, f"server_command={command}",
                       "verifier=tests.integration.mcp_verifiers:broken", name="time_broken") as broken:
        reply = _rollout(broken.url, "It is 21:00 in Tokyo.")
        assert reply["mask_sample"] is True and reply["failure_kind"] == "crash" and "verifier" in reply["failure_reason"]
        gone = json.dumps([*json.loads(command)[:2], "no_such_module_xyz"])
        # the tools are listed when the app is built: a server that cannot start fails the start itself
        with pytest.raises(RuntimeError, match="exited"):
            ServerProcess(KIND, f"server_command={gone}",
                          "verifier=tests.integration.mcp_verifiers:converted_time", name="time_gone",
                          ready_timeout_s=60).start()
