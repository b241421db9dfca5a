"""The docker provider (clusters): one container per workspace from a per-task image.

A container runs `sleep infinity` with no network, all capabilities dropped, no-new-privileges,
a read-only root, uid/gid 65534, CPU/memory/pids limits, and `/workspace` and `/tmp` as
size-capped tmpfs (the disk limit). A folder is copied in as a tar stream through `docker exec`
(`docker cp` cannot write into a tmpfs). Every command runs under `_RUN`, which kills it at its
wall-clock limit inside the container, so a command outlives no deadline even if the client dies.
Commands without stdin go through the Engine API on its unix socket (`engine_api`, no CLI process per
command); commands with stdin, and every command when the socket is not reachable, through
`docker exec`. Containers are started and removed with the CLI. Containers carry the owner label;
the janitor removes those whose owner server is dead.

An image's `VOLUME`s would be anonymous volumes on the host's disk, outside every limit; each one
is mounted instead as an empty size-capped tmpfs (what the image keeps under a `VOLUME` is not
there: a task's files belong in `/testbed` or the workspace), and the workspace and the volumes
share `disk_mb` between them.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import shlex
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any

from . import owner
from .bwrap import SANDBOX_UID
from .engine_api import EngineAPI
from .process import run_process
from .workspace import (OWNER_LABEL, STARTED, WORKDIR, ExecResult, Limits, Provider, Workspace, WorkspaceError,
                        started)

log = logging.getLogger("gymserve.sandbox")
ROLE_LABEL = "gymserve.sandbox"
TESTBED = "/testbed"
TIMEOUT_MARK = "\n[gymserve: wall-clock limit]"
# The exec's main process: runs the command with its limits, kills it at the wall-clock limit, and
# afterwards kills every process of the sandbox user but itself and pid 1 (`kill -1`, a builtin that
# needs no free pid), so nothing a command left behind (a fork bomb, a daemon) outlives it, as with bwrap.
_RUN = ('ulimit -c 0 -t "$1" -f "$2" || exit 125; printf %s "$5" >&2; exec 3<&0; /bin/bash -c "$4" <&3 & job=$!; '
        'exec 3<&-; '
        f'{{ sleep "$3"; printf %s "{TIMEOUT_MARK.strip()}" >&2; kill -KILL $job; }} & '
        '{ wait $job; } 2>/dev/null; rc=$?; kill -KILL -1 2>/dev/null; exit $rc')


def disk_shares(disk_mb: int, volumes: int) -> tuple[int, int]:
    """MB of the workspace and of each of `volumes` image volumes, together at most `disk_mb`."""
    if not volumes:
        return disk_mb, 0
    each = max(1, disk_mb // (volumes + 1))
    return max(1, disk_mb - each * volumes), each


def run_args(name: str, image: str, limits: Limits, *, extra: list[str] | None = None,
             volumes: list[str] | tuple[str, ...] = ()) -> list[str]:
    """`docker run` arguments of a workspace container (tests weaken a copy of them on purpose); `volumes`
    are the image's `VOLUME` paths, each then an empty tmpfs of its share of `disk_mb`."""
    workspace_mb, volume_mb = disk_shares(limits.disk_mb, len(volumes))
    mounts = [arg for path in volumes for arg in (
        "--tmpfs", f"{path}:rw,exec,size={volume_mb}m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755")]
    return ["run", "-d", "--name", name, "--label", f"{ROLE_LABEL}=workspace", "--label", f"{OWNER_LABEL}={owner.me()}",
            "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--read-only", "--user", f"{SANDBOX_UID}:{SANDBOX_UID}", "--cpus", "1",
            "--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m",
            "--pids-limit", str(limits.pids), "--ulimit", "core=0",
            "--tmpfs", f"{WORKDIR}:rw,exec,size={workspace_mb}m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755",
            "--tmpfs", f"/tmp:rw,exec,size=64m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=1777",
            "--workdir", WORKDIR, "--env", "HOME=/tmp", "--env", "LANG=C.UTF-8",
            *mounts, *(extra or []), "--entrypoint", "sleep", image, "infinity"]


