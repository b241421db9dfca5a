"""Bearer auth from GYMSERVE_API_KEY: every endpoint but /, /health and /ready. The key never travels in argv."""
from __future__ import annotations

import hmac
import os
from pathlib import Path

OPEN_PATHS = frozenset({"/", "/health", "/ready"})


def api_key() -> str | None:
    """The shared key, from GYMSERVE_API_KEY or the file named by GYMSERVE_API_KEY_FILE."""
    key = os.environ.get("GYMSERVE_API_KEY")
    if not key and os.environ.get("GYMSERVE_API_KEY_FILE"):
        key = Path(os.environ["GYMSERVE_API_KEY_FILE"]).read_text().strip()
    return key or None


def auth_headers() -> dict[str, str]:
    key = api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def authorized(header_value: str | None, key: str) -> bool:
    if not header_value:
        return False
    scheme, _, token = header_value.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
