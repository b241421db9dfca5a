"""The pooled client against a real local HTTP server: retries only on connect errors and 502/503/504,
deadlines cover all retries, auth and session ids are propagated."""
from __future__ import annotations

import asyncio
import collections
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from services.core.client import ServiceClient
from services.core.errors import UpstreamError
from services.core.ports import free_port

hits: collections.Counter[str] = collections.Counter()


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/flaky/{status}/{failures}")
    async def flaky(status: int, failures: int, key: str) -> JSONResponse:
        hits[key] += 1
        if hits[key] <= failures:
            return JSONResponse({"detail": f"failing {hits[key]}"}, status_code=status)
        return JSONResponse({"ok": True, "attempts": hits[key]})

    @app.get("/slow")
    async def slow(seconds: float) -> dict:
        await asyncio.sleep(seconds)
        return {"ok": True}

    @app.post("/slow_post")
    async def slow_post(seconds: float, key: str) -> dict:
        hits[key] += 1
        await asyncio.sleep(seconds)
        return {"ok": True}

    @app.get("/headers")
    async def headers(request: Request) -> dict:
        return dict(request.headers)

    return app


@pytest.fixture(scope="module")
def server_url():
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="error",
                                         timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def client() -> ServiceClient:
    return ServiceClient(deadline_s=10.0, retries=3, backoff_s=0.01, backoff_max_s=0.05)


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_retries_transient_statuses_then_succeeds(server_url, status):
    key = f"t{status}"
    reply = await client().get_json(f"{server_url}/flaky/{status}/2?key={key}")
    assert reply == {"ok": True, "attempts": 3}


@pytest.mark.parametrize("status", [500, 400, 404, 429])
async def test_no_retry_on_other_statuses(server_url, status):
    key = f"n{status}"
    response = await client().request("GET", f"{server_url}/flaky/{status}/5?key={key}")
    assert response.status_code == status and hits[key] == 1
    with pytest.raises(UpstreamError) as info:
        await client().get_json(f"{server_url}/flaky/{status}/5?key={key}b")
    assert info.value.upstream_status == status
    assert info.value.kind == ("bad_request" if status < 500 else "upstream")


async def test_gives_up_after_bounded_retries(server_url):
    with pytest.raises(UpstreamError) as info:
        await client().get_json(f"{server_url}/flaky/503/100?key=forever")
    assert hits["forever"] == 4 and info.value.upstream_status == 503


@pytest.mark.timeout(30)
async def test_connect_errors_are_retried_then_reported():
    dead = f"http://127.0.0.1:{free_port()}/x"
    with pytest.raises(UpstreamError) as info:
        await client().get_json(dead)
    assert info.value.kind == "upstream" and "4 attempts" in info.value.message


@pytest.mark.timeout(30)
async def test_deadline_covers_the_call(server_url):
    with pytest.raises(UpstreamError) as info:
        await client().get_json(f"{server_url}/slow?seconds=5", deadline_s=0.3)
    assert info.value.kind == "timeout" and info.value.status_code == 504
    assert "the 0.3s deadline" in info.value.message


async def test_auth_and_session_are_propagated(server_url, monkeypatch):
    from services.core import auth

    monkeypatch.setenv("GYMSERVE_API_KEY", "k-123")
    monkeypatch.delenv("GYMSERVE_HEAD_URL", raising=False)
    monkeypatch.setattr(auth, "_trusted", set())
    seen = await client().get_json(f"{server_url}/headers", session_id="sess-9")
    assert "authorization" not in seen and seen["x-session-id"] == "sess-9"  # not a trusted origin: no key
    auth.trust(server_url)  # what the head's URL and the stack's own servers are
    seen = await client().get_json(f"{server_url}/headers", session_id="sess-9")
    assert seen["authorization"] == "Bearer k-123" and seen["x-session-id"] == "sess-9"
    monkeypatch.delenv("GYMSERVE_API_KEY")
    seen = await client().get_json(f"{server_url}/headers")
    assert "authorization" not in seen and "x-session-id" not in seen


async def test_a_sent_request_that_times_out_is_not_sent_again(server_url):
    """A POST that reached the server but got no answer in time may have had effects: never re-sent."""
    with pytest.raises(UpstreamError) as info:
        await client().request("POST", f"{server_url}/slow_post?seconds=5&key=once", json={}, deadline_s=0.5)
    assert info.value.kind == "timeout"
    await asyncio.sleep(0.2)
    assert hits["once"] == 1


async def test_no_time_left_for_a_retry_is_a_timeout_not_an_upstream_verdict():
    """A refused connection whose backoff would overrun the deadline ends as `timeout`."""
    slow_backoff = ServiceClient(deadline_s=1.0, retries=3, backoff_s=5.0, backoff_max_s=5.0)
    try:
        with pytest.raises(UpstreamError) as info:
            await slow_backoff.request("GET", f"http://127.0.0.1:{free_port()}/x")
        assert info.value.kind == "timeout" and "deadline" in info.value.message
    finally:
        await slow_backoff.aclose()
