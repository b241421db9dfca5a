"""`gymserve up` refusing bad stacks clearly: unknown kinds, missing ${ENV}, a child that dies while
starting, a readiness timeout that names the server and shows its log lines."""
from __future__ import annotations

import re
import subprocess
import sys

from services.core.ports import free_port
from tests.integration.up_helpers import STACK, Up, children


def run_up(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gymserve", "up", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_unknown_kind_is_a_config_error_naming_it(tmp_path):
    stack = tmp_path / "s.yaml"
    stack.write_text("servers:\n  judge: {kind: resources/does_not_exist}\n")
    done = run_up("-c", str(stack))
    assert done.returncode == 2
    assert "servers.judge" in done.stderr and "resources/does_not_exist" in done.stderr and str(stack) in done.stderr
    done = run_up("-c", str(stack), "servers.judge.kind=nonsense")
    assert done.returncode == 2 and "nonsense" in done.stderr


def test_missing_env_is_named(tmp_path):
    stack = tmp_path / "s.yaml"
    stack.write_text("servers:\n  em: {kind: resources/exact_match, label: '${GS_SURELY_UNSET_VAR}'}\n")
    done = run_up("-c", str(stack))
    assert done.returncode == 2 and "GS_SURELY_UNSET_VAR" in done.stderr and "servers.em" in done.stderr


def test_taken_port_is_named(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        done = run_up("-c", str(STACK), f"servers.em_b.port={port}")
    assert done.returncode == 2 and "servers.em_b.port" in done.stderr and str(port) in done.stderr


def test_child_dying_at_start_fails_fast_with_its_log():
    up = Up("-c", str(STACK), "servers.em_b.no_such_option=1", f"head.port={free_port()}")
    code = up.wait(90)
    assert code == 1
    assert "server 'em_b' (resources/exact_match) exited with code 2 during start-up" in up.output
    assert "no_such_option" in up.output.split("during start-up", 1)[1]
    assert children(up.proc.pid) == []


def test_readiness_timeout_names_the_server_and_shows_its_log():
    up = Up("-c", str(STACK), "--ready-timeout", "0.01")
    code = up.wait(90)
    assert code == 1
    assert re.search(r"server '(head|em_a|em_b)' \(\S+\) was not ready after 0.01s \(GET http://\S+/ready\); "
                     r"its last log lines", up.output), up.output
    assert "all servers stopped" in up.output
