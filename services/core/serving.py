"""How every server is served: uvicorn with a deadline on reading request headers, replies that
leave in one write, requests told when their connection is lost, and a garbage collector tuned for
a long-running server.

uvicorn times out idle keep-alive connections but not a client that sends its request line
and headers one byte at a time (slowloris): each byte restarts nothing and the connection is
held forever. `guarded_protocol` gives each request `header_timeout_s` from its first byte to
its last header, then answers 408 and closes. The body's deadline is the input-guard middleware's.
"""
from __future__ import annotations

import asyncio
import gc
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .middleware.disconnect import DISCONNECT_EXTENSION, DisconnectHooks

_TIMEOUT_REPLY = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                  b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a per-request header deadline (`header_timeout_s`, set by `guarded_protocol`)."""

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._replies = CoalescingTransport(transport, self.loop)  # a connection's replies go out one after another
        self._lost = DisconnectHooks()  # the requests on this connection, cut when it goes
        self._arm()  # a connection that never sends a byte is held no longer than one that trickles

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self.cycle is not None:
            self.cycle.transport = self._replies  # type: ignore[assignment]
            scope: dict[str, Any] = self.cycle.scope  # type: ignore[assignment]
            scope.setdefault("extensions", {})[DISCONNECT_EXTENSION] = self._lost

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle keep-alive connections are uvicorn's keep-alive timeout's job

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        self._lost.lost()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        body = b'{"detail":"request headers not received within header_timeout_s=%g s"}' % self.header_timeout_s
        self.transport.write(_TIMEOUT_REPLY % (len(body), body))
        self.transport.close()


def guarded_protocol(header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for `uvicorn.run(http=...)` with this header deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": header_timeout_s})


# Young-generation collections every this many container allocations instead of Python's 700.
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Freeze what start-up built (modules, the app, its routes and models) out of the collector's
    reach, and collect the young generation less often. With the defaults a server spends much of
    its CPU per request re-scanning the same start-up heap: this alone took about a quarter off the
    head's CPU per proxied request (`benchmarks/head_cpu.py` measures the head's). Cycles are still
    collected, only in larger batches; the memory they hold meanwhile grows by a few MB at most."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 10, 10)


class CoalescingTransport:
    """The reply's transport as uvicorn's request cycle sees it: the status line and headers are held
    until the body's first write (or the end of the loop's turn), so a small reply leaves in one
    segment: one write system call instead of two, and one read for the client."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            if data.startswith(b"HTTP/"):
                self._held = data
                self._loop.call_soon(self.flush)
                return
            self._transport.write(data)
            return
        held, self._held = self._held, None
        self._transport.write(held + data)

    def flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
