"""Request bodies are read within a deadline and JSON nested too deep is refused, before any handler runs.

A client that trickles its body (slowloris) gets 408 once `body_timeout_s` has passed since the body
started, instead of holding a connection and a handler forever. JSON nested deeper than
`max_json_depth` gets 400: parsing, validating or echoing it would recurse past Python's limit (a 500).
The body is buffered here (the body limit outside bounds it) and replayed to the app in one message.
"""
from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Coroutine
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import error_body
from .reply import send_json
from .request_id import request_id_of

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NO_BODY = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


def json_depth_exceeds(raw: bytes | bytearray, limit: int) -> bool:
    """True when the JSON text `raw` nests arrays/objects deeper than `limit` (brackets inside strings
    do not count). Cheap for normal bodies: fewer brackets than the limit cannot nest past it."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for char in _STRING.sub(b"", raw).translate(None, _BRACKETS):
        depth += 1 if char in b"[{" else -1
        if depth > limit:
            return True
    return False


async def _within(reading: Coroutine[Any, Any, list[Message]], seconds: float) -> list[Message]:
    """`reading` with a deadline, in the caller's own task where Python has `asyncio.timeout` (3.11):
    `wait_for` would start a task per request to read a body that is usually there already."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await reading
    return await asyncio.wait_for(reading, seconds)


class InputGuardMiddleware:
    def __init__(self, app: ASGIApp, *, body_timeout_s: float, max_json_depth: int) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.max_json_depth = max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in _NO_BODY:
            await self.app(scope, receive, send)
            return
        try:
            messages = await _within(self._read_body(receive), self.body_timeout_s)
        except asyncio.TimeoutError:
            await send_json(send, 408, error_body(
                f"request body not received within body_timeout_s={self.body_timeout_s:g} s", "request_timeout",
                request_id_of(scope)), extra_headers=[(b"connection", b"close")])
            return
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        if body and json_depth_exceeds(body, self.max_json_depth):
            await send_json(send, 400, error_body(
                f"body: JSON nested deeper than max_json_depth={self.max_json_depth}", "bad_request",
                request_id_of(scope)))
            return
        replay: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
        replay += [m for m in messages if m["type"] != "http.request"]

        async def receive_buffered() -> Message:
            return replay.pop(0) if replay else await receive()

        await self.app(scope, receive_buffered, send)

    @staticmethod
    async def _read_body(receive: Receive) -> list[Message]:
        messages = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                return messages
