"""Bearer auth: with GYMSERVE_API_KEY set, everything but the liveness/readiness probes needs the key
(WebSocket handshakes included)."""
from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ..auth import OPEN_PATHS, api_key, authorized
from ..errors import error_body
from .paths import route_path
from .reply import send_json
from .request_id import request_id_of


class AuthMiddleware:
    """The key is read per request so a rotated key file takes effect without a restart."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = api_key() if scope["type"] in ("http", "websocket") else None
        if key and route_path(scope) not in OPEN_PATHS:
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"), None)
            if not authorized(header, key):
                if scope["type"] == "websocket":  # refused before the handshake: the client gets a 403
                    await send({"type": "websocket.close", "code": 1008, "reason": "missing or invalid bearer token"})
                    return
                await send_json(send, 401, error_body(
                    "missing or invalid bearer token (set Authorization: Bearer <GYMSERVE_API_KEY>)",
                    "unauthorized", request_id_of(scope)), extra_headers=[(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)
