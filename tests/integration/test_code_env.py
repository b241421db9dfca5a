"""resources/code end to end: example data with right and wrong solutions, REPL tool mode, bad input,
unsafe mode, refusal to start, sandbox failures and backpressure (real servers, real bubblewrap)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from gymserve.testing import ServerProcess, verify_body

ROOT = Path(__file__).resolve().parents[2]
ROWS = {row["id"]: row for row in map(json.loads, (ROOT / "datasets/code/example.jsonl").read_text().splitlines())}

# A correct and a wrong reference solution for every example problem.
SOLUTIONS: dict[str, tuple[str, str]] = {
    "sum_two": ("a, b = map(int, input().split())\nprint(a + b)", "a, b = map(int, input().split())\nprint(a - b)"),
    "reverse_words": ("print(' '.join(input().split()[::-1]))", "print(input()[::-1])"),
    "count_primes": (
        "n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[:2] = b'\\x00\\x00'\n"
        "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
        "        sieve[i*i::i] = bytearray(len(sieve[i*i::i]))\n"
        "print(sum(sieve))",
        "n = int(input())\n"
        "print(sum(1 for k in range(2, n + 1) if all(k % d for d in range(2, int(k ** 0.5) + 1))) + (n > 50))"),
    "fizzbuzz": (
        "for i in range(1, int(input()) + 1):\n    print('Fizz' * (i % 3 == 0) + 'Buzz' * (i % 5 == 0) or i)",
        "for i in range(1, int(input()) + 1):\n    print('Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)"),
    "is_palindrome": (
        "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
        "def is_palindrome(s):\n    return s == s[::-1]"),
    "gcd": ("import math\ndef gcd(a, b):\n    return math.gcd(a, b)", "def gcd(a, b):\n    return min(a, b)"),
    "running_max": (
        "def running_max(xs):\n    out, best = [], None\n    for x in xs:\n"
        "        best = x if best is None else max(best, x)\n        out.append(best)\n    return out",
        "def running_max(xs):\n    return sorted(xs)"),
}


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


def body_for(row: dict, text: str) -> dict:
    return {**{k: v for k, v in row.items() if k != "responses_create_params"},
            **verify_body(text, responses_create_params=row["responses_create_params"])}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess("resources/code", "timeout_s=3", "repl_timeout_s=2") as proc:
        yield proc


def _fields(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k not in ("response", "responses_create_params")}


def test_every_example_has_both_reference_solutions():
    assert set(SOLUTIONS) == set(ROWS)
    assert any("tests" in r for r in ROWS.values()) and any("test_code" in r for r in ROWS.values())


def test_correct_solutions_score_one_and_wrong_ones_do_not(server):
    ids = sorted(ROWS)
    right = server.post("/verify/batch", [body_for(ROWS[i], fenced(SOLUTIONS[i][0])) for i in ids]).json()
    wrong = server.post("/verify/batch", [body_for(ROWS[i], fenced(SOLUTIONS[i][1])) for i in ids]).json()
    for i, good, bad in zip(ids, right, wrong):
        assert good["mask_sample"] is False and bad["mask_sample"] is False, (i, good, bad)
        assert good["reward"] == 1.0 and good["tests_passed"] == good["tests_total"], (i, _fields(good))
        assert bad["reward"] < 1.0 and bad["tests_passed"] < bad["tests_total"], (i, _fields(bad))
        assert bad["id"] == i and good["sandbox"] == "bwrap"
        assert {r["failure_kind"] for r in bad["test_results"] if not r["passed"]} <= {"wrong_answer", "runtime_error"}


def test_reward_modes_and_last_block(server):
    row = ROWS["sum_two"]
    half = "import sys\na, b = map(int, input().split())\nprint(a + b if a > 0 else 7)"
    text = "```python\nprint('draft')\n```\nFinal:\n```python\n" + half + "\n```"
    fraction = server.post("/verify", body_for(row, text)).json()
    assert fraction["tests_passed"] == 2 and fraction["tests_total"] == 3
    assert fraction["reward"] == pytest.approx(2 / 3)
    strict = server.post("/verify", {**body_for(row, text), "reward_mode": "all"}).json()
    assert strict["reward"] == 0.0 and strict["tests_passed"] == 2
    plain = server.post("/verify", body_for(row, SOLUTIONS["sum_two"][0])).json()  # no fence: whole text
    assert plain["reward"] == 1.0


def test_runtime_error_and_stderr_tail(server):
    reply = server.post("/verify", body_for(ROWS["gcd"], fenced("def gcd(a, b):\n    raise ValueError('nope')"))).json()
    assert reply["reward"] == 0.0 and reply["mask_sample"] is False
    first = reply["test_results"][0]
    assert first["failure_kind"] == "runtime_error" and "ValueError: nope" in first["stderr"]



def _reaped_cpu_s(pid: int) -> float:
    """CPU seconds of the process's children that it has reaped (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def test_a_rows_test_runs_are_reaped_through_the_server(server):
    """Each test's CPU reaches the server's own children accounting: the sandbox exits by itself once
    it has answered, so bwrap reaps the runner. Killed at once (as before), bwrap died first and the
    host's init reaped the runner: batch-completion benchmarks missed most of the code work."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4:\n    pass\nprint(input())"
    row = {**ROWS["sum_two"], "tests": [{"input": "1\n", "output": "1\n"}, {"input": "2\n", "output": "2\n"}]}
    before = _reaped_cpu_s(server.proc.pid)
    reply = server.post("/verify", body_for(row, fenced(burn))).json()
    assert reply["reward"] == 1.0 and reply["tests_passed"] == 2, _fields(reply)
    assert _reaped_cpu_s(server.proc.pid) - before >= 0.6  # 0.8 CPU-s burnt inside the sandbox

def _tool(server: ServerProcess, sid: str, code) -> httpx.Response:
    return server.post("/execute_python", {"code": code}, headers={"X-Session-Id": sid})


def test_repl_state_persists_and_close_session_frees_it(server):
    sid = server.post("/seed_session", {}).json()["session_id"]
    first = _tool(server, sid, "import math\ndef area(r):\n    return math.pi * r * r\ncount = 1").json()
    assert first == {"stdout": "", "stderr": "", "exit_code": 0, "timed_out": False, "result": None,
                     "truncated": False, "terminated": False, "sandbox": "bwrap"}
    second = _tool(server, sid, "count += 1\nprint('count', count)\nround(area(2), 3)").json()
    assert second["stdout"] == "count 2\n" and second["result"] == "12.566" and second["terminated"] is False
    error = _tool(server, sid, "raise SystemExit(3)").json()
    assert error["exit_code"] == 3
    assert _tool(server, sid, "count").json()["result"] == "2"  # SystemExit did not end the interpreter
    other = server.post("/seed_session", {}).json()["session_id"]
    assert "NameError" in _tool(server, other, "count").json()["stderr"]  # sessions are separate
    assert server.post("/close_session", {}, headers={"X-Session-Id": sid}).json() == {"session_id": sid,
                                                                                      "closed": True}
    assert _tool(server, sid, "count").status_code == 409
    server.post("/close_session", {"session_id": other})


def test_repl_timeout_kills_and_restarts_the_interpreter(server):
    sid = server.post("/seed_session", {}).json()["session_id"]
    _tool(server, sid, "x = 5")
    slow = _tool(server, sid, "import time\ntime.sleep(60)").json()
    assert slow["timed_out"] is True and slow["exit_code"] is None and slow["state_lost"] is True
    after = _tool(server, sid, "print('alive')").json()
    assert after["stdout"] == "alive\n" and after["state_lost"] is True
    assert "NameError" in _tool(server, sid, "x").json()["stderr"]
    crashed = _tool(server, sid, "import os\nos._exit(4)").json()
    assert crashed["exit_code"] == 4 and crashed["state_lost"] is True
    assert _tool(server, sid, "1 + 1").json()["result"] == "2"
    server.post("/close_session", {}, headers={"X-Session-Id": sid})


def test_terminate_on_evaluation(server):
    sid = server.post("/seed_session", {"terminate_on_evaluation": True}).json()["session_id"]
    assert _tool(server, sid, "x = 2").json()["terminated"] is False
    assert _tool(server, sid, "1 / 0").json()["terminated"] is False
    done = _tool(server, sid, "x * 21").json()
    assert done["terminated"] is True and done["result"] == "42"
    server.post("/close_session", {}, headers={"X-Session-Id": sid})


@pytest.mark.parametrize("fields, needle", [
    ({}, "neither tests"),
    ({"tests": "1 2"}, "tests: expected"),
    ({"tests": [{"input": "1"}]}, "tests[0]"),
    ({"test_code": "assert ("}, "test_code: not valid Python"),
    ({"test_code": "assert True", "entry_point": "1x"}, "entry_point"),
    ({"tests": [{"input": "", "output": ""}], "reward_mode": "most"}, "reward_mode"),
])
def test_bad_verify_input_is_a_4xx_naming_the_field(server, fields, needle):
    reply = server.post("/verify", verify_body("print(1)", **fields))
    assert reply.status_code == 400 and needle in reply.json()["detail"], reply.text


def test_bad_tool_input_is_a_4xx(server):
    sid = server.post("/seed_session", {}).json()["session_id"]
    assert _tool(server, sid, 5).status_code == 400
    missing = server.post("/execute_python", {}, headers={"X-Session-Id": sid})
    assert missing.status_code == 400 and "code" in missing.json()["detail"]
    extra = server.post("/execute_python", {"code": "1", "bogus": 1}, headers={"X-Session-Id": sid})
    assert extra.status_code == 400
    assert server.post("/execute_python", {"code": "1"}).status_code == 400  # no session
    assert server.post("/seed_session", {"terminate_on_evaluation": "yes"}).status_code == 400
    assert server.post("/execute_python", content=b"{not json", headers={"X-Session-Id": sid}).status_code == 400
    server.post("/close_session", {}, headers={"X-Session-Id": sid})


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_unsafe_mode_says_so_everywhere():
    with ServerProcess("resources/code", "sandbox=unsafe", "timeout_s=3") as proc:
        ready = proc.get("/ready").json()
        assert ready["status"] == "ready" and ready["sandbox"] == "unsafe"
        reply = proc.post("/verify", body_for(ROWS["sum_two"], fenced(SOLUTIONS["sum_two"][0]))).json()
        assert reply["reward"] == 1.0 and reply["sandbox"] == "unsafe"
        sids = [proc.post("/seed_session", {}).json()["session_id"] for _ in range(2)]
        for n, sid in enumerate(sids):
            assert _tool(proc, sid, f"print({n})\nn = {n}").json() == {
                "stdout": f"{n}\n", "stderr": "", "exit_code": 0, "timed_out": False, "result": None,
                "truncated": False, "terminated": False, "sandbox": "unsafe"}
        assert [_tool(proc, sid, "print(n)").json()["stdout"] for sid in sids] == ["0\n", "1\n"]
        assert "SANDBOX DISABLED" in proc.log()
        interpreters = _descendants(proc.proc.pid)  # the sessions' supervisors and their workers
        assert len(interpreters) >= 4
    # without a PID namespace nothing but the worker's own death signal ends a session's interpreter
    # (it is in a session of its own, stopped between calls) when the server goes
    deadline = time.monotonic() + 10
    while any(map(_alive, interpreters)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, interpreters))


def test_refuses_to_start_without_a_working_sandbox():
    with pytest.raises(RuntimeError) as info:
        ServerProcess("resources/code", "bwrap_path=/nonexistent/bwrap", ready_timeout_s=60).start()
    assert "bubblewrap not found" in str(info.value) and "sandbox=unsafe" in str(info.value)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A temporary directory that the sandbox user (uid 65534, what bwrap runs as under root) can reach."""
    path = Path(tempfile.mkdtemp(prefix="gymserve-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_sandbox_failure_is_masked_not_zero(open_dir):
    """bwrap is wrapped by a script that starts failing on demand (injected fault: a broken bwrap)."""
    marker = open_dir / "broken"
    wrapper = open_dir / "bwrap"
    real = next(p for p in ("/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap") if os.path.exists(p))
    wrapper.write_text(f"#!/bin/sh\nif [ -e {marker} ]; then echo 'bwrap: simulated setup failure' >&2; exit 1; fi\n"
                       f"exec {real} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXOTH | stat.S_IROTH)
    with ServerProcess("resources/code", f"bwrap_path={wrapper}", "prestart=0") as proc:
        row = ROWS["sum_two"]
        assert proc.post("/verify", body_for(row, fenced(SOLUTIONS["sum_two"][0]))).json()["reward"] == 1.0
        marker.touch()
        reply = proc.post("/verify", body_for(row, fenced(SOLUTIONS["sum_two"][0]))).json()
        assert reply["mask_sample"] is True and reply["failure_kind"] == "sandbox"
        assert "simulated setup failure" in reply["failure_reason"]
        sid = proc.post("/seed_session", {}).json()["session_id"]
        tool = _tool(proc, sid, "1")
        assert tool.status_code == 200, tool.text
        assert tool.json()["mask_sample"] is True and tool.json()["failure_kind"] == "sandbox"
        assert "simulated" in tool.json()["failure_reason"]


async def test_bounded_queue_answers_503_when_full():
    with ServerProcess("resources/code", "max_concurrency=1", "max_pending=1", "timeout_s=5") as proc:
        slow = verify_body(fenced("import time\ntime.sleep(2)\nprint(1)"), tests=[{"input": "", "output": "1"}])
        async with httpx.AsyncClient(base_url=proc.url, timeout=30) as client:
            first = asyncio.ensure_future(client.post("/verify", json=slow))
            await asyncio.sleep(0.5)
            second = asyncio.ensure_future(client.post("/verify", json=slow))
            await asyncio.sleep(0.3)
            third = await client.post("/verify", json=slow)
            assert third.status_code == 503 and "overloaded" in third.json()["detail"]
            assert (await first).json()["reward"] == 1.0
            assert (await second).json()["reward"] == 1.0
