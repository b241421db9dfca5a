"""What has gone out of a request's reply, recorded once for every layer; JSON error replies.

Every layer needs to know something about the reply (has it started? its status? is it done?) and
the request id must ride on it. Each layer wrapping `send` for that cost every reply message a
coroutine call per layer; instead the outermost layer (`ReplyMiddleware`) wraps it once, stamps the
headers other layers asked for, and keeps a `Reply` in the scope for the others to read.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_KEY = "gymserve.reply"


class Reply:
    """The reply so far: `status` is meaningful once `started`; `headers` are added to the start line."""

    __slots__ = ("started", "status", "finished", "headers")

    def __init__(self) -> None:
        self.started = False
        self.status = 0
        self.finished = False
        self.headers: list[tuple[bytes, bytes]] = []


def reply_of(scope: Mapping[str, Any]) -> Reply:
    """The request's `Reply` (a fresh one where no `ReplyMiddleware` is outside the caller)."""
    return scope.get(_KEY) or Reply()


class ReplyMiddleware:
    """Outermost layer: the one `send` wrapper of the stack."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reply = scope[_KEY] = Reply()

        async def send_recorded(message: Message) -> None:
            if message["type"] == "http.response.start":
                reply.started, reply.status = True, message["status"]
                if reply.headers:
                    message["headers"] = [*message.get("headers", ()), *reply.headers]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                reply.finished = True
            await send(message)

        await self.app(scope, receive, send_recorded)


async def send_json(send: Send, status: int, body: dict[str, Any],
                    extra_headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                    *extra_headers],
    })
    await send({"type": "http.response.body", "body": payload})
