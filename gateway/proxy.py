"""`ANY /servers/{name}/{path}`: a streaming reverse proxy to a registered server.

Request and response bodies are streamed (never buffered whole), status codes and
end-to-end headers are kept; hop-by-hop headers are dropped as RFC 9110 asks.
An unknown name is a 404 naming it; an unreachable server a 502, a slow one a 504.

Upstream calls go through one pool of keep-alive connections (`services.core.http_pool`),
whose CPU per call is a fraction of a general client's: on a machine the servers behind the
head keep busy, the head's CPU per request is their throughput. Small bodies (up to
`BUFFER_MAX_BYTES` with a Content-Length) are passed on in one piece; larger or unsized ones
(uploads, SSE streams) are streamed, with flow control both ways.

Safety: the path is passed on exactly as the client encoded it (decoded once, by the server
that answers, so `%252e` stays `%2e` there) and a `.`/`..` segment is refused, so a request
cannot leave a registered URL's path prefix; each head stamps its id into `X-Gymserve-Via`
and refuses a request that already carries it (a registration pointing back at the head);
an unsized body that runs over the head's limit is a 413; the bearer key (the caller's or
the head's) goes only to servers of the head's stack, never to a self-registered URL.
"""
from __future__ import annotations

import functools
import logging
import secrets
from typing import AsyncIterator, Callable
from urllib.parse import unquote, urlsplit

from starlette.types import Receive, Scope, Send

from services.core.auth import auth_headers
from services.core.errors import BadRequest, GymError, NotFound, UpstreamError
from services.core.failures import FailureKind
from services.core.http_pool import ConnectionPool, Origin, Reply, UpstreamClosed, UpstreamTimeout
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
# the head sets these itself; `expect` was the head's to answer (it has read or streams the body)
_FORWARD_DROP = frozenset(h.encode() for h in HOP_BY_HOP) | {
    b"x-request-id", _VIA_BYTES, b"x-forwarded-for", b"x-forwarded-prefix", b"expect"}
_CHAINED = frozenset({_VIA_BYTES, b"x-forwarded-for", b"authorization"})  # a second value is appended


def _forward_headers(scope: Scope, name: str, *, trusted: bool, via: bytes) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    drop = set(_FORWARD_DROP)
    for k, v in headers:
        if k == b"connection":
            drop.update(h.strip().lower() for h in v.split(b",") if h.strip())
    if not trusted:
        drop.add(b"authorization")  # a URL that only registered itself never sees a key
    prior: dict[bytes, bytes] = {}
    for k, v in headers:
        if k in _CHAINED:
            prior[k] = prior[k] + b", " + v if k in prior else v
    out = [(k, v) for k, v in headers if k not in drop]
    rid = request_id_of(scope)
    if rid:
        out.append((b"x-request-id", rid.encode("latin-1")))  # one id for the whole hop, in both servers' logs
    if trusted and b"authorization" not in prior:
        out.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in auth_headers().items())
    prior_via = prior.get(_VIA_BYTES)
    out.append((_VIA_BYTES, prior_via + b", " + via if prior_via else via))
    client = scope["client"][0].encode("latin-1") if scope.get("client") else b""
    forwarded = prior.get(b"x-forwarded-for")
    out.append((b"x-forwarded-for", forwarded + b", " + client if forwarded else client))
    out.append((b"x-forwarded-prefix", b"/servers/" + name.encode("utf-8")))
    return out


