"""How every server is served: uvicorn with a deadline on reading request headers, replies that
leave in one write, requests told when their connection is lost, and a garbage collector tuned for
a long-running server.

uvicorn times out idle keep-alive connections but not a client that sends its request line
and headers one byte at a time (slowloris): each byte restarts nothing and the connection is
held forever. `guarded_protocol` gives each request `header_timeout_s` from its first byte to
its last header, then answers 408 and closes. The body's deadline is the input-guard middleware's.

A server with a pass-through mount (the head's proxy) has the ordinary requests to it served from
here, below the ASGI stack, once their whole body is in (`services.core.passthrough`).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .middleware.disconnect import DISCONNECT_EXTENSION, DisconnectHooks
from .passthrough import PassThrough

# how long a request that may pass through waits for the rest of its body before the ordinary way reads
# it (and applies `body_timeout_s`): clients often send the body in a second write, right after the head
PASSTHROUGH_BODY_WAIT_S = 1.0

_TIMEOUT_REPLY = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                  b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a per-request header deadline (`header_timeout_s`) and the server's
    pass-through mounts (`passthrough`), both set by `guarded_protocol`."""

    header_timeout_s = 10.0
    passthrough: tuple[PassThrough, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._headers_since: float | None = None
        self._choosing = False
        self._deferred: tuple[RequestResponseCycle, Any, PassThrough] | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        """The header clock starts (a request's first byte, or a new connection). One timer per connection,
        re-armed only when it fires, not a timer per request: it is a cost on every request's path."""
        self._headers_since = self.loop.time()
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._check_headers)

    def _disarm(self) -> None:
        self._headers_since = None

    def _check_headers(self) -> None:
        self._header_timer = None
        if self._headers_since is None or self.transport.is_closing():
            return  # no request is reading its headers: the next one arms the timer again
        left = self._headers_since + self.header_timeout_s - self.loop.time()
        if left > 0:
            self._header_timer = self.loop.call_later(left, self._check_headers)
            return
        body = b'{"detail":"request headers not received within header_timeout_s=%g s"}' % self.header_timeout_s
        self.transport.write(_TIMEOUT_REPLY % (len(body), body))
        self.transport.close()

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
        self._choosing = True  # a request the server starts now (not a pipelined one) may pass through
        try:
            super().on_headers_complete()
        finally:
            self._choosing = False
        if self.cycle is not None:
            self.cycle.transport = self._replies  # type: ignore[assignment]
            scope: dict[str, Any] = self.cycle.scope  # type: ignore[assignment]
            scope.setdefault("extensions", {})[DISCONNECT_EXTENSION] = self._lost

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if self._choosing and app is self.app:  # (not uvicorn's own 503 app for a concurrency limit)
            mount = next((m for m in self.passthrough if m.takes(cycle.scope)), None)
            if mount is not None:
                self._deferred = (cycle, app, mount)  # decided once the body is in: `on_message_complete`
                return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        self._stop_body_timer()
        cycle, app, mount = deferred
        if not mount.admits(cycle.scope, cycle.body):
            super()._start_asgi_task(cycle, app)  # the layers answer it (401, 413, 400, a queue)
            return
        task = self.loop.create_task(mount.serve(cycle, self._lost))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deferred is not None:  # its body is not all in: wait a little (a client may send it next)
            if self.flow.read_paused or self.transport.is_closing():
                self._hand_over()
            elif self._body_timer is None:
                self._body_timer = self.loop.call_later(PASSTHROUGH_BODY_WAIT_S, self._hand_over)

    def _hand_over(self) -> None:
        """The deferred request goes the ordinary way, whose input guard reads the rest of the body."""
        self._stop_body_timer()
        deferred, self._deferred = self._deferred, None
        if deferred is not None and not self.transport.is_closing():
            super()._start_asgi_task(deferred[0], deferred[1])

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle keep-alive connections are uvicorn's keep-alive timeout's job

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._stop_body_timer()
        self._deferred = None
        super().connection_lost(exc)
        self._lost.lost()


def guarded_protocol(header_timeout_s: float, passthrough: tuple[PassThrough, ...] = ()) -> type[HeaderDeadlineProtocol]:
    """The protocol class for `uvicorn.run(http=...)` with this header deadline and these pass-through
    mounts (an app's `app.state.passthrough`)."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,),
                {"header_timeout_s": header_timeout_s, "passthrough": passthrough})


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
