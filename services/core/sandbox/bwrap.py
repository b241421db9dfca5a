"""The bubblewrap provider (the default): a host folder bound as `/workspace` in a fresh sandbox per command.

Each `exec` is `bwrap` with every namespace unshared (no network), uid/gid 65534 inside, a read-only
root holding only the host's /usr (+ the /bin, /lib links; Debian's python3, pytest and git), a private
size-capped /tmp, no environment but PATH/HOME/LANG, and `--die-with-parent` in its own pid
namespace (killing bwrap kills everything the command started). rlimits: CPU, address space,
file size, processes. The workspace is a host folder: each file is capped (`file_mb`) and the
total is checked after every command (a command that leaves more than `disk_mb` fails with a
message); a hard total cap needs the docker provider (a size-capped tmpfs). As root, bwrap itself starts as uid 65534 so the process limit applies (it
never applies to root) and the folder belongs to that uid. Folders live under
`$GYMSERVE_SANDBOX_DIR` (default: the system temporary directory) with an owner marker beside
the tree, so the janitor can remove what a killed server left.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from . import owner
from .workspace import WORKDIR, ExecResult, Limits, Provider, Workspace, WorkspaceError

log = logging.getLogger("gymserve.sandbox")
SANDBOX_UID = 65534
PREFIX = "gymserve-ws-"
_DROP = ("import os, sys; uid = int(sys.argv[1]); os.setgroups([]); os.setgid(uid); os.setuid(uid); "
         "os.execv(sys.argv[2], sys.argv[2:])")
_LIMITS = 'ulimit -c 0 -t "$1" -v "$2" -f "$3" -u "$4" && shift 4 && exec /bin/bash -c "$1"'


def sandbox_root() -> Path:
    return Path(os.environ.get("GYMSERVE_SANDBOX_DIR") or tempfile.gettempdir())


async def pump(stream: asyncio.StreamReader | None, buf: bytearray, limit: int, over: asyncio.Event) -> None:
    """Read a pipe to its end, keeping at most `limit` bytes; sets `over` when more came."""
    assert stream is not None
    while chunk := await stream.read(65536):
        room = limit - len(buf)
        buf += chunk[: max(room, 0)]
        if len(chunk) > room:
            over.set()
            return


async def run_process(argv: list[str], stdin: bytes, wall_s: float, output_bytes: int, *,
                      env: dict[str, str] | None = None) -> ExecResult:
    """Run `argv` in its own process group with a wall-clock kill and capped output."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                                                cwd="/")
    out, err, over = bytearray(), bytearray(), asyncio.Event()

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    feeder = asyncio.ensure_future(feed())
    watcher = asyncio.ensure_future(over.wait())
    work = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, out, output_bytes, over),
                                                pump(proc.stderr, err, output_bytes, over), proc.wait()))
    timed_out = False
    try:
        done, _ = await asyncio.wait({work, watcher}, timeout=wall_s, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not done
    finally:
        if not work.done():
            kill()
        for task in (feeder, watcher, work):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(proc.wait(), 10.0)
    code = proc.returncode
    killed = timed_out or over.is_set()
    return ExecResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                      None if killed else (128 - code if code is not None and code < 0 else code),
                      timed_out=timed_out, output_exceeded=over.is_set())


