"""`ANY /servers/{name}/{path}`: a streaming reverse proxy to a registered server.

Request and response bodies are streamed (never buffered whole), status codes and
end-to-end headers are kept; hop-by-hop headers are dropped as RFC 9110 asks.
An unknown name is a 404 naming it; an unreachable server a 502, a slow one a 504.

Upstream calls go through one aiohttp `ClientSession` (a pool of keep-alive connections) made on
the serving loop. The proxy is a plain ASGI app mounted inside the shared middleware, so the key,
the body limit, the JSON depth, admission, request ids, metrics and cancellation when the client
leaves are all the middleware's, checked once. Small bodies (up to `BUFFER_MAX_BYTES` with a
Content-Length) are passed on in one piece; larger or unsized ones (uploads, SSE streams) are
streamed, with flow control both ways. What an upstream may make the head buffer of its reply's
head is bounded by the client's parser limits (`MAX_REPLY_HEADERS`, `MAX_REPLY_FIELD_BYTES`).

Safety: the path is passed on exactly as the client encoded it (decoded once, by the server
that answers, so `%252e` stays `%2e` there) and a `.`/`..` segment is refused, so a request
cannot leave a registered URL's path prefix; each head stamps its id into `X-Gymserve-Via`
and refuses a request that already carries it (a registration pointing back at the head);
an unsized body that runs over the head's limit is a 413; the bearer key (the caller's or
the head's) goes only to servers of the head's stack, never to a self-registered URL; no
redirect is followed and no cookie is kept between calls.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import secrets
from typing import AsyncIterator, Callable
from urllib.parse import unquote, urlsplit

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
# an upstream's status line and each header line, and how many headers: what its reply's head may
# make the head hold (aiohttp refuses more, and the call is a 502)
MAX_REPLY_FIELD_BYTES = 8190
MAX_REPLY_HEADERS = 128
VIA_HEADER = "x-gymserve-via"
_VIA_BYTES = VIA_HEADER.encode()
MAX_VIA = 8  # heads a request may pass through (a chain of heads, each proxying to the next)
# the head sets these itself; `expect` was the head's to answer (it has read or streams the body)
_FORWARD_DROP = frozenset(h.encode() for h in HOP_BY_HOP) | {
    b"x-request-id", _VIA_BYTES, b"x-forwarded-for", b"x-forwarded-prefix", b"expect"}
_CHAINED = frozenset({_VIA_BYTES, b"x-forwarded-for", b"authorization"})  # a second value is appended
# headers aiohttp would add on its own: the client's are passed on, nothing is made up
_NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


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
    limits, admission, cancellation, error replies), outside FastAPI's routing and request objects:
    a byte-passing path needs none of them."""

    def __init__(self, lookup: Callable[[str], Instance | None], *, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0, max_connections: int = 1024) -> None:
        self.lookup = lookup
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.via = secrets.token_hex(8).encode()  # this head's id in X-Gymserve-Via
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the serving loop, on first use
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s,
                                              sock_read=self.read_timeout_s),
                cookie_jar=aiohttp.DummyCookieJar(),  # one caller's cookies are not another's
                auto_decompress=False, skip_auto_headers=_NOT_ADDED,
                max_line_size=MAX_REPLY_FIELD_BYTES, max_field_size=MAX_REPLY_FIELD_BYTES,
                max_headers=MAX_REPLY_HEADERS)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        url = _target(inst.url, scope, rest)
        headers = _forward_headers(scope, name, trusted=inst.trusted, via=self.via)
        method = scope["method"]
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        body: _Body | None = None
        data: bytes | AsyncIterator[bytes] | None = None
        if (length is not None and not (length.isdigit() and int(length) <= BUFFER_MAX_BYTES)) or (
                length is None and any(k == b"transfer-encoding" for k, _ in scope["headers"])):
            body = _Body(receive)
            data = body.chunks()
            if length is not None:
                headers.append((b"content-length", length))  # sent as is, not re-chunked
        else:  # small or none: read here, even when empty (a server's disconnect watch starts after it)
            data = await _read_body(receive) or None
        try:
            async with self.session.request(
                    method, url, headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                    data=data, allow_redirects=False) as upstream:
                await self._reply(upstream, name, inst.url, send)
        except aiohttp.ConnectionTimeoutError:
            _raise_body_error(body)
            raise UpstreamError(f"server {name!r} at {inst.url} did not accept a connection within the "
                                f"{self.connect_timeout_s:g}s connect timeout", kind=FailureKind.TIMEOUT) from None
        except asyncio.TimeoutError:
            _raise_body_error(body)
            raise UpstreamError(f"server {name!r} at {inst.url} did not answer {method} /{rest} within the "
                                f"{self.read_timeout_s:g}s read timeout", kind=FailureKind.TIMEOUT) from None
        except aiohttp.ClientError as exc:
            _raise_body_error(body)
            raise UpstreamError(f"cannot reach server {name!r} at {inst.url}: {type(exc).__name__}: {exc}",
                                kind=FailureKind.UPSTREAM) from None

    async def _reply(self, upstream: aiohttp.ClientResponse, name: str, base: str, send: Send) -> None:
        headers = [(k.lower(), v) for k, v in upstream.raw_headers if k.lower() not in _RESPONSE_DROP_BYTES]
        size = upstream.headers.get("content-length")
        if "transfer-encoding" in upstream.headers or not (size and size.isdigit()):
            size = None  # unsized: streamed, and chunked again by our server
        if size is not None:
            headers.append((b"content-length", size.encode()))
        if size is not None and int(size) <= BUFFER_MAX_BYTES:
            payload = await upstream.read()  # a failure here is still an error reply
            await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        try:
            async for chunk in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            # the status line is sent: the connection is cut, so the client cannot take the rest for whole
            log.warning("stream from %s at %s broke off: %s: %s", name, base, type(exc).__name__, exc)
            raise _BrokenReply(f"the reply of server {name!r} broke off") from None
        await send({"type": "http.response.body", "body": b""})


