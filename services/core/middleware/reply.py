"""A JSON reply sent straight on the ASGI channel, for middleware that answers before the app runs."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.types import Send


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
