"""Conformance of the protocol bindings every resource server has: OpenEnv (`/openenv`) and MCP (`/mcp`).

An environment author sees at once whether their environment works over OpenEnv's protocol (its
discovery endpoints, a WebSocket episode that scores as `/verify` does) and over MCP (a session whose
`tools/list` matches the server's tool routes)."""
from __future__ import annotations

import json
from typing import Any

from .probe import Probe
from .report import Report, expect
from .rows import answer_text, response_with_text, verify_body


def check_openenv(report: Report, probe: Probe, row: dict[str, Any]) -> None:
    with report.check("openenv: /openenv has OpenEnv's health, metadata, schema, state and openapi.json "
                      "(simulation mode: /reset, /step, /state)"):
        health = probe.get("/openenv/health", anonymous=True)
        expect(health.status_code == 200 and health.json().get("status") == "healthy", f"GET /openenv/health: "
                                                                                         f"{health.status_code}")
        schema = probe.get("/openenv/schema").json()
        expect(all(isinstance(schema.get(k), dict) for k in ("action", "observation", "state")),
               f"GET /openenv/schema lacks action/observation/state: {sorted(schema)}")
        meta = probe.get("/openenv/metadata").json()
        expect(isinstance(meta.get("name"), str) and isinstance(meta.get("description"), str),
               f"GET /openenv/metadata: {meta}")
        paths = probe.get("/openenv/openapi.json").json().get("paths", {})
        expect({"/reset", "/step", "/state"} <= set(paths), f"/openenv/openapi.json paths: {sorted(paths)}")
        expect(probe.get("/openenv/schema", anonymous=True).status_code == 401, "/openenv/schema without the key")
    if not row:
        return
    with report.check("openenv: a WebSocket episode (reset(row), step(text)) ends with /verify's reward"):
        from websockets.sync.client import connect

        text = answer_text(row)
        ws_url = probe.url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/openenv/ws"
        with connect(ws_url, additional_headers=probe.auth(), open_timeout=30) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"row": row}}))
            reset = json.loads(ws.recv(timeout=120))
            expect(reset.get("type") == "observation" and not reset["data"]["done"], f"reset: {str(reset)[:300]}")
            ws.send(json.dumps({"type": "step", "data": {"text": text}}))
            done = json.loads(ws.recv(timeout=120))
            ws.send(json.dumps({"type": "close"}))
        expect(done.get("type") == "observation" and done["data"]["done"] is True, f"step: {str(done)[:300]}")
        verified = probe.post("/verify", verify_body(row, response_with_text(text))).json()
        want = None if verified.get("mask_sample") else verified.get("reward")
        got = done["data"]["reward"]
        expect(got == want or (got is not None and want is not None and abs(got - want) < 1e-5),
               f"OpenEnv episode reward {got}, /verify reward {want}")


def check_mcp(report: Report, probe: Probe, tool_paths: list[str], row: dict[str, Any] | None = None) -> None:
    """With an example row, MCP adopts a session seeded with it (an environment may refuse an empty seed)."""
    with report.check("mcp: POST /mcp initializes a session whose tools/list names every tool route; "
                      "DELETE closes it"):
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "gymserve-check", "version": "1"}}}
        expect(probe.post("/mcp", init, anonymous=True).status_code == 401, "POST /mcp without the key")
        adopt: dict[str, str] = {}
        if row:
            seeded = probe.post("/seed_session", {k: v for k, v in row.items() if k != "agent_ref"})
            expect(seeded.status_code == 200, f"POST /seed_session: {seeded.status_code} {seeded.text[:200]}")
            adopt = {"X-Session-Id": seeded.json()["session_id"]}
        r = probe.post("/mcp", init, headers={"Accept": "application/json, text/event-stream", **adopt})
        expect(r.status_code == 200 and "result" in r.json(), f"initialize: {r.status_code} {r.text[:200]}")
        sid = r.headers.get("mcp-session-id")
        expect(bool(sid), "initialize: no Mcp-Session-Id header")
        listed = probe.post("/mcp", {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                            headers={"Mcp-Session-Id": sid or ""}).json()
        names = {t["name"] for t in listed.get("result", {}).get("tools", [])}
        expect(names == {p.strip("/") for p in tool_paths}, f"tools/list {sorted(names)} vs routes {tool_paths}")
        closed = probe.http.delete("/mcp", headers={**probe.auth(), "Mcp-Session-Id": sid or ""})
        expect(closed.status_code == 200, f"DELETE /mcp: {closed.status_code}")
