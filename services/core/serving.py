"""How every server is served: uvicorn with a deadline on reading request headers, a byte cap on
them, replies that leave in one write, requests told when their connection is lost, and a garbage
collector tuned for a long-running server.

uvicorn times out idle keep-alive connections but not a client that sends its request line
and headers one byte at a time (slowloris): each byte restarts nothing and the connection is
held forever. Nor does its httptools protocol bound how many bytes of headers it collects before
the app (and its key check) sees the request. `guarded_protocol` gives each request
`header_timeout_s` from its first byte to its last header (then 408 and close) and `max_header_bytes`
for its request line and headers (then 431 and close). The body's deadline is the input-guard
middleware's.

The protocol is uvicorn's own, configured through public names only: asyncio's `Protocol`
methods, the parser callbacks (`on_url`, `on_header`, `on_headers_complete`, ...), and the
`http=` class option; nothing with a leading underscore is overridden or called
(`tests/unit/test_core_serving.py` checks).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .middleware.disconnect import DISCONNECT_EXTENSION, DisconnectHooks

_REFUSAL = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
# what a header line costs beyond its name and value (`: ` and CRLF)
_LINE_OVERHEAD = 4


class HeadersTooLarge(Exception):
    """Stops the parser before the request reaches the app (its 431 is already written)."""


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a per-request header deadline (`header_timeout_s`) and a byte cap on the
    request line and headers (`max_header_bytes`), both set by `guarded_protocol`."""

    header_timeout_s = 10.0
    max_header_bytes = 64 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._headers_since: float | None = None
        self._reading_head = True  # the bytes that arrive belong to a request line or headers
        self._head_bytes = 0
        self._refused = False

    def _arm(self) -> None:
        """The header clock starts (a request's first byte, or a new connection). One timer per connection,
        re-armed only when it fires, not a timer per request: it is a cost on every request's path."""
        self._headers_since = self.loop.time()
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._check_headers)

    def _disarm(self) -> None:
        self._headers_since = None

    def _refuse(self, status: int, reason: bytes, detail: str) -> None:
        """Answers `status` and closes: the request never reaches the app."""
        self._refused = True
        body = b'{"detail":"%s"}' % detail.encode()
        self.transport.write(_REFUSAL % (status, reason, len(body), body))
        self.transport.close()

    def _check_headers(self) -> None:
        self._header_timer = None
        if self._headers_since is None or self.transport.is_closing():
            return  # no request is reading its headers: the next one arms the timer again
        left = self._headers_since + self.header_timeout_s - self.loop.time()
        if left > 0:
            self._header_timer = self.loop.call_later(left, self._check_headers)
            return
        self._refuse(408, b"Request Timeout",
                     f"request headers not received within header_timeout_s={self.header_timeout_s:g} s")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # a connection's replies go out one after another, each in one write
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._lost = DisconnectHooks()  # the requests on this connection, cut when it goes
        self._arm()  # a connection that never sends a byte is held no longer than one that trickles

    def data_received(self, data: bytes) -> None:
        """Bytes that arrive while a request's head is incomplete are counted as they come, whole lines or
        not (the parser holds a header line until it ends, however long): past `max_header_bytes`, 431."""
        if self._refused:
            return  # refused and closing: whatever else comes is not read
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._reading_head and self._head_bytes > self.max_header_bytes and not self._refused:
            self._refuse(431, b"Request Header Fields Too Large",
                         f"request line and headers exceed max_header_bytes={self.max_header_bytes}")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._reading_head = False  # what follows is the body
        # a head that arrived in one read is measured whole here, before the app sees the request
        size = len(self.url) + sum(len(name) + len(value) + _LINE_OVERHEAD for name, value in self.headers)
        if size > self.max_header_bytes:
            self._refuse(431, b"Request Header Fields Too Large",
                         f"request line and headers exceed max_header_bytes={self.max_header_bytes}")
            raise HeadersTooLarge()
        super().on_headers_complete()
        if self.cycle is not None:
            scope: dict[str, Any] = self.cycle.scope  # type: ignore[assignment]
            scope.setdefault("extensions", {})[DISCONNECT_EXTENSION] = self._lost

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head, self._head_bytes = True, 0  # the next request's head, if one comes

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle keep-alive connections are uvicorn's keep-alive timeout's job

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)
        self._lost.lost()


def guarded_protocol(header_timeout_s: float, max_header_bytes: int = HeaderDeadlineProtocol.max_header_bytes,
                     ) -> type[HeaderDeadlineProtocol]:
    """The protocol class for `uvicorn.run(http=...)` with this header deadline and header byte cap."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,),
                {"header_timeout_s": header_timeout_s, "max_header_bytes": max_header_bytes})


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


def set_cpu_policy(policy: str) -> None:
    """Put this process under `policy` (a config's `cpu_policy`), on Linux.

    `batch` is SCHED_BATCH: the same share of CPU, but a wakeup does not preempt the task running on a
    busy CPU. A server that mostly forwards (the head) wakes twice per request; on cores it shares with
    CPU-bound servers (`gymserve up` on a laptop) each of those wakeups preempted one of them and
    cost both a context switch (`benchmarks/head_proxy.py` measures what that takes from them)."""
    if policy != "batch" or not hasattr(os, "SCHED_BATCH"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:  # a sandbox that forbids it: the server runs as before
        logging.getLogger("gymserve").warning("cpu_policy=batch: cannot set SCHED_BATCH (%s)", exc)


class CoalescingTransport:
    """The reply's transport as uvicorn's request cycle sees it: the status line and headers are held
    until the body's first write (or the end of the loop's turn), so a small reply leaves in one
    segment: one write system call instead of two, and one read for the client. Once closed, it
    writes nothing more (a refused request's reply is the last thing on its connection)."""

    __slots__ = ("_transport", "_loop", "_held", "_closed")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._closed = False

    def write(self, data: bytes) -> None:
        if self._closed:
            return
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
        self._closed = True
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
