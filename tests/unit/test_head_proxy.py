"""The head's proxy (`gateway/proxy.py`, aiohttp underneath) in-process against real upstreams on 127.0.0.1:
responses stream through as the upstream sends them (an SSE event arrives before the upstream has finished),
upstream connections are pooled, request ids and keys are forwarded, every refusal is the shared middleware's
(key, body limit, JSON depth, admission), errors are JSON replies with the request id, and a client that goes
away cancels the upstream call and is counted as a 499. Each case runs under gymserve's protocol and under
plain uvicorn (as under another ASGI server)."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from gateway.app import Config, build
from gymserve.testing import served_in_thread
from services.core.app import create_app
from services.core.config import ServerConfig
from services.core.middleware.disconnect import DISCONNECT_EXTENSION
from services.core.ports import free_port

KEY = "head-proxy-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROUTE = "/servers/{name}/{path:path}"


@dataclass
class Stack:
    url: str
    port: int
    release: threading.Event
    state: dict[str, Any] = field(default_factory=dict)


def _upstream(state: dict[str, Any], release: threading.Event) -> FastAPI:
    """A gymserve server (so a request whose client leaves is cancelled) that echoes, holds and streams."""
    app = create_app(ServerConfig(name="up", head_url=None))

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"headers": dict(request.headers), "body": (await request.body()).decode()}

    @app.get("/peer")
    async def peer(request: Request) -> dict[str, bool]:
        # the connection's own object (gymserve's protocol makes one per connection), kept alive so that
        # two connections cannot share an id; the client address is the proxy's X-Forwarded-For
        state["peers"].append(request.scope["extensions"][DISCONNECT_EXTENSION])
        return {"ok": True}

    @app.get("/hold")
    async def hold(s: float) -> dict[str, int]:
        state["active"] += 1
        state["most"] = max(state["most"], state["active"])
        try:
            await asyncio.sleep(s)
        except asyncio.CancelledError:
            state["cancelled"] += 1
            raise
        finally:
            state["active"] -= 1
        return {"most": state["most"]}

    @app.get("/events")
    async def events() -> StreamingResponse:
        async def gen() -> Any:
            yield b"data: first\n\n"
            while not release.is_set():  # the rest only once the test has seen the first event
                await asyncio.sleep(0.01)
            yield b"data: second\n\n"
            yield b"data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.api_route("/empty", methods=["GET", "HEAD"])
    async def empty() -> Response:
        return Response(status_code=204)

    @app.get("/big")
    async def big() -> Response:
        return Response(b"0123456789" * 300_000, media_type="application/octet-stream")  # over one piece

    return app


@pytest.fixture(scope="module", params=["gymserve's protocol", "plain uvicorn"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    state: dict[str, Any] = {"active": 0, "most": 0, "cancelled": 0, "peers": []}
    release = threading.Event()
    closed = free_port()  # nothing listens there: a server that is down
    with pytest.MonkeyPatch.context() as env, served_in_thread(_upstream(state, release)) as up_port:
        env.setenv("GYMSERVE_API_KEY", KEY)
        env.setenv("GYMSERVE_NO_AUTH", "0")
        env.delenv("GYMSERVE_API_KEY_FILE", raising=False)
        servers = {"up": {"kind": "resources/exact_match", "port": up_port},
                   "down": {"kind": "resources/exact_match", "port": closed}}
        port = free_port()
        app = build(Config(stack={"servers": servers}, port=port, max_body_bytes=2000, max_concurrent_requests=1))
        with served_in_thread(app, port=port, gymserve_protocol=request.param != "plain uvicorn"):
            yield Stack(f"http://127.0.0.1:{port}", port, release, state)


def test_sse_events_stream_through_before_the_upstream_finishes(stack: Stack) -> None:
    with httpx.stream("GET", f"{stack.url}/servers/up/events", headers=AUTH, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(line for line in lines if line) == "data: first"  # while the upstream still holds the rest
        stack.release.set()
        rest = [line for line in lines if line]
    assert rest == ["data: second", "data: [DONE]"]


def test_upstream_connections_are_pooled(stack: Stack) -> None:
    stack.state["peers"].clear()
    with httpx.Client(timeout=60, headers=AUTH) as client:
        for _ in range(20):
            assert client.get(f"{stack.url}/servers/up/peer").status_code == 200
    peers = stack.state["peers"]
    assert len(peers) == 20 and len({id(p) for p in peers}) == 1  # one keep-alive upstream connection for all 20


def test_request_ids_and_the_key_are_forwarded(stack: Stack) -> None:
    body = {"a": [1, 2, {"b": "ü"}]}
    given = httpx.post(f"{stack.url}/servers/up/echo", json=body, headers={**AUTH, "X-Request-Id": "rid-1"})
    fresh = httpx.post(f"{stack.url}/servers/up/echo", json=body, headers=AUTH)
    assert given.status_code == 200, given.text
    seen = given.json()["headers"]
    assert given.headers["x-request-id"] == seen["x-request-id"] == "rid-1"
    assert seen["authorization"] == f"Bearer {KEY}" and seen["x-forwarded-prefix"] == "/servers/up"
    assert seen["user-agent"].startswith("python-httpx/")  # the client's own headers, passed on
    assert json.loads(given.json()["body"]) == body
    assert re.fullmatch(r"[0-9a-f]{16}", fresh.headers["x-request-id"])  # made up, and the same one upstream
    assert fresh.json()["headers"]["x-request-id"] == fresh.headers["x-request-id"]


@pytest.mark.parametrize("case", ["no key", "wrong key", "body over the limit", "JSON too deep"])
def test_a_request_the_layers_refuse_never_reaches_the_upstream(stack: Stack, case: str) -> None:
    headers: dict[str, str] = {"Content-Type": "application/json", **AUTH}
    content = b'{"a": 1}'
    if case == "no key":
        del headers["Authorization"]
    elif case == "wrong key":
        headers["Authorization"] = "Bearer nope"
    elif case == "body over the limit":
        content = json.dumps({"a": "x" * 3000}).encode()
    else:
        content = b"[" * 100 + b"]" * 100
    reply = httpx.post(f"{stack.url}/servers/up/echo", content=content, headers=headers)
    assert reply.status_code == {"no key": 401, "wrong key": 401, "body over the limit": 413}.get(case, 400)
    assert reply.json()["error"]["request_id"] == reply.headers["x-request-id"]
    if reply.status_code == 401:
        assert reply.headers["www-authenticate"] == "Bearer"


def _raw(port: int, *parts: bytes, pause_s: float = 0.0) -> bytes:
    """Sends `parts` on one connection (`pause_s` between them) and reads until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i, part in enumerate(parts):
            if i and pause_s:
                time.sleep(pause_s)
            sock.sendall(part)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _request(body: bytes, *extra: bytes, close: bool = True) -> tuple[bytes, bytes]:
    head = [b"POST /servers/up/echo HTTP/1.1", b"Host: 127.0.0.1", b"Authorization: Bearer " + KEY.encode(),
            b"Content-Type: application/json", b"Content-Length: %d" % len(body), *extra]
    if close:
        head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n", body


