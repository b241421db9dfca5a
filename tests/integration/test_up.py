"""`gymserve up` with real processes: readiness, proxy to every server, restart after kill -9,
clean SIGTERM with no process left, 413 and malformed JSON through the stack, `gymserve status`."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from gymserve.testing import verify_body
from tests.integration.up_helpers import STACK, Up, children, group_alive, pid_alive


@pytest.fixture(scope="module")
def up():
    launcher = Up("-c", str(STACK), "servers.em_a.max_body_bytes=4000")
    try:
        launcher.wait_for(r"all 3 servers ready")
        launcher.wait_for(r"dashboard: http")  # printed after the table
        launcher.head = launcher.wait_for(r"head on (http://\S+)").group(1)
        yield launcher
    finally:
        launcher.kill()


def instances(up) -> dict[str, dict]:
    return {r["name"]: r for r in httpx.get(f"{up.head}/server_instances", headers=up.auth, timeout=10).json()}


def wait_registered(up, names, timeout_s=20.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = instances(up)
        if all(rows.get(n, {}).get("pid") for n in names):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"not all of {names} registered: {instances(up)}")


def test_ready_line_and_table(up):
    assert up.count(r"^\[gymserve\] all 3 servers ready$") == 1
    table = up.output.split("all 3 servers ready", 1)[1]
    for name in ("head", "em_a", "em_b"):
        assert name in table
    assert "resources/exact_match" in table
    assert up.count(r"^\[em_a\]\s") >= 1 and up.count(r"^\[head\]\s") >= 1  # per-server log prefixes


def test_every_server_reachable_through_the_proxy(up):
    rows = wait_registered(up, ["em_a", "em_b"])
    assert {rows["em_a"]["server_type"], rows["em_b"]["server_type"]} == {"resources_servers"}
    assert set(children(up.proc.pid)) >= {rows["em_a"]["pid"], rows["em_b"]["pid"]}
    body = verify_body("PARIS", expected_answer="paris")
    a = httpx.post(f"{up.head}/servers/em_a/verify", json=body, headers=up.auth, timeout=30)
    b = httpx.post(f"{up.head}/servers/em_b/verify", json=body, headers=up.auth, timeout=30)
    assert a.status_code == b.status_code == 200
    assert a.json()["reward"] == 1.0 and b.json()["reward"] == 0.0  # em_b is case-sensitive: two servers


def test_bad_input_through_the_stack(up):
    bad = httpx.post(f"{up.head}/servers/em_b/verify", content=b"{oops", headers=up.auth, timeout=30)
    assert bad.status_code == 400 and "malformed JSON" in bad.json()["detail"]
    assert httpx.post(f"{up.head}/servers/em_a/verify", content=b"x" * 5000, headers=up.auth, timeout=30).status_code == 413
    # the head's own limit (32 MiB by default) answers from the declared length, before any body is sent
    host, port = up.head.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /servers/em_a/verify HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n"
                     + f"Authorization: {up.auth['Authorization']}\r\n\r\n".encode())
        reply = ""
        while "}" not in reply:  # headers and the JSON body may arrive in separate reads
            chunk = sock.recv(65536).decode()
            if not chunk:
                break
            reply += chunk
    assert reply.startswith("HTTP/1.1 413") and "exceeds the limit" in reply
    assert httpx.get(f"{up.head}/servers/em_c/health", headers=up.auth, timeout=10).status_code == 404


def test_config_and_status_command(up):
    config = yaml.safe_load(httpx.get(f"{up.head}/global_config_dict_yaml", headers=up.auth, timeout=10).json())
    assert config["em_a"]["resources_servers"]["exact_match"]["max_body_bytes"] == 4000
    assert config["em_b"]["resources_servers"]["exact_match"]["case_sensitive"] is True
    done = subprocess.run([sys.executable, "-m", "gymserve", "status", "--head", up.head, "--json"],
                          capture_output=True, text=True, timeout=60, env=up.env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {r["name"] for r in report["servers"]} == {"em_a", "em_b"} and report["ready"] == 2
    table = subprocess.run([sys.executable, "-m", "gymserve", "status", "--head", up.head],
                           capture_output=True, text=True, timeout=60, env=up.env)
    assert table.returncode == 0 and "em_a" in table.stdout and "2/2 servers ready" in table.stdout


def test_kill_9_child_is_restarted(up):
    rows = wait_registered(up, ["em_a"])
    old = rows["em_a"]["pid"]
    os.kill(old, signal.SIGKILL)
    up.wait_for(r"server 'em_a' exited with code -9 .*restarting in \S+s \(restart #1\)", 30)
    up.wait_for(r"server 'em_a' is ready again", 60)
    r = httpx.post(f"{up.head}/servers/em_a/verify", json=verify_body("x", expected_answer="x"), headers=up.auth, timeout=30)
    assert r.status_code == 200 and r.json()["reward"] == 1.0
    deadline = time.monotonic() + 20
    while instances(up)["em_a"]["pid"] in (old, None):
        assert time.monotonic() < deadline, "restarted em_a did not re-register"
        time.sleep(0.2)
    assert not pid_alive(old)


def test_sigterm_stops_everything(up):
    kids = children(up.proc.pid)
    assert len(kids) == 3
    up.proc.send_signal(signal.SIGTERM)
    assert up.wait(60) == 0
    assert "all servers stopped" in up.output
    for pid in kids:
        assert not pid_alive(pid), f"child {pid} survived"
        assert not group_alive(pid), f"process group {pid} survived"
