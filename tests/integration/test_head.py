"""The head server as a real process: registry and heartbeat expiry, redacted config, streaming
proxy (status codes, headers, 404/502/504), aggregated health and dashboard."""
from __future__ import annotations

import json
import os
import time

import httpx
import pytest
import yaml

from gymserve.testing import ServerProcess, hung_server, verify_body
from services.core.ports import free_port

SECRET = "hunter2-do-not-leak"


@pytest.fixture(scope="module")
def upstream():
    with ServerProcess("resources/exact_match", "max_body_bytes=5000", name="em_up") as server:
        yield server


@pytest.fixture(scope="module")
def hang_port():
    """A TCP server that accepts connections and never answers (for the 504 path)."""
    with hung_server() as (port, _):
        yield port


@pytest.fixture(scope="module")
def head(upstream):
    stack = {"head": {"openrlhf_environment": None},
             "servers": {
                 "em_up": {"kind": "resources/exact_match", "port": upstream.port, "case_sensitive": False},
                 "remote_model": {"kind": "models/openai_proxy", "port": free_port(), "base_url": "http://x/v1",
                                  "api_key": "${GS_HEAD_TEST_SECRET}",
                                  "auth": {"bearer_token": "${GS_HEAD_TEST_SECRET}", "user": "bob"}},
             }}
    spec = {"stack": stack, "proxy_read_timeout_s": 1.0, "health_interval_s": 0.5}
    with ServerProcess("head", env={"GYMSERVE_SERVER_SPEC": json.dumps(spec), "GS_HEAD_TEST_SECRET": SECRET}) as h:
        yield h


def test_health_stays_simple(head):
    assert head.get("/health").json() == {"status": "ok"}
    assert head.get("/").json() == {"status": "ok"}


def test_server_instances_lists_the_stack(head, upstream):
    rows = {r["name"]: r for r in head.get("/server_instances").json()}
    assert set(rows) >= {"em_up", "remote_model"}
    em = rows["em_up"]
    assert em["server_type"] == "resources_servers" and em["kind"] == "resources/exact_match"
    assert em["host"] == "127.0.0.1" and em["port"] == upstream.port and em["url"] == upstream.url
    assert {"pid", "status"} <= set(em)
    assert rows["remote_model"]["server_type"] == "responses_api_models"


def test_global_config_is_yaml_with_secrets_redacted(head):
    r = head.get("/global_config_dict_yaml")
    assert r.status_code == 200
    text = r.json()
    assert isinstance(text, str) and SECRET not in text and SECRET not in r.text
    config = yaml.safe_load(text)
    model = config["remote_model"]["responses_api_models"]["openai_proxy"]
    assert model["api_key"] == "***" and model["auth"]["bearer_token"] == "***"
    assert model["auth"]["user"] == "bob" and model["base_url"] == "http://x/v1"
    assert config["head_server"]["port"] == head.port
    assert config["em_up"]["resources_servers"]["exact_match"]["case_sensitive"] is False


def test_register_validates_body(head):
    r = head.post("/register", json={"name": "x"})
    assert r.status_code == 422 and "host" in r.json()["detail"] and "port" in r.json()["detail"]
    r = head.post("/register", json={"name": "x", "host": "127.0.0.1", "port": 70000})
    assert r.status_code == 422 and "port" in r.json()["detail"]
    r = head.post("/register", json={"name": "bad name!", "host": "h", "port": 1})
    assert r.status_code == 422 and "name" in r.json()["detail"]
    r = head.post("/register", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]
    r = head.post("/register", json=["a"])
    assert r.status_code == 400


def test_registration_expires_without_heartbeat(head):
    body = {"name": "ephemeral", "host": "127.0.0.1", "port": 1, "kind": "resources/thing", "pid": 4242,
            "ttl_s": 1.5}
    first = head.post("/register", json=body)
    assert first.status_code == 200
    rows = {r["name"]: r for r in head.get("/server_instances").json()}
    assert rows["ephemeral"]["pid"] == 4242 and rows["ephemeral"]["status"] == "registered"
    body["lease"] = first.json()["lease"]  # heartbeats carry the lease (without it they are refused)
    for _ in range(4):  # heartbeats keep it alive past its TTL
        time.sleep(0.5)
        assert head.post("/register", json=body).status_code == 200
    assert "ephemeral" in {r["name"] for r in head.get("/server_instances").json()}
    time.sleep(2.0)
    assert "ephemeral" not in {r["name"] for r in head.get("/server_instances").json()}
    assert head.post("/servers/ephemeral/verify", json={}).status_code == 404


