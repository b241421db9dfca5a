"""The app factory in-process (ASGI transport): auth on/off, 413, malformed JSON -> 400, request ids,
/metrics counts, readiness only after start-up hooks."""
from __future__ import annotations

import asyncio

import httpx
from fastapi import Request

from services.core.app import create_app, read_json
from services.core.config import ServerConfig
from services.core.errors import BadRequest


def make_app(max_body_bytes: int = 1000, gate: asyncio.Event | None = None):
    config = ServerConfig(name="unit", kind="resources/unit", max_body_bytes=max_body_bytes, head_url=None)

    async def slow_start() -> None:
        if gate is not None:
            await gate.wait()

    app = create_app(config, on_startup=[slow_start])

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("expected a JSON object")
        return {"got": body}

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("kaput")

    return app


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://unit")


async def test_auth_off_everything_open(monkeypatch):
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    monkeypatch.delenv("GYMSERVE_API_KEY_FILE", raising=False)
    async with client(make_app()) as c:
        assert (await c.post("/echo", json={"a": 1})).json() == {"got": {"a": 1}}
        assert (await c.get("/metrics")).status_code == 200


async def test_auth_on_requires_bearer_except_probes(monkeypatch):
    monkeypatch.setenv("GYMSERVE_API_KEY", "sekrit")
    async with client(make_app()) as c:
        for path in ("/", "/health"):
            r = await c.get(path)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
        r = await c.post("/echo", json={"a": 1})
        assert r.status_code == 401 and "Bearer" in r.json()["detail"]
        assert (await c.post("/echo", json={"a": 1}, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await c.get("/metrics")).status_code == 401
        ok = await c.post("/echo", json={"a": 1}, headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200 and ok.json() == {"got": {"a": 1}}


async def test_auth_key_from_file(monkeypatch, tmp_path):
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    (tmp_path / "key").write_text("from-file\n")
    monkeypatch.setenv("GYMSERVE_API_KEY_FILE", str(tmp_path / "key"))
    async with client(make_app()) as c:
        assert (await c.post("/echo", json={})).status_code == 401
        assert (await c.post("/echo", json={}, headers={"Authorization": "Bearer from-file"})).status_code == 200


async def test_a_rotated_key_file_takes_effect_on_the_next_request(monkeypatch, tmp_path, caplog):
    """The key file is cached by its stat: a file rewritten in place or replaced by a rename is read
    again at once, and a removed one leaves the server closed rather than open with the old key."""
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    key = tmp_path / "key"
    key.write_text("first\n")
    monkeypatch.setenv("GYMSERVE_API_KEY_FILE", str(key))

    async def status(token: str) -> int:
        return (await c.post("/echo", json={}, headers={"Authorization": f"Bearer {token}"})).status_code

    async with client(make_app()) as c:
        assert await status("first") == 200
        key.write_text("second-key\n")  # rewritten in place
        assert (await status("first"), await status("second-key")) == (401, 200)
        (tmp_path / "next").write_text("third-key!\n")
        (tmp_path / "next").replace(key)  # replaced atomically, as rotation tools do
        assert (await status("second-key"), await status("third-key!")) == (401, 200)
        key.unlink()  # a removed key file closes the server, it does not open it
        assert (await status("third-key!"), await status("")) == (401, 401)
        key.write_text("")  # so does an empty one
        assert await status("") == 401
    said = [r.getMessage() for r in caplog.records if "cannot be read or is empty" in r.getMessage()]
    assert len(said) == 2 and str(key) in said[0]  # once when removed, once when emptied: not per request


async def test_body_limit_413_with_and_without_content_length():
    async with client(make_app(max_body_bytes=100)) as c:
        r = await c.post("/echo", content=b'{"a": "' + b"x" * 200 + b'"}', headers={"content-type": "application/json"})
        assert r.status_code == 413 and "100 bytes" in r.json()["detail"]

        async def chunks():
            for _ in range(10):
                yield b"x" * 50

        r = await c.post("/echo", content=chunks())
        assert r.status_code == 413 and r.json()["error"]["type"] == "payload_too_large"


async def test_malformed_json_is_400_naming_the_problem():
    async with client(make_app()) as c:
        r = await c.post("/echo", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]
        r = await c.post("/echo", content=b"")
        assert r.status_code == 400 and "empty" in r.json()["detail"]
        r = await c.post("/echo", json=[1, 2])
        assert r.status_code == 400 and "JSON object" in r.json()["detail"]


async def test_unexpected_error_is_json_500_with_request_id():
    async with client(make_app()) as c:
        r = await c.get("/boom", headers={"X-Request-Id": "rid-1"})
        assert r.status_code == 500 and "kaput" in r.json()["detail"]
        assert r.json()["error"]["request_id"] == "rid-1"


async def test_request_id_generated_or_kept():
    async with client(make_app()) as c:
        generated = (await c.get("/health")).headers["x-request-id"]
        assert len(generated) >= 8
        assert (await c.get("/health", headers={"X-Request-Id": "abc"})).headers["x-request-id"] == "abc"
        missing = await c.get("/nope")
        assert missing.status_code == 404 and missing.json()["error"]["request_id"] == missing.headers["x-request-id"]


async def test_metrics_count_requests_by_path_and_status():
    async with client(make_app()) as c:
        for _ in range(3):
            await c.post("/echo", json={})
        await c.post("/echo", content=b"{bad")
        text = (await c.get("/metrics")).text
    assert 'gymserve_requests_total{method="POST",path="/echo",status="200"} 3.0' in text
    assert 'gymserve_requests_total{method="POST",path="/echo",status="400"} 1.0' in text
    assert 'gymserve_request_duration_seconds_count{method="POST",path="/echo"} 4.0' in text
    assert "gymserve_requests_in_flight" in text


async def test_ready_only_after_startup_hooks():
    gate = asyncio.Event()
    app = make_app(gate=gate)
    async with client(app) as c:
        lifespan = app.router.lifespan_context(app)  # held: collected, its generator would run the shutdown part
        starting = asyncio.create_task(lifespan.__aenter__())
        await asyncio.sleep(0.05)
        r = await c.get("/ready")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        gate.set()
        await starting
        assert (await c.get("/ready")).status_code == 200


def test_unexpected_error_is_a_json_500_with_request_id():
    """An endpoint bug becomes a JSON 500 that names the error and keeps the request id header."""
    from fastapi.testclient import TestClient

    from services.core.app import create_app
    from services.core.config import ServerConfig

    app = create_app(ServerConfig(name="boom"))

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("kaput")

    with TestClient(app, raise_server_exceptions=False) as client:
        reply = client.get("/boom", headers={"X-Request-Id": "rid-123"})
        assert reply.status_code == 500
        assert reply.headers["x-request-id"] == "rid-123"
        assert "RuntimeError: kaput" in reply.json()["detail"]
        assert 'gymserve_failures_total{kind="crash"} 1.0' in client.get("/metrics").text


def test_a_forked_child_makes_request_ids_of_its_own():
    """Request ids come from a per-process generator (no system call each): a child forked from a
    server (a pool worker that serves too) must not repeat its parent's sequence."""
    import os

    from services.core.middleware.request_id import new_request_id

    new_request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert len(child) == 16 and child != new_request_id()
