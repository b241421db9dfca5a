"""The app factory every gymserve server is built with.

It adds liveness/readiness/metrics endpoints, request ids, JSON error bodies, a
body-size limit, bearer auth and head registration, as plain ASGI middleware so
the per-request cost stays small.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import OPEN_PATHS, api_key, authorized
from .config import ServerConfig
from .errors import BadRequest, GymError, error_body
from .metrics import Metrics
from .openapi import HEALTH_DOC, READY_DOC, install
from .text import reject_lone_surrogates

log = logging.getLogger("gymserve")

Hook = Callable[[], Awaitable[Any]]

SESSION_HEADER = "x-session-id"
SESSION_COOKIE = "gymserve_session"
REQUEST_ID_HEADER = "x-request-id"


class _BodyTooLarge(Exception):
    pass


class GymMiddleware:
    """Request id, auth, body-size limit and metrics in one ASGI layer."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, max_body_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request_id = headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = request_id
        path = scope["path"]
        method = scope["method"]

        status_holder = {"status": 500, "started": False}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                status_holder["started"] = True
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"x-request-id", request_id.encode())]
            await send(message)

        key = api_key()
        if key and path not in OPEN_PATHS and not authorized(headers.get("authorization"), key):
            await _send_json(send_wrapper, 401, error_body(
                "missing or invalid bearer token (set Authorization: Bearer <GYMSERVE_API_KEY>)",
                "unauthorized", request_id), extra_headers=[(b"www-authenticate", b"Bearer")])
            self._observe(scope, method, 401, 0.0)
            return

        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _send_json(send_wrapper, 413, error_body(
                f"request body of {length} bytes exceeds the limit of {self.max_body_bytes} bytes",
                "payload_too_large", request_id))
            self._observe(scope, method, 413, 0.0)
            return

        received = 0
        limit = self.max_body_bytes

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge()
            return message

        start = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive_limited, send_wrapper)
        except _BodyTooLarge:
            status_holder["status"] = 413
            await _send_json(send_wrapper, 413, error_body(
                f"request body exceeds the limit of {limit} bytes", "payload_too_large", request_id))
        except Exception as exc:
            # Answered here rather than by Starlette's outermost error middleware so the
            # reply still carries X-Request-Id and the failure is counted.
            log.exception("unhandled error on %s %s", method, path)
            self.metrics.failure("crash")
            if status_holder["started"]:
                raise
            await _send_json(send_wrapper, 500, error_body(
                f"internal error: {type(exc).__name__}: {exc}", "internal_error", request_id))
        finally:
            self.metrics.in_flight.dec()
            self._observe(scope, method, status_holder["status"], time.perf_counter() - start)

    def _observe(self, scope: Scope, method: str, status: int, elapsed: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or ("unmatched" if status == 404 else scope["path"][:64])
        if path == "/metrics":
            return
        self.metrics.requests.labels(method=method, path=path, status=str(status)).inc()
        self.metrics.latency.labels(method=method, path=path).observe(elapsed)


async def _send_json(send: Send, status: int, body: dict[str, Any], extra_headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = JSONResponse(body).body
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                    *extra_headers],
    })
    await send({"type": "http.response.body", "body": payload})


def request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


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
) -> FastAPI:
    """A FastAPI app with gymserve's shared behaviour.

    `on_startup` hooks run before the server reports ready (load models, start pools);
    `on_shutdown` hooks run on graceful shutdown. `readiness` is an extra check for `/ready`;
    `ready_details` adds fields to its body (e.g. a sandbox running in unsafe mode says so there).
    """
    metrics = Metrics(config.name)
    state: dict[str, Any] = {"ready": False}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        heartbeat: asyncio.Task[None] | None = None
        try:
            for hook in on_startup:
                await hook()
            state["ready"] = True
            if config.head_url:
                from .registration import heartbeat_loop

                heartbeat = asyncio.create_task(heartbeat_loop(config, server_type or _server_type(config.kind)))
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

    app = FastAPI(title=f"gymserve {config.kind or 'server'}: {config.name}", description=description,
                  lifespan=lifespan)
    install(app)
    app.state.config = config
    app.state.metrics = metrics
    app.state.gym = state

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> JSONResponse:
        if exc.status_code >= 500:
            metrics.failure(getattr(exc, "kind", None) or "upstream")
        return JSONResponse(error_body(exc.message, exc.error_type, request_id(request), **exc.details),
                            status_code=exc.status_code)

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

    app.add_middleware(GymMiddleware, metrics=metrics, max_body_bytes=config.max_body_bytes)
    return app


def _server_type(kind: str) -> str:
    """NeMo-Gym's server_type names for our kinds."""
    family = kind.split("/", 1)[0]
    return {
        "resources": "resources_servers",
        "agents": "responses_api_agents",
        "models": "responses_api_models",
        "head": "head_server",
    }.get(family, family or "unknown")