def test_proxy_forwards_requests_and_keeps_status_and_headers(head):
    r = head.post("/servers/em_up/verify", json=verify_body("Paris", expected_answer="paris", row_id=7),
                  headers={"X-Request-Id": "trace-1"})
    assert r.status_code == 200 and r.json()["reward"] == 1.0 and r.json()["row_id"] == 7
    assert r.headers["x-request-id"] == "trace-1" and r.headers["content-type"] == "application/json"
    assert head.get("/servers/em_up/health").json() == {"status": "ok"}
    missing = head.get("/servers/em_up/no_such_path")
    assert missing.status_code == 404
    bad = head.post("/servers/em_up/verify", content=b"{bad", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "malformed JSON" in bad.json()["detail"]
    too_big = head.post("/servers/em_up/verify", content=b"x" * 6000)  # the upstream's own limit is 5000
    assert too_big.status_code == 413


def test_proxy_streams_a_chunked_request_body(head):
    payload = json.dumps(verify_body("yes", expected_answer="yes")).encode()

    def chunks():
        for i in range(0, len(payload), 7):
            yield payload[i:i + 7]

    r = httpx.post(f"{head.url}/servers/em_up/verify", content=chunks(), timeout=30)
    assert r.status_code == 200 and r.json()["reward"] == 1.0


@pytest.mark.timeout(60)
def test_proxy_errors_name_the_server(head, hang_port):
    r = head.post("/servers/nobody/verify", json={})
    assert r.status_code == 404 and "nobody" in r.json()["detail"]
    for path in ("/servers/", "/servers//verify"):  # no name at all: a 404 that says what is expected
        r = head.get(path)
        assert r.status_code == 404 and "/servers/<name>/<path>" in r.json()["detail"], (path, r.text)
    dead_port = free_port()
    leases = {"dead": head.post("/register", json={"name": "dead", "host": "127.0.0.1", "port": dead_port,
                                                   "ttl_s": 60}).json()["lease"]}
    r = head.get("/servers/dead/health")
    assert r.status_code == 502 and "dead" in r.json()["detail"]
    leases["hangs"] = head.post("/register", json={"name": "hangs", "host": "127.0.0.1", "port": hang_port,
                                                   "ttl_s": 60}).json()["lease"]
    r = head.get("/servers/hangs/health")
    assert r.status_code == 504 and "hangs" in r.json()["detail"]
    assert "within the 1s read timeout" in r.json()["detail"]  # proxy_read_timeout_s, not the 600 s default
    for name in ("dead", "hangs"):
        assert head.post("/unregister", json={"name": name, "lease": leases[name]}).status_code == 200


def test_aggregated_health_and_dashboard(head):
    for _ in range(5):
        head.post("/servers/em_up/verify", json=verify_body("a", expected_answer="a"))
    time.sleep(0.6)
    report = head.get("/health/servers").json()
    rows = {r["name"]: r for r in report["servers"]}
    assert rows["em_up"]["health"] == "ready" and rows["em_up"]["healthy"] is True
    assert rows["em_up"]["requests_total"] >= 5 and rows["em_up"]["requests_per_s"] > 0
    assert rows["remote_model"]["health"] == "down" and rows["remote_model"]["healthy"] is False
    assert report["total"] == len(report["servers"]) and report["ready"] < report["total"]
    assert head.get("/status").json()["total"] == report["total"]
    page = head.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "em_up" in page.text and "remote_model" in page.text


def test_register_with_url_only(head, upstream):
    r = head.post("/register", json={"name": "by_url", "url": upstream.url, "kind": "resources/exact_match",
                                     "ttl_s": 30})
    assert r.status_code == 200, r.text
    row = next(r for r in head.get("/server_instances").json() if r["name"] == "by_url")
    assert row["host"] == "127.0.0.1" and row["port"] == upstream.port and row["url"] == upstream.url
    assert head.get("/servers/by_url/health").json() == {"status": "ok"}
    bad = head.post("/register", json={"name": "bad_url", "url": "ftp://x"})
    assert bad.status_code == 422 and "url" in bad.json()["detail"]
    lease = r.json()["lease"]
    assert head.post("/unregister", json={"name": "by_url"}).status_code == 403  # only its registrant
    assert head.post("/unregister", json={"name": "by_url", "lease": lease}).status_code == 200
    assert head.post("/unregister", json={"name": "by_url", "lease": lease}).status_code == 404


def _policy(pid: int) -> int:
    """The scheduling policy of every thread of process `pid` (they must agree)."""
    policies = {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}
    assert len(policies) == 1, policies
    return policies.pop()


def test_the_head_yields_the_cpu_to_the_servers_it_fronts(head, upstream):
    """The head runs under SCHED_BATCH (its `cpu_policy`), every other server under the normal policy;
    `cpu_policy=normal` keeps the head normal too."""
    assert _policy(head.proc.pid) == os.SCHED_BATCH
    assert _policy(upstream.proc.pid) == os.SCHED_OTHER
    with ServerProcess("head", "cpu_policy=normal") as normal:
        assert _policy(normal.proc.pid) == os.SCHED_OTHER
        assert normal.get("/health").status_code == 200
