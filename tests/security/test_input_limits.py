"""Input limits on every kind of server (real processes on 127.0.0.1): a JSON depth bomb is a 400, a client
that trickles its headers or body (slowloris) is cut off with 408 while other requests are still answered."""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest

from gymserve.testing import ServerProcess, verify_body

LIMITS = ("header_timeout_s=1", "body_timeout_s=1")
KEY = {"GYMSERVE_API_KEY": "input-limits-test-key"}  # the guards hold with auth on (and come after it)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerProcess]]:
    """A resource server, a model server and a head: the core layers every kind shares."""
    spec = {"stack": {"servers": {}}, "header_timeout_s": 1, "body_timeout_s": 1}
    procs = {"resource": ServerProcess("resources/exact_match", *LIMITS, name="limits-em", env=KEY),
             "model": ServerProcess("models/stub", *LIMITS, name="limits-model", env=KEY),
             "head": ServerProcess("head", name="head", env={"GYMSERVE_SERVER_SPEC": json.dumps(spec), **KEY})}
    for proc in procs.values():
        proc.launch()
    try:
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def depth_bomb(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("kind, path", [("resource", "/verify"), ("resource", "/seed_session"),
                                        ("model", "/v1/responses"), ("head", "/register")])
def test_json_nested_1000_deep_is_400(servers, kind, path):
    server = servers[kind]
    for body in (depth_bomb(1000), b"[" * 1000 + b"]" * 1000):
        reply = server.post(path, content=body, headers={"content-type": "application/json"})
        assert reply.status_code == 400, reply.text
        assert "max_json_depth" in reply.json()["detail"]


def test_depth_counts_structure_not_brackets_in_strings(servers):
    """Brackets inside strings are text: a prompt full of them is an ordinary request."""
    body = verify_body("[[[[{{{{" * 500, expected_answer="x")
    reply = servers["resource"].post("/verify", json=body)
    assert reply.status_code == 200 and reply.json()["reward"] == 0.0


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["resource", "model", "head"])
def test_trickled_headers_get_408_while_others_are_served(servers, kind):
    server = servers[kind]
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    sock = _raw(server.port)
    cut_off = threading.Event()

    def trickle() -> None:
        try:
            for byte in request[:-4]:  # never finishes its headers
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
        except OSError:
            cut_off.set()

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        assert httpx.get(f"{server.url}/health", timeout=10).json() == {"status": "ok"}  # others still served
        reply = _read_all(sock)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b"header_timeout_s" in reply
    finally:
        sock.close()
        sender.join(10)


@pytest.mark.timeout(60)
def test_silent_connection_is_closed(servers):
    """A connection that never sends a byte is held no longer than one that trickles."""
    sock = _raw(servers["resource"].port)
    try:
        assert _read_all(sock).startswith(b"HTTP/1.1 408")
    finally:
        sock.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind, path", [("resource", "/verify"), ("model", "/v1/responses"), ("head", "/register")])
def test_trickled_body_gets_408(servers, kind, path):
    server = servers[kind]
    sock = _raw(server.port)
    try:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Authorization: Bearer {KEY['GYMSERVE_API_KEY']}\r\nContent-Length: 1000\r\n\r\n{{".encode())
        for _ in range(20):  # 20 bytes over 2 s: the 1 s body deadline passes first
            try:
                sock.sendall(b" ")
            except OSError:
                break
            time.sleep(0.1)
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        reply = _read_all(sock)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert b"body_timeout_s" in reply
