"""A mounted plain ASGI app (services/core/middleware/mounts.py) in-process: it is served under its prefix
inside the shared middleware (auth, request ids, limits, metrics under the mount's template), a `GymError`
it raises is the usual JSON error reply, and every other path still reaches FastAPI's routes."""
from __future__ import annotations

import httpx

from services.core.app import create_app
from services.core.config import ServerConfig
from services.core.errors import NotFound

TEMPLATE = "/things/{name}/{path:path}"


async def things(scope, receive, send) -> None:
    """Echoes the path and the body it got; `/things/missing/...` raises NotFound."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    if scope["path"].startswith("/things/missing/"):
        raise NotFound("no thing named 'missing'")
    payload = scope["path"].encode() + b" " + body
    await send({"type": "http.response.start", "status": 201,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def make_client(max_body_bytes: int = 1000) -> httpx.AsyncClient:
    config = ServerConfig(name="unit", kind="resources/unit", max_body_bytes=max_body_bytes, head_url=None)
    app = create_app(config, mounts={TEMPLATE: things})

    @app.get("/plain")
    async def plain() -> dict:
        return {"ok": True}

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://unit")


async def test_a_mount_serves_its_prefix_and_fastapi_the_rest(monkeypatch):
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    monkeypatch.delenv("GYMSERVE_API_KEY_FILE", raising=False)
    async with make_client() as c:
        r = await c.post("/things/a/b?x=1", content=b"hello", headers={"X-Request-Id": "rid-7"})
        assert r.status_code == 201 and r.text == "/things/a/b hello"
        assert r.headers["x-request-id"] == "rid-7"
        assert (await c.get("/plain")).json() == {"ok": True}
        for path in ("/things/c/d", "/things/e/f"):
            await c.get(path)
        text = (await c.get("/metrics")).text
    # one label for every mounted path (its template), not one per raw path
    assert f'gymserve_requests_total{{method="GET",path="{TEMPLATE}",status="201"}} 2.0' in text
    assert 'path="/things/c/d"' not in text


async def test_a_gym_error_from_a_mount_is_a_json_reply(monkeypatch):
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    monkeypatch.delenv("GYMSERVE_API_KEY_FILE", raising=False)
    async with make_client() as c:
        r = await c.get("/things/missing/x", headers={"X-Request-Id": "rid-8"})
    assert r.status_code == 404
    assert r.json()["detail"] == "no thing named 'missing'" and r.json()["error"]["request_id"] == "rid-8"


async def test_a_mount_is_behind_auth_and_the_body_limit(monkeypatch):
    monkeypatch.setenv("GYMSERVE_API_KEY", "sekrit")
    async with make_client(max_body_bytes=10) as c:
        assert (await c.post("/things/a/b", content=b"x")).status_code == 401
        key = {"Authorization": "Bearer sekrit"}
        assert (await c.post("/things/a/b", content=b"x", headers=key)).status_code == 201
        too_big = await c.post("/things/a/b", content=b"x" * 100, headers=key)
        assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "payload_too_large"


async def test_one_record_of_the_reply_serves_every_layer(monkeypatch):
    """The reply's record (the one `send` wrapper of the stack) gives the layers inside it the status,
    the start and the end of a streamed reply: the id rides on its start line, metrics count the status
    it started with, and a mount that fails after starting gets no second reply appended."""
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    monkeypatch.delenv("GYMSERVE_API_KEY_FILE", raising=False)

    async def stream(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 202, "headers": [(b"content-type", b"text/plain")]})
        for chunk in (b"one ", b"two "):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if scope["path"].endswith("/break"):
            raise NotFound("too late to answer with this")
        await send({"type": "http.response.body", "body": b"three"})

    config = ServerConfig(name="unit", kind="resources/unit", head_url=None)
    app = create_app(config, mounts={"/stream/{path:path}": stream})
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://unit") as c:
        r = await c.get("/stream/ok", headers={"X-Request-Id": "rid-s"})
        assert (r.status_code, r.text, r.headers["x-request-id"]) == (202, "one two three", "rid-s")
        broken = await c.get("/stream/break")
        assert broken.status_code == 202 and broken.text == "one two "  # cut, not followed by a JSON error
        metrics = (await c.get("/metrics")).text
    counted = [line for line in metrics.splitlines()
               if line.startswith("gymserve_requests_total{") and "/stream/" in line]
    assert counted == ['gymserve_requests_total{method="GET",path="/stream/{path:path}",status="202"} 2.0']
