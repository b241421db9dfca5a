"""An HTTP client bound to one server under test, with the shared bearer key."""
from __future__ import annotations

from typing import Any

import httpx

TIMEOUT_S = 120.0  # generous: CI machines are loaded and some checks run real work (a sandbox, a model)


class Probe:
    def __init__(self, url: str, key: str | None, http: httpx.Client | None = None) -> None:
        """`http` replaces the network client (an in-process one, e.g. Starlette's TestClient)."""
        self.url = url.rstrip("/")
        self.key = key
        self.http = http or httpx.Client(base_url=self.url, timeout=TIMEOUT_S)

    def auth(self, key: str | None = None) -> dict[str, str]:
        key = self.key if key is None else key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def get(self, path: str, *, key: str | None = None, anonymous: bool = False, **kw: Any) -> httpx.Response:
        headers = {} if anonymous else self.auth(key)
        return self.http.get(path, headers={**headers, **kw.pop("headers", {})}, **kw)

    def post(self, path: str, json: Any = None, *, content: bytes | None = None, anonymous: bool = False,
             **kw: Any) -> httpx.Response:
        headers = {} if anonymous else self.auth()
        headers = {**headers, **kw.pop("headers", {})}
        if content is not None:
            headers.setdefault("content-type", "application/json")
            return self.http.post(path, content=content, headers=headers, **kw)
        return self.http.post(path, json=json, headers=headers, **kw)

    def close(self) -> None:
        self.http.close()


def error_message(response: httpx.Response) -> str:
    """The message of a gymserve error reply (`detail`, or `error.message`); empty when there is none."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    detail = body.get("detail")
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail:  # FastAPI's default validation shape
        return "; ".join(str(d.get("msg", d)) if isinstance(d, dict) else str(d) for d in detail)
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    return ""
