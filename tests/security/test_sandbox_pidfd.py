"""pidfd_getfd: user code cannot take a file descriptor from another process of its sandbox (bwrap's
pid 1, the REPL supervisor, the batch runner) and forge the server's replies through it; and
memfd_create, whose unmapped pages no rlimit counts, is refused."""
from __future__ import annotations

import json

from tests.security.code_sandbox import assert_healthy, run, server, stdout_of  # noqa: F401

GRAB = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
got = {}
for pid in sorted({1, os.getppid()}):
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        got[str(pid)] = "pidfd_open " + exc.__class__.__name__
        continue
    taken = []
    for fd in range(0, 8):
        r = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
        if r >= 0:
            taken.append(fd)
    got[str(pid)] = taken
print(json.dumps(got))
'''


def test_pidfd_getfd_takes_nothing_in_the_repl(server):
    out = json.loads(stdout_of(server, GRAB).strip().splitlines()[-1])
    assert all(v == [] or isinstance(v, str) for v in out.values()), out
    assert_healthy(server)


def test_pidfd_getfd_takes_nothing_in_a_verify_run(server):
    result = run(server, GRAB + "\nimport sys\nsys.exit(0 if all(v == [] or isinstance(v, str) for v in got.values()) else 3)\n")
    assert result["exit_code"] == 0, result


def test_memfd_create_is_refused(server):
    program = ("import os\ntry:\n    os.memfd_create('x')\n    print('created')\n"
               "except OSError as exc:\n    print('refused', exc.errno)\n")
    result = run(server, program, expected="refused 1\n")
    assert result["passed"], result
