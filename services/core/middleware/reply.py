"""A JSON reply sent straight on the ASGI channel, for middleware that answers before the app runs."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.types import Message, Send


class TrackedSend:
    """`send`, remembering whether the reply has started: a layer can answer with an error of its
    own only before that."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


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
