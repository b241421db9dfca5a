"""Request count, latency and in-flight gauge per route (the route template, not the raw path)."""
from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from ..metrics import Metrics
from .paths import route_path
from .reply import reply_of


class MetricsMiddleware:
    """Sits outside auth, body limit and error replies so their 401/413/500 are counted too."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reply = reply_of(scope)
        unanswered = 500  # what the client sees if nothing answers
        start = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            unanswered = 499  # cancelled unanswered: its client went away (or the server is stopping)
            raise
        finally:
            self.metrics.in_flight.dec()
            self._observe(scope, reply.status if reply.started else unanswered, time.perf_counter() - start)

    def _observe(self, scope: Scope, status: int, elapsed: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or ("unmatched" if status == 404 else route_path(scope)[:64])
        if path == "/metrics":
            return
        self.metrics.served(scope["method"], path, status, elapsed)
