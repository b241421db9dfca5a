"""Any MCP server (stdio command or Streamable-HTTP URL) as a gymserve tool environment.

    my_tools: {kind: "gymserve:mcp_environment", server_command: [python, -m, some_mcp_server],
               verifier: "my_package.rewards:score"}

The stack names the server and a verifier; gymserve owns the rest (sessions, limits, masking). It is
served as a `module:attribute` kind rather than from `services/resources/`: with no server named it has
nothing to serve, so it is not one of the environments every generic check starts as they are. Each gymserve session is one MCP
session of its own (a stdio server is started per session, so a stateful server's state belongs to
one rollout), opened by `/seed_session` and closed with the session. The server's tools, listed
once at start-up, become `POST /{tool}` routes with their own JSON schemas (and so reach OpenEnv,
MCP and TRL clients like any environment's tools). `/verify` calls the verifier, a Python callable
`module:function` taking `(row, answer_text, tool_calls)` and returning a reward (or a dict with
`reward` and more fields), in a thread within `verify_deadline_s`.

Failures: a tool error the server reports is the tool's result (`is_error`), which the policy sees;
an MCP server that cannot be started, dies or times out is a 502 `upstream` failure, and a session
whose server failed, or a verifier that raises or overruns, is a masked verify, never a 0.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from typing import Any, Callable

from fastapi import FastAPI
from pydantic import Field, model_validator

from services.core.content import function_calls
from services.core.errors import UpstreamError
from services.core.failures import FailureKind
from services.core.replies import failed_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, ToolFn, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

log = logging.getLogger("gymserve.mcp_server")


class Config(ResourceConfig):
    server_command: list[str] | None = Field(None, description="stdio MCP server: the command and its arguments")
    server_url: str | None = Field(None, description="Streamable-HTTP MCP server: its endpoint URL")
    verifier: str = Field(description="`module:function` called as function(row, answer_text, tool_calls) -> "
                                      "reward or {reward, ...}")
    call_timeout_s: float = Field(60.0, gt=0, description="deadline of one tool call (else a 502 upstream)")
    use_pool: bool = Field(False, description="no worker pool: tool calls go to the MCP server")

    @model_validator(mode="after")
    def _one_server(self) -> "Config":
        if (self.server_command is None) == (self.server_url is None):
            raise ValueError("give the MCP server as either server_command (stdio) or server_url (Streamable HTTP)")
        if ":" not in self.verifier:
            raise ValueError("verifier: expected module:function")
        return self


def _target(config: Config) -> Any:
    from mcp import StdioServerParameters

    if config.server_command:
        return StdioServerParameters(command=config.server_command[0], args=list(config.server_command[1:]))
    return config.server_url


class McpSession:
    """One MCP client session, held open by a task of its own (the client's context must be entered
    and left in one task) until `close`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.client: Any = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None
        self.task = asyncio.get_running_loop().create_task(self._hold())

    async def _hold(self) -> None:
        from mcp import Client

        try:
            async with Client(_target(self.config), mode="legacy") as client:
                self.client = client
                self.ready.set()
                await self.stop.wait()
        except BaseException as exc:  # the server did not start or died: every later call says so
            self.error = exc
            self.ready.set()

    async def open(self) -> None:
        try:
            await asyncio.wait_for(self.ready.wait(), self.config.call_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamError("MCP server did not start within call_timeout_s", kind=FailureKind.TIMEOUT) from None
        if self.error is not None or self.client is None:
            raise UpstreamError(f"MCP server failed to start: {self.error!r}")

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if self.error is not None or self.client is None or self.task.done():
            raise UpstreamError(f"MCP server of this session is gone: {self.error!r}")
        try:
            result = await asyncio.wait_for(self.client.call_tool(name, arguments), self.config.call_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamError(f"MCP tool {name} did not answer within call_timeout_s",
                                kind=FailureKind.TIMEOUT) from None
        except Exception as exc:
            raise UpstreamError(f"MCP tool {name} failed: {exc}") from None
        texts = [getattr(block, "text", "") for block in result.content]
        return {"content": "\n".join(t for t in texts if t), "is_error": bool(result.is_error),
                "structured": result.structured_content}

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)


def list_tools(config: Config) -> list[dict[str, Any]]:
    """The server's tools, asked once when the app is built (they become routes)."""
    async def ask() -> list[dict[str, Any]]:
        from mcp import Client

        async with Client(_target(config), mode="legacy") as client:
            listed = await client.list_tools()
        return [{"name": t.name, "description": t.description or t.name, "schema": dict(t.input_schema or {})}
                for t in listed.tools]

    return asyncio.run(asyncio.wait_for(ask(), config.call_timeout_s))


def load_verifier(spec: str) -> Callable[..., Any]:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


class McpServerEnvironment(Environment):
    config_model = Config
    description = "An MCP server's tools as a gymserve environment, scored by the stack's verifier."
    config: Config

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.verifier = load_verifier(config.verifier)
        self.mcp_tools = list_tools(config)
        self._tool_fns = {t["name"]: self._tool_fn(t["name"]) for t in self.mcp_tools}

    def _tool_fn(self, name: str) -> ToolFn:
        async def call(session: Session, **arguments: Any) -> Any:
            return await session.data["mcp"].call(name, arguments)

        call.__doc__ = next(t["description"] for t in self.mcp_tools if t["name"] == name)
        return call

    def tools(self) -> dict[str, ToolFn]:
        return dict(self._tool_fns)

    def tool_parameters(self, name: str, fn: ToolFn) -> dict[str, Any]:
        schema = next(t["schema"] for t in self.mcp_tools if t["name"] == name)
        return {"type": "object", "properties": schema.get("properties", {}), "required": schema.get("required", [])}

    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        held = McpSession(self.config)
        session.data["mcp"] = held
        try:
            await held.open()
        except BaseException:
            await held.close()
            raise
        return {}

    async def release(self, session: Session) -> None:
        held = session.data.pop("mcp", None)
        if held is not None:
            await held.close()

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        held = session.data.get("mcp") if session else None
        if held is not None and (held.error is not None or held.task.done()):
            return failed_reply(request, FailureKind.UPSTREAM, f"the session's MCP server failed: {held.error!r}")
        row = request.model_dump(exclude={"response"})
        calls = [{"name": name, "arguments": arguments}
                 for name, arguments in function_calls(request.response.output, self._tool_fns)]
        try:
            verdict = await asyncio.wait_for(asyncio.to_thread(self.verifier, row, request.text(), calls),
                                             self.config.verify_deadline_s)
        except asyncio.TimeoutError:
            return failed_reply(request, FailureKind.TIMEOUT, "the verifier overran verify_deadline_s")
        except Exception as exc:  # the stack's verifier, not the policy, failed
            log.exception("verifier %s raised", self.config.verifier)
            return failed_reply(request, FailureKind.CRASH, f"the verifier raised {type(exc).__name__}: {exc}")
        if isinstance(verdict, dict):
            extra = {k: v for k, v in verdict.items() if k != "reward"}
            return scored_reply(request, float(verdict["reward"]), **extra)
        return scored_reply(request, float(verdict))


def build(config: Config) -> FastAPI:
    return create_resource_app(McpServerEnvironment(config))