class BwrapWorkspace(Workspace):
    def __init__(self, provider: BwrapProvider, root: Path, limits: Limits) -> None:
        super().__init__(root.name, limits)
        self.provider = provider
        self.root = root
        self.tree = root / "tree"

    async def exec(self, command: str, *, stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        if not self.tree.is_dir():
            raise WorkspaceError(f"workspace {self.id} is gone")
        lim = self.limits
        argv = [*self.provider.bwrap_args(self.tree, lim), "/bin/bash", "-c", _LIMITS, "limits", str(lim.cpu_s),
                str(lim.memory_mb << 10), str(lim.file_mb << 10), str(lim.pids), command]
        if self.provider.spawn_uid is not None:
            argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", _DROP, str(self.provider.spawn_uid), *argv]
        try:
            result = await run_process(argv, stdin, timeout_s or lim.wall_s, lim.output_bytes,
                                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        except OSError as exc:
            raise WorkspaceError(f"could not start bubblewrap: {exc}") from exc
        if result.exit_code == 1 and not result.stdout and result.stderr.startswith("bwrap: "):
            raise WorkspaceError(f"sandbox failed: {result.stderr.strip()[-400:]}")
        used = await asyncio.to_thread(_size, self.tree)
        if used > lim.disk_mb << 20:
            result.stderr += (f"\n[workspace holds {used >> 20} MB, over its {lim.disk_mb} MB limit: "
                              "remove files]")
            result.exit_code = result.exit_code or 1
        return result

    async def destroy(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.root, True)


def _size(tree: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(tree):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _reachable(path: Path) -> bool:
    """Every directory down to `path` is searchable by any user (bwrap runs as the sandbox uid)."""
    parts = path.resolve().parts
    return all(os.stat(os.path.join(*parts[:i])).st_mode & 0o001 for i in range(1, len(parts) + 1))


def _chown_tree(tree: Path, uid: int) -> None:
    for dirpath, dirs, files in os.walk(tree):
        os.lchown(dirpath, uid, uid)
        for name in dirs + files:
            os.lchown(os.path.join(dirpath, name), uid, uid)


class BwrapProvider(Provider):
    name = "bwrap"

    def __init__(self, *, bwrap: str = "bwrap", root: Path | None = None) -> None:
        self.bwrap_name = bwrap
        self.root = root or sandbox_root()
        self.bwrap: str | None = None
        self.spawn_uid = SANDBOX_UID if os.geteuid() == 0 else None
        self.proc_mount = True

    def bwrap_args(self, tree: Path, limits: Limits) -> list[str]:
        assert self.bwrap
        path = "/usr/local/bin:/usr/bin:/bin"
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv",
                "--setenv", "PATH", path, "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
                "--ro-bind", "/usr", "/usr"]
        if self.proc_mount:
            args[4:4] = ["--disable-userns"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        if os.path.exists("/etc/ld.so.cache"):
            args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        args += ["--proc" if self.proc_mount else "--dir", "/proc", "--dev", "/dev",
                 "--size", str(64 << 20), "--tmpfs", "/tmp", "--bind", str(tree), WORKDIR, "--chdir", WORKDIR,
                 "--remount-ro", "/"]
        return args

    async def start(self) -> None:
        self.bwrap = shutil.which(self.bwrap_name)
        if not self.bwrap:
            raise WorkspaceError(f"bubblewrap not found ({self.bwrap_name!r}): apt-get install bubblewrap")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.spawn_uid is not None and not _reachable(self.root):
            raise WorkspaceError(f"uid {self.spawn_uid} cannot reach {self.root}: set GYMSERVE_SANDBOX_DIR to a "
                                 "folder every user may traverse (e.g. under /tmp)")
        await asyncio.to_thread(reclaim_folders, self.root)
        try:
            await self.probe()
        except WorkspaceError as exc:
            if "proc" not in str(exc):
                raise
            # a container runtime that masks /proc paths forbids a fresh procfs in a user namespace
            self.proc_mount = False
            await self.probe()

    async def probe(self) -> None:
        """The isolation holds: uid 65534, clean environment, no network, read-only root, writable workspace."""
        ws = await self.create(image=None, folder=None, limits=Limits(wall_s=30))
        try:
            check = ('[ "$(id -u)" = 65534 ] || { echo "uid $(id -u)"; exit 1; }; '
                     '[ -z "${GYMSERVE_API_KEY:-}" ] || { echo "environment leaks"; exit 1; }; '
                     '! touch /usr/x 2>/dev/null || { echo "root writable"; exit 1; }; '
                     '! timeout 3 bash -c "exec 3<>/dev/tcp/192.0.2.1/9" 2>/dev/null || { echo network; exit 1; }; '
                     'echo ok > probe && cat probe')
            result = await ws.exec(check)
            if result.exit_code != 0 or "ok" not in result.stdout:
                raise WorkspaceError(f"bwrap probe failed: {(result.stdout + result.stderr).strip()[-400:]}")
        finally:
            await ws.destroy()

    async def create(self, *, image: str | None, folder: Path | None, limits: Limits) -> Workspace:
        if image:
            raise WorkspaceError(f"the bwrap provider runs on the host's /usr and cannot use image {image!r}; "
                                 "give the task a folder or use sandbox_provider=docker")
        root = self.root / f"{PREFIX}{uuid.uuid4().hex[:16]}"
        root.mkdir(mode=0o700)
        (root / "owner").write_text(owner.me())
        ws = BwrapWorkspace(self, root, limits)
        try:
            await asyncio.to_thread(self._fill, root, folder)
            await ws.init_base()
        except BaseException:
            await ws.destroy()
            raise
        return ws

    def _fill(self, root: Path, folder: Path | None) -> None:
        tree = root / "tree"
        if folder is not None:
            shutil.copytree(folder, tree, symlinks=True)
        else:
            tree.mkdir()
        if self.spawn_uid is not None:
            os.chmod(root, 0o711)
            _chown_tree(tree, self.spawn_uid)

    def describe(self) -> dict[str, Any]:
        return {"provider": self.name, "proc": self.proc_mount,
                "process_limit": "rlimit (bwrap started as uid 65534)" if self.spawn_uid else "rlimit"}


def reclaim_folders(root: Path) -> int:
    """Remove workspace folders whose owner server is dead (kill -9 leaves them); returns how many."""
    removed = 0
    for path in root.glob(f"{PREFIX}*"):
        try:
            who = (path / "owner").read_text()
        except OSError:
            continue
        if owner.is_dead(who):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    if removed:
        log.warning("janitor: removed %d workspace folder(s) left by dead servers", removed)
    return removed
