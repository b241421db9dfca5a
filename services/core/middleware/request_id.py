"""Request ids: taken from the caller's X-Request-Id or made up, kept in the scope, echoed on every reply."""
from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from .reply import reply_of

REQUEST_ID_HEADER = "x-request-id"
_HEADER = REQUEST_ID_HEADER.encode()
_IDS = random.Random(os.urandom(16))  # ids only tell requests apart: no system call per request for them
if hasattr(os, "register_at_fork"):  # a forked child must not repeat its parent's ids
    os.register_at_fork(after_in_child=lambda: _IDS.seed(os.urandom(16)))


def new_request_id() -> str:
    """16 hex digits from a per-process generator seeded by the OS (no `getrandom` per request)."""
    return "%016x" % _IDS.getrandbits(64)


def request_id_of(scope: Mapping[str, Any]) -> str | None:
    """The id this middleware stored for the request (None outside a gymserve app)."""
    return (scope.get("state") or {}).get("request_id")


class RequestIdMiddleware:
    """Outside every layer that may answer, so every reply (401, 413, 500 included) carries the id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _HEADER), None)
        request_id = given or new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        reply_of(scope).headers.append((_HEADER, request_id.encode("latin-1", "replace")))
        await self.app(scope, receive, send)
