"""The head's registry cannot be hijacked or poisoned, even by a caller holding the key: a name
belongs to its first registrant (lease), bodies are bounded (depth, size, a registry cap), hosts
come from an allow-list, and nothing can be registered at the head itself or make it loop."""
from __future__ import annotations

import json

import httpx
import pytest

from gymserve.testing import ServerProcess
from services.core.ports import free_port

KEY = "registry-test-key-41c7"
ENV = {"GYMSERVE_API_KEY": KEY, "GYMSERVE_HEAD_URL": "", "GYMSERVE_ALLOWED_HOSTS": ""}


@pytest.fixture(scope="module")
def head():
    with ServerProcess("head", "max_registered=4", "health_interval_s=60", env=ENV) as proc:
        yield proc


def _register(head: ServerProcess, name: str, port: int, **extra) -> httpx.Response:
    return head.post("/register", {"name": name, "host": "127.0.0.1", "port": port, "ttl_s": 60, **extra})


def test_a_registered_name_belongs_to_its_lease_holder(head):
    first = _register(head, "tool_env", free_port())
    assert first.status_code == 200
    lease = first.json()["lease"]
    stolen = _register(head, "tool_env", free_port())  # the key alone is not enough
    assert stolen.status_code == 409 and "lease" in stolen.json()["detail"]
    assert _register(head, "tool_env", free_port(), lease="guessed").status_code == 409
    assert head.post("/unregister", {"name": "tool_env"}).status_code == 403
    assert _register(head, "tool_env", free_port(), lease=lease).status_code == 200  # the heartbeat
    assert head.post("/unregister", {"name": "tool_env", "lease": lease}).status_code == 200


def test_deeply_nested_extras_are_refused_and_the_registry_stays_readable(head):
    def nested(depth: int) -> object:
        value: object = "x"
        for _ in range(depth):
            value = {"a": value}
        return value

    r = _register(head, "deep", free_port(), notes=nested(900))
    assert r.status_code == 400 and "deeper" in r.json()["detail"]  # the body's depth limit, or the extras'
    r = _register(head, "deep", free_port(), notes=nested(20))  # a legal body, too deep for an extra field
    assert r.status_code == 400 and r.json()["detail"].startswith("notes")
    big = _register(head, "big", free_port(), notes="x" * 10_000)
    assert big.status_code == 413 and "notes" in big.json()["detail"]
    assert head.get("/server_instances").status_code == 200
    assert "deep" not in {row["name"] for row in head.get("/server_instances").json()}


def test_the_registry_has_a_cap(head):
    leases = {}
    for i in range(8):
        r = _register(head, f"filler_{i}", free_port())
        if r.status_code != 200:
            break
        leases[f"filler_{i}"] = r.json()["lease"]
    assert r.status_code == 429 and "full" in r.json()["detail"]
    assert len(leases) <= 4
    for name, lease in leases.items():
        assert head.post("/unregister", {"name": name, "lease": lease}).status_code == 200


@pytest.mark.parametrize("where", [{"host": "10.20.30.40", "port": 22},
                                   {"host": "internal.example", "port": 6379},
                                   {"url": "http://169.254.169.254:80"}])
def test_hosts_outside_the_allow_list_are_refused(head, where):
    """The head probes and proxies to every registration: an open registry is a port scanner."""
    r = head.post("/register", {"name": "scan", "ttl_s": 60, **where})
    assert r.status_code == 422 and "allow-list" in r.json()["detail"]
    field = "url" if "url" in where else "host"
    assert r.json()["detail"].startswith(field)


def test_the_head_itself_cannot_be_registered(head):
    for body in ({"host": "127.0.0.1", "port": head.port}, {"host": "localhost", "port": head.port},
                 {"url": f"http://127.0.0.1:{head.port}/servers/self"}):
        r = head.post("/register", {"name": "self", "ttl_s": 60, **body})
        assert r.status_code == 422 and "head itself" in r.json()["detail"], body


def test_unknown_scheme_and_huge_bodies_are_refused(head):
    assert head.post("/register", {"name": "ftp", "url": "ftp://127.0.0.1:21"}).status_code == 422
    for url in ("http://127.0.0.1:21/a\r\nx-injected: 1", "http://127.0.0.1:21/a b", "http://127.0.0.1:21/\u00e9"):
        r = head.post("/register", {"name": "crlf", "url": url})  # written into upstream requests as it is
        assert r.status_code == 422 and "url" in r.json()["detail"], url
    body = json.dumps({"name": "huge", "host": "127.0.0.1", "port": 1, "pad": "x" * 40_000})
    r = head.post("/register", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "body" in r.json()["detail"]


@pytest.mark.timeout(120)
def test_a_loop_between_heads_is_cut_by_the_hop_header():
    """Two heads registered at each other's proxy: the first head sees its own id come back (508)
    instead of calling itself until every connection is used up. (Without a key: with one, the
    second head would not pass the key on to a self-registered URL and the loop ends in a 401.)"""
    env = {**ENV, "GYMSERVE_API_KEY": ""}
    with ServerProcess("head", name="head_a", env=env) as a, ServerProcess("head", name="head_b", env=env) as b:
        for here, there in ((a, b), (b, a)):
            r = here.post("/register", {"name": "loop", "url": f"http://127.0.0.1:{there.port}/servers/loop",
                                        "ttl_s": 60})
            assert r.status_code == 200, r.text
        r = a.get("/servers/loop/health", timeout=60)
        assert r.status_code == 508 and "x-gymserve-via" in r.text
        assert a.get("/server_instances", timeout=10).status_code == 200
