"""The OpenEnv and MCP bindings in-process (Starlette's TestClient over a real resource app): the failure
paths a client can hit, each a clear error frame or status rather than a crash or a hang, and kinds from
`module:attribute` (the loader). The protocols themselves are tested with OpenEnv's and MCP's own clients
in tests/integration/test_protocol_bindings.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from services.core.app import server_type_name
from services.core.config import ConfigError
from services.core.loader import is_package_kind, load_server, package_family
from services.resources.exact_match import app as exact_match
from services.resources.workplace import app as workplace

KEY = "unit-key"
ROW = {"responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]},
       "expected_answer": "Paris"}
SERVER = SimpleNamespace(Config=exact_match.Config, build=exact_match.build)  # a kind as module:attribute


@pytest.fixture
def client(monkeypatch):
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    config = exact_match.Config(name="em", kind="resources/exact_match", head_url=None, max_sessions=1,
                                max_json_depth=8)
    with TestClient(exact_match.build(config)) as test_client:
        yield test_client


def _frames(client: TestClient, *messages: object) -> list[dict]:
    out = []
    with client.websocket_connect("/openenv/ws", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        for message in messages:
            ws.send_text(message if isinstance(message, str) else json.dumps(message))
            out.append(json.loads(ws.receive_text()))
    return out


def test_websocket_needs_the_key(client):
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("/openenv/ws"):
            pass
    assert refused.value.code == 1008
    assert client.get("/openenv/health").json() == {"status": "healthy"}  # the binding's liveness probe is open
    assert client.get("/openenv/schema").status_code == 401


def test_bad_frames_are_error_frames_and_the_socket_stays_usable(client):
    frames = _frames(client, "{not json", {"type": "dance"}, {"type": "step", "data": {"text": "Paris"}},
                     {"type": "reset", "data": {}}, {"type": "reset", "data": {"row": ROW}},
                     {"type": "step", "data": {"text": "Paris", "tool": "x"}}, {"type": "step", "data": "x"},
                     "[" * 20 + "]" * 20, {"type": "step", "data": {"text": "Paris"}},
                     {"type": "step", "data": {"text": "again"}}, {"type": "state"})
    codes = [f["data"].get("code") if f["type"] == "error" else f["type"] for f in frames]
    assert codes == ["INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "VALIDATION_ERROR", "observation",
                     "VALIDATION_ERROR", "VALIDATION_ERROR", "VALIDATION_ERROR", "observation", "VALIDATION_ERROR",
                     "state"]
    assert "row" in frames[3]["data"]["message"] and "max_json_depth" in frames[7]["data"]["message"]
    assert frames[2]["data"]["status"] == 409  # no episode yet: a conflict, not a reward
    done = frames[8]["data"]
    assert done["done"] is True and done["reward"] == 1.0 and done["metadata"]["mask_sample"] is False
    assert frames[10]["data"]["done"] is True


def test_session_limit_is_capacity_reached(client):
    with client.websocket_connect("/openenv/ws", headers={"Authorization": f"Bearer {KEY}"}) as first:
        first.send_text(json.dumps({"type": "reset", "data": {"row": ROW}}))
        assert json.loads(first.receive_text())["type"] == "observation"  # holds the one session allowed
        second = _frames(client, {"type": "reset", "data": {"row": ROW}})[0]
        assert second["data"]["code"] == "CAPACITY_REACHED" and second["data"]["status"] == 429
    assert _frames(client, {"type": "reset", "data": {"row": ROW}})[0]["type"] == "observation"  # freed on close


def test_http_step_is_stateless_and_needs_the_row(client):
    auth = {"Authorization": f"Bearer {KEY}"}
    missing = client.post("/openenv/step", json={"action": {"text": "Paris"}}, headers=auth)
    assert missing.status_code == 400 and "row" in missing.json()["detail"]
    scored = client.post("/openenv/step", json={"action": {"text": "Paris"}, "row": ROW}, headers=auth).json()
    assert scored["done"] is True and scored["reward"] == 1.0
    assert client.post("/openenv/mcp", json={}, headers=auth).json()["error"]["code"] == -32600


def test_mcp_session_lifecycle(monkeypatch):
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    config = workplace.Config(name="wp", kind="resources/workplace", head_url=None)
    with TestClient(workplace.build(config)) as http:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2099-01-01"}}
        reply = http.post("/mcp", json=init, headers=auth)
        sid = reply.headers["mcp-session-id"]
        assert reply.json()["result"]["protocolVersion"] == "2025-11-25"  # an unknown version: our newest
        assert http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                         headers=auth).status_code == 202
        unknown = http.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "server/discover"}, headers=auth)
        assert unknown.json()["error"]["code"] == -32601  # what makes a newer client fall back to initialize
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "no_such_tool"}}
        assert http.post("/mcp", json=call, headers={**auth, "Mcp-Session-Id": sid}).json()["error"]["code"] == -32602
        assert http.get("/mcp", headers=auth).status_code == 405
        assert http.delete("/mcp", headers={**auth, "Mcp-Session-Id": sid}).status_code == 200
        assert http.post("/mcp", json=call, headers={**auth, "Mcp-Session-Id": sid}).status_code == 404


def test_module_attribute_kinds():
    kind = f"{__name__}:SERVER"
    assert is_package_kind(kind) and not is_package_kind("resources/math") and not is_package_kind("head")
    assert load_server(kind) is SERVER and package_family(kind) == "resources"
    assert server_type_name(kind) == "resources_servers"
    with pytest.raises(ConfigError, match="no attribute"):
        load_server(f"{__name__}:MISSING")
    with pytest.raises(ConfigError, match="no module"):
        load_server("no_such_module_anywhere:thing")
    with pytest.raises(ConfigError, match="gymserve.environments"):
        load_server("no_such_entry_point")
