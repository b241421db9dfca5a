"""An environment's tools as an MCP server (Streamable HTTP, JSON replies) at `POST /mcp`.

One MCP session is one gymserve session: `initialize` opens a session (seeded with an empty row), or
adopts the session named by `X-Session-Id` (one the caller seeded with `/seed_session`, so the row is
in it); the `Mcp-Session-Id` the server returns IS that session id, so the caller verifies the
rollout with `/verify` and `X-Session-Id: <Mcp-Session-Id>`. `tools/list` lists the environment's
tools with their JSON schemas, `tools/call` runs one on the session (a refused call is a tool result
with `isError`, which the model sees, as the HTTP tool route's 4xx), `DELETE /mcp` closes the
session. The bearer key guards it like every endpoint. The server sends no requests of its own, so
`GET /mcp` (a server-to-client stream) is 405 and every reply is a single JSON body.

The JSON-RPC is written here rather than taken from an MCP server library: it is a handful of
methods, and the environment's own session store, limits and auth stay the only ones in play.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..app import session_id as gym_session_id
from ..errors import GymError
from ..resource import Environment, Session

log = logging.getLogger("gymserve.mcp")
PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"
# handshake-era revisions, oldest first; a client asking for another gets the newest
PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
SESSION_METHODS = ("tools/call",)


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def tools_list(env: Environment) -> dict[str, Any]:
    return {"tools": [{"name": t["name"], "description": t["description"] or t["name"],
                       "inputSchema": {"type": "object", **t["parameters"]}} for t in env.describe_tools()]}


async def call_tool(env: Environment, sess: Session, params: dict[str, Any]) -> dict[str, Any]:
    """`tools/call`: the tool's JSON reply as text (and as structured content when it is an object)."""
    name, arguments = str(params.get("name")), params.get("arguments") or {}
    try:
        output = await env.invoke_tool(sess, name, arguments)
    except GymError as exc:
        if exc.status_code >= 500 or exc.status_code in (409, 429):
            raise
        return {"content": [{"type": "text", "text": f"Error {exc.status_code}: {exc.message}"}], "isError": True}
    text = output if isinstance(output, str) else json.dumps(output, separators=(",", ":"), ensure_ascii=False)
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if isinstance(output, dict):
        result["structuredContent"] = output
    return result


async def dispatch(env: Environment, message: dict[str, Any], sess: Session | None) -> dict[str, Any]:
    """The reply to one JSON-RPC request (not `initialize`, which the transport handles)."""
    request_id, method = message.get("id"), message.get("method")
    params = message.get("params") or {}
    if not isinstance(params, dict):
        return _error(request_id, INVALID_PARAMS, "params: expected an object")
    if method == "ping":
        return _result(request_id, {})
    if method == "tools/list":
        return _result(request_id, tools_list(env))
    if method == "tools/call":
        if sess is None:
            return _error(request_id, INVALID_REQUEST, "tools/call needs a session (initialize first)")
        if not isinstance(params.get("name"), str):
            return _error(request_id, INVALID_PARAMS, "params.name: expected the tool's name")
        if params["name"] not in env.tools():
            return _error(request_id, INVALID_PARAMS, f"params.name: no tool named {params['name']!r}")
        try:
            return _result(request_id, await call_tool(env, sess, params))
        except GymError as exc:
            return _error(request_id, INTERNAL_ERROR, exc.message)
    return _error(request_id, METHOD_NOT_FOUND, f"method not found: {method}")


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(message, None) or (None, the JSON-RPC error to reply)."""
    try:
        message = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return None, _error(None, PARSE_ERROR, f"parse error: {exc}")
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None, _error(None, INVALID_REQUEST, "invalid request: expected one JSON-RPC 2.0 message object")
    return message, None


async def jsonrpc_reply(env: Environment, raw: bytes, sess: Session | None) -> dict[str, Any]:
    """A JSON-RPC exchange without the HTTP transport (OpenEnv's `POST /mcp` and its `mcp` frames)."""
    message, error = _parse(raw)
    if message is None:
        assert error is not None
        return error
    if not isinstance(message.get("method"), str):
        return _error(message.get("id"), INVALID_REQUEST, "invalid request: method: expected a string")
    return await dispatch(env, message, sess)


def mount_mcp(app: FastAPI, env: Environment) -> None:
    """`POST/GET/DELETE /mcp` on the resource server's app."""

    def _reply(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(body, status_code=status, headers=headers)

    @app.post(PATH, include_in_schema=False)
    async def post(request: Request) -> Response:
        message, error = _parse(await request.body())
        if message is None:
            return _reply(error or {}, 400)
        request_id, method = message.get("id"), message.get("method")
        if not isinstance(method, str):  # a response or a malformed message: nothing to answer
            return Response(status_code=202) if "id" in message else _reply(
                _error(None, INVALID_REQUEST, "invalid request: method: expected a string"), 400)
        if "id" not in message:  # a notification (notifications/initialized, cancellations)
            return Response(status_code=202)
        if method == "initialize":
            return await _initialize(request, message)
        sid = request.headers.get(SESSION_HEADER)
        sess = None
        if sid:
            sess = env.sessions.get(sid)
            if sess is None:
                return _reply(_error(request_id, INVALID_REQUEST, "unknown or closed session: initialize again"), 404)
            env.session(sid, required=False)  # an MCP call keeps the session alive like any other
        elif method in SESSION_METHODS:
            return _reply(_error(request_id, INVALID_REQUEST, "Mcp-Session-Id header required (initialize first)"), 400)
        return _reply(await dispatch(env, message, sess))

    async def _initialize(request: Request, message: dict[str, Any]) -> Response:
        params = message.get("params") or {}
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
        seeded = gym_session_id(request)
        if seeded:  # adopt a session the caller seeded (and so owns: its id is the proof)
            sess = env.session(seeded, required=True)
        else:
            sess = env.open_session()
            try:
                await env.seed(sess, {})
            except BaseException:
                env.sessions.pop(sess.id, None)
                await env.release(sess)
                raise
        assert sess is not None
        result = {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
                  "serverInfo": {"name": f"gymserve-{env.config.name}", "version": "1"},
                  "instructions": env.description or f"tools of the gymserve environment {env.config.kind}"}
        return _reply(_result(message.get("id"), result), headers={"Mcp-Session-Id": sess.id})

    @app.get(PATH, include_in_schema=False)
    async def get() -> Response:
        return Response(status_code=405, headers={"Allow": "POST, DELETE"})

    @app.delete(PATH, include_in_schema=False)
    async def delete(request: Request) -> Response:
        sid = request.headers.get(SESSION_HEADER)
        if not sid:
            return _reply(_error(None, INVALID_REQUEST, "Mcp-Session-Id header required"), 400)
        closed = await env.close_session(sid)
        return Response(status_code=200 if closed else 404)