class DockerWorkspace(Workspace):
    def __init__(self, provider: DockerProvider, container: str, limits: Limits) -> None:
        super().__init__(container, limits)
        self.provider = provider

    async def exec(self, command: str, *, stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        lim = self.limits
        wall = timeout_s or lim.wall_s
        argv = ["/bin/bash", "-c", _RUN, "run", str(lim.cpu_s), str(lim.file_mb << 10), f"{wall:.3f}", command,
                STARTED]
        api = self.provider.api
        if api is not None and not stdin:
            result = await api.exec(self.id, argv, wall + 10, lim.output_bytes, len(STARTED))
        else:
            result = await run_process([self.provider.docker, "exec", "-i", self.id, *argv], stdin, wall + 10,
                                       lim.output_bytes, stderr_mark=len(STARTED))
        if result.exit_code == 137 and TIMEOUT_MARK.strip() in result.stderr:
            result.stderr = result.stderr.replace(TIMEOUT_MARK.strip(), "")
            result.timed_out, result.exit_code = True, None
        elif result.timed_out or result.output_exceeded:
            # the client gave up or cut the output: kill what runs inside now, or its end (`_RUN`'s
            # `kill -1`) could come during the next command and kill that
            kill = ["/bin/bash", "-c", "kill -KILL -1"]
            if api is not None:
                with contextlib.suppress(WorkspaceError):  # as with the CLI: a gone container has nothing to kill
                    await api.exec(self.id, kill, 30, 1 << 16)
            else:
                await self.provider.cli("exec", self.id, *kill, wall_s=30)
        if not started(result):  # docker exec or the limits failed; the command's own output cannot get here
            raise WorkspaceError(f"docker exec failed: {(result.stderr or result.stdout).strip()[-400:]}")
        return result

    async def destroy(self) -> None:
        await self.provider.remove([self.id])


class DockerProvider(Provider):
    name = "docker"

    def __init__(self, *, docker: str = "docker", default_image: str | None = None) -> None:
        self.docker_name = docker
        self.docker = docker
        self.default_image = default_image
        self.api: EngineAPI | None = None

    async def cli(self, *args: str, stdin: bytes = b"", wall_s: float = 120.0) -> ExecResult:
        return await run_process([self.docker, *args], stdin, wall_s, 1 << 20)

    async def start(self) -> None:
        found = shutil.which(self.docker_name)
        if not found:
            raise WorkspaceError(f"docker CLI not found ({self.docker_name!r})")
        self.docker = found
        info = await self.cli("info", "--format", "{{.ServerVersion}}", wall_s=30)
        if info.exit_code != 0:
            raise WorkspaceError(f"no docker engine: {info.stderr.strip()[-300:]}")
        try:
            self.api = await EngineAPI.connect()
        except WorkspaceError as e:
            log.warning("docker: commands go through the CLI (%s)", e)
        await self.reclaim()

    async def close(self) -> None:
        if self.api is not None:
            await self.api.close()
            self.api = None

    async def reclaim(self) -> int:
        """Remove workspace containers whose owner server is dead (the start-up janitor)."""
        listed = await self.cli("ps", "-a", "--filter", f"label={ROLE_LABEL}", "--format",
                                f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}')
        dead = [line.split()[0] for line in listed.stdout.splitlines()
                if len(line.split()) == 2 and owner.is_dead(line.split()[1])]
        if dead:
            log.warning("janitor: removing %d workspace container(s) left by dead servers", len(dead))
            await self.remove(dead)
        return len(dead)

    async def remove(self, containers: list[str]) -> None:
        await self.cli("rm", "-f", "-v", *containers)

    async def create(self, *, image: str | None, folder: Path | None, limits: Limits) -> Workspace:
        image = image or self.default_image
        if not image:
            raise WorkspaceError("the docker provider needs an image (the row's `image` or sandbox_image)")
        name = f"gymserve-ws-{uuid.uuid4().hex[:16]}"
        volumes = await self.image_volumes(image)
        started = await self.cli(*run_args(name, image, limits, volumes=volumes))
        if started.exit_code != 0:
            await self.remove([name])
            raise WorkspaceError(f"docker run {image}: {started.stderr.strip()[-400:]}")
        ws = DockerWorkspace(self, name, limits)
        try:
            if folder is not None:
                data = await asyncio.to_thread(_tar, folder)
                await ws.must(f"tar -x -C {shlex.quote(WORKDIR)} --no-same-owner", stdin=data, what="copy the folder in")
            else:  # a task image keeps its repository in /testbed (SWE-bench's convention)
                await ws.must(f"if [ -d {TESTBED} ]; then cp -R {TESTBED}/. {WORKDIR}/; fi", what=f"copy {TESTBED} in")
            await ws.init_base()
        except BaseException:
            await ws.destroy()
            raise
        return ws

    async def image_volumes(self, image: str) -> list[str]:
        """The image's `VOLUME` paths, pulling it first when it is not here (a `docker run` that pulled it
        itself would have made them anonymous host volumes)."""
        for attempt in range(2):
            found = await self.cli("image", "inspect", "--format", "{{json .Config.Volumes}}", image, wall_s=60)
            if found.exit_code == 0:
                return sorted(json.loads(found.stdout.strip() or "null") or {})
            if attempt == 0:
                await self.cli("pull", "--quiet", image, wall_s=1800)
        raise WorkspaceError(f"docker image inspect {image}: {found.stderr.strip()[-400:]}")

    def describe(self) -> dict[str, Any]:
        return {"provider": self.name, "image": self.default_image}


def _tar(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
    return buf.getvalue()