def _echoed(raw: bytes) -> list[str]:
    """The bodies the upstream echoed, in the order the replies came."""
    return [json.loads(part.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1", 1)[0])["body"]
            for part in raw.split(b"HTTP/1.1 200")[1:]]


def test_a_body_in_pieces_expect_continue_and_pipelining(stack: Stack) -> None:
    head, body = _request(b'{"pieces": "' + b"x" * 500 + b'"}')
    assert _echoed(_raw(stack.port, head, body[:100], body[100:], pause_s=0.2)) == [body.decode()]
    head, body = _request(b'{"expect": true}', b"Expect: 100-continue")
    raw = _raw(stack.port, head, body, pause_s=0.2)
    assert raw.startswith(b"HTTP/1.1 100 Continue") and _echoed(raw) == [body.decode()]
    first, last = _request(b'{"n": 1}', close=False), _request(b'{"n": 2}')
    assert _echoed(_raw(stack.port, b"".join(first) + b"".join(last))) == ['{"n": 1}', '{"n": 2}']


def test_forwarded_for_is_chained_and_a_chunked_upload_streams(stack: Stack) -> None:
    forwarded = httpx.post(f"{stack.url}/servers/up/echo", json={}, headers={**AUTH, "X-Forwarded-For": "10.1.2.3"})
    assert forwarded.json()["headers"]["x-forwarded-for"].startswith("10.1.2.3")
    reply = httpx.post(f"{stack.url}/servers/up/echo", content=iter([b'{"chunked":', b" 1}"]), headers=AUTH)
    assert reply.status_code == 200 and reply.json()["body"] == '{"chunked": 1}'


def test_head_204_and_a_large_reply(stack: Stack) -> None:
    with httpx.Client(headers=AUTH, timeout=30) as client:
        for method in ("GET", "HEAD"):
            reply = client.request(method, f"{stack.url}/servers/up/empty")
            assert reply.status_code == 204 and reply.content == b""
        big = client.get(f"{stack.url}/servers/up/big")
    assert big.status_code == 200 and big.content == b"0123456789" * 300_000


def test_errors_are_json_replies_with_the_request_id(stack: Stack) -> None:
    for name, status in (("nope", 404), ("down", 502)):
        reply = httpx.get(f"{stack.url}/servers/{name}/health", headers=AUTH)
        assert reply.status_code == status and name in reply.json()["detail"], reply.text
        assert reply.json()["error"]["request_id"] == reply.headers["x-request-id"]


def test_the_admission_queue_holds_proxied_requests(stack: Stack) -> None:
    """The head allows one request at a time: three sent at once reach the upstream one after another."""
    stack.state["most"] = 0

    async def three() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=AUTH, timeout=30) as client:
            return list(await asyncio.gather(*(client.get(f"{stack.url}/servers/up/hold", params={"s": 0.3})
                                               for _ in range(3))))

    replies = asyncio.run(three())
    assert [r.status_code for r in replies] == [200] * 3 and stack.state["most"] == 1


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_goes_away_cancels_the_upstream_call_and_is_counted(stack: Stack) -> None:
    def counted() -> float:
        text = httpx.get(f"{stack.url}/metrics", headers=AUTH).text
        return _metric(text, "gymserve_requests_total", method="GET", path=ROUTE, status="499")

    before, cancelled = counted(), stack.state["cancelled"]
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(b"GET /servers/up/hold?s=60 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\n\r\n")
        deadline = time.monotonic() + 10
        while stack.state["active"] == 0:
            assert time.monotonic() < deadline, "the request never reached the upstream"
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while stack.state["cancelled"] == cancelled or counted() == before:
        assert time.monotonic() < deadline, "the upstream call went on after its client left"
        time.sleep(0.05)
    text = httpx.get(f"{stack.url}/metrics", headers=AUTH).text
    assert _metric(text, "gymserve_requests_in_flight") == 1.0  # only this scrape
    assert _metric(text, "gymserve_requests_total", method="POST", path=ROUTE, status="200") >= 1
