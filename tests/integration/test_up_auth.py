"""`gymserve up` with GYMSERVE_API_KEY: every endpoint but the probes needs the key, at the head, through
its proxy and at each server; servers register with the head using it. Then the launcher is SIGKILLed
and its children must still go (PR_SET_PDEATHSIG)."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from gymserve.testing import verify_body
from tests.integration.up_helpers import STACK, Up, children, dashboard_forwarder, pid_alive

KEY = "test-key-7f3a"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def up():
    launcher = Up("-c", str(STACK), env={"GYMSERVE_API_KEY": KEY})
    try:
        launcher.wait_for(r"all 3 servers ready")
        launcher.head = launcher.wait_for(r"head on (http://\S+)").group(1)
        yield launcher
    finally:
        launcher.kill()


def test_probes_stay_open(up):
    for path in ("/", "/health", "/ready"):
        assert httpx.get(f"{up.head}{path}", timeout=10).status_code == 200


def test_head_endpoints_need_the_key(up):
    for path in ("/server_instances", "/global_config_dict_yaml", "/health/servers", "/dashboard", "/metrics"):
        r = httpx.get(f"{up.head}{path}", timeout=10)
        assert r.status_code == 401, path
        assert httpx.get(f"{up.head}{path}", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        assert httpx.get(f"{up.head}{path}", headers=AUTH, timeout=30).status_code == 200, path
    assert httpx.post(f"{up.head}/register", json={"name": "x", "host": "h", "port": 1}, timeout=10).status_code == 401


def test_proxy_and_servers_need_the_key(up):
    body = verify_body("a", expected_answer="a")
    assert httpx.post(f"{up.head}/servers/em_a/verify", json=body, timeout=10).status_code == 401
    r = httpx.post(f"{up.head}/servers/em_a/verify", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["reward"] == 1.0
    url = {row["name"]: row for row in httpx.get(f"{up.head}/server_instances", headers=AUTH, timeout=10).json()}
    direct = url["em_b"]["url"]
    assert httpx.post(f"{direct}/verify", json=body, timeout=10).status_code == 401
    assert httpx.post(f"{direct}/verify", json=body, headers=AUTH, timeout=30).status_code == 200


def test_servers_register_with_the_key(up):
    deadline = time.monotonic() + 20
    while True:
        rows = {r["name"]: r for r in httpx.get(f"{up.head}/server_instances", headers=AUTH, timeout=10).json()}
        if all(rows[n]["status"] == "registered" and rows[n]["pid"] for n in ("em_a", "em_b")):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)
    assert "answered 401" not in up.output


def test_status_command_uses_the_key(up):
    env = {**up.env}
    ok = subprocess.run([sys.executable, "-m", "gymserve", "status", "--head", up.head], env=env,
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "em_b" in ok.stdout
    env.pop("GYMSERVE_API_KEY")
    denied = subprocess.run([sys.executable, "-m", "gymserve", "status", "--head", up.head], env=env,
                            capture_output=True, text=True, timeout=60)
    assert denied.returncode == 1 and "401" in denied.stderr



def test_dashboard_command_opens_the_dashboard_with_the_key(up):
    """A browser cannot send the bearer key: `gymserve dashboard` forwards GETs with it, read-only."""
    proc, url = dashboard_forwarder(up.head, {**up.env})
    try:
        page = httpx.get(f"{url}/dashboard", timeout=30)
        assert page.status_code == 200 and "/dashboard/data" in page.text and KEY not in page.text
        data = httpx.get(f"{url}/dashboard/data", timeout=30)
        assert data.status_code == 200 and {s["name"] for s in data.json()["servers"]} >= {"em_a", "em_b"}
        assert httpx.get(f"{url}/dashboard/static/dashboard.js", timeout=30).headers["content-type"].startswith(
            ("application/javascript", "text/javascript"))
        refused = httpx.post(f"{url}/servers/em_a/verify", json=verify_body("a", expected_answer="a"), timeout=10)
        assert refused.status_code == 405 and "read-only" in refused.json()["detail"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    wrong, wrong_url = dashboard_forwarder(up.head, {**up.env, "GYMSERVE_API_KEY": "wrong"})
    try:  # a wrong key gets the head's own 401, passed through
        assert httpx.get(f"{wrong_url}/dashboard", timeout=30).status_code == 401
    finally:
        wrong.terminate()
        wrong.communicate(timeout=30)


def test_dashboard_command_listens_on_loopback_only():
    done = subprocess.run([sys.executable, "-m", "gymserve", "dashboard", "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "loopback" in done.stderr


def test_children_die_with_a_sigkilled_launcher(up):
    kids = children(up.proc.pid)
    assert len(kids) == 3
    up.proc.send_signal(signal.SIGKILL)
    up.proc.wait(10)
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in kids):
        assert time.monotonic() < deadline, [p for p in kids if pid_alive(p)]
        time.sleep(0.2)
