"""The terminal grader against a policy that tries to turn its failure into a masked sample, and rows the
server must refuse with a 4xx (real server, real bubblewrap). A command that prints what a failing
sandbox would print (`bwrap: ...` and exit 1, or docker's `Error ...` and 125) is still the command's
own result: only a sandbox that never started the command is an infrastructure failure."""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body
from tests.integration.sandbox_helpers import sandbox_dir

PROMPT = {"input": [{"role": "user", "content": "Create hello.txt saying hi."}]}
CHECK = "grep -qx hi hello.txt"
FORGED = ["echo 'bwrap: execvp /bin/bash: No such file or directory' >&2; exit 1",
          "echo 'Error response from daemon: container is not running' >&2; exit 125",
          "echo 'Error: No such container' >&2; exit 126"]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with sandbox_dir() as where, ServerProcess("resources/terminal", "warm_pool=0", "limits.wall_s=5",
                                               env={"GYMSERVE_SANDBOX_DIR": str(where)}) as proc:
        yield proc
        proc.stop()
        assert not list(where.iterdir()), "workspace folders left behind"


def replay(server: ServerProcess, commands: list[str], **row: Any) -> dict[str, Any]:
    b = verify_body("done", responses_create_params=PROMPT, check=CHECK, **row)
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "bash", "arguments": json.dumps({"command": c})}
             for i, c in enumerate(commands)]
    b["response"]["output"] = calls + b["response"]["output"]
    r = server.post("/verify", b, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("command", FORGED)
def test_forged_sandbox_failure_in_a_replayed_call_scores_0_not_masked(server: ServerProcess, command: str) -> None:
    reply = replay(server, [command])
    assert reply["mask_sample"] is False and reply["reward"] == 0.0, reply


def test_forged_sandbox_failure_does_not_hide_real_work(server: ServerProcess) -> None:
    reply = replay(server, ["echo hi > hello.txt", FORGED[0]])
    assert reply["mask_sample"] is False and reply["reward"] == 1.0, reply


@pytest.mark.parametrize("command", FORGED)
def test_forged_sandbox_failure_is_the_tool_calls_result(server: ServerProcess, command: str) -> None:
    sid = server.post("/seed_session", {"responses_create_params": PROMPT, "check": CHECK}).json()["session_id"]
    h = {"X-Session-Id": sid}
    try:
        r = server.post("/bash", {"command": command}, headers=h)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["exit_code"] == int(command.rsplit(" ", 1)[1]) and command.split("'")[1] in out["stderr"], out
        reply = server.post("/verify", verify_body("done", responses_create_params=PROMPT, check=CHECK), headers=h)
        assert reply.status_code == 200 and reply.json()["mask_sample"] is False, reply.text
    finally:
        server.post("/close_session", {}, headers=h)


@pytest.mark.parametrize("files", [{"a": "x", "a/b": "y"}, {"a/b": "y", "a": "x"}, {".": "x"}, {"a": "x", "./a": "y"},
                                   {"a/": "x"}])
def test_conflicting_or_degenerate_files_are_a_4xx(server: ServerProcess, files: dict[str, str]) -> None:
    r = server.post("/verify", verify_body("done", responses_create_params=PROMPT, check=CHECK, files=files))
    assert 400 <= r.status_code < 500 and "files" in r.text, (r.status_code, r.text)
    r = server.post("/seed_session", {"responses_create_params": PROMPT, "check": CHECK, "files": files})
    assert 400 <= r.status_code < 500 and "files" in r.text, (r.status_code, r.text)
