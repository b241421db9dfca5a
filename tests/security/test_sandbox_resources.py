"""Resource attacks are cut off with the right failure_kind, and the server stays healthy."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from gymserve.testing import verify_body
from tests.security.code_sandbox import PRESTART, TIMEOUT_S, assert_healthy, run, server  # noqa: F401


def _leftover_cgroups(server) -> list[Path]:
    """Per-execution cgroups not explained by the pre-started sandboxes (each: bwrap, its init, python)."""
    ready = server.get("/ready").json()
    if ready.get("process_limit") != "cgroup":
        return []
    bases = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup")
    parents = [Path(base) / f"gymserve-{server.proc.pid}" for base in bases]
    leftovers = []
    for parent in filter(Path.is_dir, parents):
        children = [child for child in parent.iterdir() if child.is_dir()]
        busy = [c for c in children if len((c / "cgroup.procs").read_text().split()) > 3]
        if len(children) > PRESTART or busy:
            leftovers += busy or children
    return leftovers


def _wait_no_leftovers(server) -> list[Path]:
    deadline = time.monotonic() + 5
    while _leftover_cgroups(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _leftover_cgroups(server)


@pytest.mark.timeout(TIMEOUT_S + 60)  # the wall clock ends it; a hang fails here
def test_fork_bomb_is_contained(server):
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run(server, program)
    assert result["failure_kind"] == "timeout", result
    assert_healthy(server)
    assert _wait_no_leftovers(server) == []


def test_plain_fork_bomb_hits_the_process_limit(server):
    """The limit really applied: forks fail (EAGAIN) before `max_processes` (32) tasks exist; a
    sandbox without a working limit would print `unlimited`."""
    program = ("import os, time\n"
               "kids = 0\n"
               "while kids < 300:\n"
               "    try:\n"
               "        pid = os.fork()\n"
               "    except BlockingIOError:\n"
               "        break\n"
               "    if pid == 0:\n"
               "        time.sleep(60)\n"
               "        os._exit(0)\n"
               "    kids += 1\n"
               "print('limited' if kids < 32 else f'unlimited {kids}')\n")
    result = run(server, program, expected="limited\n")
    assert result["passed"], result
    assert_healthy(server)


def test_memory_bomb(server):
    result = run(server, "chunks = []\nwhile True:\n    chunks.append(bytearray(50_000_000))\n")
    assert result["failure_kind"] == "memory", result
    result = run(server, "x = bytearray(10 ** 11)")
    assert result["failure_kind"] == "memory", result
    assert_healthy(server)


def test_many_processes_cannot_add_up_past_the_sandbox_memory_cap(server):
    """RLIMIT_AS is per process; where the memory cgroup is available it caps the sum."""
    if server.get("/ready").json().get("memory_limit") != "cgroup+rlimit":
        # no memory cgroup here (non-root server): the documented bound is max_processes x memory_mb,
        # so check the per-process half of it holds in a child too
        result = run(server, "import os\nif os.fork() == 0:\n    x = b'x' * (400 << 20)\nelse:\n"
                             "    _, status = os.wait()\n    raise SystemExit(status >> 8)\n")
        assert result["failure_kind"] in ("memory", "runtime_error"), result
        assert "MemoryError" in result.get("stderr", ""), result
        return
    program = ("import os, time\n"
               "for _ in range(4):\n"
               "    if os.fork() == 0:\n"
               "        data = b'x' * (150 << 20)\n"
               "        time.sleep(0.5)\n"
               "        os._exit(0)\n"
               "for _ in range(4):\n"
               "    os.wait()\n"
               "print('survived')\n")
    result = run(server, program, expected="survived\n")
    assert result["failure_kind"] == "memory", result
    assert_healthy(server)


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_cpu_spin(server):
    result = run(server, "while True:\n    pass\n")
    assert result["failure_kind"] == "timeout", result
    result = run(server, "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n")
    assert result["failure_kind"] == "timeout", result
    assert_healthy(server)


def test_endless_output(server):
    result = run(server, "while True:\n    print('x' * 1000)\n")
    assert result["failure_kind"] == "output_limit", result
    result = run(server, "import sys\nwhile True:\n    sys.stderr.write('y' * 1000)\n")
    assert result["failure_kind"] == "output_limit", result
    assert len(result.get("stderr", "")) <= 1000
    assert_healthy(server)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_sleeping_forever(server):
    result = run(server, "import time\ntime.sleep(10 ** 6)\n")
    assert result["failure_kind"] == "timeout", result
    assert_healthy(server)


def test_sleeping_children_die_with_the_run(server):
    """A daemonised grandchild cannot outlive the run (the pid namespace goes with it)."""
    program = ("import os, time\n"
               "if os.fork() == 0:\n"
               "    os.setsid()\n"
               "    time.sleep(10 ** 6)\n"
               "print('parent done')\n")
    result = run(server, program, expected="parent done\n")
    assert result["passed"], result
    assert_healthy(server)
    assert _wait_no_leftovers(server) == []


async def test_fork_bomb_is_contained_without_a_cgroup():
    """Without the pids cgroup the process limit still holds: RLIMIT_NPROC, with bwrap started as
    uid 65534 when the server is root (the kernel never applies RLIMIT_NPROC to root)."""
    from services.resources.code.sandbox import Limits, Sandbox

    sandbox = Sandbox("bwrap", pids_cgroup=False)
    await sandbox.start()  # its probe already refuses to start if the fork limit does not hold
    try:
        assert sandbox.cgroup is None and sandbox.describe()["process_limit"].startswith("rlimit")
        program = "import os\nprint('start')\nwhile True:\n    os.fork()\n"
        result = await sandbox.run(program, b"", Limits(wall_s=10, processes=16))
        assert result.timed_out is False and "BlockingIOError" in result.stderr, result
        assert result.stdout.startswith("start")
    finally:
        await sandbox.close()


def test_sandbox_starts_under_uvloop_without_a_cgroup():
    """uvicorn runs on uvloop when installed, whose subprocess_exec rejects user/group/extra_groups:
    starting bwrap as uid 65534 (root without a cgroup, e.g. in a container) must still work there."""
    import os

    import uvloop

    from services.resources.code.sandbox import Limits, Sandbox

    async def main() -> tuple[str, dict]:
        sandbox = Sandbox("bwrap", pids_cgroup=False)
        await sandbox.start()  # runs the probe: uid, clean env, no network, fork limit
        try:
            result = await sandbox.run("import os\nprint(os.getuid())\n", b"", Limits(wall_s=10))
            return result.stdout, sandbox.describe()
        finally:
            await sandbox.close()

    stdout, described = uvloop.run(main())
    assert stdout.strip() == "65534"
    if os.geteuid() == 0:
        assert "uid 65534" in described["process_limit"], described


# ---- one sandbox per row: a test that misbehaves costs only its own result ---------------------- #
ROW_PROGRAM = ("import os, sys, time\n"
               "mode = input()\n"
               "if mode == 'loop':\n"
               "    while True:\n"
               "        pass\n"
               "elif mode == 'crash':\n"
               "    raise RuntimeError('boom')\n"
               "elif mode == 'flood':\n"
               "    sys.stdout.write('x' * (10 << 20))\n"
               "elif mode == 'bomb':\n"
               "    while True:\n"
               "        try:\n"
               "            os.fork()\n"
               "        except OSError:\n"
               "            pass\n"
               "elif mode == 'daemon':\n"
               "    if os.fork() == 0:\n"
               "        os.setsid()\n"
               "        time.sleep(10 ** 6)\n"
               "    print('daemon left')\n"
               "else:\n"
               "    print(int(mode) * 2)\n")


def _row(server, modes: list[str]) -> dict:
    """/verify of ROW_PROGRAM on one row, a test per mode (a number n expects 2n, the rest expect 'ok')."""
    tests = [{"input": f"{m}\n", "output": f"{int(m) * 2}\n" if m.isdigit() else "ok\n"} for m in modes]
    reply = server.post("/verify", verify_body(f"```python\n{ROW_PROGRAM}\n```", tests=tests))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["mask_sample"] is False, body.get("failure_reason")
    return body


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_a_looping_crashing_or_flooding_test_fails_alone_in_its_rows_sandbox(server):
    body = _row(server, ["1", "loop", "2", "crash", "3", "flood", "4"])
    kinds = [r["failure_kind"] for r in body["test_results"]]
    assert kinds == [None, "timeout", None, "runtime_error", None, "output_limit", None], body["test_results"]
    assert body["tests_passed"] == 4 and body["reward"] == pytest.approx(4 / 7)
    looping = body["test_results"][1]
    assert looping["exit_code"] is None and looping["time_s"] >= TIMEOUT_S  # the server's own per-test deadline
    assert "RuntimeError: boom" in body["test_results"][3]["stderr"]
    assert_healthy(server)


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_a_fork_bomb_or_a_daemon_in_one_test_leaves_the_others_passing(server):
    body = _row(server, ["1", "bomb", "2", "3", "daemon", "4", "5"])
    kinds = [r["failure_kind"] for r in body["test_results"]]
    # the daemon's test fails only on its output ('daemon left', not 'ok'); its sleeper dies with the row
    assert kinds == [None, "timeout", None, None, "wrong_answer", None, None], body["test_results"]
    assert body["tests_passed"] == 5
    assert_healthy(server)
    assert _wait_no_leftovers(server) == []


def test_each_test_of_a_row_has_its_own_directory(server):
    program = ("import os\n"
               "seen = os.path.exists('mark')\n"
               "open('mark', 'w').write(input())\n"
               "print('fresh' if not seen and os.listdir('.') == ['mark'] else 'shared')\n")
    tests = [{"input": f"{i}\n", "output": "fresh\n"} for i in range(8)]
    reply = server.post("/verify", verify_body(f"```python\n{program}\n```", tests=tests)).json()
    assert reply["tests_passed"] == 8, reply["test_results"]


async def test_a_row_whose_sandbox_dies_is_a_sandbox_failure():
    """The whole sandbox killed from outside between two tests (as an OOM kill of the sandbox or a
    crash of bwrap would): SandboxError, which the server answers as a masked `sandbox` failure."""
    import asyncio

    from services.resources.code.sandbox import Limits, Sandbox, SandboxError, Spawned

    class Recording(Sandbox):
        async def spawn(self, script: str, limits: Limits) -> Spawned:
            self.last = await super().spawn(script, limits)
            return self.last

    class KillSecond:
        def __init__(self, kill: bool) -> None:
            self.kill = kill
            self.admitted = 0

        async def acquire(self) -> None:
            self.admitted += 1
            if self.kill and self.admitted == 2:
                await asyncio.sleep(0.5)
                box.kill(box.last)

        def release(self) -> None:
            pass

    box = Recording("bwrap")
    await box.start()
    try:
        program = "print(int(input()) * 2)"
        results = await box.run_batch([(program, b"1\n"), (program, b"2\n")], Limits(wall_s=10), 1, KillSecond(False))
        assert [r.stdout for r in results] == ["2\n", "4\n"]  # the runner works; now kill it mid-row
        with pytest.raises(SandboxError, match="sandbox failed"):
            await box.run_batch([(program, b"1\n"), (program, b"2\n")], Limits(wall_s=10), 1, KillSecond(True))
    finally:
        await box.close()
