"""`ANY /servers/{name}/{path}`: a streaming reverse proxy to a registered server.

Request and response bodies are streamed (never buffered whole), status codes and
end-to-end headers are kept; hop-by-hop headers are dropped as RFC 9110 asks.
An unknown name is a 404 naming it; an unreachable server a 502, a slow one a 504.

Upstream calls go through one pooled aiohttp session (keep-alive connections reused
across requests, no per-request client setup): it costs a fraction of httpx's CPU per
request, which on a small machine is the head's throughput. Small bodies (up to
`BUFFER_MAX_BYTES` with a Content-Length) are passed on in one piece, which is cheaper
than a chunk iterator; larger or unsized ones (uploads, SSE streams) are streamed.

Safety: the path is passed on exactly as the client encoded it (decoded once, by the server
that answers, so `%252e` stays `%2e` there) and a `.`/`..` segment is refused, so a request
cannot leave a registered URL's path prefix; each head stamps its id into `X-Gymserve-Via`
and refuses a request that already carries it (a registration pointing back at the head);
an unsized body that runs over the head's limit is a 413; the bearer key (the caller's or
the head's) goes only to servers of the head's stack, never to a self-registered URL.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
from typing import AsyncIterator, Callable
from urllib.parse import unquote

import aiohttp
from fastapi import Request
from multidict import CIMultiDict
from yarl import URL
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from services.core.auth import auth_headers
from services.core.errors import BadRequest, GymError, NotFound, UpstreamError
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
VIA_HEADER = "x-gymserve-via"
MAX_VIA = 8  # heads a request may pass through (a chain of heads, each proxying to the next)


def _forward_headers(request: Request, name: str, *, trusted: bool, via: str) -> CIMultiDict[str]:
    drop = set(HOP_BY_HOP)
    connection = request.headers.get("connection", "")
    drop.update(h.strip().lower() for h in connection.split(",") if h.strip())
    drop.update(("x-request-id", VIA_HEADER))
    if not trusted:
        drop.add("authorization")  # a URL that only registered itself never sees a key
    headers: CIMultiDict[str] = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
    rid = request.scope.get("state", {}).get("request_id")
    if rid:
        headers.add("x-request-id", rid)  # one id for the whole hop, in both servers' logs
    if trusted and "authorization" not in headers:
        headers.extend(auth_headers())  # the head's own key, when it has one
    prior_via = request.headers.get(VIA_HEADER)
    headers.add(VIA_HEADER, f"{prior_via}, {via}" if prior_via else via)
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
        self.via = secrets.token_hex(8)  # this head's id in X-Gymserve-Via
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

    def _check_loop(self, request: Request) -> None:
        hops = [h.strip() for h in request.headers.get(VIA_HEADER, "").split(",") if h.strip()]
        if self.via in hops or len(hops) >= MAX_VIA:
            raise GymError(f"{VIA_HEADER}: this request already passed through this head ({len(hops)} hops): "
                           "a registered URL points back at the head", status_code=508)

    async def handle(self, request: Request, name: str, path: str) -> Response:
        self._check_loop(request)
        inst = self.lookup(name)
        if inst is None:
            raise NotFound(f"no server named {name!r} is registered with the head (see GET /server_instances)")
        url = _target(inst.url, request, path)
        headers = _forward_headers(request, name, trusted=inst.trusted, via=self.via)
        length = request.headers.get("content-length")
        data: bytes | AsyncIterator[bytes] | None = None
        body: _Body | None = None
        if length is not None and length.isdigit() and int(length) <= BUFFER_MAX_BYTES:
            data = await request.body() if int(length) else None
            if data is not None:
                headers["Content-Length"] = str(len(data))
        elif length is not None or "transfer-encoding" in request.headers:
            body = _Body(request)
            data = body.chunks()
            if length is not None:
                headers["Content-Length"] = length  # sent as is, not re-chunked
        try:
            upstream = await self.session.request(
                request.method, url, headers=headers,
                data=data, allow_redirects=False, compress=None, chunked=None)
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            raise UpstreamError(f"server {name!r} at {inst.url} did not answer {request.method} /{path} "
                               f"within the {self.timeout.sock_read:g}s read timeout",
                                kind=FailureKind.TIMEOUT) from None
        except aiohttp.ClientError as exc:
            if body is not None and body.error is not None:
                raise body.error from None  # our own reading failed (a body over the limit: 413), not the server
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


def _target(base: str, request: Request, path: str) -> URL:
    """`base` + the request's path as the client encoded it (never decoded twice) + its query.

    The raw path is `/servers/<name>/<rest>`; a segment that the upstream would read as `.` or
    `..` (`%2e%2e` included) is refused rather than resolved, so the target stays under `base`'s
    path. `%252e` is passed on as is: the upstream decodes it once, to a literal `%2e`."""
    raw: bytes = request.scope.get("raw_path") or request.url.path.encode()
    parts = raw.decode("latin-1").split("/", 3)  # ['', 'servers', name, rest]
    rest = parts[3] if len(parts) > 3 else ""
    for segment in rest.split("/"):
        decoded = unquote(segment)
        if decoded in (".", ".."):
            raise BadRequest(f"path: a {decoded!r} segment is not allowed in a proxied path ({path!r})")
    query = request.scope.get("query_string", b"").decode("latin-1")
    return URL(f"{base}/{rest}" + (f"?{query}" if query else ""), encoded=True)


class _Body:
    """A request body streamed upstream; remembers an error of our own reading (the body limit's)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.error: BaseException | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.request.stream():
                if chunk:
                    yield chunk
        except Exception as exc:
            self.error = exc
            raise


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
