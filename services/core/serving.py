"""How every server is served: uvicorn with a deadline on reading request headers.

uvicorn times out idle keep-alive connections but not a client that sends its request line
and headers one byte at a time (slowloris): each byte restarts nothing and the connection is
held forever. `guarded_protocol` gives each request `header_timeout_s` from its first byte to
its last header, then answers 408 and closes. The body's deadline is the input-guard middleware's.
"""
from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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
        self._arm()  # a connection that never sends a byte is held no longer than one that trickles

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # idle keep-alive connections are uvicorn's keep-alive timeout's job

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

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