def _split(scope: Scope) -> tuple[str, str]:
    """(server name, the rest of the path as the client encoded it) of `/servers/<name>/<rest>`."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    parts = raw.decode("latin-1")[len(scope.get("root_path", "")):].split("/", 3)  # ['', 'servers', name, rest]
    if len(parts) < 3 or parts[1] != "servers" or not parts[2]:
        raise NotFound("expected /servers/<name>/<path>: a server's name (see GET /server_instances)")
    return unquote(parts[2]), parts[3] if len(parts) > 3 else ""


def _target(base: str, scope: Scope, rest: str) -> URL:
    """`base`'s origin and path + the request's path as the client encoded it (never decoded twice) +
    its query.

    A segment that the upstream would read as `.` or `..` (`%2e%2e` included) is refused rather than
    resolved, so the target stays under `base`'s path. `%252e` is passed on as is: the upstream
    decodes it once, to a literal `%2e`."""
    for segment in rest.split("/"):
        decoded = unquote(segment)
        if decoded in (".", ".."):
            raise BadRequest(f"path: a {decoded!r} segment is not allowed in a proxied path ({unquote(rest)!r})")
    origin, prefix = _origin(base)
    query: bytes = scope.get("query_string", b"")
    target = f"{origin}{prefix}/{rest}"
    return URL(target + "?" + query.decode("latin-1") if query else target, encoded=True)


@functools.lru_cache(maxsize=1024)
def _origin(base: str) -> tuple[str, str]:
    """A registered URL's origin (`http://host:port`) and path prefix, parsed once."""
    parts = urlsplit(base)
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")


class _ClientGone(Exception):
    """The client went away before it had sent its whole body."""


class _BrokenReply(Exception):
    """An upstream's reply broke off after its status line had been passed on."""


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
    """A request body streamed upstream. What stopped it (the body limit's 413, raised by `receive`, or
    the client leaving) is kept: the client library reports it only as a failed upload."""

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


def _raise_body_error(body: _Body | None) -> None:
    if body is not None and body.error is not None:
        raise body.error
