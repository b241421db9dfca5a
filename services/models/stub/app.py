"""stub: a zero-latency, scripted OpenAI Responses server for agent tests and benchmarks.

It is NOT a model. It exists so that agent logic (tool-call loops, invalid arguments,
max_steps, model failures, deadlines) can be tested deterministically, and so that
`benchmarks/agent_run.py` can measure the overhead of our stack with an upstream that
costs nothing. Real rollouts use `models/hf` or `models/openai_proxy`.

Each call answers the next step of a script, counted per `X-Session-Id`. The script comes
from the request's `metadata.stub_script` (a JSON string, so rows can carry it) or from
the `script` option; past its end the stub answers `text`. A step is an object with any of:
`text` (final message), `tool_calls` (list of `{name, arguments}`; `arguments` may be an
invalid JSON string on purpose), `status` + `error` (answer with that HTTP error),
`sleep` (seconds to wait first), `usage` (token counts to report), `retry_after` (the
`Retry-After` header of a scripted error). With `metadata.stub_turn: "input"` the step is
instead the number of model outputs already in the request's input (function calls and
assistant messages), so a conversation replayed elsewhere gets the same answers.

The `rules` option makes it a scripted judge: the first rule whose `match` (a regular
expression) is found in the request's input text gives the step, whatever the session, so
answers can depend on the prompt (an order-dependent judge, a judge that 429s once). A rule
with `times: N` applies to its first N matching calls only; a rule with `quote: true` puts the
match's first group where its `text` says `{quote}` (a judge that quotes the answer it judges).
`GET /stats` counts the calls.
"""
from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import defaultdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field, field_validator

from services.core.app import create_app, read_json, session_id
from services.core.config import ServerConfig
from services.core.content import content_text
from services.core.errors import BadRequest
from services.core.openapi import SESSION_HEADER, describe
from services.core.schemas import ResponseObject
from services.models import openai_api as oa
from services.models.openai_api import ModelList, ResponsesRequest, parse_request


class Config(ServerConfig):
    text: str = Field("42", description="the answer once the script is exhausted")
    script: list[dict[str, Any]] | None = Field(None, description="steps answered in order, per session")
    model_name: str = Field("stub", description="name reported in replies and /v1/models")
    rules: list[dict[str, Any]] | None = Field(
        None, description="steps chosen by prompt: [{match: REGEX, times: N?, ...step}]; the first rule that "
                          "matches the input text answers")

    @field_validator("rules")
    @classmethod
    def _rules(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, rule in enumerate(value or []):
            if not isinstance(rule.get("match"), str):
                raise ValueError(f"rules[{i}].match: expected a regular expression")
            try:
                re.compile(rule["match"])
            except re.error as exc:
                raise ValueError(f"rules[{i}].match: {exc}") from None
        return value

    @field_validator("text", mode="before")
    @classmethod
    def _any_scalar(cls, value: object) -> object:
        return str(value) if isinstance(value, (int, float)) else value  # `text=42` on the command line


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex[:16]}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def outputs_in(items: Any) -> int:
    """Model outputs already in a conversation: each was one function call or one assistant message."""
    if not isinstance(items, list):
        return 0
    return sum(1 for i in items if isinstance(i, dict) and (
        i.get("type") == "function_call" or (i.get("role") == "assistant" and i.get("type", "message") == "message")))


def _call(spec: dict[str, Any]) -> dict[str, Any]:
    arguments = spec.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:16]}", "call_id": f"call_{uuid.uuid4().hex[:16]}",
            "name": spec.get("name", ""), "arguments": arguments, "status": "completed"}


def build(config: Config) -> FastAPI:
    app = create_app(config, description=__doc__ or "")
    turns: dict[str, int] = defaultdict(int)
    rule_uses: dict[int, int] = defaultdict(int)
    stats = {"calls": 0}

    def by_rule(body: dict[str, Any]) -> dict[str, Any] | None:
        raw = body.get("input")
        text = raw if isinstance(raw, str) else "\n".join(
            content_text(m.get("content")) for m in raw or [] if isinstance(m, dict))
        for i, rule in enumerate(config.rules or []):
            found = re.search(rule["match"], text)
            if found and rule_uses[i] < rule.get("times", float("inf")):
                rule_uses[i] += 1
                if rule.get("quote") and found.groups():
                    return {**rule, "text": str(rule.get("text", "")).replace("{quote}", found.group(1) or "")}
                return rule
        return None

    def script_of(body: dict[str, Any]) -> list[dict[str, Any]]:
        raw = (body.get("metadata") or {}).get("stub_script") if isinstance(body.get("metadata"), dict) else None
        if raw is None:
            return config.script or []
        try:
            script = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            raise BadRequest(f"metadata.stub_script: invalid JSON: {exc}") from None
        if not isinstance(script, list) or not all(isinstance(step, dict) for step in script):
            raise BadRequest("metadata.stub_script: expected a JSON list of step objects")
        for i, step in enumerate(script):
            status, sleep = step.get("status"), step.get("sleep")
            if status is not None and (not isinstance(status, int) or not 100 <= status <= 599):
                raise BadRequest(f"metadata.stub_script[{i}].status: expected an HTTP status code")
            if sleep is not None and (not isinstance(sleep, (int, float)) or not 0 <= sleep <= 600):
                raise BadRequest(f"metadata.stub_script[{i}].sleep: expected seconds between 0 and 600")
            if not isinstance(step.get("tool_calls") or [], list):
                raise BadRequest(f"metadata.stub_script[{i}].tool_calls: expected a list")
        return script

    @app.post("/v1/responses", **describe(body=ResponsesRequest, reply=ResponseObject, parameters=[SESSION_HEADER],
                                          errors=(429, 502, 503, 504), passes_4xx=True))
    async def responses(request: Request) -> JSONResponse:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("body: expected a JSON object")
        req = parse_request(ResponsesRequest, body)  # the stub answers only requests a real server would accept
        stats["calls"] += 1
        step = by_rule(body)
        if step is None:
            script = script_of(body)
            sid = session_id(request)
            turn = turns[sid] if sid else 0
            if sid:
                turns[sid] += 1
            if isinstance(body.get("metadata"), dict) and body["metadata"].get("stub_turn") == "input":
                turn = outputs_in(body.get("input"))
            step = script[turn] if turn < len(script) else {"text": config.text}
        if step.get("sleep"):
            await asyncio.sleep(float(step["sleep"]))
        if step.get("status"):
            headers = {"Retry-After": str(step["retry_after"])} if "retry_after" in step else None
            return JSONResponse({"detail": step.get("error", "scripted failure")}, status_code=int(step["status"]),
                                headers=headers)
        output = [_call(c) for c in step.get("tool_calls") or []]
        if "text" in step or not output:
            output.insert(0, _message(str(step.get("text", config.text))))
        usage = step.get("usage") or {"input_tokens": len(json.dumps(body.get("input", ""))) // 4,
                                      "output_tokens": 8}
        # a complete Responses object (NeMo-Gym's agents validate every field); scripted counts as given
        reply = oa.response_object(req, body.get("model") or config.model_name, output,
                                   input_tokens=int(usage.get("input_tokens", 0)),
                                   output_tokens=int(usage.get("output_tokens", 0)), finish_reason="stop")
        reply["usage"].update(usage)
        return JSONResponse(reply)

    @app.get("/stats", **describe(reply={"type": "object", "properties": {"calls": {"type": "integer"}}}))
    async def get_stats() -> dict[str, Any]:
        return dict(stats)

    @app.get("/v1/models", **describe(reply=ModelList))
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "owned_by": "gymserve"}]}

    return app
