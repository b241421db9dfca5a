"""The head's pass-through path (`services.core.passthrough`): an ordinary request to `/servers/` skips the
ASGI layers and gets the reply the layers would give; anything else goes through the layers.

Real servers on 127.0.0.1, in this process so the path taken can be counted: an upstream FastAPI app,
and two heads built from the same config, one served by gymserve's protocol (pass-through on) and one
by plain uvicorn (every request through the layers), so each case is compared between the two."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from gateway.app import Config, build
from gymserve.testing import served_in_thread
from services.core.app import create_app
from services.core.config import ServerConfig
from services.core.ports import free_port
from services.core.passthrough import PassThrough
from services.core.serving import PASSTHROUGH_BODY_WAIT_S

KEY = "passthrough-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROUTE = "/servers/{name}/{path:path}"


@dataclass
class Heads:
    fast: str
    plain: str
    passthrough: PassThrough
    upstream: dict[str, Any]
    fast_port: int

    def urls(self) -> tuple[str, str]:
        return self.fast, self.plain


def _upstream(state: dict[str, Any]) -> FastAPI:
    """A gymserve server (so a request whose client leaves is cancelled) that echoes and holds requests."""
    app = create_app(ServerConfig(name="up", head_url=None))

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, Any]:
        return {"headers": dict(request.headers), "body": (await request.body()).decode()}

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

    return app


@pytest.fixture(scope="module")
def heads() -> Iterator[Heads]:
    state = {"active": 0, "most": 0, "cancelled": 0}
    closed = free_port()  # nothing listens there: a server that is down
    with pytest.MonkeyPatch.context() as env, served_in_thread(_upstream(state)) as up_port:
        env.setenv("GYMSERVE_API_KEY", KEY)
        env.setenv("GYMSERVE_NO_AUTH", "0")
        env.delenv("GYMSERVE_API_KEY_FILE", raising=False)
        servers = {"up": {"kind": "resources/exact_match", "port": up_port},
                   "down": {"kind": "resources/exact_match", "port": closed}}

        def head_app(port: int) -> Any:
            return build(Config(stack={"servers": servers}, port=port, max_body_bytes=2000, max_concurrent_requests=1))

        fast_port, plain_port = free_port(), free_port()
        fast_app = head_app(fast_port)
        with served_in_thread(fast_app, port=fast_port) as fast, \
                served_in_thread(head_app(plain_port), port=plain_port, gymserve_protocol=False) as plain:
            yield Heads(f"http://127.0.0.1:{fast}", f"http://127.0.0.1:{plain}", fast_app.state.passthrough[0],
                        state, fast)


@contextlib.contextmanager
def _counted(heads: Heads, expected: int) -> Iterator[None]:
    """Asserts that `expected` requests were answered by the pass-through path inside the block."""
    before = heads.passthrough.served
    yield
    assert heads.passthrough.served - before == expected


def _comparable(reply: httpx.Response) -> dict[str, Any]:
    """What a client sees of a reply, without what differs between two heads (their ids, the date)."""
    seen = dict(reply.json())
    if isinstance(seen.get("headers"), dict):
        seen["headers"] = {k: v for k, v in seen["headers"].items() if k not in ("x-gymserve-via", "x-request-id")}
    if isinstance(seen.get("error"), dict):
        seen["error"] = {k: v for k, v in seen["error"].items() if k != "request_id"}
    return {"status": reply.status_code, "json": seen,
            "headers": sorted(k for k in reply.headers if k not in ("date", "server", "content-length"))}


def test_an_ordinary_request_passes_through_with_the_reply_the_layers_give(heads: Heads) -> None:
    body = {"a": [1, 2, {"b": "ü"}]}
    with _counted(heads, 2):
        fast, plain = (httpx.post(f"{url}/servers/up/echo", json=body, headers={**AUTH, "X-Request-Id": "rid-1"})
                       for url in heads.urls())
        fresh = httpx.post(f"{heads.fast}/servers/up/echo", json=body, headers=AUTH)
    assert fast.status_code == 200 and _comparable(fast) == _comparable(plain)
    seen = fast.json()["headers"]
    assert fast.headers["x-request-id"] == seen["x-request-id"] == "rid-1"
    assert seen["authorization"] == f"Bearer {KEY}" and seen["x-forwarded-prefix"] == "/servers/up"
    assert json.loads(fast.json()["body"]) == body
    assert re.fullmatch(r"[0-9a-f]{16}", fresh.headers["x-request-id"])  # made up, and the same one upstream
    assert fresh.json()["headers"]["x-request-id"] == fresh.headers["x-request-id"]


@pytest.mark.parametrize("case", ["no key", "wrong key", "body over the limit", "JSON too deep"])
def test_a_request_the_layers_refuse_is_refused_by_them(heads: Heads, case: str) -> None:
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
    with _counted(heads, 0):
        fast, plain = (httpx.post(f"{url}/servers/up/echo", content=content, headers=headers) for url in heads.urls())
    assert fast.status_code in (400, 401, 413) and _comparable(fast) == _comparable(plain)
    assert fast.json()["error"]["request_id"] == fast.headers["x-request-id"]
    if fast.status_code == 401:
        assert fast.headers["www-authenticate"] == "Bearer"


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


@pytest.mark.parametrize("pause_s", [0.0, 0.2, PASSTHROUGH_BODY_WAIT_S + 0.3])
def test_a_body_in_pieces_passes_through_unless_it_is_slow(heads: Heads, pause_s: float) -> None:
    """The head and the body in separate writes (as many clients send them) still pass through; a body
    whose rest takes longer than the wait is read by the layers (and their body deadline)."""
    head, body = _request(b'{"pieces": "' + b"x" * 500 + b'"}')
    with _counted(heads, 1 if pause_s < PASSTHROUGH_BODY_WAIT_S else 0):
        raw = _raw(heads.fast_port, head, body[:100], body[100:], pause_s=pause_s)
    assert _echoed(raw) == [body.decode()]


def test_expect_continue_and_forwarded_for_go_through_the_asgi_server(heads: Heads) -> None:
    head, body = _request(b'{"expect": true}', b"Expect: 100-continue")
    with _counted(heads, 0):
        raw = _raw(heads.fast_port, head, body, pause_s=0.2)
        forwarded = [httpx.post(f"{url}/servers/up/echo", json={}, headers={**AUTH, "X-Forwarded-For": "10.1.2.3"})
                     for url in heads.urls()]
    assert raw.startswith(b"HTTP/1.1 100 Continue") and _echoed(raw) == [body.decode()]
    assert _comparable(forwarded[0]) == _comparable(forwarded[1])
    assert forwarded[0].json()["headers"]["x-forwarded-for"].startswith("10.1.2.3")


def test_a_chunked_upload_goes_through_the_layers(heads: Heads) -> None:
    with _counted(heads, 0):
        reply = httpx.post(f"{heads.fast}/servers/up/echo", content=iter([b'{"chunked":', b" 1}"]), headers=AUTH)
    assert reply.status_code == 200 and reply.json()["body"] == '{"chunked": 1}'


def test_pipelined_requests_are_answered_in_order(heads: Heads) -> None:
    first, last = _request(b'{"n": 1}', close=False), _request(b'{"n": 2}')
    raw = _raw(heads.fast_port, b"".join(first) + b"".join(last))
    assert _echoed(raw) == ['{"n": 1}', '{"n": 2}']


def test_errors_are_json_replies_with_the_request_id(heads: Heads) -> None:
    with _counted(heads, 2):
        replies = [(httpx.get(f"{url}/servers/{name}/health", headers=AUTH), name)
                   for name in ("nope", "down") for url in heads.urls()]
    for (fast, name), (plain, _) in zip(replies[::2], replies[1::2]):
        assert fast.status_code == (404 if name == "nope" else 502) and _comparable(fast) == _comparable(plain)
        assert name in fast.json()["detail"] and fast.json()["error"]["request_id"] == fast.headers["x-request-id"]


def test_the_admission_queue_counts_both_paths(heads: Heads) -> None:
    """The heads allow one request at a time: three sent at once reach the upstream one after another
    (a pass-through request never takes a slot someone waits for)."""
    heads.upstream["most"] = 0

    async def three() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=AUTH, timeout=30) as client:
            return list(await asyncio.gather(*(client.get(f"{heads.fast}/servers/up/hold", params={"s": 0.3})
                                               for _ in range(3))))

    replies = asyncio.run(three())
    assert [r.status_code for r in replies] == [200] * 3 and heads.upstream["most"] == 1


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_goes_away_cancels_the_upstream_call_and_is_counted(heads: Heads) -> None:
    def counted() -> float:
        text = httpx.get(f"{heads.fast}/metrics", headers=AUTH).text
        return _metric(text, "gymserve_requests_total", method="GET", path=ROUTE, status="499")

    before, cancelled = counted(), heads.upstream["cancelled"]
    with _counted(heads, 1), socket.create_connection(("127.0.0.1", heads.fast_port), timeout=10) as sock:
        sock.sendall(b"GET /servers/up/hold?s=60 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\n\r\n")
        deadline = time.monotonic() + 10
        while heads.upstream["active"] == 0:
            assert time.monotonic() < deadline, "the request never reached the upstream"
            time.sleep(0.02)
    deadline = time.monotonic() + 10
    while heads.upstream["cancelled"] == cancelled or counted() == before:
        assert time.monotonic() < deadline, "the upstream call went on after its client left"
        time.sleep(0.05)
    text = httpx.get(f"{heads.fast}/metrics", headers=AUTH).text
    assert _metric(text, "gymserve_requests_in_flight") == 1.0  # only this scrape
    assert _metric(text, "gymserve_requests_total", method="POST", path=ROUTE, status="200") >= 1
