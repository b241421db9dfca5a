"""Admission control on a real server: first come first served, a bounded queue answered with 503 +
Retry-After when full, liveness never queued; the core client waits out Retry-After within its deadline."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import Request
from fastapi.responses import JSONResponse

from services.core.app import create_app
from services.core.client import ServiceClient
from services.core.config import ServerConfig
from services.core.errors import UpstreamError
from services.core.ports import free_port


class _ThreadEvent:
    """An event the test's loop sets and the server's handlers await (the server runs its own loop)."""

    def __init__(self) -> None:
        self._flag = threading.Event()

    def set(self) -> None:
        self._flag.set()

    async def wait(self) -> None:
        while not self._flag.is_set():
            await asyncio.sleep(0.01)


class _Gate:
    """Handlers block until the test opens the gate; entries are recorded in order."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.open = _ThreadEvent()


@pytest.fixture()
def server():
    config = ServerConfig(name="adm", max_concurrent_requests=1, max_queued_requests=3, retry_after_s=2)
    app = create_app(config)
    gate = _Gate()
    busy: dict[str, int] = {}

    @app.post("/job/{name}")
    async def work(name: str) -> dict:
        gate.entered.append(name)
        await gate.open.wait()
        return {"name": name}

    @app.get("/busy/{key}")
    async def busy_once(key: str, request: Request) -> JSONResponse:
        busy[key] = busy.get(key, 0) + 1
        if busy[key] == 1:
            return JSONResponse({"detail": "busy"}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"attempts": busy[key], "at": time.monotonic()})

    port = free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                       timeout_graceful_shutdown=1))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", gate, uv
    uv.should_exit = True
    thread.join(timeout=10)


def test_fifo_bounded_queue_and_503_with_retry_after(server) -> None:
    url, gate, _ = server

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            first = asyncio.create_task(client.post("/job/a"))
            while gate.entered != ["a"]:
                await asyncio.sleep(0.01)
            queued = []
            for name in ("b", "c", "d"):  # wait in line, in this order
                queued.append(asyncio.create_task(client.post(f"/job/{name}")))
                await asyncio.sleep(0.05)
            refused = None
            for _ in range(200):  # the 4th waiter finds the line full (once the 3 are in it)
                refused = await client.post("/job/e")
                if refused.status_code == 503:
                    break
                await asyncio.sleep(0.02)
            assert refused is not None and refused.status_code == 503
            assert refused.headers["retry-after"] == "2"
            assert "max_queued=3" in refused.json()["detail"] and refused.headers.get("x-request-id")
            assert (await client.get("/health")).json() == {"status": "ok"}  # liveness is never queued
            assert gate.entered == ["a"]
            gate.open.set()
            replies = await asyncio.gather(first, *queued)
            assert [r.json()["name"] for r in replies] == ["a", "b", "c", "d"]
            assert gate.entered[:4] == ["a", "b", "c", "d"]  # served in arrival order

    asyncio.run(scenario())


def test_client_waits_out_retry_after(server) -> None:
    url, _, _ = server

    async def scenario() -> None:
        client = ServiceClient(backoff_s=0.001, backoff_max_s=0.001)
        try:
            start = time.monotonic()
            reply = await client.get_json(f"{url}/busy/k1", deadline_s=30)
            assert reply["attempts"] == 2
            assert reply["at"] - start >= 1.0  # not before the server said so, although the backoff is 1 ms
            with pytest.raises(UpstreamError) as info:  # Retry-After beyond the deadline: no second attempt
                await client.get_json(f"{url}/busy/k2", deadline_s=0.5)
            assert info.value.kind == "timeout"
            assert (await client.get_json(f"{url}/busy/k2", deadline_s=30))["attempts"] == 2
        finally:
            await client.aclose()

    asyncio.run(scenario())
