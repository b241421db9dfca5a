"""workplace: a stateful company database (email, calendar, projects and tasks, CRM) behind tools.

Each session gets its own database, seeded from the row (`initial_state` / `state_updates`
over the default Lumen Labs seed). Tools are `POST /{tool}`. Verification replays the
row's `ground_truth` calls on a fresh copy of the seed and compares the final databases,
ignoring record order and generated ids/timestamps, so any equivalent sequence of calls
scores 1. Without a live session (offline re-scoring) the response's own function calls
are replayed instead.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field

from services.core.content import function_calls
from services.core.errors import BadRequest
from services.core.openapi import describe
from services.core.replies import scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app, tool
from services.core.schemas import VerifyReply, VerifyRequest

from . import tools as wp
from .db import WorkplaceDB, diff_tables


class Config(ResourceConfig):
    use_pool: bool = False  # tools and verification are microsecond dict operations


def parse_calls(calls: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """`[{"name", "arguments"}]` (arguments a JSON string or an object) -> (name, dict) pairs."""
    if not isinstance(calls, list):
        raise BadRequest(f"{where}: expected a list of {{name, arguments}} tool calls")
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise BadRequest(f"{where}[{i}]: expected an object with a tool name")
        if call["name"] not in wp.TOOLS:
            raise BadRequest(f"{where}[{i}]: unknown tool {call['name']!r}")
        args = call.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except ValueError as exc:
                raise BadRequest(f"{where}[{i}].arguments: invalid JSON: {exc}") from None
        if not isinstance(args, dict):
            raise BadRequest(f"{where}[{i}].arguments: expected a JSON object")
        out.append((call["name"], args))
    return out


def replay(db: WorkplaceDB, calls: list[tuple[str, dict[str, Any]]], *, strict: bool, where: str = "") -> WorkplaceDB:
    """Apply calls in order; a failing call is an error (strict, for ground truth) or skipped (the model's)."""
    for i, (name, args) in enumerate(calls):
        try:
            wp.call(db, name, args)
        except BadRequest as exc:
            if strict:
                raise BadRequest(f"{where}[{i}] ({name}) fails on the seed state: {exc.message}") from None
    return db


def predicted_calls(request: VerifyRequest) -> list[tuple[str, dict[str, Any]]]:
    """The model's function calls from the trajectory, invalid ones dropped (they changed nothing)."""
    return function_calls(request.response.output, wp.TOOLS)


class ToolCall(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class WorkplaceRequest(VerifyRequest):
    ground_truth: list[ToolCall] = Field(description="the reference tool calls, replayed on a fresh database")
    initial_state: dict[str, Any] | None = Field(None, description="database tables replacing the default seed")
    state_updates: dict[str, Any] | None = Field(None, description="records added to the seed")


class WorkplaceReply(VerifyReply):
    mismatched_tables: list[str] | None = None
    state_source: Literal["session", "replay"] | None = None


class Workplace(Environment):
    config_model = Config
    request_model = WorkplaceRequest
    reply_model = WorkplaceReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Email Bob: launch moves."}]},
                   "ground_truth": [{"name": "send_email", "arguments": json.dumps(
                       {"recipient": "bob.martinez@lumen.io", "subject": "Launch", "body": "It moves."})}]}
    example_answer = "Done."
    description = "Company database tools; reward 1 when the final state equals the ground truth's."
    rebuildable = True  # seed and tools are functions of the row and the calls (fixed clock, counted ids)

    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        session.data["db"] = WorkplaceDB.from_row(body)
        return {"tools": list(wp.TOOLS)}

    def tool_parameters(self, name: str, fn: Any) -> dict[str, Any]:
        schemas = {s["name"]: s["parameters"] for s in wp.tool_schemas([name])} if name in wp.TOOLS else {}
        return schemas.get(name) or super().tool_parameters(name, fn)

    def call_tool(self, session: Session, name: str, arguments: dict[str, Any]) -> Any:
        db = session.data.get("db")
        if db is None:
            raise BadRequest("this session has no database: seed it with the row first")
        return wp.call(db, name, arguments)

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        row = request.model_dump()  # seed fields (initial_state, state_updates) of the row
        truth = parse_calls(request.field("ground_truth"), "ground_truth")
        seed = WorkplaceDB.from_row(row)
        expected = replay(seed.copy(), truth, strict=True, where="ground_truth")
        live = session.data.get("db") if session else None
        actual = live if live is not None else replay(seed.copy(), predicted_calls(request), strict=False)
        mismatched = diff_tables(actual, expected)
        return scored_reply(request, 0.0 if mismatched else 1.0, mismatched_tables=mismatched,
                           state_source="session" if live is not None else "replay")


def _make_tool(spec: wp.ToolSpec):
    async def run_tool(self: Workplace, session: Session, **arguments: Any) -> Any:
        return self.call_tool(session, spec.name, arguments)

    run_tool.__name__ = spec.name
    run_tool.__qualname__ = f"Workplace.{spec.name}"
    run_tool.__doc__ = spec.description
    return tool(run_tool)


for _spec in wp.TOOLS.values():
    setattr(Workplace, _spec.name, _make_tool(_spec))


def build(config: Config) -> FastAPI:
    env = Workplace(config)
    app = create_resource_app(env)

    @app.get("/tools", **describe(reply={"type": "array", "items": {"type": "object"}}, errors=()))
    async def list_tools() -> list[dict[str, Any]]:
        """JSON schemas of every tool, ready for `responses_create_params.tools`."""
        return wp.tool_schemas()

    return app
