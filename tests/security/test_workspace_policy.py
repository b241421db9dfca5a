"""The shared sandbox policy in bubblewrap workspaces (terminal, swe): the seccomp filter of the code
sandbox applies (`Seccomp: 2`; io_uring, keyctl, ptrace, bpf, pidfd_getfd, AF_INET and netlink sockets refused),
nothing set-id or a device survives onto the host, a tree 1,100 folders deep is measured and removed
without recursion, and only the sandbox user can enter a workspace's host folder."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import AsyncIterator

import pytest

from services.core.sandbox.folder import BwrapProvider, FolderWorkspace
from services.core.sandbox.workspace import Limits
from tests.integration.sandbox_helpers import sandbox_dir

LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=256, pids=64, disk_mb=48, file_mb=16, output_bytes=16384)

# each prints REFUSED <name> when the kernel says no, ALLOWED <name> when it lets the call through
SYSCALLS = r'''
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def probe(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(("REFUSED " if r == -1 and ctypes.get_errno() in (errno.EPERM, errno.ENOSYS) else "ALLOWED ") + name)
probe("io_uring_setup", 425, 1, ctypes.c_void_p(0))
probe("keyctl", 250, 0, 0)
probe("ptrace", 101, 16, os.getppid(), 0, 0)
probe("bpf", 321, 0, 0, 0)
probe("userfaultfd", 323, 0)
probe("pidfd_getfd", 438, -1, 0, 0)
for fam, name in ((socket.AF_INET, "AF_INET"), (socket.AF_INET6, "AF_INET6"), (socket.AF_NETLINK, "netlink"),
                  (socket.AF_PACKET, "AF_PACKET")):
    try:
        socket.socket(fam, socket.SOCK_RAW if fam in (socket.AF_NETLINK, socket.AF_PACKET) else socket.SOCK_STREAM)
        print("ALLOWED " + name)
    except OSError:
        print("REFUSED " + name)
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
print("unix ok")
'''


@pytest.fixture
async def provider() -> AsyncIterator[BwrapProvider]:
    with sandbox_dir() as where:
        p = BwrapProvider(root=where)
        await p.start()
        yield p
        assert not list(where.iterdir()), "workspace folders left behind"


async def test_seccomp_filter_in_workspaces(provider: BwrapProvider) -> None:
    if os.uname().machine != "x86_64":
        pytest.fail("the syscall numbers of this test are x86_64's")
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    try:
        status = await ws.exec("grep '^Seccomp:' /proc/self/status")
        assert status.stdout.split() == ["Seccomp:", "2"], status
        out = await ws.exec(f"python3 -I -c {_q(SYSCALLS)}")
        assert out.exit_code == 0 and "unix ok" in out.stdout, out
        assert "ALLOWED" not in out.stdout, out.stdout
        assert out.stdout.count("REFUSED") == 10, out.stdout
    finally:
        await ws.destroy()


async def test_no_setid_file_or_device_survives_on_the_host(provider: BwrapProvider) -> None:
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    assert isinstance(ws, FolderWorkspace)
    try:
        out = await ws.exec("cp /bin/true t && chmod 4755 t && mkdir -p d && cp /bin/true d/g && chmod 2755 d/g "
                            "&& chmod 2775 d && mkfifo f && python3 -c \"import os; os.mknod('n', 0o20600, os.makedev(1, 3))\" "
                            "2>/dev/null; ls -l t d/g f n 2>&1; true")
        assert out.exit_code == 0, out
        bad = []
        for dirpath, dirs, files in os.walk(ws.root):
            for name in dirs + files:
                st = os.lstat(os.path.join(dirpath, name))
                if st.st_mode & (stat.S_ISUID | stat.S_ISGID) or not (
                        stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    bad.append((os.path.join(dirpath, name), oct(st.st_mode)))
        assert not bad, bad
        # the executable is still there and still runs, only without the bit
        assert (await ws.exec("./t && test ! -u t && test ! -g d/g")).exit_code == 0
        if os.geteuid() == 0:  # only the sandbox user may enter the folder from the host
            st = os.stat(ws.root)
            assert st.st_uid == provider.uid and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
    finally:
        await ws.destroy()


async def test_a_tree_1100_folders_deep_is_measured_refused_and_removed(provider: BwrapProvider) -> None:
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    assert isinstance(ws, FolderWorkspace)
    try:
        out = await ws.exec("p=deep; for i in $(seq 1100); do p=$p/d; done; mkdir -p $p && echo x > $p/f && echo made")
        assert "made" in out.stdout, out
        assert out.exit_code != 0 and "folders deep" in out.stderr, out
    finally:
        await ws.destroy()
    assert not Path(ws.root).exists()


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
