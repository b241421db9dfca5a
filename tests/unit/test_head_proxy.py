"""The head's proxy in-process against a real upstream: responses stream through as the upstream sends
them (an SSE event arrives before the upstream has finished), and upstream connections are pooled
(many requests, one keep-alive connection). Both ways a request can take through the head: passed
through by gymserve's protocol, and through every layer (as under another ASGI server)."""
from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from gateway.app import Config, build
from gymserve.testing import served_in_thread
from services.core.ports import free_port


@pytest.fixture(scope="module", params=["gymserve's protocol", "plain uvicorn"])
def stack(request):
    release = threading.Event()
    peers: list[int] = []
    upstream = FastAPI()

    @upstream.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @upstream.get("/peer")
    async def peer(request: Request) -> dict:
        peers.append(request.client.port)
        return {"port": request.client.port}

    @upstream.get("/events")
    async def events() -> StreamingResponse:
        async def gen():
            yield b"data: first\n\n"
            while not release.is_set():  # the rest only once the test has seen the first event
                await asyncio.sleep(0.01)
            yield b"data: second\n\n"
            yield b"data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    with served_in_thread(upstream, gymserve_protocol=False) as up_port:
        head_port = free_port()
        head_app = build(Config(stack={"servers": {"up": {"kind": "resources/exact_match", "port": up_port}}},
                                port=head_port))
        passthrough = head_app.state.passthrough[0]
        with served_in_thread(head_app, port=head_port, gymserve_protocol=request.param != "plain uvicorn"):
            yield f"http://127.0.0.1:{head_port}", release, peers
        assert (passthrough.served > 0) == (request.param != "plain uvicorn")


def test_sse_events_stream_through_before_the_upstream_finishes(stack) -> None:
    url, release, _ = stack
    with httpx.stream("GET", f"{url}/servers/up/events", timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(line for line in lines if line) == "data: first"  # while the upstream still holds the rest
        release.set()
        rest = [line for line in lines if line]
    assert rest == ["data: second", "data: [DONE]"]


def test_upstream_connections_are_pooled(stack) -> None:
    url, _, peers = stack
    peers.clear()
    with httpx.Client(timeout=60) as client:
        for _ in range(20):
            assert client.get(f"{url}/servers/up/peer").status_code == 200
    assert len(peers) == 20 and len(set(peers)) == 1  # one keep-alive upstream connection for all 20
