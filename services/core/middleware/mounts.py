"""Plain ASGI apps served under a path prefix, innermost in the shared middleware.

A mounted app still passes auth, request ids, metrics, admission and the input limits, but skips
FastAPI's routing, exception and request/response machinery. That is for the hot path of a server
that only passes bytes on (the head's proxy): on a machine whose cores the servers behind it keep
busy, its CPU per request is throughput taken from them. A `GymError` the app raises before it
has replied becomes the same JSON error reply, counted the same way, as from a FastAPI route.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import GymError, counted_failure, gym_error_body
from ..metrics import Metrics
from .paths import route_path
from .reply import reply_of, send_json
from .request_id import request_id_of


class MountsMiddleware:
    """`mounts` maps a path template (`/servers/{name}/{path:path}`) to the app serving every path
    that starts with its literal part (`/servers/`); the template is the request's metrics label."""

    def __init__(self, app: ASGIApp, *, mounts: Mapping[str, ASGIApp], metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self.mounts = [(template.split("{", 1)[0], SimpleNamespace(path=template), mounted)
                       for template, mounted in mounts.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.mounts:
            path = route_path(scope)
            for prefix, route, mounted in self.mounts:
                if path.startswith(prefix):
                    scope["route"] = route
                    await self._serve(mounted, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(self, mounted: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await mounted(scope, receive, send)
        except GymError as exc:
            if reply_of(scope).started:
                raise
            self.metrics.failure(counted_failure(exc))
            await send_json(send, exc.status_code, gym_error_body(exc, request_id_of(scope)))
