"""Request-body size limit: refused up front by Content-Length, or cut off while streaming in."""
from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import error_body
from .reply import reply_of, send_json
from .request_id import request_id_of


class _BodyTooLarge(Exception):
    """Raised from `receive` when a body without (or with a lying) Content-Length runs over."""


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.limit:
            await send_json(send, 413, error_body(
                f"request body of {length} bytes exceeds the limit of {self.limit} bytes",
                "payload_too_large", request_id_of(scope)))
            return

        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, receive_limited, send)
        except _BodyTooLarge:
            if reply_of(scope).started:
                raise
            await send_json(send, 413, error_body(
                f"request body exceeds the limit of {self.limit} bytes", "payload_too_large", request_id_of(scope)))
