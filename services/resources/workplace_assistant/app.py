"""workplace_assistant: NeMo-Gym's workplace assistant environment (27 tools, its database, its rows).

Each session gets its own copy of the company tables; tools are `POST /{tool}`. Verification
is NeMo-Gym's: the response's function calls and the row's `ground_truth` are each replayed
on a fresh database (a call that fails is skipped), and the reward is 1 when the calendar,
email, plot, task and customer tables end equal, compared case-insensitively except for
`status`, `list_name` and `board`.
"""
from __future__ import annotations

import inspect
import json
import math
from typing import Any

import numpy as np
import pandas as pd
from fastapi import FastAPI
from pydantic import BaseModel, Field

from services.core.errors import BadRequest
from services.core.openapi import describe
from services.core.replies import scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app, tool
from services.core.schemas import VerifyReply, VerifyRequest

from . import tools as wa

TABLES = ("calendar", "email", "analytics", "project_management", "customer_relationship_manager")


class Config(ResourceConfig):
    workers: int = Field(1, ge=0, description="worker processes that replay and compare the databases")


Call = tuple[str, str]  # (tool name, arguments as the JSON text the model wrote)


def replay(calls: list[Call]) -> wa.Workspace:
    """A fresh database with `calls` applied in order; a call that fails changes nothing more."""
    workspace = wa.Workspace()
    for name, arguments in calls:
        try:
            getattr(workspace, name)(**json.loads(arguments))
        except Exception:  # the model's mistakes (unknown tool, bad JSON, bad arguments) are skipped
            continue
    return workspace


def _lowered(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    for column in table.columns:
        if column not in wa.CASE_SENSITIVE:
            table[column] = table[column].str.lower()
    return table


def mismatched_tables(predicted: list[Call], truth: list[Call]) -> list[str]:
    """Worker job: the tables whose final states differ between the two replays."""
    ours, theirs = replay(predicted).state(), replay(truth).state()
    return [name for name, a, b in zip(TABLES, ours, theirs) if not _lowered(a).equals(_lowered(b))]


def truth_calls(value: Any) -> list[Call]:
    """The row's `ground_truth`: a list of `{name, arguments}` with string values."""
    if not isinstance(value, list):
        raise BadRequest("ground_truth: expected a list of {name, arguments} tool calls")
    calls = []
    for i, call in enumerate(value):
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)
                and isinstance(call.get("arguments"), str)):
            raise BadRequest(f"ground_truth[{i}]: expected {{name, arguments}} with arguments a JSON string")
        calls.append((call["name"], call["arguments"]))
    return calls


def predicted_calls(request: VerifyRequest) -> list[Call]:
    """The response's `function_call` items, in order."""
    calls = []
    for item in request.response.output:
        data = item.model_dump() if hasattr(item, "model_dump") else item
        if isinstance(data, dict) and data.get("type") == "function_call":
            calls.append((str(data.get("name")), str(data.get("arguments"))))
    return calls


def plain(value: Any) -> Any:
    """A tool result as JSON: numpy scalars as numbers, missing values (NaN) as null."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


class ToolCall(BaseModel):
    name: str
    arguments: str = Field(description="the call's arguments as a JSON object's text")


class WorkplaceAssistantRequest(VerifyRequest):
    ground_truth: list[ToolCall] = Field(description="the reference calls, replayed on a fresh database")
    id: int | None = Field(None, description="the row's number (echoed)")
    category: str | None = Field(None, description="the toolkit the task is about, e.g. workplace_assistant_email")
    environment_name: str | None = Field(None, description="workplace_assistant in NeMo-Gym's rows (echoed)")


class WorkplaceAssistantReply(VerifyReply):
    mismatched_tables: list[str] | None = Field(None, description="tables whose final states differ")


class WorkplaceAssistant(Environment):
    config_model = Config
    request_model = WorkplaceAssistantRequest
    reply_model = WorkplaceAssistantReply
    needs_pool = True
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Delete customer 00000009."}]},
                   "ground_truth": [{"name": "customer_relationship_manager_delete_customer",
                                     "arguments": '{"customer_id": "00000009"}'}]}
    example_answer = "Done."
    description = "NeMo-Gym's workplace assistant: reward 1 when the replayed calls leave the ground truth's state."
    reverify_mode = "stateless"  # /verify replays the body's calls on a fresh database: the body alone decides

    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        session.data["workspace"] = wa.Workspace()
        return {"tools": list(wa.TOOL_NAMES)}

    def tool_parameters(self, name: str, fn: Any) -> dict[str, Any]:
        return next(s["parameters"] for s in wa.schemas() if s["name"] == name)

    def call_tool(self, session: Session, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        workspace = session.data.get("workspace")
        if workspace is None:
            raise BadRequest("this session has no database: seed it with /seed_session first")
        arguments = {k: v for k, v in arguments.items() if v is not None}  # null means "not given"
        function = getattr(workspace, name)
        try:
            inspect.signature(function).bind(**arguments)
        except TypeError as exc:
            raise BadRequest(f"tool {name}: {exc}") from None
        try:
            result = function(**arguments)
        except Exception as exc:  # as in NeMo-Gym: the model reads the error and can correct itself
            result = f"Error executing tool '{name}': {exc}"
        return {"output": plain(result)}

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        truth = truth_calls(request.model_dump().get("ground_truth"))
        mismatched = await self.in_pool(mismatched_tables, predicted_calls(request), truth)
        return scored_reply(request, 0.0 if mismatched else 1.0, mismatched_tables=mismatched)


def _make_tool(name: str, description: str):
    async def run_tool(self: WorkplaceAssistant, session: Session, **arguments: Any) -> Any:
        return self.call_tool(session, name, arguments)

    run_tool.__name__ = name
    run_tool.__qualname__ = f"WorkplaceAssistant.{name}"
    run_tool.__doc__ = description
    return tool(run_tool)


for _schema in wa.schemas():
    setattr(WorkplaceAssistant, _schema["name"], _make_tool(_schema["name"], _schema["description"]))


def build(config: Config) -> FastAPI:
    app = create_resource_app(WorkplaceAssistant(config))

    @app.get("/tools", **describe(reply={"type": "array", "items": {"type": "object"}}, errors=()))
    async def list_tools() -> list[dict[str, Any]]:
        """The 27 tools' function schemas, as NeMo-Gym's rows carry them in `responses_create_params.tools`."""
        return wa.schemas()

    return app
