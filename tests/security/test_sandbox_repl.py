"""The execute_python interpreter: user code cannot forge the reply frame, nothing runs between calls,
a lost interpreter is a masked `sandbox` failure and the session recovers; numpy and sympy import."""
from __future__ import annotations

import json
import os
import signal
import time

from gymserve.testing import ServerProcess
from services.core.sandbox.bwrap import host_uids
from tests.security.code_sandbox import assert_healthy, require_full_isolation, run, server, session  # noqa: F401

# writes a well-formed fake reply frame into every descriptor it has, and through /proc into those of
# every other process of the sandbox (the supervisor's protocol pipe included, were it reachable)
FORGE = """
import glob, json, os, struct
frame = json.dumps({"stdout": "FORGED", "stderr": "", "exit_code": 0, "evaluated": False, "result": None,
                    "truncated": False}).encode()
frame = struct.pack(">I", len(frame)) + frame
hits = []
for fd in range(0, 64):
    try:
        os.write(fd, frame)
        hits.append(fd)
    except OSError:
        pass
for path in glob.glob("/proc/[0-9]*/fd/*"):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(fd, frame)
        hits.append(path)
    except OSError:
        pass
    finally:
        os.close(fd)
print("tried", len(hits))
"""


def test_user_code_cannot_forge_the_reply_frame(server):
    require_full_isolation(server.get("/ready").json())
    headers = session(server)
    try:
        assert server.post("/execute_python", {"code": "secret = 41"}, headers=headers).json()["exit_code"] == 0
        forged = server.post("/execute_python", {"code": FORGE}, headers=headers)
        assert forged.status_code == 200, forged.text
        # the reply is the real one: the frames written to its own stdout are just printed text
        assert forged.json()["stdout"] != "FORGED" and "tried" in forged.json()["stdout"], forged.json()
        for _ in range(3):  # the channel is still in step, and the state is intact
            reply = server.post("/execute_python", {"code": "secret + 1"}, headers=headers)
            assert reply.status_code == 200 and reply.json()["result"] == "42", reply.text
            assert "FORGED" not in reply.text
    finally:
        server.post("/close_session", {}, headers=headers)
    assert_healthy(server)


BUSY = """
import os, threading, time
ticks = []
def spin():
    while True:
        ticks.append(time.monotonic())
        time.sleep(0.005)
threading.Thread(target=spin, daemon=True).start()
if os.fork() == 0:  # a busy child process too, in its own session
    os.setsid()
    with open("child_ticks", "a") as f:
        while True:
            f.write(f"{time.monotonic()}\\n")
            f.flush()
            time.sleep(0.005)
time.sleep(0.3)
"""

GAPS = """
import time
time.sleep(0.3)  # let both run again for a while
child = [float(x) for x in open("child_ticks").read().split()]
def gap(ts):
    return max(b - a for a, b in zip(ts, ts[1:]))
(round(gap(ticks), 2), round(gap(child), 2))
"""


def test_busy_loops_are_frozen_between_calls(server):
    """A thread and a detached child that spin and record the time: between calls nothing of the
    session runs, so both records show the pause between the calls (here 2 s) as a gap."""
    require_full_isolation(server.get("/ready").json())
    headers = session(server)
    try:
        assert server.post("/execute_python", {"code": BUSY}, headers=headers).json()["exit_code"] == 0
        time.sleep(2.0)  # the pause between calls, not a measurement
        reply = server.post("/execute_python", {"code": GAPS}, headers=headers).json()
        assert reply["exit_code"] == 0, reply
        thread_gap, child_gap = json.loads(reply["result"].replace("(", "[").replace(")", "]"))
        assert thread_gap >= 1.5 and child_gap >= 1.5, reply
    finally:
        server.post("/close_session", {}, headers=headers)


