"""The control plane is authenticated by default: `gymserve up` with no key generates one (a 0600
file in the user's config dir, its path printed, never the key), every server enforces it, clients
find it without an export, a registration cannot re-point a server of the stack, children inherit
no unrelated variable, and the dashboard forwarder answers loopback Host names only."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.core.ports import free_port
from tests.integration.up_helpers import STACK, Up, dashboard_forwarder

UNRELATED = "GS_UNRELATED_CLOUD_TOKEN"


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    config_home = tmp_path_factory.mktemp("config")
    env = {"XDG_CONFIG_HOME": str(config_home), "GYMSERVE_API_KEY": "", "GYMSERVE_API_KEY_FILE": "",
           UNRELATED: "do-not-leak-8d1f"}
    launcher = Up("-c", str(STACK), env=env)
    try:
        launcher.wait_for(r"all 3 servers ready", timeout_s=180)
        launcher.head = launcher.wait_for(r"head on (http://\S+)").group(1)
        launcher.key_file = config_home / "gymserve" / "api_key"
        yield launcher
    finally:
        launcher.kill()


def test_a_key_is_generated_into_a_private_file_and_only_its_path_is_printed(up):
    assert stat.S_IMODE(up.key_file.stat().st_mode) == 0o600
    key = up.key_file.read_text().strip()
    assert len(key) >= 32
    assert str(up.key_file) in up.output and key not in up.output


def test_registration_without_the_key_is_401(up):
    r = httpx.post(f"{up.head}/register", json={"name": "evil", "host": "127.0.0.1", "port": 1}, timeout=10)
    assert r.status_code == 401
    assert httpx.get(f"{up.head}/server_instances", timeout=10).status_code == 401
    assert httpx.post(f"{up.head}/servers/em_a/verify", json={}, timeout=10).status_code == 401


def test_clients_find_the_generated_key_without_an_export(up):
    env = {k: v for k, v in up.env.items() if k not in ("GYMSERVE_API_KEY", "GYMSERVE_API_KEY_FILE")}
    done = subprocess.run([sys.executable, "-m", "gymserve", "status", "--head", up.head], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "em_a" in done.stdout, done.stderr


def test_a_stack_server_cannot_be_repointed_even_with_the_key(up):
    url = {r["name"]: r["url"] for r in httpx.get(f"{up.head}/server_instances", headers=up.auth, timeout=10).json()}
    hijack = {"name": "em_a", "host": "127.0.0.1", "port": free_port(), "kind": "resources/exact_match"}
    r = httpx.post(f"{up.head}/register", json=hijack, headers=up.auth, timeout=10)
    assert r.status_code == 403 and "name" in r.json()["detail"]
    after = {r["name"]: r["url"] for r in httpx.get(f"{up.head}/server_instances", headers=up.auth, timeout=10).json()}
    assert after["em_a"] == url["em_a"]


def test_children_get_only_the_base_environment(up):
    deadline = time.monotonic() + 30
    while True:
        rows = httpx.get(f"{up.head}/server_instances", headers=up.auth, timeout=10).json()
        pids = [r["pid"] for r in rows if r.get("pid")]
        if len(pids) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(pids) == 2, rows
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        names = {e.split(b"=", 1)[0].decode() for e in environ if e}
        assert UNRELATED not in names and "PATH" in names and "GYMSERVE_API_KEY_FILE" in names



def test_dashboard_forwarder_checks_host_and_forwards_the_dashboard_only(up):
    proc, url = dashboard_forwarder(up.head, {k: v for k, v in up.env.items() if k != "GYMSERVE_API_KEY_FILE"})
    try:
        assert httpx.get(f"{url}/dashboard/data", timeout=30).status_code == 200
        assert httpx.get(f"{url}/dashboard", headers={"Host": "localhost"}, timeout=30).status_code == 200
        rebound = httpx.get(f"{url}/dashboard/data", headers={"Host": "attacker.example:11080"}, timeout=30)
        assert rebound.status_code == 403 and "Host" in rebound.json()["detail"]
        for path in ("/global_config_dict_yaml", "/server_instances", "/servers/em_a/health"):
            assert httpx.get(f"{url}{path}", timeout=30).status_code == 404, path
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_no_auth_is_refused_beyond_loopback(tmp_path):
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "GYMSERVE_API_KEY": ""}
    done = subprocess.run([sys.executable, "-m", "gymserve", "up", "-c", str(STACK), "--no-auth", "head.host=0.0.0.0",
                           f"head.port={free_port()}"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--no-auth" in done.stderr and "loopback" in done.stderr
    assert not (tmp_path / "gymserve").exists()


def test_a_head_beyond_loopback_without_a_key_does_not_start():
    env = {**os.environ, "GYMSERVE_API_KEY": "", "GYMSERVE_API_KEY_FILE": "", "GYMSERVE_HEAD_URL": ""}
    done = subprocess.run([sys.executable, "-m", "gymserve", "serve", "head", "--host", "0.0.0.0", "--port",
                           str(free_port())], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "without a bearer key" in done.stderr
