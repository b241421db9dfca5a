"""resources/terminal end to end (real server, real bubblewrap): tools act on the session's workspace,
/verify runs the task's check there (or replays the calls in a fresh one), limits hold, bad input is a
4xx, and a server killed with SIGKILL leaves folders that the next server's janitor removes."""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body
from tests.integration.sandbox_helpers import sandbox_dir

ROOT = Path(__file__).resolve().parents[2]
ROWS = {r["task_id"]: r for r in map(json.loads, (ROOT / "datasets/terminal/example.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with sandbox_dir() as where, ServerProcess("resources/terminal", "limits.wall_s=3", "limits.output_bytes=4096",
                                               env={"GYMSERVE_SANDBOX_DIR": str(where)}) as proc:
        yield proc
        proc.stop()
        assert not list(where.iterdir()), "workspace folders left behind"


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "call_id": f"c_{name}", "name": name, "arguments": json.dumps(args)}


def body(row: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    fields = {k: v for k, v in row.items() if k != "responses_create_params"}
    b = verify_body("done", responses_create_params=row["responses_create_params"], **fields)
    b["response"]["output"] = output + b["response"]["output"]
    return b


def test_session_tools_and_check(server: ServerProcess) -> None:
    row = ROWS["fix_script"]
    sid = server.post("/seed_session", row).json()["session_id"]
    h = {"X-Session-Id": sid}
    assert "$2" in server.post("/read_file", {"path": "bin/greet.sh"}, headers=h).json()["stdout"]
    wrong = server.post("/verify", body(row, []), headers=h).json()
    assert wrong["reward"] == 0.0 and wrong["mask_sample"] is False and wrong["state_source"] == "session"
    patch = ("diff --git a/bin/greet.sh b/bin/greet.sh\n--- a/bin/greet.sh\n+++ b/bin/greet.sh\n@@ -1,2 +1,2 @@\n"
             " #!/bin/bash\n-echo \"hello, $2\"\n+echo \"hello, $1\"\n")
    assert server.post("/apply_patch", {"patch": patch}, headers=h).json()["exit_code"] == 0
    right = server.post("/verify", body(row, []), headers=h).json()
    assert right["reward"] == 1.0 and right["check_exit_code"] == 0
    server.post("/close_session", {}, headers=h)


def test_replay_without_a_session(server: ServerProcess) -> None:
    row = ROWS["count_lines"]
    good = [call("bash", {"command": "tail -n +2 data.csv | wc -l > count.txt"})]
    assert server.post("/verify", body(row, good)).json()["reward"] == 1.0
    bad = [call("write_file", {"path": "count.txt", "content": "4"}), call("bash", {"command": 42})]
    reply = server.post("/verify", body(row, bad)).json()
    assert reply["reward"] == 0.0 and reply["state_source"] == "replay" and reply["mask_sample"] is False


def test_limits_hold(server: ServerProcess) -> None:
    sid = server.post("/seed_session", ROWS["hello_file"]).json()["session_id"]
    h = {"X-Session-Id": sid}
    slow = server.post("/bash", {"command": "sleep 30; echo never"}, headers=h).json()
    assert slow["timed_out"] is True and slow["exit_code"] is None and "never" not in slow["stdout"]
    loud = server.post("/bash", {"command": "yes"}, headers=h).json()
    assert loud["output_exceeded"] is True and len(loud["stdout"]) <= 4096
    server.post("/close_session", {}, headers=h)


def test_bad_input_is_4xx_naming_the_field(server: ServerProcess) -> None:
    sid = server.post("/seed_session", ROWS["hello_file"]).json()["session_id"]
    h = {"X-Session-Id": sid}
    for tool, args, field in (("bash", {"command": ""}, "command"), ("write_file", {"path": "a"}, "content"),
                              ("read_file", {"path": 3}, "path"), ("apply_patch", {}, "patch")):
        r = server.post(f"/{tool}", args, headers=h)
        assert r.status_code in (400, 422) and field in r.text, (tool, r.status_code, r.text)
    r = server.post("/seed_session", {**ROWS["count_lines"], "files": {"../escape": "x"}})
    assert r.status_code == 400 and "files" in r.text
    r = server.post("/verify", {**body(ROWS["hello_file"], []), "check": ""})
    assert 400 <= r.status_code < 500 and "check" in r.text
    server.post("/close_session", {}, headers=h)


def test_killed_server_leftovers_are_reclaimed() -> None:
    with sandbox_dir() as where:
        env = {"GYMSERVE_SANDBOX_DIR": str(where)}
        first = ServerProcess("resources/terminal", "warm_pool=2", env=env).start()
        try:
            assert first.post("/seed_session", ROWS["hello_file"]).status_code == 200
            assert first.proc is not None
            os.killpg(first.proc.pid, signal.SIGKILL)
            first.proc.wait(10)
        finally:
            first.stop()
        assert list(where.glob("gymserve-ws-*")), "the killed server had no workspace to leave behind"
        with ServerProcess("resources/terminal", "warm_pool=0", env=env) as second:
            assert not list(where.glob("gymserve-ws-*")), "the janitor left a dead server's folders"
            second.stop()


def test_a_failed_sandbox_is_masked_not_zero(server: ServerProcess) -> None:
    row = ROWS["hello_file"]
    sid = server.post("/seed_session", row).json()["session_id"]
    h = {"X-Session-Id": sid}
    where = Path(server.env["GYMSERVE_SANDBOX_DIR"])
    # the session's folder disappears under the server (a disk cleaner, an operator): infrastructure
    assert server.post("/bash", {"command": f"touch {sid}"}, headers=h).json()["exit_code"] == 0
    mine = [folder for folder in where.glob("gymserve-ws-*") if (folder / "tree" / sid).exists()]
    assert len(mine) == 1
    shutil.rmtree(mine[0])
    tool = server.post("/bash", {"command": "echo hi > hello.txt"}, headers=h)
    assert tool.status_code == 503 and "sandbox" in tool.text, tool.text
    reply = server.post("/verify", body(row, []), headers=h).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == "sandbox", reply
    server.post("/close_session", {}, headers=h)


def test_max_sessions_is_a_429_not_a_hang() -> None:
    with sandbox_dir() as where, ServerProcess("resources/terminal", "max_sessions=1", "warm_pool=0",
                                               env={"GYMSERVE_SANDBOX_DIR": str(where)}) as env:
        first = env.post("/seed_session", ROWS["hello_file"])
        assert first.status_code == 200
        second = env.post("/seed_session", ROWS["hello_file"])
        assert second.status_code == 429 and "max_sessions" in second.text
        env.post("/close_session", {}, headers={"X-Session-Id": first.json()["session_id"]})
        assert env.post("/seed_session", ROWS["hello_file"]).status_code == 200
        env.stop()
        assert not list(where.iterdir())