def test_a_lost_interpreter_is_a_masked_sandbox_failure_and_the_session_recovers(server):
    headers = session(server)
    try:
        server.post("/execute_python", {"code": "x = 1"}, headers=headers)
        # the user's code kills the process that holds the protocol channel (its parent)
        lost = server.post("/execute_python", {"code": "import os\nos.kill(os.getppid(), 9)\nimport time\n"
                                                        "time.sleep(1)"}, headers=headers)
        assert lost.status_code == 200, lost.text
        body = lost.json()
        assert body["mask_sample"] is True and body["failure_kind"] == "sandbox", body
        assert "lost" in body["failure_reason"] and body["state_lost"] is True
        after = server.post("/execute_python", {"code": "print('back')\n'x' in dir()"}, headers=headers).json()
        assert after["stdout"] == "back\n" and after["result"] == "False" and after["state_lost"] is True, after
        assert "mask_sample" not in after
    finally:
        server.post("/close_session", {}, headers=headers)
    assert_healthy(server)


def test_the_interpreters_own_death_is_not_a_sandbox_failure(server):
    """os._exit in user code ends only the worker: a normal reply (exit code, state lost), not masked."""
    headers = session(server)
    try:
        reply = server.post("/execute_python", {"code": "import os\nos._exit(3)"}, headers=headers).json()
        assert reply["exit_code"] == 3 and reply["state_lost"] is True and "mask_sample" not in reply, reply
    finally:
        server.post("/close_session", {}, headers=headers)


NUMERIC = "import numpy, sympy\nprint(int(numpy.arange(5).sum()), sympy.factor('x**2 - 1'))\n"


def test_numpy_and_sympy_import_inside_the_sandbox_and_nothing_else_of_the_venv():
    # its own server with roomy clocks: importing sympy cold takes seconds on a busy machine
    with ServerProcess("resources/code", "timeout_s=60", "repl_timeout_s=60", "prestart=0") as numeric:
        result = run(numeric, NUMERIC, expected="10 (x - 1)*(x + 1)\n")
        assert result["passed"], result
        headers = session(numeric)
        reply = numeric.post("/execute_python", {"code": NUMERIC}, headers=headers).json()
        assert reply["stdout"] == "10 (x - 1)*(x + 1)\n", reply
        isolated = ("import importlib.util, os, numpy\n"
                    "try:\n    open(os.path.join(os.path.dirname(numpy.__file__), 'x'), 'w')\n"
                    "    print('writable')\nexcept OSError as exc:\n    print(exc.strerror)\n"
                    "[m for m in ('fastapi', 'httpx', 'services', 'gymserve') if importlib.util.find_spec(m)]")
        reply = numeric.post("/execute_python", {"code": isolated}, headers=headers).json()
        assert reply["stdout"] == "Read-only file system\n" and reply["result"] == "[]", reply


def test_a_long_non_ascii_result_is_cut_not_taken_for_a_broken_channel(server):
    """JSON-escaped, a result cut at max_output_bytes is up to 6 times longer: still a normal reply."""
    headers = session(server)
    try:
        reply = server.post("/execute_python", {"code": "'\u00e9' * 20000"}, headers=headers).json()
        assert reply["exit_code"] == 0 and reply["truncated"] is True and "state_lost" not in reply, reply
        assert reply["result"].startswith("'\u00e9\u00e9")
    finally:
        server.post("/close_session", {}, headers=headers)


def _kill_repl_sandboxes(server_pid: int) -> int:
    """SIGKILL every REPL supervisor the server started (found from outside, by its runner's source)."""
    killed = 0
    for pid in host_uids(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_GymSupervisor" in f.read() and pid != server_pid:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
        except OSError:
            continue
    return killed


def test_a_sandbox_killed_between_calls_is_a_masked_sandbox_failure(server):
    headers = session(server)
    try:
        assert server.post("/execute_python", {"code": "x = 1"}, headers=headers).json()["exit_code"] == 0
        assert _kill_repl_sandboxes(server.proc.pid) >= 1
        lost = server.post("/execute_python", {"code": "x"}, headers=headers)
        assert lost.status_code == 200, lost.text
        assert lost.json()["mask_sample"] is True and lost.json()["failure_kind"] == "sandbox", lost.json()
        after = server.post("/execute_python", {"code": "2 * 21"}, headers=headers).json()
        assert after["result"] == "42" and after["state_lost"] is True, after
    finally:
        server.post("/close_session", {}, headers=headers)
    assert_healthy(server)
