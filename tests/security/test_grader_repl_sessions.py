"""REPL sessions: a call queued behind `/close_session` (or running when it comes) must not leave a live
interpreter behind, outside `max_sessions` and owned by no session; and closing a session is never
reported as a masked sandbox failure of the call it interrupted."""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from gymserve.testing import ServerProcess
from tests.security.code_sandbox import assert_healthy, server  # noqa: F401


def interpreters_under(root: int) -> list[int]:
    """Pids of REPL sandbox processes (supervisor, worker, bwrap) descended from `root`."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdlines[int(entry)] = f.read()
        except (OSError, ValueError, IndexError):
            continue
    found = []
    for pid, cmd in cmdlines.items():
        if b"_GymSupervisor" not in cmd:
            continue
        p = pid
        while p in parents and p not in (0, 1):
            p = parents[p]
            if p == root:
                found.append(pid)
                break
    return found


def test_a_call_queued_behind_close_session_starts_nothing(server: ServerProcess) -> None:
    assert server.proc is not None
    sid = server.post("/seed_session", {}).json()["session_id"]
    h = {"X-Session-Id": sid}
    assert server.post("/execute_python", {"code": "x = 1"}, headers=h).status_code == 200
    replies: dict[str, Any] = {}

    def call(name: str, code: str) -> None:
        replies[name] = server.post("/execute_python", {"code": code}, headers=h, timeout=30)

    slow = threading.Thread(target=call, args=("slow", "import time\ntime.sleep(2)"))
    slow.start()
    time.sleep(0.5)
    queued = threading.Thread(target=call, args=("queued", "print('late')"))
    queued.start()
    time.sleep(0.5)
    assert server.post("/close_session", {}, headers=h).json()["closed"] is True
    slow.join(30)
    queued.join(30)
    for name in ("slow", "queued"):
        r = replies[name]
        assert r.status_code == 409 or (r.status_code == 200 and not r.json().get("mask_sample")), (name, r.text)
    assert replies["queued"].status_code == 409, replies["queued"].text
    deadline = time.monotonic() + 10
    while interpreters_under(server.proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert interpreters_under(server.proc.pid) == [], "an interpreter outlived its closed session"
    assert_healthy(server)
