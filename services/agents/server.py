"""The HTTP face of an agent: `POST /run`, `POST /v1/responses`, `POST /aggregate_metrics`."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from services.core.app import create_app, read_json, session_id
from services.core.client import shared_client
from services.core.errors import BadRequest, UpstreamError
from services.core.metrics_agg import aggregate_metrics
from services.core.openapi import SESSION_HEADER, describe
from services.core.schemas import AggregateRequest, DatasetRow, ResponseObject, RolloutReply
from services.models.openai_api import ResponsesRequest, parse_request

from .checkpoint import ROLLOUT_HEADER
from .loop import Agent, parse_row

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


def create_agent_app(agent: Agent, *, description: str = "") -> FastAPI:
    config = agent.config
    # `/ready` names the resource server, so the trainer client can find where a group reward is computed
    app = create_app(config, on_shutdown=[agent.drain], description=description,
                     ready_details=lambda: {"resources_server": config.resources_server})
    metrics = app.state.metrics
    app.state.agent = agent

    @app.post("/run", **describe(body=DatasetRow, reply=RolloutReply, errors=(503,), examples={"row": {
        "responses_create_params": {"input": [{"role": "user", "content": "Capital of France? One word."}]},
        "agent_ref": {"type": "responses_api_agents", "name": "exact_match_simple_agent"},
        "expected_answer": "Paris"}}))
    async def run(request: Request) -> dict[str, Any]:
        """One rollout of a dataset row: seed, model/tool loop, verify."""
        row = parse_row(await read_json(request))
        reply = await agent.run(row, request.headers.get(ROLLOUT_HEADER))
        metrics.failure(reply.get("failure_kind"))
        return reply

    @app.post("/v1/responses", **describe(body=ResponsesRequest, reply=ResponseObject, errors=(404, 422, 429, 502, 503, 504),
                                          parameters=[SESSION_HEADER], passes_4xx=True))  # the model's own 4xx
    async def responses(request: Request) -> Response:
        """Forward one model call to this agent's model server (streaming passes through)."""
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("body: expected a JSON object (Responses API create parameters)")
        parse_request(ResponsesRequest, body)  # a 400 naming the field here, not the model server's reply
        sid = session_id(request)
        if body.get("stream"):
            return await _stream(agent, body, sid)
        response = await agent.model.post("/v1/responses", body, session_id=sid,
                                          deadline_s=config.step_deadline_s)
        headers = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_HEADERS
                   and k.lower() in ("content-type", "x-session-id")}
        return Response(response.content, status_code=response.status_code, headers=headers)

    @app.post("/aggregate_metrics", **describe(body=AggregateRequest, reply={"type": "object"}, errors=(502, 503, 504)))
    async def aggregate(request: Request) -> Any:
        """The resource server's aggregation when it answers, else the core one computed here."""
        body = await read_json(request)
        try:
            response = await agent.resources.post("/aggregate_metrics", body, session_id=None, deadline_s=30.0)
        except UpstreamError:
            return aggregate_metrics(body)
        if response.status_code >= 500:
            return aggregate_metrics(body)
        return Response(response.content, status_code=response.status_code,
                        media_type=response.headers.get("content-type", "application/json"))

    return app


async def _stream(agent: Agent, body: dict[str, Any], sid: str | None) -> Response:
    url = await agent.model.base() + "/v1/responses"
    client = shared_client()  # streaming needs httpx's streamed responses
    http = client.http
    request = http.build_request("POST", url, json=body, headers=client.headers(None, sid, url),
                                 timeout=agent.config.step_deadline_s)
    try:
        upstream = await http.send(request, stream=True)
    except Exception as exc:
        raise UpstreamError(f"{type(exc).__name__} calling {url}: {exc}") from None
    if upstream.status_code >= 400:
        content = await upstream.aread()
        await upstream.aclose()
        return Response(content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type", "application/json"))

    async def chunks():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()

    return StreamingResponse(chunks(), status_code=upstream.status_code,
                             media_type=upstream.headers.get("content-type", "text/event-stream"))