class Proxy:
    """A plain ASGI app, mounted at `/servers/` inside the shared middleware (auth, request ids, metrics,
    limits, error replies) but outside FastAPI's routing and request objects: their CPU per request is
    throughput taken from the servers behind the head on a machine those servers keep busy."""

    def __init__(self, lookup: Callable[[str], Instance | None], *, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0, max_connections: int = 1024) -> None:
        self.lookup = lookup
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.via = secrets.token_hex(8).encode()  # this head's id in X-Gymserve-Via
        self._pool: ConnectionPool | None = None

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:  # made on the serving loop, on first use
            self._pool = ConnectionPool(connect_timeout_s=self.connect_timeout_s, read_timeout_s=self.read_timeout_s,
                                        max_connections=self.max_connections)
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    def _check_loop(self, scope: Scope) -> None:
        given = b",".join(v for k, v in scope["headers"] if k == _VIA_BYTES)
        hops = [h.strip() for h in given.split(b",") if h.strip()]
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
        origin, target = _target(inst.url, scope, rest)
        headers = _forward_headers(scope, name, trusted=inst.trusted, via=self.via)
        method = scope["method"]
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        data: bytes | AsyncIterator[bytes] | None = None
        if length is not None and length.isdigit() and int(length) <= BUFFER_MAX_BYTES:
            data = await _read_body(receive) if int(length) else None
            if data is not None:
                headers.append((b"content-length", b"%d" % len(data)))
        elif length is not None or any(k == b"transfer-encoding" for k, _ in scope["headers"]):
            data = _chunks(receive)
            if length is not None:
                headers.append((b"content-length", length))  # sent as is, not re-chunked
        try:
            upstream = await self.pool.request(origin, method, target, headers, data)
        except UpstreamTimeout as exc:
            waited = (f"did not accept a connection within the {self.connect_timeout_s:g}s connect timeout"
                      if exc.connecting else f"did not answer {method} /{rest} within the "
                      f"{self.read_timeout_s:g}s read timeout")
            raise UpstreamError(f"server {name!r} at {inst.url} {waited}", kind=FailureKind.TIMEOUT) from None
        except UpstreamClosed as exc:
            raise UpstreamError(f"cannot reach server {name!r} at {inst.url}: {exc}",
                                kind=FailureKind.UPSTREAM) from None
        try:
            await self._reply(upstream, name, inst.url, send)
        finally:
            upstream.release()

    async def _reply(self, upstream: Reply, name: str, base: str, send: Send) -> None:
        headers = [(k, v) for k, v in upstream.headers if k not in _RESPONSE_DROP_BYTES]
        size = upstream.header(b"content-length")
        if upstream.header(b"transfer-encoding") is not None or not (size and size.isdigit()):
            size = None  # unsized: streamed, and chunked again by our server
        if size is not None:
            headers.append((b"content-length", size))
        if size is not None and int(size) <= BUFFER_MAX_BYTES:
            try:
                payload = await upstream.read()
            except (UpstreamTimeout, UpstreamClosed) as exc:
                raise UpstreamError(f"server {name!r} at {base} broke off its reply: {exc}",
                                    kind=FailureKind.TIMEOUT if isinstance(exc, UpstreamTimeout)
                                    else FailureKind.UPSTREAM) from None
            await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        try:
            async for chunk in upstream.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (UpstreamTimeout, UpstreamClosed) as exc:  # the status line is sent: all we can do is cut
            log.warning("stream from %s broke off: %s", name, exc)
        await send({"type": "http.response.body", "body": b""})


def _split(scope: Scope) -> tuple[str, str]:
    """(server name, the rest of the path as the client encoded it) of `/servers/<name>/<rest>`."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    parts = raw.decode("latin-1")[len(scope.get("root_path", "")):].split("/", 3)  # ['', 'servers', name, rest]
    if len(parts) < 3 or parts[1] != "servers" or not parts[2]:
        raise NotFound("expected /servers/<name>/<path>: a server's name (see GET /server_instances)")
    return unquote(parts[2]), parts[3] if len(parts) > 3 else ""


def _target(base: str, scope: Scope, rest: str) -> tuple[Origin, bytes]:
    """Where `base` lives, and the request target: `base`'s path + the request's path as the client
    encoded it (never decoded twice) + its query.

    A segment that the upstream would read as `.` or `..` (`%2e%2e` included) is refused rather than
    resolved, so the target stays under `base`'s path. `%252e` is passed on as is: the upstream
    decodes it once, to a literal `%2e`."""
    for segment in rest.split("/"):
        decoded = unquote(segment)
        if decoded in (".", ".."):
            raise BadRequest(f"path: a {decoded!r} segment is not allowed in a proxied path ({unquote(rest)!r})")
    origin, prefix = _origin(base)
    query: bytes = scope.get("query_string", b"")
    target = prefix + b"/" + rest.encode("latin-1")
    return origin, target + b"?" + query if query else target


@functools.lru_cache(maxsize=1024)
def _origin(base: str) -> tuple[Origin, bytes]:
    """A registered URL's origin and path prefix (`http://host:port/prefix`), parsed once."""
    parts = urlsplit(base)
    return Origin(parts.scheme, parts.hostname or "", parts.port), parts.path.rstrip("/").encode("latin-1")


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


async def _chunks(receive: Receive) -> AsyncIterator[bytes]:
    """A request body streamed upstream; the body limit's 413 (raised by `receive`) comes out of it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        if message.get("body"):
            yield message["body"]
        if not message.get("more_body", False):
            return
