"""Escapes to the host: the sandbox user is never root outside, no global kernel setting is writable,
/dev is not a free disk, every writable place is counted, and the CPU limit applies.

Each test runs the real bubblewrap sandbox (as root here, with and without cgroups where it matters).
Files under /proc/sys are only ever opened with O_WRONLY and closed unwritten.
"""
from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator

import pytest

from services.core.sandbox.bwrap import PROBE, Bind, bwrap_argv, parse_probe, probe_problems
from services.resources.code import sandbox as sandbox_module
from services.resources.code.sandbox import Limits, Sandbox, SandboxError
from tests.security.code_sandbox import require_full_isolation

# every file under /proc/sys and /proc/sysrq-trigger: opened for writing and closed unwritten
OPEN_FOR_WRITING = """
import json, os
opened = []
paths = ["/proc/sysrq-trigger"] + [os.path.join(r, f) for r, _, fs in os.walk("/proc/sys") for f in fs]
for path in paths:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    os.close(fd)
    opened.append(path)
print(json.dumps({"uid": os.getuid(), "uid_map": open("/proc/self/uid_map").read().split(),
                  "opened": opened, "walked": len(paths)}))
"""


def _need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the security suite runs as root in CI")
        pytest.skip("needs root (what the escape takes)")


@pytest.fixture(params=["cgroup", "rlimit"])
async def sandbox(request) -> AsyncIterator[Sandbox]:
    """The sandbox in both process-limit modes: pids/memory cgroups (as root) and rlimits only (the
    compose `code` container's mode)."""
    box = Sandbox("bwrap", pids_cgroup=request.param == "cgroup")
    await box.start()
    if request.param == "cgroup":
        require_full_isolation(box.describe())
    try:
        yield box
    finally:
        await box.close()


async def _report(box: Sandbox, program: str, limits: Limits | None = None) -> dict:
    result = await box.run(program, b"", limits or Limits(wall_s=20, cpu_s=10))
    assert result.exit_code == 0 and not result.sandbox_error, result
    return json.loads(result.stdout)


async def test_the_sandbox_user_is_not_root_outside(sandbox):
    seen = await _report(sandbox, OPEN_FOR_WRITING)
    inside, outside, _count = seen["uid_map"]
    assert seen["uid"] == int(inside) == 65534
    assert outside != "0", seen  # was `65534 0 1`: the sandbox user was host root
    if os.geteuid() == 0:
        assert outside == "65534"


async def test_no_global_sysctl_and_no_sysrq_trigger_opens_for_writing(sandbox):
    seen = await _report(sandbox, OPEN_FOR_WRITING)
    assert seen["walked"] > 100, seen  # /proc/sys is there and was really walked
    assert seen["opened"] == [], seen["opened"][:10]


