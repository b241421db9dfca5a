"""Commands in a container through the Docker Engine API over its unix socket (no CLI process per command).

`docker exec` through the CLI starts a Go binary per command plus several API round trips; here one
aiohttp session per provider creates the exec, reads its multiplexed stream (8-byte frame headers:
stream type, 3 zero bytes, big-endian size) with the same output cap as `run_process`, then reads
its exit code. Commands with stdin need a hijacked connection, so they stay on the CLI.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp

from .workspace import ExecResult, WorkspaceError

_BASE = "http://docker"  # the host part is ignored on a unix socket


def socket_path() -> str | None:
    """The engine's unix socket (`DOCKER_HOST` when it names one); None for a non-unix `DOCKER_HOST`."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return "/var/run/docker.sock"
    return host.removeprefix("unix://") if host.startswith("unix://") else None


class EngineAPI:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    @classmethod
    async def connect(cls) -> EngineAPI:
        """A session on the engine's socket, once it answers `/_ping`; WorkspaceError when it does not."""
        path = socket_path()
        if path is None:
            raise WorkspaceError(f"DOCKER_HOST is not a unix socket ({os.environ.get('DOCKER_HOST')!r})")
        session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path))
        try:
            async with session.get(f"{_BASE}/_ping", timeout=aiohttp.ClientTimeout(total=10)) as reply:
                if reply.status != 200:
                    raise WorkspaceError(f"engine API /_ping: HTTP {reply.status}")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            await session.close()
            raise WorkspaceError(f"engine API unreachable at {path}: {e!r}") from e
        except BaseException:
            await session.close()
            raise
        return cls(session)

    async def close(self) -> None:
        await self.session.close()

    async def _json(self, method: str, path: str, body: dict[str, Any] | None, ok: int) -> Any:
        async with self.session.request(method, f"{_BASE}{path}", json=body,
                                        timeout=aiohttp.ClientTimeout(total=60)) as reply:
            if reply.status != ok:
                raise WorkspaceError(f"docker exec failed: {method} {path}: HTTP {reply.status}: "
                                     f"{(await reply.text()).strip()[-400:]}")
            return await reply.json()

    async def exec(self, container: str, argv: list[str], wall_s: float, output_bytes: int,
                   stderr_mark: int = 0) -> ExecResult:
        """Run `argv` in `container`; output past `output_bytes` per stream or past `wall_s` is cut, as in
        `run_process` (exit code None, `output_exceeded` / `timed_out` set). An engine error is a WorkspaceError."""
        try:
            created = await self._json("POST", f"/containers/{container}/exec",
                                       {"Cmd": argv, "AttachStdout": True, "AttachStderr": True}, 201)
            out, err = bytearray(), bytearray()
            timed_out = over = False
            try:
                over = await asyncio.wait_for(self._stream(created["Id"], out, err, output_bytes, stderr_mark), wall_s)
            except asyncio.TimeoutError:
                timed_out = True
            code = None
            if not (timed_out or over):
                code = (await self._json("GET", f"/exec/{created['Id']}/json", None, 200))["ExitCode"]
        except (aiohttp.ClientError, OSError) as e:
            raise WorkspaceError(f"docker exec failed: engine API: {e!r}") from e
        return ExecResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), code,
                          timed_out=timed_out, output_exceeded=over)

    async def _stream(self, exec_id: str, out: bytearray, err: bytearray, limit: int, stderr_mark: int) -> bool:
        """Demultiplex the exec's stream into `out`/`err` until its end; True when a stream went past `limit`."""
        reply = await self.session.post(f"{_BASE}/exec/{exec_id}/start", json={"Detach": False, "Tty": False},
                                        timeout=aiohttp.ClientTimeout(total=None))
        try:
            if reply.status != 200:
                raise WorkspaceError(f"docker exec failed: start: HTTP {reply.status}: "
                                     f"{(await reply.text()).strip()[-400:]}")
            return await demux(reply.content, out, err, limit, stderr_mark)
        finally:
            reply.close()  # an unread rest (cut output) closes the connection instead of reusing it


async def demux(stream: aiohttp.StreamReader | asyncio.StreamReader, out: bytearray, err: bytearray,
                limit: int, stderr_mark: int = 0) -> bool:
    """Read frames (type 1 stdout, 2 stderr) keeping at most `limit` bytes per stream (stderr `stderr_mark`
    more, for a provider's start mark); True when more came."""
    while True:
        try:
            header = await stream.readexactly(8)
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise WorkspaceError("docker exec failed: the engine's stream ended inside a frame header") from e
            return False
        size = int.from_bytes(header[4:8], "big")
        buf = err if header[0] == 2 else out
        cap = limit + stderr_mark if buf is err else limit
        while size:
            chunk = await stream.read(min(size, 65536))
            if not chunk:
                raise WorkspaceError("docker exec failed: the engine's stream ended inside a frame")
            size -= len(chunk)
            room = cap - len(buf)
            buf += chunk[: max(room, 0)]
            if len(chunk) > room:
                return True

