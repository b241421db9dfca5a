"""The bubblewrap workspace provider (the default): a host folder bound as `/workspace` in a fresh
sandbox per command, built by the shared hardened argv builder (`bwrap.py`), with the shared seccomp
filter (`seccomp.py`: no ptrace, io_uring, keyring, bpf, non-Unix sockets, new namespaces, mounts).

Each `exec` gets everything `bwrap_argv` promises (never root outside, no network, a read-only
root of the host's /usr, read-only /proc/sys, sized /tmp and /dev/shm, a clean environment, no
nested user namespaces) plus the workspace folder bound writable at `/workspace`, and rlimits for
CPU, address space, file size and processes; `--die-with-parent` in its own pid namespace means
killing bwrap kills everything the command started, so nothing outlives a command. The folder is
owned by the uid bwrap runs as, inside a folder only that uid may enter. The workspace is a host
folder: each file is capped (`file_mb`); after every command `tree.py` clears set-id bits, removes
device and fifo nodes and measures the tree without recursion (a command that leaves more than
`disk_mb`, `files` entries or `depth` levels fails with a message); a hard total cap needs the
docker provider (a size-capped tmpfs). Folders live
under `$GYMSERVE_SANDBOX_DIR` (default: the system temporary directory) with an owner marker
beside the tree, so the janitor can remove what a killed server left.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from . import owner, seccomp
from . import tree as host_tree
from .bwrap import PROBE, Bind, bwrap_argv, parse_probe, probe_problems, reachable_by, spawn_uid, unprivileged
from .process import run_process
from .workspace import STARTED, WORKDIR, ExecResult, Limits, Provider, Workspace, WorkspaceError, started

log = logging.getLogger("gymserve.sandbox")
PREFIX = "gymserve-ws-"
TMP_MB = 64  # /tmp and /dev/shm of one command
_LIMITS = ('ulimit -c 0 -t "$1" -v "$2" -f "$3" -u "$4" && shift 4 && printf %s "$2" >&2 '
           '&& exec /bin/bash -c "$1"')


def sandbox_root() -> Path:
    return Path(os.environ.get("GYMSERVE_SANDBOX_DIR") or tempfile.gettempdir())


class FolderWorkspace(Workspace):
    def __init__(self, provider: BwrapProvider, root: Path, limits: Limits) -> None:
        super().__init__(root.name, limits)
        self.provider = provider
        self.root = root
        self.tree = root / "tree"

    async def exec(self, command: str, *, stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        if not self.tree.is_dir():
            raise WorkspaceError(f"workspace {self.id} is gone")
        lim = self.limits
        seccomp_fd = self.provider.seccomp_fd()
        try:
            argv = unprivileged([*self.provider.bwrap_args(self.tree, lim, seccomp_fd), "/bin/bash", "-c", _LIMITS,
                                 "limits", str(lim.cpu_s), str(lim.memory_mb << 10), str(lim.file_mb << 10),
                                 str(lim.pids), command, STARTED])
            result = await run_process(argv, stdin, timeout_s or lim.wall_s, lim.output_bytes,
                                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                       pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                                       stderr_mark=len(STARTED))
        except OSError as exc:
            raise WorkspaceError(f"could not start bubblewrap: {exc}") from exc
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        if not started(result):  # bwrap or the limits failed: what the command prints cannot get here
            raise WorkspaceError(f"sandbox failed: {(result.stderr or result.stdout).strip()[-400:]}")
        # the tree as the command left it: set-id bits and device nodes gone, then held to its limits
        stats = await host_tree.inspect(self.tree)
        over = []
        if stats.bytes > lim.disk_mb << 20:
            over.append(f"holds {stats.bytes >> 20} MB, over its {lim.disk_mb} MB limit")
        if stats.entries > lim.files:
            over.append(f"holds {stats.entries} files and folders, over its {lim.files} limit")
        if stats.depth > lim.depth:
            over.append(f"nests {stats.depth} folders deep, over its {lim.depth} limit")
        if over:
            result.stderr += f"\n[workspace {'; '.join(over)}: remove files]"
            result.exit_code = result.exit_code or 1
        return result

    async def destroy(self) -> None:
        await host_tree.remove(self.root)


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
        self.uid = spawn_uid()
        self.proc_mount = True
        self.seccomp_filter: bytes | None = None

    def seccomp_fd(self) -> int | None:
        """A memfd holding the compiled filter, for one bwrap start (the caller closes it)."""
        if self.seccomp_filter is None:
            return None
        fd = os.memfd_create("seccomp", 0)
        os.write(fd, self.seccomp_filter)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def bwrap_args(self, tree: Path, limits: Limits, seccomp_fd: int | None = None) -> list[str]:
        assert self.bwrap
        # --disable-userns needs a /proc of the sandbox; without one the filter refuses new namespaces
        return bwrap_argv(self.bwrap, tmp_mb=TMP_MB, binds=[Bind(str(tree), WORKDIR, writable=True)],
                          proc=self.proc_mount, chdir=WORKDIR, seccomp_fd=seccomp_fd,
                          disable_userns=self.proc_mount or seccomp_fd is None)

    async def start(self) -> None:
        self.bwrap = shutil.which(self.bwrap_name)
        if not self.bwrap:
            raise WorkspaceError(f"bubblewrap not found ({self.bwrap_name!r}): apt-get install bubblewrap")
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and not reachable_by(str(self.root), self.uid):
            raise WorkspaceError(f"uid {self.uid} cannot reach {self.root}: set GYMSERVE_SANDBOX_DIR to a "
                                 "folder every user may traverse (e.g. under /tmp)")
        await asyncio.to_thread(reclaim_folders, self.root)
        self.seccomp_filter = seccomp.build_filter()
        if self.seccomp_filter is None:
            log.warning("no seccomp filter for architecture %s: workspaces run without one", os.uname().machine)
        try:
            await self.probe()
        except WorkspaceError as exc:
            if "proc" not in str(exc):
                raise
            # a container runtime that masks /proc paths forbids a fresh procfs in a user namespace
            self.proc_mount = False
            await self.probe()

    async def probe(self) -> None:
        """The hardened sandbox's own probe (never root outside, no writable kernel settings), plus: a
        clean environment, no network, a read-only root and a writable workspace."""
        ws = await self.create(image=None, folder=None, limits=Limits(wall_s=30))
        try:
            seccomp_check = ("grep -q '^Seccomp:[[:space:]]*2' /proc/self/status || { echo 'no seccomp'; exit 1; }; "
                             if self.seccomp_filter is not None and self.proc_mount else "")
            check = (seccomp_check + '[ -z "${GYMSERVE_API_KEY:-}" ] || { echo "environment leaks"; exit 1; }; '
                     '! touch /usr/x 2>/dev/null || { echo "root writable"; exit 1; }; '
                     '! timeout 3 bash -c "exec 3<>/dev/tcp/192.0.2.1/9" 2>/dev/null || { echo network; exit 1; }; '
                     'echo ok > probe && cat probe && python3 -I -c "$0"')
            result = await ws.exec(f"bash -c {_quote(check)} {_quote(PROBE)}")
            if result.exit_code != 0 or not result.stdout.startswith("ok"):
                raise WorkspaceError(f"bwrap probe failed: {(result.stdout + result.stderr).strip()[-400:]}")
            problems = probe_problems(parse_probe(result.stdout), self.uid)
            if problems:
                raise WorkspaceError("unsafe sandbox: " + "; ".join(problems))
        finally:
            await ws.destroy()

    async def create(self, *, image: str | None, folder: Path | None, limits: Limits) -> Workspace:
        if image:
            raise WorkspaceError(f"the bwrap provider runs on the host's /usr and cannot use image {image!r}; "
                                 "give the task a folder or use sandbox_provider=docker")
        root = self.root / f"{PREFIX}{uuid.uuid4().hex[:16]}"
        root.mkdir(mode=0o700)
        (root / "owner").write_text(owner.me())
        ws = FolderWorkspace(self, root, limits)
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
        if os.geteuid() == 0 and self.uid != 0:
            # only the sandbox user (and root) may enter: what a command leaves in the tree is out of
            # every other host user's reach, even between a command and the set-id sweep after it
            os.chown(root, self.uid, self.uid)
            os.chmod(root, 0o700)
            _chown_tree(tree, self.uid)

    def describe(self) -> dict[str, Any]:
        return {"provider": self.name, "proc": self.proc_mount, "uid_outside": self.uid,
                "seccomp": self.seccomp_filter is not None}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def reclaim_folders(root: Path) -> int:
    """Remove workspace folders whose owner server is dead (kill -9 leaves them); returns how many."""
    removed = 0
    for path in root.glob(f"{PREFIX}*"):
        try:
            who = (path / "owner").read_text()
        except OSError:
            continue
        if owner.is_dead(who):
            host_tree.remove_now(path)
            removed += 1
    if removed:
        log.warning("janitor: removed %d workspace folder(s) left by dead servers", removed)
    return removed
