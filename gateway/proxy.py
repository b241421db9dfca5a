"""`ANY /servers/{name}/{path}`: a streaming reverse proxy to a registered server.

Request and response bodies are streamed (never buffered whole), status codes and
end-to-end headers are kept; hop-by-hop headers are dropped as RFC 9110 asks.
An unknown name is a 404 naming it; an unreachable server a 502, a slow one a 504.

Upstream calls go through one pooled aiohttp session (keep-alive connections reused
across requests, no per-request client setup): it costs a fraction of httpx's CPU per
request, which on a small machine is the head's throughput. Small bodies (up to
`BUFFER_MAX_BYTES` with a Content-Length) are passed on in one piece, which is cheaper
than a chunk iterator; larger or unsized ones (uploads, SSE streams) are streamed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

import aiohttp
from fastapi import Request
from multidict import CIMultiDict
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
_RESPONSE_DROP_BYTES = frozenset(h.encode() for h in _RESPONSE_DROP)
BUFFER_MAX_BYTES = 1 << 20


def _forward_headers(request: Request, name: str) -> CIMultiDict[str]:
    drop = set(HOP_BY_HOP)
    connection = request.headers.get("connection", "")
    drop.update(h.strip().lower() for h in connection.split(",") if h.strip())
    drop.add("x-request-id")
    headers: CIMultiDict[str] = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
    rid = request.scope.get("state", {}).get("request_id")
    if rid:
        headers.add("x-request-id", rid)  # one id for the whole hop, in both servers' logs
    if "authorization" not in headers:
        headers.extend(auth_headers())  # the head's own key, when it has one
    client = request.client.host if request.client else ""
    prior = request.headers.get("x-forwarded-for")
    headers.add("x-forwarded-for", f"{prior}, {client}" if prior else client)
    headers.add("x-forwarded-prefix", f"/servers/{name}")
    return headers


class Proxy:
    def __init__(self, lookup: Callable[[str], Instance | None], *, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0, max_connections: int = 1024) -> None:
        self.lookup = lookup
        self.timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, keepalive_timeout=30)
            # no automatic decompression and no added headers: bytes pass through as the two ends sent them
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, trust_env=False, auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def handle(self, request: Request, name: str, path: str) -> Response:
        inst = self.lookup(name)
        if inst is None:
            raise NotFound(f"no server named {name!r} is registered with the head (see GET /server_instances)")
        url = f"{inst.url}/{path}"
        headers = _forward_headers(request, name)
        length = request.headers.get("content-length")
        data: bytes | AsyncIterator[bytes] | None = None
        if length is not None and length.isdigit() and int(length) <= BUFFER_MAX_BYTES:
            data = await request.body() if int(length) else None
            if data is not None:
                headers["Content-Length"] = str(len(data))
        elif length is not None or "transfer-encoding" in request.headers:
            data = _body(request)
            if length is not None:
                headers["Content-Length"] = length  # sent as is, not re-chunked
        try:
            upstream = await self.session.request(
                request.method, url, params=request.query_params.multi_items() or None, headers=headers,
                data=data, allow_redirects=False, compress=None, chunked=None)
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            raise UpstreamError(f"server {name!r} at {inst.url} did not answer {request.method} /{path} "
                               f"within the {self.timeout.sock_read:g}s read timeout",
                                kind=FailureKind.TIMEOUT) from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"cannot reach server {name!r} at {inst.url}: {type(exc).__name__}: {exc}",
                                kind=FailureKind.UPSTREAM) from None
        raw_headers = [(k.lower(), v) for k, v in upstream.raw_headers if k.lower() not in _RESPONSE_DROP_BYTES]
        sized = "Content-Length" in upstream.headers and "Transfer-Encoding" not in upstream.headers
        if sized:
            raw_headers.append((b"content-length", upstream.headers["Content-Length"].encode("latin-1")))
        if sized and int(upstream.headers["Content-Length"]) <= BUFFER_MAX_BYTES:
            try:
                body = await upstream.read()
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                upstream.release()
                raise UpstreamError(f"server {name!r} at {inst.url} broke off its reply: {type(exc).__name__}",
                                    kind=FailureKind.TIMEOUT if isinstance(exc, asyncio.TimeoutError)
                                    else FailureKind.UPSTREAM) from None
            response = Response(body, status_code=upstream.status)
        else:
            response = StreamingResponse(_stream(upstream, name), status_code=upstream.status,
                                         background=BackgroundTask(_release, upstream))
        response.raw_headers = raw_headers
        return response


async def _body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


async def _release(upstream: aiohttp.ClientResponse) -> None:
    upstream.release()


async def _stream(upstream: aiohttp.ClientResponse, name: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.content.iter_any():
            yield chunk
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:  # the status line is sent: all we can do is cut
        log.warning("stream from %s broke off: %s", name, exc)
    finally:
        upstream.release()
