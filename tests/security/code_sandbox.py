"""Shared helpers for the code sandbox security tests: one real `resources/code` server per module."""
from __future__ import annotations

import os
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body

API_KEY = "gymserve-test-secret-4f1c"
TIMEOUT_S = 3.0
PRESTART = 2


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("resources/code", f"timeout_s={TIMEOUT_S}", "memory_mb=256", "sandbox_memory_mb=320",
                       "max_output_bytes=8192", "repl_timeout_s=3", f"prestart={PRESTART}",
                       env={"GYMSERVE_API_KEY": API_KEY}) as proc:
        require_full_isolation(proc.get("/ready").json())
        yield proc


def run(server: ServerProcess, program: str, stdin: str = "", expected: str = "") -> dict[str, Any]:
    """Verify `program` against one stdin/stdout test; returns that test's result (plus the reply)."""
    reply = server.post("/verify", verify_body(f"```python\n{program}\n```",
                                               tests=[{"input": stdin, "output": expected}]))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["mask_sample"] is False, body.get("failure_reason")
    result = dict(body["test_results"][0])
    result["_reply"] = body
    return result


def stdout_of(server: ServerProcess, program: str) -> str:
    """Run `program` in tool mode (fresh session) and return its stdout; asserts it ran."""
    sid = server.post("/seed_session", {}).json()["session_id"]
    try:
        reply = server.post("/execute_python", {"code": program}, headers={"X-Session-Id": sid})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["exit_code"] == 0, body
        return body["stdout"]
    finally:
        server.post("/close_session", {}, headers={"X-Session-Id": sid})


def assert_healthy(server: ServerProcess) -> None:
    """The server still answers and still runs a normal program correctly."""
    assert server.get("/health").json() == {"status": "ok"}
    assert server.proc is not None and server.proc.poll() is None
    result = run(server, "print(int(input()) * 2)", "21\n", "42\n")
    assert result["passed"], result


def require_full_isolation(ready: dict[str, Any]) -> None:
    """In CI (CI=true, run as root) a weaker fallback (no pids/memory cgroups) fails loudly instead of
    letting the security tests pass against a sandbox that is not the one deployed as root."""
    if os.environ.get("CI") == "true" and (os.geteuid() != 0 or ready.get("process_limit") != "cgroup"):
        pytest.fail(f"security tests need root with cgroups in CI; got uid {os.geteuid()} and {ready}")


def session(server: ServerProcess) -> dict[str, str]:
    """Headers of a fresh tool session."""
    return {"X-Session-Id": server.post("/seed_session", {}).json()["session_id"]}
