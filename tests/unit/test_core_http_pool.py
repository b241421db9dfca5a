"""The head's upstream client (`services.core.http_pool`) against real sockets on 127.0.0.1: a scripted
server answers each request with the exact bytes a test gives it (framings, interim replies, a connection
closed at the wrong moment, silence), so each case is the wire as a real server could write it."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

import pytest

from services.core.http_pool import ConnectionPool, Origin, UpstreamClosed, UpstreamTimeout
from services.core.ports import free_port

Answer = Callable[[int, bytes, asyncio.StreamWriter], Awaitable[bool]]  # (connection no., request) -> keep open?


class Scripted:
    """A server whose replies the test writes; it records every connection and every request's bytes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> Origin:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return Origin("http", "127.0.0.1", self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.lower().split(b"\r\n")
                length = next((int(h.split(b":")[1]) for h in lines if h.startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                if any(h == b"transfer-encoding: chunked" for h in lines):
                    body = await reader.readuntil(b"0\r\n\r\n")
                self.requests.append(head + body)
                if not await self.answer(number, head + body, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client left, or the test is over
        finally:
            writer.close()


def reply(body: bytes = b"ok", *extra: bytes) -> Answer:
    async def answer(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"".join(h + b"\r\n" for h in extra)
                     + b"content-length: %d\r\n\r\n%s" % (len(body), body))
        return True
    return answer


async def test_a_sized_reply_and_its_connection_kept_for_the_next_request() -> None:
    script = Scripted(reply(b'{"reward": 1.0}', b"content-type: application/json", b"set-cookie: a=1",
                            b"Set-Cookie: b=2"))
    async with script as origin:
        pool = ConnectionPool()
        for _ in range(3):
            got = await pool.request(origin, "POST", b"/verify?x=1", [(b"content-length", b"2")], b"{}")
            try:
                assert got.status == 200 and await got.read() == b'{"reward": 1.0}'
                assert got.header(b"content-type") == b"application/json"
                assert [v for k, v in got.headers if k == b"set-cookie"] == [b"a=1", b"b=2"]  # both, names lowered
            finally:
                got.release()
        await pool.aclose()
    assert script.connections == 1 and len(script.requests) == 3
    first = script.requests[0]
    assert first.startswith(b"POST /verify?x=1 HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n" % origin.port)
    assert first.endswith(b"content-length: 2\r\n\r\n{}")


@pytest.mark.parametrize("framing", ["chunked", "until close"])
async def test_chunked_and_read_to_close_replies_are_whole(framing: str) -> None:
    async def answer(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello world")
        return False  # the end of the connection is the end of the reply

    script = Scripted(answer)
    async with script as origin:
        pool = ConnectionPool()
        for _ in range(2):
            got = await pool.request(origin, "GET", b"/", [])
            assert await got.read() == b"hello world"
            got.release()
        await pool.aclose()
    assert script.connections == (1 if framing == "chunked" else 2)  # a reply framed by the close is not reused


async def test_interim_replies_are_skipped_and_head_and_204_have_no_body() -> None:
    async def answer(_: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        if request.startswith(b"HEAD"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")  # the length of a GET's body
        elif b"/empty" in request:
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
                         b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone")
        return True

    async with Scripted(answer) as origin:
        pool = ConnectionPool(read_timeout_s=5)
        got = await pool.request(origin, "POST", b"/", [(b"content-length", b"0")], b"")
        assert got.status == 201 and await got.read() == b"done" and got.header(b"link") is None
        got.release()
        for method, path, status in (("HEAD", b"/", 200), ("GET", b"/empty", 204)):
            got = await asyncio.wait_for(pool.request(origin, method, path, []), 5)
            assert got.status == status and await asyncio.wait_for(got.read(), 5) == b""
            got.release()
        await pool.aclose()


async def _body(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def test_a_streamed_request_body_goes_chunked_unless_its_length_is_given() -> None:
    script = Scripted(reply())
    async with script as origin:
        pool = ConnectionPool()
        got = await pool.request(origin, "POST", b"/up", [], _body([b"abc", b"", b"defgh"]))
        got.release()
        got = await pool.request(origin, "POST", b"/up", [(b"content-length", b"8")], _body([b"abc", b"defgh"]))
        got.release()
        await pool.aclose()
    chunked, sized = script.requests
    assert b"transfer-encoding: chunked\r\n" in chunked and chunked.endswith(b"\r\n\r\n3\r\nabc\r\n5\r\ndefgh\r\n0\r\n\r\n")
    assert b"transfer-encoding" not in sized and sized.endswith(b"\r\n\r\nabcdefgh")


async def test_a_large_reply_streams_through_with_flow_control() -> None:
    size = 8 << 20

    async def answer(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        return True

    async with Scripted(answer) as origin:
        pool = ConnectionPool()
        got = await pool.request(origin, "GET", b"/big", [])
        received = 0
        async for chunk in got.chunks():
            received += len(chunk)
            await asyncio.sleep(0)  # a consumer slower than the socket: the pool pauses reading meanwhile
        got.release()
        await pool.aclose()
    assert received == size


async def test_a_consumer_slower_than_the_read_timeout_is_not_the_servers_silence(monkeypatch) -> None:
    size = 4 << 20
    loop = asyncio.get_running_loop()
    timers = []
    call_at = loop.call_at
    monkeypatch.setattr(loop, "call_at", lambda when, *a, **k: (timers.append(when), call_at(when, *a, **k))[1])

    async def answer(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + b"x" * size)
        return True

    async with Scripted(answer) as origin:
        pool = ConnectionPool(read_timeout_s=0.3)
        got = await pool.request(origin, "GET", b"/big", [])
        chunks = got.chunks()
        received = len(await chunks.__anext__())
        await asyncio.sleep(1.0)  # reading is paused meanwhile: over three read timeouts, all of them ours
        async for chunk in chunks:
            received += len(chunk)
        got.release()
        await pool.aclose()
    assert received == size
    assert len(timers) <= 8  # the read timeout is looked at once per timeout while paused, not in a busy loop


async def test_silence_is_a_read_timeout_and_a_closed_port_cannot_be_reached() -> None:
    async def silent(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    async with Scripted(silent) as origin:
        pool = ConnectionPool(read_timeout_s=0.3)
        with pytest.raises(UpstreamTimeout, match="0.3s read timeout") as caught:
            await asyncio.wait_for(pool.request(origin, "GET", b"/", []), 10)
        assert not caught.value.connecting
        await pool.aclose()
    with pytest.raises(UpstreamClosed, match="cannot connect"):
        await ConnectionPool().request(Origin("http", "127.0.0.1", free_port()), "GET", b"/", [])


async def test_malformed_reply_is_an_error_not_a_hang() -> None:
    async def garbage(_: int, __: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SMTP ready\r\n\r\n")
        return True

    async with Scripted(garbage) as origin:
        with pytest.raises(UpstreamClosed, match="malformed reply"):
            await asyncio.wait_for(ConnectionPool().request(origin, "GET", b"/", []), 10)


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_reused_connection_the_server_closed_is_retried_only_when_idempotent(method: str) -> None:
    async def answer(number: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        if number == 1 and request.startswith(b"%s /second" % method.encode()):
            return False  # the second request on the first connection: closed unanswered
        await reply()(number, request, writer)
        return True

    script = Scripted(answer)
    async with script as origin:
        pool = ConnectionPool()
        (await pool.request(origin, method, b"/first", [])).release()  # its body unread: the connection is kept
        if method == "GET":
            got = await pool.request(origin, method, b"/second", [])
            assert await got.read() == b"ok"
            got.release()
        else:
            with pytest.raises(UpstreamClosed, match="closed the connection"):
                await pool.request(origin, method, b"/second", [])  # it may have run: never sent twice
        await pool.aclose()
    sent = sum(r.startswith(b"%s /second" % method.encode()) for r in script.requests)
    assert (sent, script.connections) == ((2, 2) if method == "GET" else (1, 1))


async def test_cancelling_a_request_closes_its_connection_and_frees_its_slot() -> None:
    async def answer(_: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/slow" in request:
            await asyncio.sleep(30)
        return await reply()(_, request, writer)

    script = Scripted(answer)
    async with script as origin:
        pool = ConnectionPool(max_connections=1)
        slow = asyncio.create_task(pool.request(origin, "GET", b"/slow", []))
        await asyncio.sleep(0.2)
        queued = asyncio.create_task(pool.request(origin, "GET", b"/next", []))
        await asyncio.sleep(0.2)
        assert not queued.done()  # one connection at most: the second waits its turn
        slow.cancel()
        got = await asyncio.wait_for(queued, 10)
        assert await got.read() == b"ok"
        got.release()
        await pool.aclose()
    assert script.connections == 2  # the cancelled one's connection was not reused


@pytest.mark.parametrize("when", ["with the reply", "while it is read", "once it is idle"])
async def test_a_second_reply_is_not_mixed_into_the_first_and_retires_its_connection(when: str) -> None:
    async def answer(_: int, request: bytes, writer: asyncio.StreamWriter) -> bool:
        stray = b"HTTP/1.1 408 Request Timeout\r\nx-stray: 1\r\ncontent-length: 5\r\n\r\nstray"  # unasked
        if when == "with the reply":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" + stray)  # in one segment
        else:
            await reply()(_, request, writer)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(stray)
        return True

    script = Scripted(answer)
    async with script as origin:
        pool = ConnectionPool()
        for _ in range(2):
            got = await pool.request(origin, "GET", b"/", [])
            if when != "once it is idle":
                await asyncio.sleep(0.1)  # the stray reply arrives while the caller holds the connection
            assert got.status == 200 and await got.read() == b"ok" and got.header(b"x-stray") is None
            got.release()
            await asyncio.sleep(0.1)
        await pool.aclose()
    assert script.connections == 2


async def test_a_server_that_answers_before_the_whole_body_is_sent_is_heard() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the headers only: the body is too large to read at all
        writer.write(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 8\r\nconnection: close\r\n\r\ntoo big!")
        await writer.drain()
        writer.close()

    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < 1 << 30:
            sent += 65536
            yield b"x" * 65536

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    try:
        pool = ConnectionPool(read_timeout_s=10)
        got = await asyncio.wait_for(pool.request(Origin("http", "127.0.0.1", server.sockets[0].getsockname()[1]),
                                                  "POST", b"/upload", [], endless()), 30)
        assert got.status == 413 and await got.read() == b"too big!"
        got.release()
        await pool.aclose()
    finally:
        server.close()
        await server.wait_closed()
    assert sent < 1 << 30  # the sending stopped when the reply came
