"""`ANY /servers/{name}/{path}`: a streaming reverse proxy to a registered server.

Request and response bodies are streamed (never buffered whole), status codes and
end-to-end headers are kept; hop-by-hop headers are dropped as RFC 9110 asks.
An unknown name is a 404 naming it; an unreachable server a 502, a slow one a 504.
"""
from __future__ import annotations

import logging
from typing import AsyncIterator, Callable

import httpx
from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from services.core.auth import auth_headers
from services.core.errors import NotFound, UpstreamError
from services.core.failures import FailureKind

from .registry import Instance

log = logging.getLogger("gymserve.head.proxy")

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})

# the head's own server adds these to every response
_RESPONSE_DROP = HOP_BY_HOP | {"date", "server", "x-request-id"}


def _forward_headers(request: Request, name: str) -> list[tuple[str, str]]:
    drop = set(HOP_BY_HOP)
    connection = request.headers.get("connection", "")
    drop.update(h.strip().lower() for h in connection.split(",") if h.strip())
    drop.add("x-request-id")
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in drop]
    rid = request.scope.get("state", {}).get("request_id")
    if rid:
        headers.append(("x-request-id", rid))  # one id for the whole hop, in both servers' logs
    if not any(k.lower() == "authorization" for k, _ in headers):
        headers.extend(auth_headers().items())  # the head's own key, when it has one
    client = request.client.host if request.client else ""
    prior = request.headers.get("x-forwarded-for")
    headers.append(("x-forwarded-for", f"{prior}, {client}" if prior else client))
    headers.append(("x-forwarded-prefix", f"/servers/{name}"))
    return headers


class Proxy:
    def __init__(self, lookup: Callable[[str], Instance | None], *, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0, max_connections: int = 1024) -> None:
        self.lookup = lookup
        self.timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            # no automatic decompression: bytes pass through exactly as the upstream sent them
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=self.limits, trust_env=False,
                                             follow_redirects=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def handle(self, request: Request, name: str, path: str) -> Response:
        inst = self.lookup(name)
        if inst is None:
            raise NotFound(f"no server named {name!r} is registered with the head (see GET /server_instances)")
        url = f"{inst.url}/{path}"
        has_body = request.method not in ("GET", "HEAD", "OPTIONS", "DELETE") or "content-length" in request.headers \
            or "transfer-encoding" in request.headers
        upstream_request = self.client.build_request(
            request.method, url, params=request.query_params.multi_items() or None,
            headers=_forward_headers(request, name),
            content=_body(request) if has_body else None,
        )
        try:
            upstream = await self.client.send(upstream_request, stream=True)
        except httpx.TimeoutException:
            raise UpstreamError(f"server {name!r} at {inst.url} did not answer {request.method} /{path} in time",
                                kind=FailureKind.TIMEOUT) from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"cannot reach server {name!r} at {inst.url}: {type(exc).__name__}: {exc}",
                                kind=FailureKind.UPSTREAM) from None
        headers = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in _RESPONSE_DROP]
        if "content-length" in upstream.headers and "transfer-encoding" not in upstream.headers:
            headers.append(("content-length", upstream.headers["content-length"]))
        response = StreamingResponse(_stream(upstream, name), status_code=upstream.status_code,
                                     background=BackgroundTask(upstream.aclose))
        response.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return response


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


async def _stream(upstream: httpx.Response, name: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:  # the status line is already sent: all we can do is cut the body
        log.warning("stream from %s broke off: %s", name, exc)
    finally:
        await upstream.aclose()
