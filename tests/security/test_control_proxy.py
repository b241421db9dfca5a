"""The head's proxy passes a path exactly as the client encoded it (decoded once, by the server that
answers), never lets `..` leave a registered URL's path prefix, answers an oversized chunked body
with 413, and never hands the key to a URL that only registered itself. The upstream is a plain
HTTP server in this process that records what reached it."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest

from gymserve.testing import ServerProcess

KEY = "proxy-test-key-90aa"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, object]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        elif self.headers.get("transfer-encoding", "").lower() == "chunked":  # read it all, as a server would
            while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                self.rfile.read(size + 2)
            self.rfile.readline()
        self.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, list[dict[str, object]]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def head(upstream):
    url, _ = upstream
    with ServerProcess("head", "max_body_bytes=2000", env={"GYMSERVE_API_KEY": KEY, "GYMSERVE_HEAD_URL": ""}) as proc:
        for name, target in (("echo", url), ("app", f"{url}/app")):
            assert proc.post("/register", {"name": name, "url": target, "ttl_s": 600}).status_code == 200
        yield proc


def _last(upstream) -> dict:
    return upstream[1][-1]


def test_percent_encoding_is_passed_on_not_decoded_twice(head, upstream):
    r = head.get("/servers/echo/files/%252e%252e/x%2Fy?q=%2541")
    assert r.status_code == 200
    assert _last(upstream)["path"] == "/files/%252e%252e/x%2Fy?q=%2541"


@pytest.mark.parametrize("path", ["%2e%2e/secret", "a/%2E%2E/%2e%2e/secret", "%2e/secret"])
def test_dot_segments_cannot_leave_the_registered_prefix(head, upstream, path):
    before = len(upstream[1])
    r = head.get(f"/servers/app/{path}")
    assert r.status_code == 400 and "path" in r.json()["detail"]
    assert len(upstream[1]) == before  # nothing was sent


def test_a_registered_prefix_is_kept(head, upstream):
    assert head.get("/servers/app/inner/page").status_code == 200
    assert _last(upstream)["path"] == "/app/inner/page"


def test_an_oversized_chunked_body_is_413(head):
    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b"x" * 100

    r = httpx.post(f"{head.url}/servers/echo/upload", content=chunks(), headers=head.headers(), timeout=30)
    assert r.status_code == 413 and "limit" in r.json()["detail"]


def test_the_key_never_reaches_a_self_registered_url(head, upstream):
    assert head.get("/servers/echo/whoami").status_code == 200
    seen = _last(upstream)["headers"]
    assert "authorization" not in seen
    assert seen["x-gymserve-via"]  # the hop header is stamped
