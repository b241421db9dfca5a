"""Typed OpenAPI for servers whose handlers read their bodies by hand.

Handlers parse bodies themselves (`read_json` + a pydantic model): the hot path stays one
`json.loads` and one validation, and bad input keeps gymserve's 400 replies. `describe`
gives a route the request and reply schemas, documented error replies and examples for
`/docs` and `/openapi.json`; `install` puts the models those routes name into the app's
components. Nothing here runs per request.
"""
from __future__ import annotations

from typing import Any, Iterable

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"
_MODELS: dict[str, type[BaseModel]] = {}


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    message: str
    request_id: str | None = None


class ErrorReply(BaseModel):
    """Every 4xx/5xx reply: `detail` (as FastAPI's) and a structured `error`."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "detail": "expected_answer: missing or not a string",
        "error": {"type": "bad_request", "message": "expected_answer: missing or not a string",
                  "request_id": "3f2a9c0d1e2b4a5c"}}]})

    detail: str
    error: ErrorDetail


ERRORS: dict[int, str] = {
    400: "Malformed JSON, JSON nested deeper than max_json_depth, or a body or field the endpoint cannot accept "
         "(a wrong type anywhere in a Responses object included); the message names the field.",
    401: "GYMSERVE_API_KEY is set and the request has no valid `Authorization: Bearer` header.",
    403: "Not allowed whatever the key: e.g. re-pointing a server of the head's stack, or weight updates that are off.",
    404: "No such resource (e.g. an unknown server name on the head).",
    408: "The request's headers or body did not arrive within header_timeout_s / body_timeout_s (a slow client).",
    409: "Unknown, closed or expired session (seed a new one), or a session another caller holds.",
    413: "The request body exceeds the server's max_body_bytes (or a prompt models/hf's max_prompt_chars).",
    422: "A typed parameter failed validation; the message names it.",
    429: "Too many requests, or max_sessions open sessions: retry later.",
    502: "Another server this call depends on failed or answered something unusable.",
    503: "Not ready yet, or overloaded: retry later.",
    504: "A call this request depends on ran out of time.",
    508: "The request came back to the head that forwarded it (a registered URL points at the head).",
}
# What any endpoint can answer whatever it does.
COMMON_ERRORS = (400, 401, 408, 413)
SESSION_HEADER = {"name": "X-Session-Id", "in": "header", "required": False, "schema": {"type": "string"},
                  "description": "Session id from /seed_session (the gymserve_session cookie works too)."}


def ref(model: type[BaseModel]) -> dict[str, str]:
    """A `$ref` to `model` in the components (registered for `install`)."""
    name = model.__name__
    known = _MODELS.setdefault(name, model)
    if known is not model:
        name = f"{model.__module__.replace('.', '_')}__{model.__name__}"
        _MODELS.setdefault(name, model)
    return {"$ref": REF.format(model=name)}


def schema_of(spec: type[BaseModel] | dict[str, Any] | None) -> dict[str, Any]:
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return spec
    return ref(spec)


def list_of(model: type[BaseModel] | dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema_of(model)}


def describe(*, body: type[BaseModel] | dict[str, Any] | None = None, reply: type[BaseModel] | dict[str, Any] | None = None,
             errors: Iterable[int] = (), body_required: bool = True, examples: dict[str, Any] | None = None,
             reply_examples: dict[str, Any] | None = None, reply_media: str = "application/json",
             parameters: list[dict[str, Any]] | None = None, summary: str | None = None,
             stream: bool = False, passes_4xx: bool = False) -> dict[str, Any]:
    """Keyword arguments for `app.post(...)`/`app.get(...)`: request body, 200 reply, error replies.

    `stream`: with `"stream": true` the reply is server-sent events; `passes_4xx`: an upstream's
    4xx is passed on unchanged (proxies), so any 4xx can answer."""
    extra: dict[str, Any] = {}
    if body is not None:
        content: dict[str, Any] = {"schema": schema_of(body)}
        if examples:
            content["examples"] = {name: {"value": value} for name, value in examples.items()}
        extra["requestBody"] = {"required": body_required, "content": {"application/json": content}}
    if parameters:
        extra["parameters"] = parameters
    ok: dict[str, Any] = {"description": "Success", "content": {reply_media: {"schema": schema_of(reply)}}}
    if reply_examples:
        ok["content"][reply_media]["examples"] = {name: {"value": value} for name, value in reply_examples.items()}
    if stream:
        ok["content"]["text/event-stream"] = {"schema": {
            "type": "object", "description": "one server-sent event: `event` names it, `data` is its JSON",
            "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}
    responses: dict[int | str, dict[str, Any]] = {200: ok}
    if passes_4xx:
        responses["4XX"] = {"description": "The upstream's own 4xx, passed on",
                            "content": {"application/json": {"schema": {}}}}
    for status in sorted(set(COMMON_ERRORS) | set(errors)):
        responses[status] = {"description": ERRORS[status],
                             "content": {"application/json": {"schema": ref(ErrorReply)}}}
    out: dict[str, Any] = {"openapi_extra": extra, "responses": responses}
    if summary:
        out["summary"] = summary
    return out


def _refs(value: Any, found: set[str]) -> None:
    if isinstance(value, dict):
        target = value.get("$ref")
        if isinstance(target, str) and target.startswith("#/components/schemas/"):
            found.add(target.rsplit("/", 1)[1])
        for item in value.values():
            _refs(item, found)
    elif isinstance(value, list):
        for item in value:
            _refs(item, found)


def _any_of(value: Any) -> Any:
    """`oneOf` -> `anyOf`: a message item also matches the catch-all item schema, which a strict
    `oneOf` would reject; the server's own discriminator decides, the schema only describes."""
    if isinstance(value, dict):
        return {("anyOf" if k == "oneOf" else k): _any_of(v) for k, v in value.items() if k != "discriminator"}
    if isinstance(value, list):
        return [_any_of(v) for v in value]
    return value


