"""`kind: nemo_gym/<server>`: NeMo-Gym's own resources server behind a gymserve server.

The sidecar is an ordinary gymserve server in our virtualenv (registered with the head, so it is
reached at `/servers/<name>/...` like any other): every request passes our key check, body limit and
JSON-depth guard, admission queue and metrics before it is forwarded, unchanged, to NeMo-Gym's
server on 127.0.0.1 (`upstream.Upstream`). What comes back is NeMo-Gym's reply, unchanged, except
where NeMo-Gym has no answer of its own: a request that could not reach its server (it is starting
or restarting) is retried a bounded number of times; a reply that does not come within the deadline,
a 5xx, or a connection cut mid-request is a failure with a `failure_kind`, and on `/verify` that is a
masked reply (`mask_sample: true`), never a reward. Session headers and cookies pass through as sent.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field

from services.core.app import create_app, request_id
from services.core.config import ConfigError, ServerConfig
from services.core.errors import error_body
from services.core.failures import FailureKind
from services.core.replies import failed_reply
from services.core.schemas import VerifyReply

from . import KIND_PREFIX
from .upstream import Upstream
from .venv import base_venv, server_venv
from .wheel import package_root, server_files

# request headers that describe the hop to us, not the request (and our key, which NeMo-Gym never sees)
HOP_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "authorization",
                         "proxy-authorization", "te", "upgrade", "accept-encoding"})
REPLY_DROP = frozenset({"content-length", "connection", "keep-alive", "transfer-encoding", "content-encoding",
                        "server", "date"})


class Config(ServerConfig):
    """The sidecar's own settings; every other key of the stack entry is an option of NeMo-Gym's server,
    laid over its config block (as a NeMo-Gym config override would be)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    request_deadline_s: float = Field(300.0, gt=0, description="a request NeMo-Gym's server has not answered "
                                      "within this is a `timeout` failure (masked on /verify)")
    retries: int = Field(3, ge=0, le=10, description="times a request that could not reach NeMo-Gym's server "
                         "(starting, restarting) is sent again once it is back")
    start_timeout_s: float = Field(900.0, gt=0, description="NeMo-Gym's server must answer /health within this")
    restart_backoff_s: float = Field(1.0, gt=0, description="first wait before restarting a dead NeMo-Gym server")

    def nemo_options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def nemo_server_name(kind: str) -> str:
    name = kind.removeprefix(KIND_PREFIX)
    if not name or "/" in name or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"kind {kind!r}: expected nemo_gym/<resources server of NeMo-Gym's wheel>")
    return name


def _head_address(config: ServerConfig) -> tuple[str, int] | None:
    if not config.head_url:
        return None
    host_port = config.head_url.split("://", 1)[-1].rstrip("/").rsplit(":", 1)
    return (host_port[0], int(host_port[1])) if len(host_port) == 2 and host_port[1].isdigit() else None


def build(config: Config) -> FastAPI:
    server = nemo_server_name(config.kind)
    files = server_files(package_root(base_venv()), server)
    holder: dict[str, Upstream] = {}

    async def startup() -> None:
        venv = await asyncio.to_thread(server_venv, server, files.requirements)
        upstream = Upstream(files, venv, files.instance, config.nemo_options(), head=_head_address(config),
                            start_timeout_s=config.start_timeout_s, backoff_s=config.restart_backoff_s)
        holder["upstream"] = upstream
        await upstream.start()

    async def shutdown() -> None:
        if "upstream" in holder:
            await holder["upstream"].stop()

    def details() -> dict[str, Any]:
        upstream = holder.get("upstream")
        return {"nemo_gym_server": server, "upstream": upstream.url if upstream else None,
                "upstream_pid": upstream.pid if upstream else None, "restarts": upstream.restarts if upstream else 0}

    app = create_app(config, server_type="resources_servers", on_startup=[startup], on_shutdown=[shutdown],
                     readiness=lambda: "upstream" in holder and holder["upstream"].ready.is_set(),
                     ready_details=details, description=f"NeMo-Gym 0.7.0's {server} resources server, fronted by "
                     "gymserve")
    client = httpx.AsyncClient(trust_env=False, limits=httpx.Limits(max_connections=None,
                                                                      max_keepalive_connections=64))
    app.router.on_shutdown.append(client.aclose)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    async def forward(path: str, request: Request) -> Response:
        upstream = holder["upstream"]
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        deadline = time.monotonic() + config.request_deadline_s
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not await upstream.wait_ready(left):
                return _failure(request, path, body, FailureKind.TIMEOUT,
                                f"NeMo-Gym's {server} server was not up within the {config.request_deadline_s:g}s "
                                "deadline")
            try:
                reply = await client.request(request.method, f"{upstream.url}/{path}", params=request.query_params,
                                             content=body, headers=headers,
                                             timeout=max(0.001, deadline - time.monotonic()))
            except httpx.ConnectError as exc:  # never reached it: safe to send again once it is back
                attempt += 1
                if attempt > config.retries:
                    return _failure(request, path, body, FailureKind.UPSTREAM,
                                    f"NeMo-Gym's {server} server could not be reached after {attempt} tries: {exc}")
                # its supervisor notices a dead server within moments and clears `ready` until it is back
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), 4.0, max(0.0, deadline - time.monotonic())))
                continue
            except httpx.TimeoutException:
                return _failure(request, path, body, FailureKind.TIMEOUT,
                                f"NeMo-Gym's {server} server did not answer /{path} within "
                                f"{config.request_deadline_s:g}s")
            except httpx.TransportError as exc:  # cut mid-request: it may have acted, so it is not sent again
                return _failure(request, path, body, FailureKind.CRASH,
                                f"NeMo-Gym's {server} server dropped /{path}: {type(exc).__name__}: {exc}")
            if reply.status_code >= 500:
                return _failure(request, path, body, FailureKind.CRASH,
                                f"NeMo-Gym's {server} server answered /{path} with {reply.status_code}: "
                                f"{reply.text[:500]}")
            out = [(k, v) for k, v in reply.headers.multi_items() if k.lower() not in REPLY_DROP]
            response = Response(reply.content, status_code=reply.status_code)
            for key, value in out:
                response.headers.append(key, value)
            return response

    def _failure(request: Request, path: str, body: bytes, kind: FailureKind, reason: str) -> Response:
        app.state.metrics.failure(str(kind))
        if path.strip("/") == "verify":
            try:
                row = json.loads(body or b"{}")
            except ValueError:
                row = None
            if isinstance(row, dict):
                masked: VerifyReply = failed_reply(row, kind, reason)
                return JSONResponse(masked.model_dump(mode="json"))
        status = 504 if kind == FailureKind.TIMEOUT else 502
        return JSONResponse(error_body(reason, "upstream_error", request_id(request), failure_kind=str(kind)),
                            status_code=status)

    return app
