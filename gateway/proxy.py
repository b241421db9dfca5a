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
from starlette.types import Receive, Scope, Send
from yarl import URL

from services.core.auth import auth_headers
from services.core.errors import BadRequest, GymError, NotFound, UpstreamError
from services.core.failures import FailureKind
from services.core.middleware import request_id_of

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
_VIA_BYTES = VIA_HEADER.encode()
MAX_VIA = 8  # heads a request may pass through (a chain of heads, each proxying to the next)


def _forward_headers(scope: Scope, name: str, *, trusted: bool, via: str) -> list[tuple[str, str]]:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
    drop = set(HOP_BY_HOP)
    drop.update(h.strip().lower() for k, v in headers if k == "connection" for h in v.split(",") if h.strip())
    drop.update(("x-request-id", VIA_HEADER, "x-forwarded-for", "x-forwarded-prefix"))
    if not trusted:
        drop.add("authorization")  # a URL that only registered itself never sees a key
    prior: dict[str, str] = {}
    for k, v in headers:
        if k in (VIA_HEADER, "x-forwarded-for", "authorization"):
            prior[k] = f"{prior[k]}, {v}" if k in prior else v
    out = [(k, v) for k, v in headers if k not in drop]
    rid = request_id_of(scope)
    if rid:
        out.append(("x-request-id", rid))  # one id for the whole hop, in both servers' logs
    if trusted and "authorization" not in prior:
        out.extend(auth_headers().items())  # the head's own key, when it has one
    prior_via = prior.get(VIA_HEADER)
    out.append((VIA_HEADER, f"{prior_via}, {via}" if prior_via else via))
    client = scope["client"][0] if scope.get("client") else ""
    forwarded = prior.get("x-forwarded-for")
    out.append(("x-forwarded-for", f"{forwarded}, {client}" if forwarded else client))
    out.append(("x-forwarded-prefix", f"/servers/{name}"))
    return out


class Proxy:
    """A plain ASGI app, mounted at `/servers/` inside the shared middleware (auth, request ids, metrics,
    limits, error replies) but outside FastAPI's routing and request objects: their CPU per request is
    throughput taken from the servers behind the head on a machine those servers keep busy."""

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

    def _check_loop(self, scope: Scope) -> None:
        given = ",".join(v.decode("latin-1") for k, v in scope["headers"] if k == _VIA_BYTES)
        hops = [h.strip() for h in given.split(",") if h.strip()]
        if self.via in hops or len(hops) >= MAX_VIA:
            raise GymError(f"{VIA_HEADER}: this request already passed through this head ({len(hops)} hops): "
                           "a registered URL points back at the head", status_code=508)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._proxy(scope, receive, send)
        except _ClientGone:
            return  # nobody is left to answer

    async def _proxy(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._check_loop(scope)
        name, rest = _split(scope)
        inst = self.lookup(name)
        if inst is None:
            raise NotFound(f"no server named {name!r} is registered with the head (see GET /server_instances)")
        url = _target(inst.url, scope, rest)
        headers = _forward_headers(scope, name, trusted=inst.trusted, via=self.via)
        method = scope["method"]
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        data: bytes | AsyncIterator[bytes] | None = None
        body: _Body | None = None
        if length is not None and length.isdigit() and int(length) <= BUFFER_MAX_BYTES:
            data = await _read_body(receive) if int(length) else None
            if data is not None:
                headers.append(("Content-Length", str(len(data))))
        elif length is not None or any(k == b"transfer-encoding" for k, _ in scope["headers"]):
            body = _Body(receive)
            data = body.chunks()
            if length is not None:
                headers.append(("Content-Length", length.decode("latin-1")))  # sent as is, not re-chunked
        try:
            upstream = await self.session.request(
                method, url, headers=headers, data=data, allow_redirects=False, compress=None, chunked=None)
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError):
            raise UpstreamError(f"server {name!r} at {inst.url} did not answer {method} /{rest} "
                                f"within the {self.timeout.sock_read:g}s read timeout",
                                kind=FailureKind.TIMEOUT) from None
        except (aiohttp.ClientError, _ClientGone) as exc:
            if body is not None and body.error is not None:
                raise body.error from None  # our own reading failed (a body over the limit: 413), not the server
            if isinstance(exc, _ClientGone):
                raise
            raise UpstreamError(f"cannot reach server {name!r} at {inst.url}: {type(exc).__name__}: {exc}",
                                kind=FailureKind.UPSTREAM) from None
        try:
            await self._reply(upstream, name, inst.url, send)
        finally:
            upstream.release()

    async def _reply(self, upstream: aiohttp.ClientResponse, name: str, base: str, send: Send) -> None:
        raw_headers = [(k.lower(), v) for k, v in upstream.raw_headers if k.lower() not in _RESPONSE_DROP_BYTES]
        size = upstream.headers.get("Content-Length")
        sized = size is not None and "Transfer-Encoding" not in upstream.headers
        if sized:
            raw_headers.append((b"content-length", size.encode("latin-1")))
        if sized and int(size) <= BUFFER_MAX_BYTES:
            try:
                payload = await upstream.read()
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                raise UpstreamError(f"server {name!r} at {base} broke off its reply: {type(exc).__name__}",
                                    kind=FailureKind.TIMEOUT if isinstance(exc, asyncio.TimeoutError)
                                    else FailureKind.UPSTREAM) from None
            await send({"type": "http.response.start", "status": upstream.status, "headers": raw_headers})
            await send({"type": "http.response.body", "body": payload})
            return
        await send({"type": "http.response.start", "status": upstream.status, "headers": raw_headers})
        try:
            async for chunk in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:  # the status line is sent: all we can do is cut
            log.warning("stream from %s broke off: %s", name, exc)
        await send({"type": "http.response.body", "body": b""})


def _split(scope: Scope) -> tuple[str, str]:
    """(server name, the rest of the path as the client encoded it) of `/servers/<name>/<rest>`."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    parts = raw.decode("latin-1")[len(scope.get("root_path", "")):].split("/", 3)  # ['', 'servers', name, rest]
    if len(parts) < 3 or parts[1] != "servers" or not parts[2]:
        raise NotFound("expected /servers/<name>/<path>: a server's name (see GET /server_instances)")
    return unquote(parts[2]), parts[3] if len(parts) > 3 else ""


def _target(base: str, scope: Scope, rest: str) -> URL:
    """`base` + the request's path as the client encoded it (never decoded twice) + its query.

    A segment that the upstream would read as `.` or `..` (`%2e%2e` included) is refused rather than
    resolved, so the target stays under `base`'s path. `%252e` is passed on as is: the upstream
    decodes it once, to a literal `%2e`."""
    for segment in rest.split("/"):
        decoded = unquote(segment)
        if decoded in (".", ".."):
            raise BadRequest(f"path: a {decoded!r} segment is not allowed in a proxied path ({unquote(rest)!r})")
    query = scope.get("query_string", b"").decode("latin-1")
    return URL(f"{base}/{rest}" + (f"?{query}" if query else ""), encoded=True)


class _ClientGone(Exception):
    """The client went away before it had sent its whole body."""


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class _Body:
    """A request body streamed upstream; remembers an error of our own reading (the body limit's)."""

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.error: BaseException | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone()
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    return
        except Exception as exc:
            self.error = exc
            raise
