"""Unexpected exceptions become a JSON 500 (counted as a `crash`) instead of Starlette's plain-text page.

Answered here rather than by Starlette's outermost error middleware so the reply still
carries X-Request-Id and passes through the metrics layer.
"""
from __future__ import annotations

import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import error_body
from ..metrics import Metrics
from .reply import reply_of, send_json
from .request_id import request_id_of

log = logging.getLogger("gymserve")


class ErrorReplyMiddleware:
    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            self.metrics.failure("crash")
            if reply_of(scope).started:
                raise
            await send_json(send, 500, error_body(
                f"internal error: {type(exc).__name__}: {exc}", "internal_error", request_id_of(scope)))
