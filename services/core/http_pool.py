"""A pool of keep-alive HTTP/1.1 connections whose replies are parsed by httptools (uvicorn's own C parser).

Why not aiohttp here: the head's proxy makes one upstream call per request it forwards, and aiohttp's
request path (request and response objects, multidicts, timers, tracing hooks, payload registry) cost
the head about 190 µs of CPU per call, 45% of all its CPU per proxied request
(`benchmarks/head_cpu.py`). On a machine whose cores the environment servers keep busy that CPU is
their throughput. Here a request is one `write` of bytes the caller has already laid out, and a reply
is the callbacks of the parser uvicorn uses for requests.

What it does and does not do: HTTP/1.1 over TCP or TLS; `Content-Length`, chunked and read-to-close
replies; request bodies in one piece or streamed (chunked when unsized); flow control both ways;
a connect timeout, and a read timeout that is the longest silence while a reply is awaited or read;
1xx interim replies skipped; a reply that comes before a streamed body is whole (a 413) is the
reply; one retry of an idempotent request on a reused connection that the server had closed; a
stray second reply retires its connection. No redirects, cookies, proxies or decompression: the
head passes bytes through. Every case is on the wire in `tests/unit/test_core_http_pool.py`.
"""
from __future__ import annotations

import asyncio
import collections
import ssl
from typing import AsyncIterator

import httptools

Headers = list[tuple[bytes, bytes]]

_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_READ_HIGH_WATER = 1 << 20  # reading pauses while this much of a streamed reply waits for its consumer


class UpstreamClosed(ConnectionError):
    """The connection failed or ended before the reply was complete."""


class UpstreamTimeout(TimeoutError):
    """No connection within the connect timeout, or silence longer than the read timeout."""

    def __init__(self, message: str, *, connecting: bool) -> None:
        super().__init__(message)
        self.connecting = connecting


class Origin:
    """Where requests go: scheme, host and port, and the Host header they carry."""

    __slots__ = ("tls", "host", "port", "host_header", "key")

    def __init__(self, scheme: str, host: str, port: int | None) -> None:
        self.tls = scheme == "https"
        self.host = host
        self.port = port or (443 if self.tls else 80)
        shown = f"[{host}]" if ":" in host else host
        header = shown if port is None else f"{shown}:{port}"
        self.host_header = header.encode("idna") if not header.isascii() else header.encode()
        self.key = (self.tls, host, self.port)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self, pool: ConnectionPool, key: tuple[bool, str, int]) -> None:
        self.pool = pool
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reused = False
        self.spent = False
        self.busy = False  # a request is in flight (bytes at any other time are a protocol error)
        self.idle_since = 0.0
        self.closed = False
        self._writable: asyncio.Future[None] | None = None
        self._begin_request(head_only=False)

    def _begin_request(self, *, head_only: bool) -> None:
        self.head_only = head_only  # a reply to HEAD has no body, whatever its Content-Length says
        self.head: asyncio.Future[tuple[int, Headers]] = self.loop.create_future()
        self.headers: Headers = []
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False  # reading paused until the consumer takes what is buffered
        self.done = False
        self.reusable = False
        self.error: BaseException | None = None
        self.received = False  # any byte of this reply
        self.interim = False
        self.to_close = False  # the reply was framed by the connection's end
        self.waiter: asyncio.Future[None] | None = None
        self.last_data = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.busy:
            self.abort()  # nothing was asked: whatever this is (a 408 of an idle timeout), the connection is spent
            return
        self.received = True
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamClosed(f"malformed reply: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self.to_close and self.head.done() and not self.done:
            self.on_message_complete()  # a reply without length ends with the connection
        elif not self.done:
            self._fail(UpstreamClosed("the server closed the connection" + (f": {exc}" if exc else "")))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.head.done() and not self.interim:
            self.spent = True  # a second reply to one request: whatever it is, the connection is not reused

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.spent:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.spent:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.interim = True  # 100 Continue, 103 Early Hints: the real reply follows
            self.headers = []
            return
        names = {name for name, _ in self.headers}
        self.to_close = b"content-length" not in names and b"transfer-encoding" not in names and status not in (
            204, 304)
        if not self.head.done():
            self.head.set_result((status, self.headers))
        if self.head_only:
            self.to_close = False
            self._complete(reusable=False)

    def on_body(self, body: bytes) -> None:
        if self.spent:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        if not self.done:
            self._complete(reusable=not self.to_close and self.parser.should_keep_alive())

    # the pool's side
    def _complete(self, *, reusable: bool) -> None:
        self.done = True
        self.reusable = reusable and not self.closed
        self._disarm()
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.done:
            return
        self.done = True
        self.reusable = False
        self.error = error
        self._disarm()
        if not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved: a failure nobody awaits is not logged as "never retrieved"
        self._wake()
        self.abort()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def arm(self, timeout_s: float) -> None:
        """The read timeout: checked when it would run out, against the time of the last byte read."""
        self.last_data = self.loop.time()
        self.timer = self.loop.call_at(self.last_data + timeout_s, self._check_silence, timeout_s)

    def _check_silence(self, timeout_s: float) -> None:
        self.timer = None
        now = self.loop.time()
        if self.paused:  # the silence is ours (the consumer is behind): the server's clock restarts on resuming
            wait = timeout_s
        elif now - self.last_data >= timeout_s:
            self._fail(UpstreamTimeout(f"no reply within the {timeout_s:g}s read timeout", connecting=False))
            return
        else:
            wait = timeout_s - (now - self.last_data)
        self.timer = self.loop.call_at(now + wait, self._check_silence, timeout_s)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    async def writable(self) -> None:
        if self._writable is not None:
            await self._writable

    async def next_chunk(self) -> bytes | None:
        """The next piece of the reply's body; None at its end."""
        while not self.chunks:
            if self.done:
                if self.error is not None:
                    raise self.error
                return None
            self.waiter = self.loop.create_future()
            await self.waiter
            self.waiter = None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered <= _READ_HIGH_WATER and self.transport is not None and not self.closed:
            self.paused = False
            self.last_data = self.loop.time()  # the server's silence counts from here
            self.transport.resume_reading()
        return chunk

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Reply:
    """An upstream's reply: its status and headers (names lower-cased), its body read whole or streamed.
    `release()` (always, in a `finally`) returns the connection to the pool if the body was read to
    its end, and closes it otherwise."""

    __slots__ = ("status", "headers", "_conn", "_pool")

    def __init__(self, status: int, headers: Headers, conn: _Connection, pool: ConnectionPool) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self._pool = pool

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    async def read(self) -> bytes:
        conn = self._conn
        if conn.done and conn.error is None:  # the usual small reply: all of it came with its headers
            body = b"".join(conn.chunks)
            conn.chunks.clear()
            conn.buffered = 0
            return body
        parts = []
        async for chunk in self.chunks():
            parts.append(chunk)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._conn.next_chunk()) is not None:
            yield chunk

    def release(self) -> None:
        self._pool._release(self._conn)