def component_schemas(names: Iterable[str]) -> dict[str, Any]:
    """JSON schemas of the registered models `names` and everything they use, as OpenAPI components."""
    models = [(name, _MODELS[name]) for name in sorted(set(names)) if name in _MODELS]
    if not models:
        return {}
    mapping, top = models_json_schema([(model, "validation") for _, model in models], ref_template=REF)
    out: dict[str, Any] = dict(top.get("$defs", {}))
    for name, model in models:
        generated = mapping[(model, "validation")]
        if generated.get("$ref") != REF.format(model=name):
            out[name] = generated
    return _any_of(out)


def install(app: FastAPI, *, tags: list[dict[str, str]] | None = None) -> None:
    """Make `app.openapi()` include the components of every model the routes reference."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = base()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        wanted: set[str] = set()
        _refs(schema.get("paths", {}), wanted)
        added = component_schemas(n for n in wanted if n not in components)
        for name, value in added.items():
            components.setdefault(name, value)
        if tags:
            schema["tags"] = tags
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class Health(BaseModel):
    status: str = "ok"


class Readiness(BaseModel):
    """`/ready`: 200 once models and pools are loaded, 503 (same body, status "starting") before."""

    model_config = ConfigDict(extra="allow")

    status: str
    name: str
    kind: str


HEALTH_DOC: dict[str, Any] = {
    "responses": {200: {"description": "Alive", "content": {"application/json": {"schema": ref(Health)}}}},
    "summary": "Liveness"}
READY_DOC: dict[str, Any] = {"responses": {
    200: {"description": "Ready", "content": {"application/json": {"schema": ref(Readiness)}}},
    503: {"description": "Still starting", "content": {"application/json": {"schema": ref(Readiness)}}}},
    "summary": "Readiness"}