async def test_proc_sys_is_read_only_even_for_a_root_mapped_sandbox():
    """Defence in depth: the builder's own argv, started as root (what the launcher prevents), still
    mounts /proc/sys and /proc/sysrq-trigger read-only."""
    _need_root()
    import subprocess

    python, dirs = sandbox_module._interpreter()
    argv = bwrap_argv("bwrap", tmp_mb=8, binds=[Bind(d, d) for d in dirs]) + [python, "-I", "-S", "-c"]
    done = subprocess.run([*argv, OPEN_FOR_WRITING], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout)["opened"] == []
    done = subprocess.run([*argv, PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert parse_probe(done.stdout)["writable"] == []


def test_probe_problems_name_each_reason():
    assert probe_problems({"uid_map": "65534 65534 1\n", "writable": []}, 65534) == []
    root = probe_problems({"uid_map": "65534 0 1\n", "writable": []}, 65534)
    assert len(root) == 1 and "uid 0 outside" in root[0]
    sysctl = probe_problems({"uid_map": "65534 65534 1\n", "writable": ["/proc/sys/kernel/core_pattern"]}, 65534)
    assert len(sysctl) == 1 and "core_pattern" in sysctl[0]
    assert probe_problems(None, 65534) and probe_problems({"uid_map": None, "writable": []}, 0)
    rooted = probe_problems({"uid_map": "65534 65534 1\n", "writable": []}, 65534, {10: 65534, 11: 0})
    assert len(rooted) == 1 and "uid 0 outside" in rooted[0] and "11" in rooted[0]


async def test_start_refuses_when_bwrap_would_run_as_root(monkeypatch):
    """Without the privilege drop (today's cgroup mode as root) the start-up probe refuses to serve."""
    _need_root()
    monkeypatch.setattr(sandbox_module, "unprivileged", lambda argv, uid=65534: argv)
    box = Sandbox("bwrap")
    try:
        with pytest.raises(SandboxError, match="refusing to serve.*run as uid 0 outside"):
            await box.start()
    finally:
        await box.close()


# writes until refused, in /dev itself, /dev/shm, /tmp; 1 MiB files; stops at 64 MiB in all
FILL = """
import json, os
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"y" * (5 << 20))
    big = "written"
except OSError as exc:
    big = exc.strerror
os.unlink("/tmp/big")
written, errors = {}, {}
for where in ("/dev", "/dev/shm", "/tmp"):
    total = 0
    for i in range(64):
        try:
            with open(f"{where}/fill{i}", "wb") as f:
                f.write(b"x" * (1 << 20))
            total += 1 << 20
        except OSError as exc:
            errors[where] = exc.strerror
            break
    written[where] = total
print(json.dumps({"written": written, "errors": errors, "big": big}))
"""


async def test_dev_is_no_disk_and_every_writable_place_counts_against_tmp_mb(sandbox):
    limits = Limits(wall_s=30, cpu_s=20, tmp_mb=8, file_mb=4)
    seen = await _report(sandbox, FILL, limits)
    assert seen["written"]["/dev"] == 0 and seen["errors"]["/dev"] == "Read-only file system", seen
    assert 0 < seen["written"]["/dev/shm"] and 0 < seen["written"]["/tmp"], seen
    assert sum(seen["written"].values()) <= 8 << 20, seen  # /tmp and /dev/shm share tmp_mb
    assert seen["big"] == "File too large", seen  # file_mb caps one file


async def test_cpu_time_limit_kills_a_spinner_that_ignores_sigxcpu():
    box = Sandbox("bwrap")
    await box.start()
    program = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n"
    try:
        result = await box.run(program, b"", Limits(wall_s=60, cpu_s=1))
    finally:
        await box.close()
    assert result.timed_out is False, result  # the CPU limit, not the wall clock, ended it
    assert result.signal == signal.SIGKILL, result


async def test_fork_bomb_stops_at_the_process_limit(sandbox):
    """The limit really applies: forks fail once `processes` tasks exist (cgroup or RLIMIT_NPROC, which
    the kernel never applies to uid 0: so it also shows the sandbox does not run as root)."""
    program = ("import json, os, time\nkids = 0\nerror = None\n"
               "while kids < 200:\n"
               "    try:\n        pid = os.fork()\n"
               "    except OSError as exc:\n        error = exc.strerror\n        break\n"
               "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
               "    kids += 1\n"
               "print(json.dumps({'kids': kids, 'error': error}))\n")
    seen = await _report(sandbox, program, Limits(wall_s=30, cpu_s=10, processes=12))
    assert seen["error"] == "Resource temporarily unavailable", seen
    assert 1 <= seen["kids"] < 12, seen


def test_ci_fails_loudly_on_the_weaker_fallback(monkeypatch):
    """With CI=true, a sandbox without cgroups (or a non-root run) fails the suite instead of passing it."""
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="need root with cgroups"):
        require_full_isolation({"process_limit": "rlimit (bwrap started as uid 65534)"})
    if os.geteuid() == 0:
        require_full_isolation({"process_limit": "cgroup"})  # the full sandbox passes