class ConnectionPool:
    """Keep-alive connections by origin, at most `max_connections` requests at once (more wait in order).

    An idle connection is reused for at most `idle_s` (below the keep-alive timeout servers commonly
    use, gymserve's 30 s included, so the server rarely closes one as it is reused)."""

    def __init__(self, *, connect_timeout_s: float = 10.0, read_timeout_s: float = 600.0,
                 max_connections: int = 1024, idle_s: float = 15.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_s = idle_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[bool, str, int], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def request(self, origin: Origin, method: str, target: bytes, headers: Headers,
                      body: bytes | AsyncIterator[bytes] | None = None) -> Reply:
        """Send a request (`headers` without Host; with Content-Length where `body` is sized bytes, and
        none for a streamed body unless it is exact: an unsized stream goes chunked)."""
        if self._closed:
            raise UpstreamClosed("the connection pool is closed")
        await self._slots.acquire()
        try:
            conn = await self._connection(origin)
            try:
                return await self._exchange(conn, origin, method, target, headers, body)
            except UpstreamClosed:
                replayable = body is None or isinstance(body, bytes)
                if not (conn.reused and not conn.received and method in _IDEMPOTENT and replayable):
                    raise
                conn = await self._connection(origin, fresh=True)  # the server had closed it: once more, anew
                return await self._exchange(conn, origin, method, target, headers, body)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, conn: _Connection, origin: Origin, method: str, target: bytes, headers: Headers,
                        body: bytes | AsyncIterator[bytes] | None) -> Reply:
        conn._begin_request(head_only=method == "HEAD")
        conn.busy = True
        streamed = body is not None and not isinstance(body, bytes)
        chunked = streamed and not any(k == b"content-length" for k, _ in headers)
        lines = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method.encode("ascii"), target, origin.host_header)]
        lines.extend(b"%s: %s\r\n" % pair for pair in headers)
        if chunked:
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        if isinstance(body, bytes):
            lines.append(body)
        assert conn.transport is not None
        try:
            conn.arm(self.read_timeout_s)
            conn.transport.write(b"".join(lines))
            if streamed:
                assert body is not None and not isinstance(body, bytes)
                await self._send_body(conn, body, chunked=chunked)
            status, reply_headers = await conn.head
        except BaseException:
            conn._disarm()
            conn.abort()  # cancelled, or our own body failed: the connection is in no state to reuse
            raise
        return Reply(status, reply_headers, conn, self)

    @staticmethod
    async def _send_body(conn: _Connection, body: AsyncIterator[bytes], *, chunked: bool) -> None:
        """A streamed request body, as fast as the server reads it. A server that answers (a 413, say) or
        hangs up before the whole body is sent ends the sending: its reply or its error is what comes back."""
        assert conn.transport is not None
        async for chunk in body:
            if chunk:
                await conn.writable()
                if conn.head.done() or conn.closed:
                    conn.spent = True  # the request was cut short: the connection cannot carry another
                    return
                conn.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                conn.last_data = conn.loop.time()  # progress on our side is not the server's silence
        if chunked:
            conn.transport.write(b"0\r\n\r\n")

    async def _connection(self, origin: Origin, *, fresh: bool = False) -> _Connection:
        idle = self._idle.get(origin.key)
        if idle and not fresh:
            horizon = idle[-1].loop.time() - self.idle_s
            while idle and idle[0].idle_since < horizon:  # the oldest first: they expire in order
                idle.pop(0).abort()
            if idle:
                conn = idle.pop()  # the most recently used: the least likely to have been closed
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if origin.tls else None
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Connection(self, origin.key), origin.host, origin.port, ssl=tls,
                server_hostname=origin.host if tls else None), self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamTimeout(f"no connection within the {self.connect_timeout_s:g}s connect timeout",
                                  connecting=True) from None
        except OSError as exc:
            raise UpstreamClosed(f"cannot connect: {exc.strerror or exc}") from None
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _release(self, conn: _Connection) -> None:
        self._slots.release()
        conn.busy = False
        if conn.done and conn.reusable and not conn.spent and not conn.closed and not self._closed:
            conn.chunks.clear()  # a body the caller did not read is complete: the connection is clean
            conn.idle_since = conn.loop.time()  # (asyncio.get_running_loop() is a getpid() system call on 3.11)
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.abort()

    def _forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
