"""The app factory every gymserve server is built with.

It adds liveness/readiness/metrics endpoints, JSON error bodies and head registration,
and composes the middleware (one per concern, in `services.core.middleware`).
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from .config import ServerConfig
from .errors import BadRequest, GymError, counted_failure, error_body, gym_error_body
from .metrics import Metrics
from .middleware import (REQUEST_ID_HEADER, AdmissionControl, AuthMiddleware, BodyLimitMiddleware,
                         DisconnectMiddleware, ErrorReplyMiddleware, InputGuardMiddleware, MetricsMiddleware,
                         MountsMiddleware, ReplyMiddleware, RequestIdMiddleware, admission_queue, request_id_of)
from .openapi import HEALTH_DOC, READY_DOC, install
from .text import reject_lone_surrogates

log = logging.getLogger("gymserve")

Hook = Callable[[], Awaitable[Any]]

SESSION_HEADER = "x-session-id"
SESSION_COOKIE = "gymserve_session"
__all__ = ["REQUEST_ID_HEADER", "SESSION_COOKIE", "SESSION_HEADER", "create_app", "read_json", "request_id",
           "server_type_name", "session_id"]


def request_id(request: Request) -> str | None:
    return request_id_of(request.scope)


async def read_json(request: Request, *, allow_empty: bool = False) -> Any:
    """The request body as JSON whatever its content type; malformed JSON is a 400 naming the problem."""
    raw = await request.body()
    if not raw.strip():
        if allow_empty:
            return None
        raise BadRequest("request body is empty: expected JSON")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from None
    reject_lone_surrogates(raw, body)
    return body


def session_id(request: Request) -> str | None:
    """The session id an agent passes on (`X-Session-Id` header or the session cookie)."""
    return request.headers.get(SESSION_HEADER) or request.cookies.get(SESSION_COOKIE)


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        ctx = detail.get("ctx") or {}
        return 400, f"malformed JSON body: {ctx.get('error', detail.get('msg'))}"
    parts = []
    for err in errors[:10]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg')}")
    return 422, "invalid request: " + "; ".join(parts)


def create_app(
    config: ServerConfig,
    *,
    server_type: str | None = None,
    on_startup: tuple[Hook, ...] | list[Hook] = (),
    on_shutdown: tuple[Hook, ...] | list[Hook] = (),
    readiness: Callable[[], bool] | None = None,
    description: str = "",
    ready_details: Callable[[], dict[str, Any]] | None = None,
    mounts: Mapping[str, ASGIApp] | None = None,
) -> FastAPI:
    """A FastAPI app with gymserve's shared behaviour.

    `on_startup` hooks run before the server reports ready (load models, start pools);
    `on_shutdown` hooks run on graceful shutdown. `readiness` is an extra check for `/ready`;
    `ready_details` adds fields to its body (e.g. a sandbox running in unsafe mode says so there).
    `mounts` are plain ASGI apps by path template, served inside the shared middleware but before
    FastAPI's routing (`middleware/mounts.py`).
    """
    metrics = Metrics(config.name)
    admission = admission_queue(config)
    state: dict[str, Any] = {"ready": False}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        heartbeat: asyncio.Task[None] | None = None
        try:
            for hook in on_startup:
                await hook()
            state["ready"] = True
            if config.head_url and config.register_with_head:
                from .registration import heartbeat_loop

                heartbeat = asyncio.create_task(heartbeat_loop(config, server_type or server_type_name(config.kind)))
            yield
        finally:
            state["ready"] = False
            if heartbeat:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await heartbeat
            for hook in reversed(list(on_shutdown)):
                try:
                    await hook()
                except Exception:  # shutdown must go on
                    log.exception("shutdown hook failed")

    # Outermost first. Adding a concern is one line here; order matters: the reply's record wraps `send`
    # once for every layer inside it, a request whose client went away is cancelled whatever layer it is
    # in (an admission queue included), the request id is set before anything can answer, metrics count
    # every reply (401/413/500 included), error replies catch what the layers inside them raise, the body
    # limit answers its own overflow, and the input guard (inside it, so its buffering is bounded) answers
    # a slow body or a depth bomb before any handler parses it.
    middleware = [
        Middleware(ReplyMiddleware),
        Middleware(DisconnectMiddleware),
        Middleware(RequestIdMiddleware),
        Middleware(MetricsMiddleware, metrics=metrics),
        Middleware(ErrorReplyMiddleware, metrics=metrics),
        Middleware(AuthMiddleware),
        Middleware(AdmissionControl, queue=admission),  # after auth: strangers take no queue slot
        Middleware(BodyLimitMiddleware, max_body_bytes=config.max_body_bytes),
        Middleware(InputGuardMiddleware, body_timeout_s=config.body_timeout_s, max_json_depth=config.max_json_depth),
    ]
    if mounts:
        middleware.append(Middleware(MountsMiddleware, mounts=mounts, metrics=metrics))
    app = FastAPI(title=f"gymserve {config.kind or 'server'}: {config.name}", description=description,
                  lifespan=lifespan, middleware=middleware, **_fastapi_telemetry())
    install(app)
    app.state.config = config
    app.state.metrics = metrics
    app.state.gym = state

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> JSONResponse:
        metrics.failure(counted_failure(exc))
        return JSONResponse(gym_error_body(exc, request_id(request)), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _validation_message(exc)
        return JSONResponse(error_body(message, "bad_request", request_id(request)), status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "http_error", request_id(request)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.get("/", include_in_schema=False)
    @app.get("/health", **HEALTH_DOC)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", **READY_DOC)
    async def ready() -> JSONResponse:
        ok = state["ready"] and (readiness() if readiness else True)
        body = {"status": "ready" if ok else "starting", "name": config.name, "kind": config.kind}
        if ready_details:
            body = {**ready_details(), **body}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    return app


def _fastapi_telemetry() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry layer (newer FastAPI) looks up the global providers on every request;
    our metrics are Prometheus'. It stays on where OpenTelemetry is set up through the environment
    (OTEL_* or FASTAPI_OTEL_* variables, as `opentelemetry-instrument` sets), and is off otherwise."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    if any(name.startswith(("OTEL_", "FASTAPI_OTEL_")) for name in os.environ):
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}


def server_type_name(kind: str) -> str:
    """NeMo-Gym's server_type names for our kinds."""
    family = kind.split("/", 1)[0]
    from .loader import FAMILIES, is_package_kind, package_family

    if family not in FAMILIES and kind != "head" and is_package_kind(kind):
        try:
            family = package_family(kind)
        except Exception:  # not installed here (the head of another machine): no family to name
            family = "unknown"
    return {
        "resources": "resources_servers",
        "agents": "responses_api_agents",
        "models": "responses_api_models",
        "head": "head_server",
        "nemo_gym": "resources_servers",  # NeMo-Gym's own resources servers behind gymserve's sidecar
    }.get(family, family or "unknown")
